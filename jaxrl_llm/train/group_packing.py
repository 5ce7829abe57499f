"""Padding-free RL batches: each prompt once with its `G` completions, several groups per row.

A rollout batch holds `N = B·G` rows of `P + T` slots: every prompt left-padded to the
longest, every completion right-padded to the longest (or to the budget), and each prompt
repeated for its `G` samples. Packing lays each group out as one run of real tokens,

    [ prompt (p) | completion 1 (c₁) | … | completion G (c_G) ]
      role 0       role 1                 role G
    positions 0..p−1 | p..p+c₁−1 | … | p..p+c_G−1

and puts several groups into rows of `L` slots (best-fit decreasing, as for SFT and preference
pairs: `jaxrl_llm.train.packing`, `jaxrl_llm.train.pair_packing`). Attention
(`Decoder.hidden_states(segment_ids=, segment_roles=)`) stays inside a group, and a completion
reads the prompt and its own earlier tokens only, at the rotary positions of its padded row,
so every completion token sees what it sees in the padded batch. A completion's first token
is predicted by the prompt's last state, a later one by its predecessor; the forward gathers
those states back into the padded `[N, T]` layout (`slots`) and scores the batch's own
targets, so log-probs, entropies and everything the losses read from them equal the padded
forward's up to float rounding (`tests/train/test_group_packing.py`). Only the real tokens are
computed: `Σ_b (p_b + Σ_k c_bk)` instead of `N · (P + T)`.

The packed rows ride along the `RLBatch` (`RLBatch.packed`) into the update, and into the
old-policy, reference and critic forwards (`PackedSequences`, `make_logprob_fn`,
`make_value_fn`); a value head or a `ValueModel` reads the same gathered states
(`packed_completion_hidden`).

Micro-batches: an update of `parts = minibatches × accumulation_steps` micro-batches of whole
groups (`minibatch_unit: prompt`) gives micro-batch `j` the groups at positions `≡ j (mod
parts)` of the epoch's group order, and the packed rows `≡ j (mod parts)`
(`jaxrl_llm.train.update`). The packing follows that split, as packed preference pairs do
(`jaxrl_llm.train.pair_packing`): each micro-batch's groups fill its own rows `b·parts + j`,
every micro-batch gets the same number of rows, and each sequence records its row inside the
micro-batch (`row`, what the update's objective reads) and inside the whole batch
(`batch_row`, what a forward of the whole batch reads). A shuffled update (`minibatches > 1`)
draws a new group order every epoch from its state's key; `update_unit_orders` draws the
same orders on the host, and `pack_groups(orders=)` lays out one packing per epoch (every
leaf then has a leading epoch axis). Sources:
padding-free training (verl's `use_remove_padding`, TRL's `padding_free`); prefix sharing
(Wang et al., arXiv 2410.20305).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.train.batch import SequenceBatch, prompt_length
from jaxrl_llm.train.packing import best_fit_decreasing
from jaxrl_llm.train.pair_packing import _checked_completion, _place, _positive_int


class PackedGroups(NamedTuple):
    """A rollout batch's groups packed several to a row (module docstring).

    Row leaves (`R` packed rows of `L` slots):
      tokens: `[R, L]` int, the groups' real tokens back to back, then `pad_id`.
      positions: `[R, L]` int32 rotary positions (each completion continues its prompt).
      segment_ids: `[R, L]` int32, `k ≥ 1` for the row's `k`-th group, 0 for padding.
      roles: `[R, L]` int32, 0 prompt, `k + 1` the group's `k`-th completion (0 on padding).

    Sequence leaves (`N = B·G` rows of the padded batch, `T` completion slots):
      row: `[N]` int32, the packed row of the sequence's group inside its micro-batch.
      slots: `[N, T]` int32, the slot (in that row) of the state that predicts completion
        token `t` (0 past the completion's real tokens).
      batch_row: `[N]` int32, that row inside the whole batch (`row` with one micro-batch).

    Packed for a shuffled update (`pack_groups(orders=)`), every leaf has a leading axis of
    `E` epochs.

    Examples:
      >>> b = SequenceBatch(np.array([[4, 5, 6, 0], [4, 5, 7, 8]]), np.array([[1, 1, 1, 0],
      ...                   [1, 1, 1, 1]]), np.array([[1.0, 0.0], [1.0, 1.0]]))
      >>> p = pack_groups(b, 2)  # one row: prompt 4 5, completions 6 and 7 8
      >>> p.tokens.tolist(), p.positions.tolist(), p.slots.tolist()
      ([[4, 5, 6, 7, 8, 0]], [[0, 1, 2, 2, 3, 0]], [[1, 0], [1, 3]])
    """

    tokens: Any
    positions: Any
    segment_ids: Any
    roles: Any
    row: Any
    slots: Any
    batch_row: Any


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
    length: int | None = None,
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
      length: slots per packed row `L` (None: `P + G·T`, a padded group, which always fits).
      row_step: each micro-batch's row count is rounded up to a multiple of this, at most
        `B / parts` (None: `⌈B / (8·parts)⌉`, so that a run compiles at most 8 row counts
        per width).
      pad_id: the token id of empty slots.

    Returns:
      A `PackedGroups` with `R = parts · rows_per_part` rows (the same for every epoch).

    Raises:
      ValueError: `N` not a multiple of `G`, `B` not a multiple of `parts`, an order that
        is not a permutation of the `B` groups, rows of a group with different prompts, a
        completion target on padding, a completion without a prompt token before it, or a
        group longer than `length`.

    Examples:
      >>> b = SequenceBatch(np.array([[0, 3, 1, 0], [0, 3, 2, 2], [5, 6, 1, 0], [5, 6, 0, 0]]),
      ...                   np.array([[0, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]),
      ...                   np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
      >>> p = pack_groups(b, 2, length=8)  # both groups in one row
      >>> p.tokens.tolist(), p.roles.tolist()
      ([[3, 1, 2, 2, 5, 6, 1, 0]], [[0, 1, 2, 2, 0, 0, 1, 0]])
      >>> p.segment_ids.tolist(), p.slots.tolist()
      ([[1, 1, 1, 1, 2, 2, 2, 0]], [[0, 0], [0, 2], [5, 0], [0, 0]])
      >>> p = pack_groups(b, 2, parts=2, orders=[[0, 1], [1, 0]], length=8)
      >>> p.tokens[:, :, :4].tolist()  # epoch 1: group 1 first, so in micro-batch 0's row
      [[[3, 1, 2, 2], [5, 6, 1, 0]], [[5, 6, 1, 0], [3, 1, 2, 2]]]
      >>> p.row.tolist(), p.batch_row.tolist()
      ([[0, 0, 0, 0], [0, 0, 0, 0]], [[0, 0, 1, 1], [1, 1, 0, 0]])
    """
    where = "pack_groups"
    G = _positive_int(where, "group_size", group_size)
    parts = _positive_int(where, "parts", parts)
    tokens = np.asarray(batch.tokens)
    N = tokens.shape[0]
    if N % G:
        raise ValueError(f"{where}: {N} rows do not form groups of group_size = {G}.")
    B = N // G
    if B % parts:
        raise ValueError(f"{where}: {B} groups do not split into `parts` = {parts} micro-batches.")
    P = prompt_length(batch)
    T = np.asarray(batch.completion_mask).shape[1]
    length = P + G * T if length is None else _positive_int(where, "length", length)
    prompts, completions = _real_tokens(batch, G, where)
    sizes = [len(prompts[b]) + sum(len(c) for c in completions[b]) for b in range(B)]
    layouts = [np.arange(B)] if orders is None else _checked_orders(orders, B, where)
    bins = [_micro_batch_bins(order, sizes, parts, length, where) for order in layouts]
    needed = max(len(part) for layout in bins for part in layout)
    most = B // parts  # a group per row always fits
    step = max(1, -(-most // 8)) if row_step is None else _positive_int(where, "row_step", row_step)
    rows_per_part = max(needed, min(-(-needed // step) * step, most))
    packed = [
        _lay_out(layout, rows_per_part, prompts, completions, (G, T, length, tokens.dtype, pad_id))
        for layout in bins
    ]
    if orders is None:
        return packed[0]
    return PackedGroups(*(np.stack(leaves) for leaves in zip(*packed, strict=True)))


def _checked_orders(orders: Any, B: int, where: str) -> list[np.ndarray]:
    orders = np.asarray(orders)
    if orders.ndim != 2 or orders.shape[1] != B:
        raise ValueError(f"{where}: `orders` must be [E, B] = [E, {B}], got {orders.shape}.")
    for e, order in enumerate(orders):
        if not np.array_equal(np.sort(order), np.arange(B)):
            raise ValueError(f"{where}: `orders[{e}]` is not a permutation of the {B} groups.")
    return list(orders)


def _micro_batch_bins(
    order: np.ndarray, sizes: list[int], parts: int, length: int, where: str
) -> list[list[list[int]]]:
    """Per micro-batch `j` (the groups at positions `≡ j (mod parts)` of `order`): the groups
    of each of its rows (best-fit decreasing)."""
    out = []
    for j in range(parts):
        members = [int(b) for b in order[j::parts]]
        try:
            part_bins = best_fit_decreasing([sizes[b] for b in members], length)
        except ValueError as err:
            raise ValueError(f"{where}: `length` {length}: {err}") from None
        out.append([[members[i] for i in row] for row in part_bins])
    return out


def _lay_out(
    bins: list[list[list[int]]],
    rows_per_part: int,
    prompts: list[np.ndarray],
    completions: list[list[np.ndarray]],
    shape: tuple[int, int, int, Any, int],
) -> PackedGroups:
    """One packing: micro-batch `j`'s `b`-th row is row `b·parts + j` (the update's split)."""
    G, T, length, dtype, pad_id = shape
    parts, N = len(bins), len(prompts) * G
    R = parts * rows_per_part
    out = {
        "tokens": np.full((R, length), pad_id, dtype),
        **{k: np.zeros((R, length), np.int32) for k in ("positions", "segment_ids", "roles")},
    }
    row, batch_row = np.zeros(N, np.int32), np.zeros(N, np.int32)
    slots = np.zeros((N, T), np.int32)
    ends = np.zeros(G, np.int32)  # (a reward model's read-out; unused here)
    for j, part_bins in enumerate(bins):
        for b, members in enumerate(part_bins):
            r, start = b * parts + j, 0
            for segment, group in enumerate(members, start=1):
                rows = slice(group * G, (group + 1) * G)
                row[rows], batch_row[rows] = b, r
                start = _place(
                    out, r, start, segment, prompts[group], completions[group], slots[rows], ends
                )
    return PackedGroups(row=row, slots=slots, batch_row=batch_row, **out)


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
        sequences' rows are `row` (else `batch_row`, rows of the whole batch).

    Examples:
      >>> class Model:  # a Decoder in practice; here h = token
      ...     def hidden_states(self, tokens, positions, segment_ids, segment_roles):
      ...         return jax.nn.one_hot(tokens, 4)
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
    (`logprobs.completion_hidden` of the padded rows), from one forward of the packed rows:
    what a value head reads.

    Args:
      model: a `Decoder` (a policy, or a `ValueModel`'s backbone).
      packed: the batch's `PackedGroups`, or one micro-batch's.
      in_micro_batch: `packed` is one of the update step's micro-batches: the sequences' rows
        are `row` (else `batch_row`).

    Examples:
      >>> class Model:  # a Decoder in practice; here h = position
      ...     def hidden_states(self, tokens, positions, segment_ids, segment_roles):
      ...         return positions[..., None].astype(jnp.float32)
      >>> b = SequenceBatch(np.array([[1, 2, 3], [1, 2, 0]]), np.array([[1, 1, 1], [1, 1, 0]]),
      ...                   np.array([[1.0, 1.0], [1.0, 0.0]]))
      >>> packed_completion_hidden(Model(), pack_groups(b, 2))[..., 0].tolist()
      [[0.0, 1.0], [0.0, 0.0]]
    """
    hidden = model.hidden_states(
        jnp.asarray(packed.tokens),
        jnp.asarray(packed.positions),
        segment_ids=jnp.asarray(packed.segment_ids),
        segment_roles=jnp.asarray(packed.roles),
    )
    rows = packed.row if in_micro_batch else packed.batch_row
    return hidden[jnp.asarray(rows)[:, None], jnp.asarray(packed.slots)]


def check_packed_groups(packed: PackedGroups, N: int, T: int, *, where: str) -> None:
    """Raise a ValueError naming the problem unless `packed` holds `N` rows' `row [N]`,
    `batch_row [N]` and `slots [N, T]` (`pack_groups` of this batch), each with the same
    leading epoch axis if any.

    Examples:
      >>> z = np.zeros(2, int)
      >>> p = PackedGroups(*([np.zeros((1, 4))] * 4), z, np.zeros((2, 3), int), z)
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
