"""Padding-free RL batches: each prompt once, its `G` completions packed into rows that read it.

A rollout batch holds `N = B·G` rows of `P + T` slots: every prompt left-padded to the
longest, every completion right-padded to the longest (or to the budget), and each prompt
repeated for its `G` samples. Packing keeps the `B` prompts once, left-padded (`[B, P]`,
what the shared-prompt forward already does), and puts each group's completions back to back
into completion rows of `W` slots (`W = T` by default, so every completion fits; best-fit
decreasing per group, as for SFT and preference pairs: `jaxrl_llm.train.packing`):

    prompt row b:       [ pad … | prompt b ]                          positions 0..p−1
    completion row r:   [ completion i | completion j | … | pad ]     roles 1, 2, …, 0
                        each at positions p..p+c−1, reading prompt `prompt_row[r]`

`Decoder.prompt_indexed_hidden_states` runs them: a completion token reads the real tokens of
its group's prompt and the earlier tokens of its own completion, at the rotary positions of
its padded row, so every completion token sees what it sees in the padded batch. A
completion's first token is predicted by the prompt's last state (slot `P − 1`), a later one
by its predecessor (`slots`); the forward gathers those states back into the padded
`[N, T]` layout and scores the batch's own targets, so log-probs, entropies and everything
the losses read from them equal the padded forward's up to float rounding
(`tests/train/test_group_packing.py`). Each completion row attends over `P + W` keys, as a
padded row does, so a batch of full-length completions costs what the padded shared-prompt
forward costs, and one of short completions fewer rows: `B·P + R·W` slots instead of
`B·P + N·T`.

The packing rides along the `RLBatch` (`RLBatch.packed`) into the update, and into the
old-policy, reference and critic forwards (`PackedSequences`, `make_logprob_fn`,
`make_value_fn`); a value head or a `ValueModel` reads the same gathered states
(`packed_completion_hidden`).

Micro-batches: an update of `parts = minibatches × accumulation_steps` micro-batches of whole
groups (`minibatch_unit: prompt`) gives micro-batch `j` the groups at positions `≡ j (mod
parts)` of the epoch's group order, and the prompt rows and completion rows `≡ j (mod
parts)` (`jaxrl_llm.train.update`). The packing follows that split, as packed preference
pairs do (`jaxrl_llm.train.pair_packing`): micro-batch `j`'s `b`-th group is prompt row
`b·parts + j` and its completions fill completion rows `c·parts + j`, every micro-batch gets
the same number of rows, and the indices come twice: inside the micro-batch (`row`,
`prompt_row`: what the update's objective reads) and inside the whole batch (`batch_row`,
`batch_prompt_row`: what a forward of the whole batch reads). A shuffled update
(`minibatches > 1`) draws a new group order every epoch from its state's key;
`update_unit_orders` draws the same orders on the host, and `pack_groups(orders=)` lays out
one packing per epoch (every leaf then has a leading epoch axis). Sources: padding-free
training (verl's `use_remove_padding`, TRL's `padding_free`); prefix sharing (Wang et al.,
arXiv 2410.20305).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import positions_from_mask
from jaxrl_llm.train.batch import SequenceBatch, prompt_length
from jaxrl_llm.train.packing import best_fit_decreasing
from jaxrl_llm.train.pair_packing import _checked_completion, _positive_int

SEQUENCE_LEAVES = ("row", "batch_row", "slots")  # split as the batch's rows (train.update)


class PackedGroups(NamedTuple):
    """A rollout batch's prompts once and its completions packed into rows (module docstring).

    Prompt leaves (`B` prompts of `P` slots, left-padded):
      prompt_tokens: `[B, P]` int; prompt_positions: `[B, P]` int32 rotary positions;
      prompt_mask: `[B, P]` int32, 1 on real tokens.

    Completion-row leaves (`R` rows of `W` slots):
      tokens: `[R, W]` int, completions back to back, then `pad_id`.
      positions: `[R, W]` int32 rotary positions (each completion continues its prompt).
      roles: `[R, W]` int32, `k ≥ 1` for the row's `k`-th completion, 0 for empty slots.
      prompt_row: `[R]` int32, the prompt row the row reads, inside its micro-batch.
      batch_prompt_row: `[R]` int32, that prompt row inside the whole batch.

    Sequence leaves (`N = B·G` rows of the padded batch, `T` completion slots):
      row: `[N]` int32, the completion row of the sequence inside its micro-batch.
      batch_row: `[N]` int32, that row inside the whole batch (`row` with one micro-batch).
      slots: `[N, T]` int32, the slot (in that row) of the state that predicts completion
        token `t ≥ 1` (token 0 is predicted by the prompt's last state; 0 past the end).

    Packed for a shuffled update (`pack_groups(orders=)`), every leaf has a leading axis of
    `E` epochs.

    Examples:
      >>> b = SequenceBatch(np.array([[4, 5, 6, 0], [4, 5, 7, 8]]), np.array([[1, 1, 1, 0],
      ...                   [1, 1, 1, 1]]), np.array([[1.0, 0.0], [1.0, 1.0]]))
      >>> p = pack_groups(b, 2, width=3)  # prompt 4 5; completions 6 and 7 8 in one row
      >>> p.prompt_tokens.tolist(), p.tokens.tolist(), p.positions.tolist()
      ([[4, 5]], [[6, 7, 8]], [[2, 2, 3]])
      >>> p.roles.tolist(), p.slots.tolist()
      ([[1, 2, 2]], [[0, 0], [0, 1]])
    """

    prompt_tokens: Any
    prompt_positions: Any
    prompt_mask: Any
    tokens: Any
    positions: Any
    roles: Any
    prompt_row: Any
    batch_prompt_row: Any
    row: Any
    batch_row: Any
    slots: Any


class PackedSequences(NamedTuple):
    """A padded `SequenceBatch` with its `PackedGroups`: what `make_logprob_fn` runs packed and
    returns in the padded `[N, T]` layout.

    Examples:
      >>> PackedSequences(None, None)._fields
      ('sequences', 'packed')
    """

    sequences: SequenceBatch
    packed: PackedGroups


def pack_groups(
    batch: SequenceBatch,
    group_size: int,
    *,
    parts: int = 1,
    orders: Any = None,
    width: int | None = None,
    row_step: int | None = None,
    pad_id: int = 0,
) -> PackedGroups:
    """Pack the groups of a padded rollout batch (host NumPy; module docstring).

    Args:
      batch: the padded batch: `N = B·G` rows, groups of `G` consecutive rows with the same
        prompt (left-padded to `P`), completions right-padded to `T`.
      group_size: `G`.
      parts: the update's micro-batches of whole groups (`minibatches × accumulation_steps`);
        `B` must be a multiple of it.
      orders: `[E, B]`, the groups' order in each epoch of a shuffled update
        (`update_unit_orders`): one packing per epoch, stacked along a leading axis. None:
        the batch's own order, one packing.
      width: slots per completion row `W`, at least the longest completion (None: `T`).
      row_step: each micro-batch's completion-row count is rounded up to a multiple of this,
        at most `N / parts` (None: `⌈N / (8·parts)⌉`, so that a run compiles at most 8 row
        counts per width).
      pad_id: the token id of empty slots.

    Returns:
      A `PackedGroups` with `B` prompt rows and `R = parts · rows_per_part` completion rows
      (the same for every epoch).

    Raises:
      ValueError: `N` not a multiple of `G`, `B` not a multiple of `parts`, an order that
        is not a permutation of the `B` groups, rows of a group with different prompts, a
        completion target on padding, a completion without a prompt token before it, or a
        completion longer than `width`.

    Examples:
      >>> b = SequenceBatch(np.array([[0, 3, 1, 0], [0, 3, 2, 2], [5, 6, 1, 0], [5, 6, 0, 0]]),
      ...                   np.array([[0, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]),
      ...                   np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
      >>> p = pack_groups(b, 2, width=3)  # group 0: 1 | 2 2; group 1: 1 (its second is empty)
      >>> p.prompt_tokens.tolist(), p.tokens.tolist(), p.prompt_row.tolist()
      ([[0, 3], [5, 6]], [[1, 2, 2], [1, 0, 0]], [0, 1])
      >>> p.row.tolist(), p.slots.tolist()
      ([0, 0, 1, 0], [[0, 0], [0, 1], [0, 0], [0, 0]])
      >>> p = pack_groups(b, 2, parts=2, orders=[[0, 1], [1, 0]], width=3)
      >>> p.prompt_tokens[1].tolist()  # epoch 1: group 1 first, so micro-batch 0's prompt
      [[5, 6], [0, 3]]
      >>> p.batch_prompt_row.tolist(), p.prompt_row.tolist()
      ([[0, 1], [0, 1]], [[0, 0], [0, 0]])
    """
    where = "pack_groups"
    G = _positive_int(where, "group_size", group_size)
    parts = _positive_int(where, "parts", parts)
    tokens = np.asarray(batch.tokens)
    N = tokens.shape[0]
    if N % G:
        raise ValueError(f"{where}: {N} rows do not form groups of group_size = {G}.")
    T = np.asarray(batch.completion_mask).shape[1]
    W = T if width is None else _positive_int(where, "width", width)
    _, completions = _real_tokens(batch, G, where)  # (checks each group's prompt)
    lengths = [[len(c) for c in group] for group in completions]
    if max((n for group in lengths for n in group), default=0) > W:
        raise ValueError(
            f"{where}: a completion of {max(max(g) for g in lengths)} tokens does not fit in "
            f"`width` = {W} slots."
        )
    layouts, rows = _row_layouts(lengths, parts, orders, W, where)
    rows_per_part = _rows_per_part(rows, N, parts, row_step, where)
    prompt = _prompt_rows(batch, G)
    packed = [
        _lay_out(order, layout, rows_per_part, prompt, completions, (G, T, W, pad_id))
        for order, layout in zip(layouts, rows, strict=True)
    ]
    if orders is None:
        return packed[0]
    return PackedGroups(*(np.stack(leaves) for leaves in zip(*packed, strict=True)))


def _row_layouts(
    lengths: list[list[int]], parts: int, orders: Any, width: int, where: str
) -> tuple[list[np.ndarray], list[list[list[tuple[int, list[int]]]]]]:
    """The groups' order in each layout (one, or one per epoch of `orders`) and, per layout,
    each micro-batch's completion rows (`_micro_batch_rows`)."""
    B = len(lengths)
    if B % parts:
        raise ValueError(f"{where}: {B} groups do not split into `parts` = {parts} micro-batches.")
    layouts = [np.arange(B)] if orders is None else _checked_orders(orders, B, where)
    return layouts, [_micro_batch_rows(order, lengths, parts, width) for order in layouts]


def _rows_per_part(
    rows: list[list[list[Any]]], N: int, parts: int, row_step: int | None, where: str
) -> int:
    """Each micro-batch's completion rows: the most any layout's micro-batch needs, rounded up
    to a multiple of `row_step` (default `⌈N / (8·parts)⌉`), at most `N / parts`."""
    needed = max(1, max(len(part) for layout in rows for part in layout))
    most = N // parts  # a completion per row always fits
    step = max(1, -(-most // 8)) if row_step is None else _positive_int(where, "row_step", row_step)
    return max(needed, min(-(-needed // step) * step, most))


def completion_row_count(
    lengths: Any,
    *,
    width: int,
    parts: int = 1,
    orders: Any = None,
    row_step: int | None = None,
) -> int:
    """The completion rows `R` that `pack_groups` lays out for completions of these lengths,
    without laying them out (host; what a caller weighs before packing: `B·P + R·W` packed
    slots against the padded `B·P + N·T`).

    Args:
      lengths: `[B, G]` ints, each completion's real tokens (0: empty).
      width, parts, orders, row_step: as for `pack_groups`.

    Examples:
      >>> completion_row_count([[3, 1], [2, 2]], width=4)  # 3 + 1 | 2 + 2
      2
      >>> completion_row_count([[3, 3], [3, 3]], width=4)  # no two share a row
      4
    """
    where = "completion_row_count"
    lengths = np.asarray(lengths)
    if lengths.ndim != 2:
        raise ValueError(f"{where}: `lengths` must be [B, G], got shape {lengths.shape}.")
    parts = _positive_int(where, "parts", parts)
    _, rows = _row_layouts(lengths.tolist(), parts, orders, width, where)
    return parts * _rows_per_part(rows, lengths.size, parts, row_step, where)


def _checked_orders(orders: Any, B: int, where: str) -> list[np.ndarray]:
    orders = np.asarray(orders)
    if orders.ndim != 2 or orders.shape[1] != B:
        raise ValueError(f"{where}: `orders` must be [E, B] = [E, {B}], got {orders.shape}.")
    for e, order in enumerate(orders):
        if not np.array_equal(np.sort(order), np.arange(B)):
            raise ValueError(f"{where}: `orders[{e}]` is not a permutation of the {B} groups.")
    return list(orders)


def _micro_batch_rows(
    order: np.ndarray, lengths: list[list[int]], parts: int, width: int
) -> list[list[tuple[int, list[int]]]]:
    """Per micro-batch `j` (the groups at positions `≡ j (mod parts)` of `order`): its
    completion rows, each `(group, [completions])` (best-fit decreasing within a group)."""
    out = []
    for j in range(parts):
        part = []
        for b in (int(b) for b in order[j::parts]):
            placed = [k for k in range(len(lengths[b])) if lengths[b][k]]
            bins = best_fit_decreasing([lengths[b][k] for k in placed], width) if placed else []
            part.extend((b, [placed[i] for i in row]) for row in bins)
        out.append(part)
    return out


def _prompt_rows(batch: SequenceBatch, G: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each group's left-padded prompt `[B, P]`: tokens, rotary positions, real-token mask."""
    P = prompt_length(batch)
    tokens = np.asarray(batch.tokens)[::G, :P]
    mask = (np.asarray(batch.attention_mask)[::G, :P] > 0).astype(np.int32)
    return tokens, np.asarray(positions_from_mask(mask), np.int32), mask


def _lay_out(
    order: np.ndarray,
    rows: list[list[tuple[int, list[int]]]],
    rows_per_part: int,
    prompt: tuple[np.ndarray, np.ndarray, np.ndarray],
    completions: list[list[np.ndarray]],
    shape: tuple[int, int, int, int],
) -> PackedGroups:
    """One packing: micro-batch `j`'s `b`-th group is prompt row `b·parts + j`, its `c`-th
    completion row is row `c·parts + j` (the update's split)."""
    G, T, W, pad_id = shape
    parts = len(rows)
    B, N, R = len(completions), len(completions) * G, parts * rows_per_part
    order = np.asarray(order)
    prompt_tokens, prompt_positions, prompt_mask = prompt
    # the group at position u of the order is micro-batch (u mod parts)'s (u div parts)-th:
    # prompt row (u div parts)·parts + (u mod parts) = u
    where_prompt = np.argsort(order).astype(np.int32)  # group → its prompt row (whole batch)
    out = {
        "prompt_tokens": prompt_tokens[order],
        "prompt_positions": prompt_positions[order],
        "prompt_mask": prompt_mask[order],
        "tokens": np.full((R, W), pad_id, prompt_tokens.dtype),
        "positions": np.zeros((R, W), np.int32),
        "roles": np.zeros((R, W), np.int32),
        "prompt_row": np.zeros(R, np.int32),
        "batch_prompt_row": np.zeros(R, np.int32),
        "row": np.zeros(N, np.int32),
        "batch_row": np.zeros(N, np.int32),
        "slots": np.zeros((N, T), np.int32),
    }
    for j, part in enumerate(rows):
        for c, (b, members) in enumerate(part):
            r, start, p = c * parts + j, 0, int(prompt_mask[b].sum())
            out["prompt_row"][r] = where_prompt[b] // parts
            out["batch_prompt_row"][r] = where_prompt[b]
            for role, k in enumerate(members, start=1):
                n, seq = b * G + k, completions[b][k]
                end = start + len(seq)
                out["tokens"][r, start:end] = seq
                out["positions"][r, start:end] = p + np.arange(len(seq))
                out["roles"][r, start:end] = role
                out["row"][n], out["batch_row"][n] = c, r
                out["slots"][n, 1 : len(seq)] = start + np.arange(len(seq) - 1)
                start = end
    for b in range(B):  # empty completions: any row of the micro-batch (never read)
        for k in range(G):
            if not len(completions[b][k]):
                out["batch_row"][b * G + k] = where_prompt[b] % parts
    return PackedGroups(**out)


def _real_tokens(
    batch: SequenceBatch, G: int, where: str
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Each group's real prompt tokens and its completions' real tokens, checked: one prompt
    per group, targets on real tokens only, a prompt token before a completion."""
    P = prompt_length(batch)
    tokens, real = np.asarray(batch.tokens), np.asarray(batch.attention_mask) > 0
    targets = np.asarray(batch.completion_mask) > 0
    prompts, completions = [], []
    for b in range(tokens.shape[0] // G):
        first = b * G
        prompt = tokens[first, :P][real[first, :P]]
        group = []
        for n in range(first, first + G):
            if not np.array_equal(tokens[n, :P][real[n, :P]], prompt):
                raise ValueError(
                    f"{where}: rows {first} and {n} of group {b} hold different prompts; a "
                    "packed group runs one prompt for its G rows."
                )
            what = f"row {n}'s completion"
            group.append(
                _checked_completion(tokens[n, P:], real[n, P:], targets[n], prompt, where, what)
            )
        prompts.append(prompt)
        completions.append(group)
    return prompts, completions


def packed_completion_logprobs(
    model: Any,
    batch: Any,
    packed: PackedGroups,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool = False,
    in_micro_batch: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """Token log-probs (and entropies) `[N, T]` of the padded batch's completions from one
    forward of its packed groups, as `logprobs.completion_logprobs` computes them from the
    padded rows (0 outside the completion mask).

    Args:
      model: the policy `Decoder`.
      batch: the padded batch (`tokens[N, P + T]`, `completion_mask[N, T]`): the targets.
      packed: its `PackedGroups`.
      temperature: the sampling temperature τ.
      chunk_size: positions per vocabulary chunk.
      with_entropy: also compute the entropy.
      in_micro_batch: `batch` and `packed` are one of the update step's micro-batches: the
        rows are `row` and `prompt_row` (else `batch_row`, `batch_prompt_row`).

    Examples:
      >>> class Model:  # a Decoder in practice; here h = token
      ...     def prompt_indexed_hidden_states(self, pt, pp, pm, tokens, positions, roles, index):
      ...         return jax.nn.one_hot(pt, 4), jax.nn.one_hot(tokens, 4)
      ...     def logits(self, h):  # favours "next token = this token + 1"
      ...         return 5.0 * jnp.roll(h, 1, axis=-1)
      >>> b = SequenceBatch(jnp.array([[1, 2, 3], [1, 2, 0]]), jnp.array([[1, 1, 1], [1, 1, 0]]),
      ...                   jnp.array([[1.0, 1.0], [1.0, 0.0]]))
      >>> p = pack_groups(b, 2)  # prompt 1; completions 2 3 and 2
      >>> lp, _ = packed_completion_logprobs(Model(), b, p)
      >>> lp.round(2).tolist()
      [[-0.02, -0.02], [-0.02, 0.0]]
    """
    from jaxrl_llm.train.logprobs import chunked_logprobs

    P = prompt_length(batch)
    mask = (batch.completion_mask > 0).astype(jnp.float32)
    return chunked_logprobs(
        model,
        packed_completion_hidden(model, packed, in_micro_batch=in_micro_batch),
        batch.tokens[:, P:],
        mask,
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
    )


def packed_completion_hidden(
    model: Any, packed: PackedGroups, *, in_micro_batch: bool = False
) -> jax.Array:
    """The final-normed states `[N, T, D]` that predict the padded batch's completion tokens
    (`logprobs.completion_hidden` of the padded rows), from one forward of the packed groups
    (`Decoder.prompt_indexed_hidden_states`): what a value head reads.

    Args:
      model: a `Decoder` (a policy, or a `ValueModel`'s backbone).
      packed: the batch's `PackedGroups`, or one micro-batch's.
      in_micro_batch: `packed` is one of the update step's micro-batches: the rows are `row`
        and `prompt_row` (else `batch_row`, `batch_prompt_row`).

    Examples:
      >>> class Model:  # a Decoder in practice; here h = position
      ...     def prompt_indexed_hidden_states(self, pt, pp, pm, tokens, positions, roles, index):
      ...         return pp[..., None].astype(jnp.float32), positions[..., None].astype(jnp.float32)
      >>> b = SequenceBatch(np.array([[1, 2, 3], [1, 2, 0]]), np.array([[1, 1, 1], [1, 1, 0]]),
      ...                   np.array([[1.0, 1.0], [1.0, 0.0]]))
      >>> packed_completion_hidden(Model(), pack_groups(b, 2))[..., 0].tolist()
      [[0.0, 1.0], [0.0, 1.0]]
    """
    rows = jnp.asarray(packed.row if in_micro_batch else packed.batch_row)
    prompt_row = jnp.asarray(packed.prompt_row if in_micro_batch else packed.batch_prompt_row)
    x_p, x_c = model.prompt_indexed_hidden_states(
        jnp.asarray(packed.prompt_tokens),
        jnp.asarray(packed.prompt_positions),
        jnp.asarray(packed.prompt_mask),
        jnp.asarray(packed.tokens),
        jnp.asarray(packed.positions),
        jnp.asarray(packed.roles),
        prompt_row,
    )
    slots = jnp.asarray(packed.slots)
    later = x_c[rows[:, None], slots]  # [N, T, D]: token t ≥ 1 from its predecessor
    first = x_p[prompt_row[rows], -1]  # [N, D]: token 0 from the prompt's last state
    is_first = (jnp.arange(slots.shape[-1]) == 0)[None, :, None]
    return jnp.where(is_first, first[:, None], later)


def check_packed_groups(packed: PackedGroups, N: int, T: int, *, where: str) -> None:
    """Raise a ValueError naming the problem unless `packed` holds `N` rows' `row [N]`,
    `batch_row [N]` and `slots [N, T]` (`pack_groups` of this batch), each with the same
    leading epoch axis if any.

    Examples:
      >>> z = np.zeros(2, int)
      >>> p = PackedGroups(*([np.zeros((1, 4))] * 8), z, z, np.zeros((2, 3), int))
      >>> check_packed_groups(p, 2, 5, where="demo")
      Traceback (most recent call last):
      ...
      ValueError: demo: `packed` must hold the N = 2 rows' row [N], batch_row [N] and slots [N, T] = [2, 5] (pack_groups of this batch; an epoch axis first, if any), got (2,), (2,) and (2, 3).
    """
    lead = packed.row.shape[:-1]
    ok = packed.row.shape == (*lead, N) and len(lead) <= 1
    ok = ok and packed.batch_row.shape == packed.row.shape
    if not ok or packed.slots.shape != (*lead, N, T):
        raise ValueError(
            f"{where}: `packed` must hold the N = {N} rows' row [N], batch_row [N] and slots "
            f"[N, T] = [{N}, {T}] (pack_groups of this batch; an epoch axis first, if any), "
            f"got {packed.row.shape}, {packed.batch_row.shape} and {packed.slots.shape}."
        )


def group_rows_part(x: Any, j: Any, parts: int, group_size: int) -> Any:
    """Part `j` of the `parts` micro-batches of whole groups (`pack_groups(parts=)`'s split,
    `jaxrl_llm.train.update`'s with `unit = group_size`): the rows of the groups `≡ j (mod
    parts)` of `x[N, ...]` (`N = B·G`), in order. `j` is an int (host NumPy) or a traced
    scalar (one program for every part).

    Examples:
      >>> group_rows_part(np.arange(8), 1, 2, 2).tolist()  # groups 0 1 | 2 3 | 4 5 | 6 7
      [2, 3, 6, 7]
    """
    N, rest = x.shape[0], x.shape[1:]
    if N % (parts * group_size):
        raise ValueError(
            f"group_rows_part: {N} rows do not split into {parts} parts of whole groups of "
            f"{group_size} rows."
        )
    groups = N // (parts * group_size)  # per part
    return x.reshape(groups, parts, group_size, *rest)[:, j].reshape(groups * group_size, *rest)


def packing_part(packed: PackedGroups, j: Any, parts: int) -> PackedGroups:
    """Part `j` of a packing laid out for `parts` micro-batches (`pack_groups(parts=)`, one
    epoch) as a packing of its own rows: its prompt and completion rows (`≡ j (mod parts)`)
    and the sequences of its groups (`group_rows_part`), with the whole-batch indices set to
    the part's (`batch_row = row`, `batch_prompt_row = prompt_row`). The padded rows of the
    same groups (`group_rows_part` of the batch) and this part make the `PackedSequences` of
    a forward of the part alone. `j`: an int (host) or a traced scalar.

    Examples:
      >>> b = SequenceBatch(np.array([[3, 1, 0], [3, 2, 2], [5, 1, 0], [5, 0, 0]]),
      ...                   np.array([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]]),
      ...                   np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
      >>> p = packing_part(pack_groups(b, 2, parts=2, width=3), 1, 2)  # group 1 alone
      >>> p.prompt_tokens.tolist(), p.tokens.tolist(), p.batch_row.tolist()
      ([[5]], [[1, 0, 0]], [0, 0])
    """
    if packed.row.ndim != 1:
        raise ValueError(
            "packing_part: one packing (no epoch axis) is split into parts; got `packed.row` "
            f"of shape {packed.row.shape}."
        )
    B, N = packed.prompt_tokens.shape[0], packed.row.shape[0]

    def rows(x: Any) -> Any:  # prompt and completion rows: strided
        return group_rows_part(x, j, parts, 1)

    leaves = {k: rows(v) for k, v in packed._asdict().items() if k not in SEQUENCE_LEAVES}
    seqs = {k: group_rows_part(getattr(packed, k), j, parts, N // B) for k in SEQUENCE_LEAVES}
    seqs["batch_row"] = seqs["row"]
    leaves["batch_prompt_row"] = leaves["prompt_row"]
    return PackedGroups(**leaves, **seqs)


def join_group_parts(outputs: Any, group_size: int) -> Any:
    """The inverse of `group_rows_part` over all parts: the parts' outputs (a sequence of
    pytrees, part `j`'s leaves `[N/parts, ...]` rows of its groups) interleaved back into the
    batch's `[N, ...]` order (as device arrays; None leaves stay None).

    Examples:
      >>> x = np.arange(8)
      >>> join_group_parts([group_rows_part(x, j, 2, 2) for j in range(2)], 2).tolist()
      [0, 1, 2, 3, 4, 5, 6, 7]
    """

    def join(*parts: Any) -> jax.Array:
        n, rest = parts[0].shape[0] // group_size, parts[0].shape[1:]
        stacked = jnp.stack([jnp.reshape(x, (n, group_size, *rest)) for x in parts], axis=1)
        return stacked.reshape(n * len(parts) * group_size, *rest)

    return jax.tree.map(join, *outputs)


def check_packing_parts(packed: PackedGroups, parts: int, *, where: str) -> None:
    """Raise a ValueError naming the problem unless the (host or concrete) packing `packed`
    (one epoch) was laid out for `parts` micro-batches: every sequence's whole-batch row is
    its part's row `row·parts + j` (`j` the part of its group), which a packing made for
    another `parts` does not satisfy.

    Examples:
      >>> b = SequenceBatch(np.array([[3, 1], [3, 2], [5, 1], [5, 2]]), np.ones((4, 2)),
      ...                   np.ones((4, 1)))
      >>> check_packing_parts(pack_groups(b, 2, parts=2), 2, where="demo")
      >>> check_packing_parts(pack_groups(b, 2), 2, where="demo")
      Traceback (most recent call last):
      ...
      ValueError: demo: the packed groups were not laid out for 2 micro-batches (pack_groups(parts=2)): sequence 1's whole-batch row is 1, not row·parts + part = 1·2 + 0.
    """
    row, batch_row = np.asarray(packed.row), np.asarray(packed.batch_row)
    if row.ndim != 1:
        raise ValueError(
            f"{where}: one packing (no epoch axis) is checked against its parts; got "
            f"`packed.row` of shape {row.shape}."
        )
    G = row.shape[0] // np.shape(packed.prompt_tokens)[0]
    part = (np.arange(row.shape[0]) // G) % parts
    wrong = np.flatnonzero(batch_row != row * parts + part)
    if wrong.size:
        n = int(wrong[0])
        raise ValueError(
            f"{where}: the packed groups were not laid out for {parts} micro-batches "
            f"(pack_groups(parts={parts})): sequence {n}'s whole-batch row is "
            f"{int(batch_row[n])}, not row·parts + part = {int(row[n])}·{parts} + "
            f"{int(part[n])}."
        )


def group_packing_fill(packed: PackedGroups) -> float:
    """The share of the packed slots (`B·P` prompt and `R·W` completion slots) that hold a
    token (host; for metrics).

    Examples:
      >>> b = SequenceBatch(np.array([[0, 4, 5, 0], [0, 4, 6, 7]]),
      ...                   np.array([[0, 1, 1, 0], [0, 1, 1, 1]]), np.array([[1, 0], [1, 1]]))
      >>> group_packing_fill(pack_groups(b, 2))  # prompt 1 of 2, completions 3 of 2 rows × 2
      0.6666666666666666
    """
    prompt, roles = np.asarray(packed.prompt_mask), np.asarray(packed.roles)
    return float((np.sum(prompt > 0) + np.sum(roles > 0)) / (prompt.size + roles.size))
