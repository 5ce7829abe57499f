"""Combining and gating several rewards into one (ALGORITHMS.md §10.4 and the §11 reward rows).

Conventions:

* Rewards are per sequence (`[N]`, `[B,G]` or any shape; §10 functions run before the advantage
  estimator). Multi-reward inputs put the `K` components (or `C` rubric criteria, `J` judges) on
  the last axis.
* Missing components are marked by a `valid` mask (TRL marks them with NaN); they are replaced with
  `where(valid, x, 0)` before any arithmetic, so NaN/inf there never reach a value.
* Gates (`format_ok`, `violated`, `truncated`) are bool / {0,1}: entries `> 0` are True.
* Reward functions run under stop-gradient (§0.6). Every output is float32.

Weighted sums here are the "sum, then normalise" path (TRL's default); the "normalise each
component, then sum" path of GDPO is `losses.gdpo_advantages`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._rewards import (
    check_number,
    check_shape,
    flags,
    optional_flags,
    real_array,
    sg,
    zero_outside,
)


class WeightedRewards(NamedTuple):
    """Output of `weighted_rewards`: the combined reward and whether any component was valid.

    Attributes:
      rewards: `[...]` float32 `Σ_k w_k r_k` over the valid components (0 where none is valid).
      valid: `[...]` bool, False where no component is valid: pass it as the `valid` of the
        advantage estimator so such samples get advantage 0 and leave the group statistics.

    Examples:
      >>> import jax.numpy as jnp
      >>> out = weighted_rewards(jnp.array([[1.0, 2.0]]), jnp.array([0.5, 0.25]))
      >>> out.rewards.tolist(), out.valid.tolist()
      ([1.0], [True])
    """

    rewards: Array
    valid: Array


def weighted_rewards(
    rewards: ArrayLike, weights: ArrayLike, *, valid: ArrayLike | None = None
) -> WeightedRewards:
    """Weighted sum of `K` reward components (ALGORITHMS.md §10.4).

        r = Σ_k w_k·r_k      over the valid components k

    A sample with no valid component is invalid (`valid` of the output is False, its reward 0).
    One-hot weights select a component.

    Sources: decomposed rule rewards of "SWE-RL", "ToolRL", MT-R1-Zero, Tool-Star and the weighted
    mixes of CORY, SSR-Zero, RefCritic, KLCF, REVISOR, Vision-SR1, Optima (seed papers). Peers: TRL
    `reward_weights` (NaN = missing component, summed with `nansum`).

    Args:
      rewards: `[..., K]` reward components.
      weights: `[K]` weights (may be traced).
      valid: optional `[..., K]` bool, False for a missing component.

    Returns:
      `WeightedRewards(rewards[...], valid[...])`, float32 rewards under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[1.0, 0.0], [1.0, jnp.nan], [jnp.nan, jnp.nan]])
      >>> ok = jnp.isfinite(r)
      >>> out = weighted_rewards(r, jnp.array([1.0, 0.5]), valid=ok)
      >>> out.rewards.tolist(), out.valid.tolist()
      ([1.0, 1.0, 0.0], [True, True, False])
    """
    where = "weighted_rewards"
    r = real_array(rewards, "rewards", where=where)
    if r.ndim < 1:
        raise ValueError(f"{where}: `rewards` must be [..., K], got a scalar.")
    K = r.shape[-1]
    w = real_array(weights, "weights", where=where)
    if w.shape != (K,):
        raise ValueError(
            f"{where}: `weights` must have shape (K,) = ({K},), one weight per component on the "
            f"last axis of `rewards` {r.shape}, got {w.shape}."
        )
    v = optional_flags(valid, r.shape, "valid", where=where, like="rewards")
    total = jnp.sum(zero_outside(r, v) * w, axis=-1)
    return WeightedRewards(rewards=sg(total), valid=jnp.any(v, axis=-1))


def rubric_rewards(met: ArrayLike, w: ArrayLike, *, valid: ArrayLike | None = None) -> Array:
    """Rubric score: weighted criteria met, normalised by the attainable total (ALGORITHMS.md §11).

        r_n = Σ_c met_nc·w_c / Σ_c max(w_c, 0)        (valid criteria only)

    Negative weights are pitfall criteria (penalties): they lower the score but do not enlarge the
    attainable total, so a response meeting every positive criterion and no pitfall scores 1. Rows
    whose valid criteria have no positive weight are divided by 1 (the raw weighted sum).

    Source: RuscaRL, "Breaking the Exploration Bottleneck: Rubric-Scaffolded Reinforcement Learning
    for General LLM Reasoning" (seed paper); the normalisation by the positive weights is
    (reconstructed — verify against the paper). No peer.

    Args:
      met: `[N,C]` criterion scores (0/1 verdicts of a judge, or in `[0, 1]`).
      w: `[C]` weights shared by the batch, or `[N,C]` per-sample rubrics.
      valid: optional `[N,C]` bool for padded rubrics of different sizes.

    Returns:
      `[N]` float32 rubric rewards, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> met = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
      >>> rubric_rewards(met, jnp.array([3.0, 1.0, -2.0])).tolist()
      [1.0, 0.25]
    """
    where = "rubric_rewards"
    x = real_array(met, "met", where=where, rank=2)
    weights = real_array(w, "w", where=where, rank=(1, 2))
    if weights.shape not in (x.shape[1:], x.shape):
        raise ValueError(
            f"{where}: `w` must have shape {x.shape[1:]} (shared) or {x.shape} (per sample), "
            f"got {weights.shape}."
        )
    v = optional_flags(valid, x.shape, "valid", where=where, like="met")
    weights = zero_outside(jnp.broadcast_to(weights, x.shape), v)
    score = jnp.sum(zero_outside(x, v) * weights, axis=-1)
    attainable = jnp.sum(jnp.maximum(weights, 0.0), axis=-1)
    return sg(score / jnp.where(attainable > 0, attainable, 1.0))


def format_gated_rewards(
    score: ArrayLike, format_ok: ArrayLike, *, fail_value: float = -1.0
) -> Array:
    """Hierarchical reward: the score only counts when the format is right (ALGORITHMS.md §10.4).

        r = score        format_ok
        r = fail_value   otherwise

    Source: "SWE-RL: Advancing LLM Reasoning via Reinforcement Learning on Open Software Evolution"
    (arXiv 2502.18449; −1 for a malformed patch); MT-R1-Zero, Tool-Star (seed papers; their fail
    values differ: pass each paper's). No peer.

    Args:
      score: rewards of any shape (NaN allowed where the format failed).
      format_ok: bool / {0,1} of the shape of `score`.
      fail_value: reward of a malformed response.

    Returns:
      float32 rewards of the shape of `score`, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.array([0.5, jnp.nan, 1.0])
      >>> format_gated_rewards(s, jnp.array([True, False, True])).tolist()
      [0.5, -1.0, 1.0]
    """
    where = "format_gated_rewards"
    s = real_array(score, "score", where=where)
    ok = flags(format_ok, s.shape, "format_ok", where=where, like="score")
    check_number(fail_value, "fail_value", where=where)
    return sg(jnp.where(ok, s, jnp.asarray(fail_value, s.dtype)))


def constraint_gated_rewards(rewards: ArrayLike, violated: ArrayLike, *, floor: float) -> Array:
    """Mixture-of-judges gate: any violated constraint replaces the reward (ALGORITHMS.md §10.4).

        r' = floor   if any_j violated_nj
        r' = r       otherwise

    Source: CGPO, "The Perfect Blend: Redefining RLHF with Mixture of Judges" (arXiv 2409.20370);
    replacing the reward by a floor is (reconstructed — verify against the paper: CGPO also drops
    violating samples from the positive set of its constrained optimisers). Per-task
    standardisation is `losses.segment_standardize`. No peer.

    Args:
      rewards: `[N]` rewards.
      violated: `[N,J]` bool / {0,1} verdicts of `J` constraint judges.
      floor: reward of a sample that violates a constraint.

    Returns:
      `[N]` float32 rewards, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> bad = jnp.array([[False, False], [False, True]])
      >>> constraint_gated_rewards(jnp.array([0.75, 0.5]), bad, floor=-1.0).tolist()
      [0.75, -1.0]
    """
    where = "constraint_gated_rewards"
    r = real_array(rewards, "rewards", where=where, rank=1)
    v = jnp.asarray(violated)
    if v.ndim != 2 or v.shape[0] != r.shape[0]:
        raise ValueError(
            f"{where}: `violated` must be [N,J] with N = {r.shape[0]}, got shape {v.shape}."
        )
    bad = jnp.any(flags(v, v.shape, "violated", where=where), axis=-1)
    check_number(floor, "floor", where=where)
    return sg(jnp.where(bad, jnp.asarray(floor, r.dtype), r))


def gated_accumulated_rewards(
    outcome: ArrayLike, step_rewards: ArrayLike, step_mask: ArrayLike, *, threshold: float
) -> Array:
    """G-RA: immediate step rewards count only when the outcome clears a gate (ALGORITHMS.md §10.4).

        r_n = outcome_n + [outcome_n ≥ threshold]·Σ_m step_rewards_nm·step_mask_nm

    Dense step rewards cannot be farmed by trajectories that fail the task. `threshold = −inf`
    gives the plain sum, `+inf` the outcome alone.

    Source: G-RA, "Stabilizing Long-term Multi-turn Reinforcement Learning with Gated Rewards"
    (seed paper). No peer.

    Args:
      outcome: `[N]` outcome rewards.
      step_rewards: `[N,M]` immediate rewards of the steps (turns, tool calls).
      step_mask: `[N,M]` {0,1} valid steps.
      threshold: gate on the outcome (may be ±inf).

    Returns:
      `[N]` float32 rewards, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> steps = jnp.array([[0.25, 0.25], [0.5, jnp.nan]])
      >>> m = jnp.array([[1, 1], [1, 0]])
      >>> gated_accumulated_rewards(jnp.array([1.0, 0.0]), steps, m, threshold=0.5).tolist()
      [1.5, 0.0]
    """
    where = "gated_accumulated_rewards"
    o = real_array(outcome, "outcome", where=where, rank=1)
    s = real_array(step_rewards, "step_rewards", where=where, rank=2)
    if s.shape[0] != o.shape[0]:
        raise ValueError(
            f"{where}: `step_rewards` must be [N,M] with N = {o.shape[0]}, got shape {s.shape}."
        )
    m = flags(step_mask, s.shape, "step_mask", where=where, like="step_rewards")
    check_number(threshold, "threshold", where=where)
    dense = jnp.sum(zero_outside(s, m), axis=-1)
    return sg(o + jnp.where(o >= threshold, dense, 0.0))


def gap_rewards(r: ArrayLike, r_ref: ArrayLike) -> Array:
    """Reward as the improvement over a reference response: `r − r_ref` (ALGORITHMS.md §11).

    Source: PIT, "Enabling Language Models to Implicitly Learn Self-Improvement"
    (arXiv 2310.00898): the reward of a response is its reward-model gap to the reference response
    it improves on. No peer.

    Args:
      r: rewards of any shape.
      r_ref: rewards of the reference responses, broadcastable to `r`.

    Returns:
      float32 gaps of the shape of `r`, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> gap_rewards(jnp.array([1.0, 0.25]), jnp.array([0.5, 0.5])).tolist()
      [0.5, -0.25]
    """
    where = "gap_rewards"
    x = real_array(r, "r", where=where)
    ref = real_array(r_ref, "r_ref", where=where)
    try:
        shape = jnp.broadcast_shapes(x.shape, ref.shape)
    except ValueError:
        shape = None
    if shape != x.shape:
        raise ValueError(
            f"{where}: `r_ref` with shape {ref.shape} must broadcast to `r` {x.shape}."
        )
    return sg(x - ref)


def self_correction_bonus(r1: ArrayLike, r2: ArrayLike, *, alpha: float) -> Array:
    """SCoRe's reward for a second attempt: `r2 + α·(r2 − r1)` (ALGORITHMS.md §11).

    The bonus rewards *changing* a wrong first attempt into a right second one (and penalises the
    reverse) more than staying right, which keeps the policy from collapsing to "repeat the first
    answer".

    Source: SCoRe, "Training Language Models to Self-Correct via Reinforcement Learning"
    (arXiv 2409.12917); the additive form is (reconstructed — verify against the paper). No peer.

    Args:
      r1: rewards of the first attempts, any shape.
      r2: rewards of the second attempts, same shape.
      alpha: bonus coefficient α (> 1 in the paper's stage II; any value accepted).

    Returns:
      float32 rewards of the second attempts, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> self_correction_bonus(jnp.array([0.0, 1.0, 1.0]), jnp.array([1.0, 0.0, 1.0]), alpha=2.0)
      Array([ 3., -2.,  1.], dtype=float32)
    """
    where = "self_correction_bonus"
    a = real_array(r1, "r1", where=where)
    b = real_array(r2, "r2", where=where)
    check_shape(b, a.shape, "r2", where=where, like="r1")
    check_number(alpha, "alpha", where=where)
    return sg(b + alpha * (b - a))
