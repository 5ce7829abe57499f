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

The packed rows ride along the `RLBatch` (`RLBatch.packed`) into an update that makes one
optimizer update per batch (the row leaves are not split into micro-batches), and into the
old-policy, reference and critic forwards (`PackedSequences`, `make_logprob_fn`,
`make_value_fn`); a value head or a `ValueModel` reads the same gathered states
(`packed_completion_hidden`). Sources:
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
      row: `[N]` int32, the packed row of the sequence's group.
      slots: `[N, T]` int32, the slot (in that row) of the state that predicts completion
        token `t` (0 past the completion's real tokens).

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
    length: int | None = None,
    row_step: int | None = None,
    pad_id: int = 0,
) -> PackedGroups:
    """Pack the groups of a padded rollout batch (host NumPy; module docstring).

    Args:
      batch: the padded batch: `N = B·G` rows, groups of `G` consecutive rows with the same
        prompt (left-padded to `P`), completions right-padded to `T`.
      group_size: `G`.
      length: slots per packed row `L` (None: `P + G·T`, a padded group, which always fits).
      row_step: the row count is rounded up to a multiple of this, at most `B` (None:
        `⌈B / 8⌉`, so that a run compiles at most 8 row counts per width).
      pad_id: the token id of empty slots.

    Returns:
      A `PackedGroups`.

    Raises:
      ValueError: `N` not a multiple of `G`, rows of a group with different prompts, a
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
    """
    where = "pack_groups"
    G = _positive_int(where, "group_size", group_size)
    tokens = np.asarray(batch.tokens)
    N = tokens.shape[0]
    if N % G:
        raise ValueError(f"{where}: {N} rows do not form groups of group_size = {G}.")
    B = N // G
    P = prompt_length(batch)
    T = np.asarray(batch.completion_mask).shape[1]
    length = P + G * T if length is None else _positive_int(where, "length", length)
    prompts, completions = _real_tokens(batch, G, where)
    sizes = [len(prompts[b]) + sum(len(c) for c in completions[b]) for b in range(B)]
    try:
        bins = best_fit_decreasing(sizes, length)
    except ValueError as err:
        raise ValueError(f"{where}: `length` {length}: {err}") from None
    step = max(1, -(-B // 8)) if row_step is None else _positive_int(where, "row_step", row_step)
    R = max(len(bins), min(-(-len(bins) // step) * step, B))
    out = {
        "tokens": np.full((R, length), pad_id, tokens.dtype),
        **{k: np.zeros((R, length), np.int32) for k in ("positions", "segment_ids", "roles")},
    }
    row = np.zeros(N, np.int32)
    slots = np.zeros((N, T), np.int32)
    ends = np.zeros(G, np.int32)  # (a reward model's read-out; unused here)
    for r, members in enumerate(bins):
        start = 0
        for segment, b in enumerate(members, start=1):
            rows = slice(b * G, (b + 1) * G)
            row[rows] = r
            start = _place(out, r, start, segment, prompts[b], completions[b], slots[rows], ends)
    return PackedGroups(row=row, slots=slots, **out)


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
        packed_completion_hidden(model, packed),
        batch.tokens[:, P:],
        mask,
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
    )


def packed_completion_hidden(model: Any, packed: PackedGroups) -> jax.Array:
    """The final-normed states `[N, T, D]` that predict the padded batch's completion tokens
    (`logprobs.completion_hidden` of the padded rows), from one forward of the packed rows:
    what a value head reads.

    Args:
      model: a `Decoder` (a policy, or a `ValueModel`'s backbone).
      packed: the batch's `PackedGroups`.

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
    return hidden[jnp.asarray(packed.row)[:, None], jnp.asarray(packed.slots)]


def check_packed_groups(packed: PackedGroups, N: int, T: int, *, where: str) -> None:
    """Raise a ValueError naming the problem unless `packed` holds `N` rows' `row [N]` and
    `slots [N, T]` (`pack_groups` of this batch).

    Examples:
      >>> p = PackedGroups(*([np.zeros((1, 4))] * 4), np.zeros(2, int), np.zeros((2, 3), int))
      >>> check_packed_groups(p, 2, 5, where="demo")
      Traceback (most recent call last):
      ...
      ValueError: demo: `packed` must hold the N = 2 rows' row [N] and slots [N, T] = [2, 5] (pack_groups of this batch), got (2,) and (2, 3).
    """
    if packed.row.shape != (N,) or packed.slots.shape != (N, T):
        raise ValueError(
            f"{where}: `packed` must hold the N = {N} rows' row [N] and slots [N, T] = "
            f"[{N}, {T}] (pack_groups of this batch), got {packed.row.shape} and "
            f"{packed.slots.shape}."
        )
