"""Length limits and length rewards (ALGORITHMS.md §10.1, §10.2 and the §11 length rows).

Conventions:

* Lengths are token counts (not characters: Tunix's DAPO reward measures characters), one per
  sequence: `[N]` or `[B,G]` with contiguous groups (`losses.to_groups`).
* `correct` is a bool / {0,1} flag (entries `> 0` are correct) unless a function says it is the
  numeric correctness reward itself.
* Group functions take `valid[B,G]` (optional): invalid samples leave every group statistic and
  get 0. They are replaced with `where(valid, x, 0)` before any arithmetic, so NaN/inf there never
  reach a value.
* Reward functions run under stop-gradient (§0.6). Every output is float32.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jax.sharding import AxisType, PartitionSpec
from jaxtyping import ArrayLike

from losses._checks import check_valid_range
from losses._rewards import (
    check_integer,
    check_number,
    check_shape,
    flags,
    optional_flags,
    real_array,
    sg,
    zero_outside,
)

# --------------------------------------------------------------------------------------------------
# length limits (§10.1)
# --------------------------------------------------------------------------------------------------


def overlong_penalty(
    lengths: ArrayLike,
    *,
    max_length: float,
    buffer_length: float,
    factor: float = 1.0,
) -> Array:
    """DAPO's soft overlong punishment, added to the reward (ALGORITHMS.md §10.1).

    With `L₀ = max_length − buffer_length`:

        p(len) = 0                                   len ≤ L₀
        p(len) = −factor·(len − L₀)/buffer_length     L₀ < len ≤ max_length
        p(len) = −factor                              len > max_length

    The penalty is continuous and non-increasing in the length. verl and Tunix do not cap it beyond
    `max_length` (their samplers never exceed it); OpenRLHF and TRL do, as here.

    Source: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476;
    20480 tokens with a 4096-token buffer in the paper — reconstructed, verify against the paper).
    Peers: TRL `get_soft_overlong_punishment(max_completion_len, soft_punish_cache)` (factor 1);
    verl `reward_model.overlong_buffer.{len, penalty_factor}`; OpenRLHF `--overlong_buffer_len`,
    `--overlong_penalty_factor`; Tunix `DAPOConfig.overlong_buffer`.

    Args:
      lengths: token counts of any shape (`[N]` or `[B,G]`).
      max_length: the sampler's maximum completion length (> 0).
      buffer_length: width of the linear ramp (`0 < buffer_length <= max_length`).
      factor: penalty at and beyond `max_length` (>= 0).

    Returns:
      float32 penalties of the shape of `lengths`, in `[−factor, 0]`, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> p = overlong_penalty(jnp.array([70, 80, 90, 100, 110]), max_length=100, buffer_length=20)
      >>> p.tolist()
      [0.0, 0.0, -0.5, -1.0, -1.0]
    """
    where = "overlong_penalty"
    length = real_array(lengths, "lengths", where=where)
    check_number(max_length, "max_length", where=where, low=0.0, low_open=True)
    check_number(buffer_length, "buffer_length", where=where, low=0.0, low_open=True)
    check_number(factor, "factor", where=where, low=0.0)
    static = isinstance(max_length, int | float) and isinstance(buffer_length, int | float)
    if static and buffer_length > max_length:
        raise ValueError(
            f"{where}: `buffer_length` must be <= `max_length` ({max_length}), got {buffer_length}."
        )
    start = max_length - buffer_length
    ramp = jnp.clip((length - start) / buffer_length, 0.0, 1.0)
    return sg(0.0 - factor * ramp)


def truncation_penalty(rewards: ArrayLike, truncated: ArrayLike, *, coef: float) -> Array:
    """ProRL's "stop properly" penalty for truncated samples (ALGORITHMS.md §10.1).

        r' = coef·r     truncated and 0 ≤ coef ≤ 1   (scale the reward down)
        r' = coef       truncated and coef < 0       (a fixed negative reward)
        r' = r          otherwise

    Source: "ProRL: Prolonged Reinforcement Learning Expands Reasoning Boundaries in Large Language
    Models" (arXiv 2505.24864). Peer: OpenRLHF `--stop_properly_penalty_coef` (same two regimes).

    Args:
      rewards: rewards of any shape.
      truncated: bool / {0,1} of the shape of `rewards` (the sampler's truncation flags).
      coef: `<= 1`; in `[0, 1]` it scales, below 0 it replaces truncated rewards.

    Returns:
      float32 rewards of the shape of `rewards`, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([1.0, 1.0, 0.5]); cut = jnp.array([False, True, True])
      >>> truncation_penalty(r, cut, coef=0.5).tolist()
      [1.0, 0.5, 0.25]
      >>> truncation_penalty(r, cut, coef=-0.5).tolist()
      [1.0, -0.5, -0.5]
    """
    where = "truncation_penalty"
    r = real_array(rewards, "rewards", where=where)
    cut = flags(truncated, r.shape, "truncated", where=where, like="rewards")
    check_number(coef, "coef", where=where, high=1.0)
    coef = jnp.asarray(coef, r.dtype)
    scaled = jnp.where(coef < 0, coef, coef * r)
    return sg(jnp.where(cut, scaled, r))


def mask_truncated(mask: ArrayLike, truncated: ArrayLike) -> Array:
    """Drop truncated completions from the loss: `mask' = mask·(1 − truncated)` (§10.1).

    The rows leave every normaliser of `aggregate` (DAPO's overlong filtering). Pass the result as
    the loss mask; advantages of the dropped rows are irrelevant.

    Sources: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476,
    overlong filtering). Peer: TRL `mask_truncated_completions=True`.

    Args:
      mask: `[N,T]` {0,1} completion mask.
      truncated: `[N]` bool / {0,1} truncation flags.

    Returns:
      `[N,T]` float32 mask.

    Examples:
      >>> import jax.numpy as jnp
      >>> mask_truncated(jnp.ones((2, 3)), jnp.array([False, True])).tolist()
      [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    """
    where = "mask_truncated"
    m = jnp.asarray(mask)
    if m.ndim != 2:
        raise ValueError(f"{where}: `mask` must be [N,T], got shape {m.shape}.")
    m = flags(m, m.shape, "mask", where=where)
    cut = flags(truncated, m.shape[:1], "truncated", where=where)
    return (m & ~cut[:, None]).astype(jnp.float32)


# --------------------------------------------------------------------------------------------------
# group length rewards (§10.2, §11)
# --------------------------------------------------------------------------------------------------


def _grouped(x: Any, name: str, valid: Any, *, where: str) -> tuple[Array, Array]:
    """Validate `x[B,G]` and `valid[B,G]`; return `(where(valid, x, 0), valid)`."""
    x = real_array(x, name, where=where, rank=2)
    v = optional_flags(valid, x.shape, "valid", where=where)
    return zero_outside(x, v), v


def kimi_length_rewards(
    lengths: ArrayLike, correct: ArrayLike, *, valid: ArrayLike | None = None
) -> Array:
    """Kimi k1.5 length reward within each group (ALGORITHMS.md §10.2).

        λ = 0.5 − (len − min_b)/(max_b − min_b)        (λ = 0 if max_b = min_b)
        r = λ               correct
        r = min(0, λ)       incorrect

    `min_b`, `max_b` are over the valid responses of the group. Shorter correct answers are
    rewarded, longer ones penalised; wrong answers are only penalised. Add it to the task reward
    with a weight.

    Source: "Kimi k1.5: Scaling Reinforcement Learning with LLMs" (arXiv 2501.12599). The min/max
    over the group's sampled responses is (reconstructed — verify against the paper). No peer.

    Args:
      lengths: `[B,G]` token counts.
      correct: `[B,G]` bool / {0,1}.
      valid: optional `[B,G]` bool; invalid samples leave min/max and get 0.

    Returns:
      `[B,G]` float32 rewards in `[−0.5, 0.5]`, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> kimi_length_rewards(jnp.array([[100, 200, 300]]), jnp.array([[1, 1, 0]])).tolist()
      [[0.5, 0.0, -0.5]]
    """
    where = "kimi_length_rewards"
    length, v = _grouped(lengths, "lengths", valid, where=where)
    ok = flags(correct, length.shape, "correct", where=where, like="lengths")
    lo = jnp.min(jnp.where(v, length, jnp.inf), axis=-1, keepdims=True)
    hi = jnp.max(jnp.where(v, length, -jnp.inf), axis=-1, keepdims=True)
    spread = hi - lo
    has_spread = spread > 0  # False for constant groups and groups without a valid sample
    lo = jnp.where(has_spread, lo, 0.0)
    lam = jnp.where(has_spread, 0.5 - (length - lo) / jnp.where(has_spread, spread, 1.0), 0.0)
    r = jnp.where(ok, lam, jnp.minimum(lam, 0.0))
    return sg(zero_outside(r, v))


def hapo_length_rewards(
    lengths: ArrayLike,
    correct: ArrayLike,
    history: ArrayLike,
    *,
    weight: float = 1.0,
    floor: float = -0.7,
) -> Array:
    """HAPO's history-aware length reward (ALGORITHMS.md §10.2).

    With `h` the shortest correct length seen so far for the sample's prompt:

        c = weight·cos(min(len/h, 2)·π/2)
        r = max(floor, c)    correct
        r = min(0, c)        incorrect
        r = 0                no history yet (h = +inf, the initial value, or h <= 0 / NaN)

    A correct answer shorter than the record is rewarded (up to `weight`), a longer one penalised
    (down to `floor`, so with a 1/0 correctness reward and `weight=1` every correct total ≥ 0.3
    exceeds every incorrect total ≤ 0). Compute the rewards with the history *before* this batch's
    `hapo_history_update`.

    Source: "HAPO: Training Language Models to Reason Concisely via History-Aware Policy
    Optimization" (seed paper; formula from the authors' code; a different "HAPO", arXiv
    2507.21848, exists). No peer.

    Args:
      lengths: token counts, any shape (`[N]` or `[B,G]`).
      correct: bool / {0,1} of the shape of `lengths`.
      history: per-sample records of the shape of `lengths`, i.e. `history[prompt_ids]` gathered
        from the `[P]` table kept by `hapo_history_update` (initialise it with
        `jnp.full((P,), jnp.inf)`).
      weight: amplitude of the cosine (>= 0).
      floor: lower bound of a correct answer's reward.

    Returns:
      float32 rewards of the shape of `lengths`, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = hapo_length_rewards(
      ...     jnp.array([50, 150, 50, 250, 80]),
      ...     jnp.array([True, True, False, False, True]),
      ...     jnp.array([100.0, 100.0, 100.0, 100.0, jnp.inf]),
      ... )
      >>> [round(x, 6) for x in r.tolist()]
      [0.707107, -0.7, 0.0, -1.0, 0.0]
    """
    where = "hapo_length_rewards"
    length = real_array(lengths, "lengths", where=where)
    ok = flags(correct, length.shape, "correct", where=where, like="lengths")
    h = real_array(history, "history", where=where)
    check_shape(h, length.shape, "history", where=where, like="lengths")
    check_number(weight, "weight", where=where, low=0.0)
    check_number(floor, "floor", where=where)
    has_history = jnp.isfinite(h) & (h > 0)
    ratio = jnp.minimum(length / jnp.where(has_history, h, 1.0), 2.0)
    c = weight * jnp.cos(ratio * (math.pi / 2))
    r = jnp.where(ok, jnp.maximum(c, floor), jnp.minimum(c, 0.0))
    return sg(zero_outside(r, has_history))


def _explicit_mesh() -> bool:
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and any(t == AxisType.Explicit for t in mesh.axis_types)


def hapo_history_update(
    history: ArrayLike, prompt_ids: ArrayLike, lengths: ArrayLike, correct: ArrayLike
) -> Array:
    """Update HAPO's per-prompt record of the shortest correct length (ALGORITHMS.md §10.2).

        history'[p] = min(history[p], min{len_n : prompt_ids[n] = p, correct_n})

    Prompts without a correct response keep their record; negative ids (padding) are ignored,
    and a concrete id ≥ P is an error (the table is too small; traced ones are ignored). Start
    from `jnp.full((P,), jnp.inf)` (no history). The table is state of the training loop (a pytree
    leaf of the train state), updated after the rewards of the batch are computed.

    Source: "HAPO: Training Language Models to Reason Concisely via History-Aware Policy
    Optimization" (seed paper). No peer.

    Args:
      history: `[P]` shortest correct length per prompt (+inf: none yet).
      prompt_ids: `int[N]` dataset index of each sample's prompt.
      lengths: `[N]` token counts.
      correct: `[N]` bool / {0,1}.

    Returns:
      `[P]` float32 updated table.

    Examples:
      >>> import jax.numpy as jnp
      >>> h = jnp.full((3,), jnp.inf)
      >>> h = hapo_history_update(
      ...     h, jnp.array([0, 0, 2, 2]), jnp.array([40, 30, 90, 10]), jnp.array([1, 1, 1, 0])
      ... )
      >>> h.tolist()
      [30.0, inf, 90.0]
    """
    where = "hapo_history_update"
    table = real_array(history, "history", where=where, rank=1)
    check_integer(prompt_ids, "prompt_ids", where=where)
    ids = jnp.asarray(prompt_ids)
    if ids.ndim != 1:
        raise ValueError(f"{where}: `prompt_ids` must be [N], got shape {ids.shape}.")
    length = real_array(lengths, "lengths", where=where)
    check_shape(length, ids.shape, "lengths", where=where, like="prompt_ids")
    ok = flags(correct, ids.shape, "correct", where=where, like="prompt_ids")
    P = table.shape[0]
    check_valid_range(ids, None, "prompt_ids", where=where, high=P - 1)
    in_range = (ids >= 0) & (ids < P)
    candidate = jnp.where(ok & in_range, length, jnp.inf).astype(table.dtype)
    out_sharding = PartitionSpec() if _explicit_mesh() else None
    best = jax.ops.segment_min(
        candidate, jnp.where(in_range, ids, 0), num_segments=P, out_sharding=out_sharding
    )
    return sg(jnp.minimum(table, best))


def accuracy_gated_rewards(
    correct: ArrayLike,
    len_r: ArrayLike,
    *,
    threshold: float,
    lam: float,
    valid: ArrayLike | None = None,
) -> Array:
    """GRPO-λ: apply a length reward only in groups that are accurate enough (ALGORITHMS.md §11).

        acc_b = mean_g correct_bg                       (valid samples)
        r = correct + λ·len_r     if acc_b ≥ threshold
        r = correct               otherwise

    A low correctness ratio switches the group back to the length-agnostic 0/1 reward, so the length
    penalty cannot destroy the reasoning it is meant to shorten.

    Source: GRPO-λ, "Stable Reinforcement Learning for Efficient Reasoning" (seed paper). The gate
    on the group mean with `≥` and the additive combination are (reconstructed — verify against the
    paper). No peer.

    Args:
      correct: `[B,G]` correctness reward (0/1, or a score; its group mean is the accuracy).
      len_r: `[B,G]` length reward (e.g. `kimi_length_rewards` or `−len/max_length`).
      threshold: accuracy at which the length reward switches on.
      lam: weight of the length reward.
      valid: optional `[B,G]` bool; invalid samples leave the accuracy and get 0.

    Returns:
      `[B,G]` float32 rewards, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> c = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
      >>> len_r = jnp.array([[0.5, -0.5, -0.5], [0.5, 0.0, -0.5]])
      >>> accuracy_gated_rewards(c, len_r, threshold=0.5, lam=0.25).tolist()
      [[1.125, 0.875, -0.125], [1.0, 0.0, 0.0]]
    """
    where = "accuracy_gated_rewards"
    c, v = _grouped(correct, "correct", valid, where=where)
    check_shape(len_r, c.shape, "len_r", where=where, like="correct")
    length_r = zero_outside(real_array(len_r, "len_r", where=where), v)
    check_number(threshold, "threshold", where=where)
    check_number(lam, "lam", where=where)
    count = jnp.sum(v, axis=-1, keepdims=True)
    accuracy = jnp.sum(c, axis=-1, keepdims=True) / jnp.maximum(count, 1.0)
    gate = (accuracy >= threshold) & (count > 0)
    r = c + jnp.where(gate, lam * length_r, 0.0)
    return sg(zero_outside(r, v))


def conciseness_gated_rewards(correct: ArrayLike, concise: ArrayLike, *, w: float) -> Array:
    """Reward conciseness only when the answer is correct (ALGORITHMS.md §11).

        r = correct·(1 + w·concise)

    `concise` is a conciseness score (e.g. from a conciseness reward model, in `[0, 1]`); an
    incorrect answer gets `0·(…) = 0` whatever its conciseness, so brevity can never compensate a
    wrong answer.

    Sources: CRM/CRF conciseness rewards and "Exploring and Exploiting the Inherent Efficiency
    within Large Reasoning Models for Self-Guided Efficiency Enhancement" (seed papers); the
    multiplicative form is (reconstructed — verify against the paper). No peer.

    Args:
      correct: correctness reward (0/1) of any shape.
      concise: conciseness score of the shape of `correct`.
      w: weight of the conciseness bonus.

    Returns:
      float32 rewards of the shape of `correct`, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> conciseness_gated_rewards(jnp.array([1.0, 1.0, 0.0]), jnp.array([1.0, 0.5, 1.0]), w=0.5)
      Array([1.5 , 1.25, 0.  ], dtype=float32)
    """
    where = "conciseness_gated_rewards"
    c = real_array(correct, "correct", where=where)
    s = real_array(concise, "concise", where=where)
    check_shape(s, c.shape, "concise", where=where, like="correct")
    check_number(w, "w", where=where)
    # where(c != 0, ...) first: NaN in the score of a wrong answer stays out of the value
    return sg(jnp.where(c != 0, c * (1.0 + w * zero_outside(s, c != 0)), 0.0))


def drpo_positive_weights(
    len_r: ArrayLike, correct: ArrayLike, *, lam: float, valid: ArrayLike | None = None
) -> Array:
    """DRPO's length-based weights of the correct samples of each group (ALGORITHMS.md §11).

        w_bg = exp(len_r_bg/λ) / Σ_{g' correct} exp(len_r_bg'/λ)    correct samples
        w_bg = 0                                                     incorrect / invalid

    The closed-form maximiser of `E_q[len_r] − λ·KL(q ‖ uniform over the positives)`: weights sum to
    1 over the correct samples of a group (0 if it has none), so length preferences are normalised
    *within the positive group* and never turn a correct answer's signal negative. Use the weights
    on the positive term of a discriminative objective (e.g. `disco_loss`) or as `token_weights`.

    Source: "DRPO: Efficient Reasoning via Decoupled Reward Policy Optimization" (seed paper). The
    softmax over correct samples without importance weights (on-policy) is (reconstructed — verify
    against the paper). No peer.

    Args:
      len_r: `[B,G]` length reward (larger = preferred, e.g. `−len/max_length`).
      correct: `[B,G]` bool / {0,1}.
      lam: temperature λ > 0 (small: all weight on the preferred sample; large: uniform).
      valid: optional `[B,G]` bool.

    Returns:
      `[B,G]` float32 weights, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> w = drpo_positive_weights(
      ...     jnp.array([[0.0, -1.0, 5.0], [0.0, 0.0, 0.0]]), jnp.array([[1, 1, 0], [0, 0, 0]]), lam=1.0
      ... )
      >>> [[round(x, 4) for x in row] for row in w.tolist()]
      [[0.7311, 0.2689, 0.0], [0.0, 0.0, 0.0]]
    """
    where = "drpo_positive_weights"
    r, v = _grouped(len_r, "len_r", valid, where=where)
    positive = flags(correct, r.shape, "correct", where=where, like="len_r") & v
    check_number(lam, "lam", where=where, low=0.0, low_open=True)
    logits = jnp.where(positive, r / lam, -jnp.inf)
    top = jnp.max(logits, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    e = jnp.where(positive, jnp.exp(jnp.where(positive, logits - top, 0.0)), 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    return sg(e / jnp.where(total > 0, total, 1.0))
