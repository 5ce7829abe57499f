"""The update batches and their loss normalisers.

Layout (ALGORITHMS.md §0.3): each row is a prompt left-padded to the common length `P`, followed
by its completion right-padded to `T`, so `S = P + T` and completion token `t` sits at absolute
position `P + t`. Its log-prob comes from the hidden state at `P + t − 1`.

    tokens[N,S]            int      prompt (left-padded) + completion (right-padded)
    attention_mask[N,S]    {0,1}    1 = real token (positions are derived from it)
    completion_mask[N,T]   {0,1}    1 = completion token that enters the loss

`RLBatch` adds the per-token arrays the policy losses need; `SequenceBatch` alone is the SFT batch.
Optional fields are `None` (an empty pytree node), never zero-filled placeholders.

Packed rows (SFT with `packing`, `jaxrl_llm.train.packing`) hold several sequences each, in the
same layout with `P = 1`: `T = S − 1`, so every position after the first can be a target, and

    segment_ids[N,S]       int      0 = padding, k ≥ 1 = the row's k-th sequence (one contiguous
                                    run; positions restart at 0 in each, and attention stays
                                    inside it)

with `completion_mask[n, t]` = 1 where `tokens[n, t + 1]` is a completion token (never the first
token of a sequence, so a target and the state that predicts it share their segment).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

import losses


class SequenceBatch(NamedTuple):
    """Token sequences with a completion mask (the SFT batch; the inputs of every forward).

    `segment_ids` is None except in packed rows (module docstring).

    Examples:
      >>> import jax.numpy as jnp
      >>> b = SequenceBatch(tokens=jnp.zeros((2, 5), jnp.int32), attention_mask=jnp.ones((2, 5)),
      ...                   completion_mask=jnp.ones((2, 3)))
      >>> prompt_length(b), b.segment_ids
      (2, None)
    """

    tokens: jax.Array  # [N,S] int
    attention_mask: jax.Array  # [N,S] {0,1}
    completion_mask: jax.Array  # [N,T] {0,1}
    segment_ids: jax.Array | None = None  # [N,S] int, packed rows only


class RLBatch(NamedTuple):
    """One rollout batch prepared for the policy update (all per-token arrays `[N,T]` float32).

    Attributes:
      tokens, attention_mask, completion_mask: see the module docstring.
      advantages: `[N,T]` advantages (from `compute_advantages`).
      old_logp: `[N,T]` log-probs of the policy before the update (a separate forward, fixed for
        all epochs). None is allowed only when the step makes one optimizer update
        (epochs = minibatches = 1): the loss then uses `stop_gradient(logp)` (ratio ≡ 1).
      ref_logp: `[N,T]` reference log-probs (KL as a loss), or None.
      old_values: `[N,T]` critic values before the update (value clipping), or None.
      returns: `[N,T]` value targets (from GAE), or None.
      rollout_logp: `[N,T]` behaviour log-probs of the sampler (rollout correction), or None.
      packed: the batch's groups packed (`jaxrl_llm.train.pack_groups`: each prompt once,
        its completions in shared rows), or None; the policy's forward then runs the packed
        rows. Its row leaves do not have `N` rows: an update split into micro-batches needs
        a packing made for its split (`pack_groups(parts=, orders=)`).

    Examples:
      >>> import jax.numpy as jnp
      >>> z = jnp.zeros((2, 3))
      >>> b = RLBatch(tokens=jnp.zeros((2, 5), jnp.int32), attention_mask=jnp.ones((2, 5)),
      ...             completion_mask=z, advantages=z, old_logp=z)
      >>> b.ref_logp is None, len(jax.tree.leaves(b))
      (True, 5)
    """

    tokens: jax.Array
    attention_mask: jax.Array
    completion_mask: jax.Array
    advantages: jax.Array
    old_logp: jax.Array | None = None
    ref_logp: jax.Array | None = None
    old_values: jax.Array | None = None
    returns: jax.Array | None = None
    rollout_logp: jax.Array | None = None
    packed: Any = None


class Normalizers(NamedTuple):
    """Global loss denominators of one optimizer update, and the scale of each part's loss.

    A batch split into micro-batches (gradient accumulation, devices) gets the *global* counts of
    the whole update, so the parts' losses add up to the loss of the whole (ALGORITHMS.md §0.7).
    `grad_scale` multiplies each part's loss before differentiation: `k` when `optax.MultiSteps`
    averages `k` micro-batch gradients, `D` when a data-parallel wrapper averages over `D`
    devices, 1 otherwise.

    Examples:
      >>> import jax.numpy as jnp
      >>> n = count_normalizers(jnp.array([[1, 1, 0], [0, 0, 0]]))
      >>> float(n.num_tokens), float(n.num_seqs), float(n.grad_scale)
      (2.0, 1.0, 1.0)
    """

    num_tokens: jax.Array
    num_seqs: jax.Array
    grad_scale: jax.Array


def count_normalizers(
    completion_mask: jax.Array, segment_ids: jax.Array | None = None
) -> Normalizers:
    """Token count and count of rows with at least one valid token (float32), `grad_scale` 1.

    With `segment_ids` (`[N,T]`, packed rows: the segment of each target) the sequence count
    counts the (row, segment) pairs with a valid token instead of the rows.

    These are *sums*: the counts of a batch are the sums of its micro-batches' counts. Callers
    that divide by them clamp at 1 (`losses.aggregate` receives `max(count, 1)`).

    Examples:
      >>> import jax.numpy as jnp
      >>> float(count_normalizers(jnp.ones((3, 4))).num_tokens)
      12.0
    """
    m = (jnp.asarray(completion_mask) > 0).astype(jnp.float32)
    _, lengths = losses.sequence_sums(m, m, segment_ids=segment_ids)
    return Normalizers(
        num_tokens=jnp.sum(m),
        num_seqs=jnp.sum((lengths > 0).astype(jnp.float32)),
        grad_scale=jnp.ones((), jnp.float32),
    )


def prompt_length(batch: Any) -> int:
    """Static prompt length `P = S − T` of a batch with `tokens[N,S]` and `completion_mask[N,T]`.

    Examples:
      >>> import jax.numpy as jnp
      >>> prompt_length(SequenceBatch(jnp.zeros((1, 9), jnp.int32), jnp.ones((1, 9)), jnp.ones((1, 4))))
      5
    """
    return batch.tokens.shape[1] - batch.completion_mask.shape[1]


def check_sequence_batch(batch: Any, *, where: str) -> None:
    """Validate the static layout of `tokens`, `attention_mask` and `completion_mask`.

    Raises:
      ValueError: naming the field, the expected shape/dtype and what was received.

    Examples:
      >>> import jax.numpy as jnp
      >>> check_sequence_batch(SequenceBatch(jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3)),
      ...                                    jnp.ones((2, 3))), where="demo")
      Traceback (most recent call last):
      ...
      ValueError: demo: `completion_mask` must be [N,T] with N = 2 and 1 <= T < S = 3 (at least one prompt token), got (2, 3).
    """
    tokens = batch.tokens
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(
            f"{where}: `tokens` must be an integer array [N,S], got {tokens.dtype}{tokens.shape}."
        )
    N, S = tokens.shape
    if batch.attention_mask.shape != (N, S):
        raise ValueError(
            f"{where}: `attention_mask` must have the shape of `tokens` {(N, S)}, got "
            f"{batch.attention_mask.shape}."
        )
    cm = batch.completion_mask.shape
    if len(cm) != 2 or cm[0] != N or not 1 <= cm[1] < S:
        raise ValueError(
            f"{where}: `completion_mask` must be [N,T] with N = {N} and 1 <= T < S = {S} (at "
            f"least one prompt token), got {cm}."
        )
    segments = getattr(batch, "segment_ids", None)
    if segments is None:
        return
    if segments.shape != (N, S) or not jnp.issubdtype(segments.dtype, jnp.integer):
        raise ValueError(
            f"{where}: `segment_ids` must be integer ids with the shape of `tokens` {(N, S)}, "
            f"got {segments.dtype}{segments.shape}."
        )
    if cm[1] != S - 1:
        raise ValueError(
            f"{where}: packed rows (`segment_ids` set) score every position after the first: "
            f"`completion_mask` must be [N, S − 1] = {(N, S - 1)}, got {cm}."
        )


def check_rl_batch(batch: RLBatch, *, where: str) -> None:
    """Validate an `RLBatch`: the sequence layout plus `[N,T]` floating per-token fields.

    Examples:
      >>> import jax.numpy as jnp
      >>> z = jnp.zeros((2, 3))
      >>> check_rl_batch(RLBatch(jnp.zeros((2, 5), jnp.int32), jnp.ones((2, 5)), z,
      ...                        advantages=jnp.zeros((2, 4))), where="demo")
      Traceback (most recent call last):
      ...
      ValueError: demo: `advantages` must be a floating array of shape (2, 3) ([N,T]), got float32(2, 4).
    """
    check_sequence_batch(batch, where=where)
    shape = batch.completion_mask.shape
    for name in ("advantages", "old_logp", "ref_logp", "old_values", "returns", "rollout_logp"):
        value = getattr(batch, name)
        if value is None:
            continue
        if value.shape != shape or not jnp.issubdtype(value.dtype, jnp.floating):
            raise ValueError(
                f"{where}: `{name}` must be a floating array of shape {shape} ([N,T]), got "
                f"{value.dtype}{value.shape}."
            )
    if batch.packed is not None:
        from jaxrl_llm.train.group_packing import check_packed_groups

        check_packed_groups(batch.packed, *shape, where=where)
