"""Padding-free preference pairs: several pairs per row, each pair's prompt once.

A padded preference batch spends `2 · N · (P + T)` token slots per forward (`N · (P + 2T)` with
`shared_prompt`), whatever the pairs' real lengths: every prompt is left-padded to the batch's
longest and every completion right-padded to its longest. Packing lays each pair out as one
run of real tokens,

    [ prompt (p) | chosen (c) | rejected (r) ]       positions 0..p−1 | p..p+c−1 | p..p+r−1
      role 0       role 1       role 2

and puts several such runs into rows of `L` slots (best-fit decreasing, as for SFT packing,
`jaxrl_llm.train.packing`). Attention (`Decoder.hidden_states(segment_ids=, segment_roles=)`)
stays inside a pair, and the rejected tokens read the prompt but not the chosen tokens, so
every completion token sees what it sees in its padded row: the prompt, then its own earlier
tokens, at the same rotary positions. The chosen and rejected completions' first tokens are
both predicted by the prompt's last state; a later token by its predecessor in the same
completion. The forward then gathers those predicting states into `[N, 2, T]` and scores the
padded batch's own targets, so the log-probs (and everything the losses read from them) equal
the padded forward's up to float rounding (`tests/train/test_pair_packing.py`). Only the real
tokens are computed: `Σ (p + c + r)` instead of `N · (P + 2T)` (plus the rows' tail).

Micro-batches: the update step gives micro-batch `j` of `parts = minibatches ×
accumulation_steps` the rows `≡ j (mod parts)` of every leaf (`jaxrl_llm.train.update`). The
packing follows that split: pair `n` goes into a row of its micro-batch `n mod parts`, every
micro-batch gets the same number of rows, and each pair records both its row inside the
micro-batch (`row`, what the update step's objective reads) and inside the whole batch
(`batch_row`, what a forward of the whole batch reads: the reference, an evaluation). The rows
must therefore not be permuted between packing and the update: packing is refused with
`minibatches > 1` and shuffling (`PreferenceConfig`).

Sources: prefix sharing for preference tuning (Wang et al., "Accelerating Direct Preference
Optimization with Prefix Sharing", arXiv 2410.20305); padding-free training (TRL's
`padding_free`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.train.batch import prompt_length
from jaxrl_llm.train.packing import best_fit_decreasing

PROMPT, CHOSEN, REJECTED = 0, 1, 2


class PackedPairs(NamedTuple):
    """A preference batch's pairs packed several to a row (module docstring).

    Row leaves (`R` packed rows of `L` slots):
      tokens: `[R, L]` int, the pairs' real tokens back to back, then `pad_id`.
      positions: `[R, L]` int32 rotary positions (each completion continues its prompt).
      segment_ids: `[R, L]` int32, `k ≥ 1` for the row's `k`-th pair, 0 for padding.
      roles: `[R, L]` int32, 0 prompt, 1 chosen, 2 rejected (0 on padding).

    Pair leaves (`N` pairs, `T` the padded batch's completion length):
      row: `[N]` int32, the pair's row inside its micro-batch.
      batch_row: `[N]` int32, the pair's row inside the whole batch.
      slots: `[N, 2, T]` int32, the slot (in the pair's row) of the state that predicts
        completion token `t` of the chosen (`[:, 0]`) and rejected (`[:, 1]`) response (0
        past the response's end).
      ends: `[N, 2]` int32, the slot of the chosen and the rejected sequence's last real token
        (the prompt's last for an empty response; where a reward model reads its score).
      targets: `[N, 2, T]` the completion tokens of the padded batch.
      target_mask: `[N, 2, T]` float32, the padded batch's completion masks.

    Examples:
      >>> from jaxrl_llm.train.batch import SequenceBatch
      >>> c = SequenceBatch(np.array([[4, 5, 6]]), np.ones((1, 3)), np.ones((1, 1)))
      >>> r = SequenceBatch(np.array([[4, 5, 7]]), np.ones((1, 3)), np.ones((1, 1)))
      >>> p = pack_pairs(c, r)  # one row: prompt 4 5, chosen 6, rejected 7
      >>> p.tokens.tolist(), p.positions.tolist(), p.ends.tolist()
      ([[4, 5, 6, 7]], [[0, 1, 2, 2]], [[2, 3]])
    """

    tokens: Any
    positions: Any
    segment_ids: Any
    roles: Any
    row: Any
    batch_row: Any
    slots: Any
    ends: Any
    targets: Any
    target_mask: Any


def pack_pairs(
    chosen: Any,
    rejected: Any,
    *,
    parts: int = 1,
    length: int | None = None,
    rows_per_part: int | None = None,
    pad_id: int = 0,
) -> PackedPairs:
    """Pack the pairs of a padded preference batch (host NumPy; module docstring).

    Args:
      chosen, rejected: the padded `SequenceBatch`es of `make_preference_batch` (each row's
        prompt left-padded to `P`, completion right-padded to `T`; the same prompt in both).
      parts: the update's micro-batches (`minibatches × accumulation_steps`); `N` must be a
        multiple of it.
      length: slots per packed row `L` (None: `P_c + T_c + T_r`, the padded pair, which
        always fits).
      rows_per_part: packed rows per micro-batch (None: the fewest that hold every
        micro-batch's pairs, rounded up to a multiple of `⌊N / (8·parts)⌋` and at most
        `N / parts`, so that a run compiles at most 8 row counts per bucket).
      pad_id: the token id of empty slots.

    Returns:
      A `PackedPairs` with `R = parts · rows_per_part` rows.

    Raises:
      ValueError: prompts that differ between a pair's rows, a completion target on padding,
        a response with tokens but no prompt token before it, a pair longer than `length`,
        `N` not a multiple of `parts`, or more rows needed than `rows_per_part`.

    Examples:
      >>> from jaxrl_llm.train.batch import SequenceBatch
      >>> c = SequenceBatch(np.array([[0, 7, 1, 2], [8, 9, 3, 0]]),
      ...                   np.array([[0, 1, 1, 1], [1, 1, 1, 0]]), np.array([[1, 1], [1, 0]]))
      >>> r = SequenceBatch(np.array([[0, 7, 4, 0], [8, 9, 5, 6]]),
      ...                   np.array([[0, 1, 1, 0], [1, 1, 1, 1]]), np.array([[1, 0], [1, 1]]))
      >>> p = pack_pairs(c, r, length=10)
      >>> p.tokens.tolist(), p.roles.tolist()  # both pairs in one row
      ([[7, 1, 2, 4, 8, 9, 3, 5, 6, 0]], [[0, 1, 1, 2, 0, 0, 1, 2, 2, 0]])
      >>> p.positions.tolist()[0], p.slots[1].tolist()  # pair 1: its chosen 3, rejected 5, 6
      ([0, 1, 2, 1, 0, 1, 2, 2, 3, 0], [[5, 0], [5, 7]])
    """
    where = "pack_pairs"
    parts = _positive_int(where, "parts", parts)
    N = np.asarray(chosen.tokens).shape[0]
    if np.asarray(rejected.tokens).shape[0] != N:
        raise ValueError(
            f"{where}: {N} chosen rows but {np.asarray(rejected.tokens).shape[0]} rejected rows."
        )
    if N % parts:
        raise ValueError(f"{where}: {N} pairs do not split into `parts` = {parts} micro-batches.")
    T_c, T_r = (
        np.asarray(chosen.completion_mask).shape[1],
        np.asarray(rejected.completion_mask).shape[1],
    )
    T = max(T_c, T_r)
    length = (
        prompt_length(chosen) + T_c + T_r
        if length is None
        else _positive_int(where, "length", length)
    )
    prompts, responses = _real_tokens(chosen, rejected, where)
    lengths = [len(prompts[n]) + len(responses[n][0]) + len(responses[n][1]) for n in range(N)]
    bins = []  # per micro-batch j (pairs ≡ j mod parts): the pairs of each of its rows
    for j in range(parts):
        members = list(range(j, N, parts))
        try:
            part_bins = best_fit_decreasing([lengths[n] for n in members], length)
        except ValueError as err:
            raise ValueError(f"{where}: `length` {length}: {err}") from None
        bins.append([[members[i] for i in b] for b in part_bins])
    needed = max(len(b) for b in bins)
    if rows_per_part is None:
        most = N // parts  # a pair per row always fits
        step = max(1, most // 8)  # at most 8 row counts per bucket: few compilations
        rows_per_part = min(-(-needed // step) * step, most)
    rows_per_part = _positive_int(where, "rows_per_part", rows_per_part)
    if needed > rows_per_part:
        raise ValueError(
            f"{where}: the pairs need {needed} rows of {length} slots per micro-batch, more "
            f"than rows_per_part = {rows_per_part}."
        )
    R = parts * rows_per_part
    out = {
        "tokens": np.full((R, length), pad_id, np.asarray(chosen.tokens).dtype),
        **{k: np.zeros((R, length), np.int32) for k in ("positions", "segment_ids", "roles")},
    }
    row, batch_row = np.zeros(N, np.int32), np.zeros(N, np.int32)
    slots, ends = np.zeros((N, 2, T), np.int32), np.zeros((N, 2), np.int32)
    for j, part_bins in enumerate(bins):
        for b, members in enumerate(part_bins):
            r, start = b * parts + j, 0  # micro-batch j's b-th row (the update's split)
            for segment, n in enumerate(members, start=1):
                row[n], batch_row[n] = b, r
                start = _place(out, r, start, segment, prompts[n], responses[n], slots[n], ends[n])
    targets = np.zeros((N, 2, T), out["tokens"].dtype)
    target_mask = np.zeros((N, 2, T), np.float32)
    for side, seqs in enumerate((chosen, rejected)):
        width = np.asarray(seqs.completion_mask).shape[1]
        targets[:, side, :width] = np.asarray(seqs.tokens)[:, prompt_length(seqs) :]
        target_mask[:, side, :width] = np.asarray(seqs.completion_mask)
    return PackedPairs(
        row=row,
        batch_row=batch_row,
        slots=slots,
        ends=ends,
        targets=targets,
        target_mask=target_mask,
        **out,
    )


def _real_tokens(
    chosen: Any, rejected: Any, where: str
) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Each pair's real prompt tokens and its chosen and rejected completions' real tokens,
    checked: one prompt per pair, targets on real tokens only, a prompt before a response."""
    sides = []
    for seqs in (chosen, rejected):
        P = prompt_length(seqs)
        tokens, real = np.asarray(seqs.tokens), np.asarray(seqs.attention_mask) > 0
        sides.append((tokens[:, :P], real[:, :P], tokens[:, P:], real[:, P:], seqs))
    prompts, responses = [], []
    for n in range(sides[0][0].shape[0]):
        prompt = sides[0][0][n][sides[0][1][n]]
        if not np.array_equal(prompt, sides[1][0][n][sides[1][1][n]]):
            raise ValueError(
                f"{where}: pair {n}'s chosen and rejected rows hold different prompts; a "
                "packed pair runs one prompt (build the pairs with make_preference_batch)."
            )
        pair = []
        for name, (_, _, completion, real, seqs) in zip(("chosen", "rejected"), sides, strict=True):
            targets = np.asarray(seqs.completion_mask)[n] > 0
            what = f"pair {n}'s {name} completion"
            pair.append(_checked_completion(completion[n], real[n], targets, prompt, where, what))
        prompts.append(prompt)
        responses.append(pair)
    return prompts, responses


def _checked_completion(
    tokens: np.ndarray,
    real: np.ndarray,
    targets: np.ndarray,
    prompt: np.ndarray,
    where: str,
    what: str,
) -> np.ndarray:
    """The real tokens of one padded completion row (`tokens[real]`), checked: its targets lie
    on real tokens, and a prompt token comes before it."""
    completion = tokens[real]
    if np.any(targets & ~real) or np.any(targets[len(completion) :]):
        raise ValueError(
            f"{where}: {what} has a target on a padding slot (completion_mask 1 where "
            "attention_mask is 0, or after the completion's real tokens)."
        )
    if len(completion) and not len(prompt):
        raise ValueError(
            f"{where}: {what} has tokens but no prompt token before it, so no state predicts "
            "its first token."
        )
    return completion


def _place(
    out: dict[str, np.ndarray],
    r: int,
    start: int,
    segment: int,
    prompt: np.ndarray,
    responses: list[np.ndarray],
    slots: np.ndarray,
    ends: np.ndarray,
) -> int:
    """Write one prompt and its `K` responses (a pair: chosen, rejected) at slot `start` of row
    `r`, the `k`-th response with role `k + 1`; fill their `slots[K, T]` and `ends[K]`; the
    next free slot."""
    p = len(prompt)
    pieces = [(prompt, PROMPT, 0)] + [
        (tokens, role, p) for role, tokens in enumerate(responses, start=CHOSEN)
    ]
    at = start
    for tokens, role, first_position in pieces:
        end = at + len(tokens)
        out["tokens"][r, at:end] = tokens
        out["positions"][r, at:end] = first_position + np.arange(len(tokens))
        out["segment_ids"][r, at:end] = segment
        out["roles"][r, at:end] = role
        if role != PROMPT:
            # token 0 is predicted by the prompt's last state, token t > 0 by token t − 1
            slots[role - 1, : len(tokens)] = np.concatenate(
                [[start + p - 1], at + np.arange(len(tokens) - 1)]
            )[: len(tokens)]
            ends[role - 1] = max(end - 1 if len(tokens) else start + p - 1, 0)
        at = end
    return at


def _positive_int(where: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{where}: `{name}` must be a positive int, got {value!r}.")
    return int(value)


def _packed_hidden(
    decoder: Any, packed: PackedPairs, in_micro_batch: bool
) -> tuple[jax.Array, jax.Array]:
    """The packed rows' hidden states `[R, L, D]` and each pair's row `[N]` in them."""
    hidden = decoder.hidden_states(
        jnp.asarray(packed.tokens),
        jnp.asarray(packed.positions),
        segment_ids=jnp.asarray(packed.segment_ids),
        segment_roles=jnp.asarray(packed.roles),
    )
    return hidden, jnp.asarray(packed.row if in_micro_batch else packed.batch_row)


def packed_pair_logprobs(
    model: Any,
    packed: PackedPairs,
    *,
    in_micro_batch: bool = False,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> jax.Array:
    """Token log-probs `[N, 2, T]` of the chosen (`[:, 0]`) and rejected (`[:, 1]`) completions
    from one forward of the packed rows (0 outside `target_mask`).

    Args:
      model: the policy `Decoder`.
      packed: the `PackedPairs` of the whole batch, or of one micro-batch of the update step.
      in_micro_batch: `packed` is one of the update step's micro-batches: the pairs' rows are
        `row` (else `batch_row`).
      temperature: the sampling temperature τ.
      chunk_size: positions per vocabulary chunk.

    Examples:
      >>> class Model:  # a Decoder in practice; here h = (position, token)
      ...     def hidden_states(self, tokens, positions, segment_ids, segment_roles):
      ...         return jnp.stack([positions, tokens], -1).astype(jnp.float32)
      ...     def logits(self, h):  # favours "next token = this token + 1"
      ...         return 5.0 * jax.nn.one_hot(h[..., 1].astype(int) + 1, 4)
      >>> t = jnp.array([[1, 2, 3, 2, 0]])  # prompt 1; chosen 2, 3; rejected 2
      >>> p = PackedPairs(t, jnp.array([[0, 1, 2, 1, 0]]), jnp.array([[1, 1, 1, 1, 0]]),
      ...     jnp.array([[0, 1, 1, 2, 0]]), jnp.zeros(1, int), jnp.zeros(1, int),
      ...     jnp.array([[[0, 1], [0, 0]]]), jnp.array([[2, 3]]), jnp.array([[[2, 3], [2, 0]]]),
      ...     jnp.array([[[1.0, 1.0], [1.0, 0.0]]]))
      >>> (packed_pair_logprobs(Model(), p) * 100).round().tolist()  # log(e⁵ / (e⁵ + 3))
      [[[-2.0, -2.0], [-2.0, 0.0]]]
    """
    from jaxrl_llm.train.logprobs import chunked_logprobs

    hidden, rows = _packed_hidden(model, packed, in_micro_batch)
    slots = jnp.asarray(packed.slots)
    N, _, T = slots.shape
    states = hidden[rows[:, None, None], slots]  # [N, 2, T, D]
    logp, _ = chunked_logprobs(
        model,
        states.reshape(2 * N, T, -1),
        jnp.asarray(packed.targets).reshape(2 * N, T),
        (jnp.asarray(packed.target_mask) > 0).astype(jnp.float32).reshape(2 * N, T),
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=False,
    )
    return logp.reshape(N, 2, T)


def packed_pair_scores(
    model: Any, packed: PackedPairs, *, in_micro_batch: bool = False
) -> jax.Array:
    """A reward model's `[N, 2]` float32 scores of the chosen (`[:, 0]`) and rejected
    (`[:, 1]`) sequences from one forward of the packed rows: its value at each sequence's last
    real token (`ends`), as `reward_model.sequence_scores` reads a padded row.

    Args:
      model: a `ValueModel` (a backbone and a scalar head).
      packed: the `PackedPairs` of the whole batch, or of one micro-batch of the update step.
      in_micro_batch: `packed` is one of the update step's micro-batches: rows `row` (else
        `batch_row`).

    Examples:
      >>> class Backbone:  # a Decoder in practice; here h = token
      ...     def hidden_states(self, tokens, positions, segment_ids, segment_roles):
      ...         return tokens[..., None].astype(jnp.float32)
      >>> class RM:
      ...     backbone, head = Backbone(), staticmethod(lambda h: 10.0 * h[..., 0])
      >>> row = jnp.array([[1, 2, 3, 4]])  # tokens (positions, segments, roles unused here)
      >>> p = PackedPairs(row, row, row, row, jnp.zeros(1, int), jnp.zeros(1, int), None,
      ...                 jnp.array([[2, 3]]), None, None)
      >>> packed_pair_scores(RM(), p).tolist()  # the values at slots 2 and 3
      [[30.0, 40.0]]
    """
    hidden, rows = _packed_hidden(model.backbone, packed, in_micro_batch)
    states = hidden[rows[:, None], jnp.asarray(packed.ends)]  # [N, 2, D]
    return model.head(states).astype(jnp.float32)


def packing_fill(packed: PackedPairs) -> float:
    """The share of the packed rows' slots that hold a token (host; for metrics).

    Examples:
      >>> p = PackedPairs(*([np.array([[1, 1, 0, 0]])] * 4), *([None] * 6))
      >>> packing_fill(p)
      0.5
    """
    segments = np.asarray(packed.segment_ids)
    return float(np.mean(segments > 0))
