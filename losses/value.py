"""Critic losses and running reward statistics (ALGORITHMS.md §7.1, §7.3).

* `value_loss`: PPO's clipped value loss, with the ½ factor.
* `RunningMoments`, `init_running_moments`, `running_moments_update`: count, mean and sum of squared
  deviations of a stream of rewards, merged batch by batch with the parallel (Chan/Welford) rule.
* `normalize_rewards`: standardise rewards with those running moments (PPO-max).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_floating,
    check_positive,
    check_rank,
    check_same_shape,
)
from losses._policy import stop_gradient_metrics, zero_outside
from losses.aggregation import AggMode, aggregate


def value_loss(
    values: ArrayLike,
    old_values: ArrayLike | None,
    returns: ArrayLike,
    mask: ArrayLike,
    *,
    clip: float | None = 0.2,
    agg: AggMode = "token_mean",
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """PPO's clipped value (critic) loss, with the ½ factor (ALGORITHMS.md §7.1).

    With the critic's values `v`, the values `v_old` of the critic that collected the batch and the
    returns `R` (e.g. from `gae`):

        v_c  = v_old + clip(v − v_old, −c, c)
        ℓ    = ½·max((v − R)², (v_c − R)²)          (clip=None: ℓ = ½(v − R)²)
        loss = aggregate(ℓ, mask, agg)

    Where the clipped branch is the larger one, `v` has moved more than `c` away from `v_old` and
    the gradient is 0 (the update is "trusted" only inside the clip range, as the policy ratio).

    Sources: "Proximal Policy Optimization Algorithms" (arXiv 1707.06347); "Secrets of RLHF in Large
    Language Models Part I: PPO" (arXiv 2307.04964). Peers: TRL PPO (`cliprange_value=0.2`, ½
    factor, `vf_coef=0.1` applied by the caller) = defaults; verl `compute_value_loss` and OpenRLHF
    `ValueLoss` (clip 0.5, ½ factor) = `clip=0.5`. Default 0.2 follows TRL and the PPO paper's
    policy clip; the value scale of LLM critics (rewards in [-1, 1] or [0, 1]) makes 0.2 and 0.5
    both common.

    Args:
      values: `[N,T]` predictions of the critic being trained (differentiable).
      old_values: `[N,T]` predictions of the critic that collected the batch (no gradient); may be
        None only when `clip` is None.
      returns: `[N,T]` regression targets (no gradient).
      mask: `[N,T]` {0,1} tokens that count.
      clip: value clip range `c` > 0; None disables clipping (plain ½ MSE).
      agg: aggregation mode of `losses.aggregate`.
      num_tokens: global token count for `agg` (see `aggregate`).
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `value/clip_frac` (fraction of valid tokens where the
      clipped branch is strictly larger), `value/mean` (masked mean of `v`), `value/explained_var`
      (`1 − var(R − v)/var(R)` over valid tokens, ddof=1 as verl; 0 when `var(R) = 0`).

    Examples:
      >>> import jax.numpy as jnp
      >>> v = jnp.array([[0.5, 1.0]]); old = jnp.array([[0.2, 0.9]]); R = jnp.array([[1.0, 0.0]])
      >>> loss, m = value_loss(v, old, R, jnp.ones((1, 2)), clip=0.2)
      >>> round(float(loss), 4), float(m["value/clip_frac"])
      (0.34, 0.5)
    """
    where = "value_loss"
    check_rank(values, 2, "values", where=where)
    check_floating(values, "values", where=where)
    check_floating(returns, "returns", where=where)
    check_same_shape(values, "values", where, old_values=old_values, returns=returns)
    if clip is not None:
        check_positive(clip, "clip", where=where)
        if old_values is None:
            raise ValueError(
                f"{where}: `old_values` is required when `clip` is set (got clip={clip!r} and "
                "old_values=None); pass clip=None for the unclipped loss."
            )
        check_floating(old_values, "old_values", where=where)
    m = as_mask(mask, jnp.shape(values), where=where)
    valid = m > 0
    v = zero_outside(as_float32(values), valid)
    ret = jax.lax.stop_gradient(zero_outside(as_float32(returns), valid))

    err_sq = (v - ret) ** 2
    if clip is None:
        per_token = 0.5 * err_sq
        clipped_larger = jnp.zeros(v.shape, bool)
    else:
        old = jax.lax.stop_gradient(zero_outside(as_float32(old_values), valid))
        # = old + clip(v − old, ±c), written so that v_c is exactly v inside the range (no
        # rounding makes the clipped branch spuriously larger)
        v_clipped = jnp.clip(v, old - clip, old + clip)
        clipped_sq = (v_clipped - ret) ** 2
        per_token = 0.5 * jnp.maximum(err_sq, clipped_sq)
        clipped_larger = clipped_sq > err_sq

    loss = aggregate(
        per_token,
        m,
        mode=agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    count = jnp.maximum(jnp.sum(m), 1.0)
    metrics = {
        "value/clip_frac": jnp.sum(jnp.where(valid & clipped_larger, 1.0, 0.0)) / count,
        "value/mean": jnp.sum(v) / count,
        "value/explained_var": _explained_variance(v, ret, m),
    }
    return loss, stop_gradient_metrics(metrics)


def _explained_variance(v: Array, ret: Array, m: Array) -> Array:
    """`1 − var(R − v)/var(R)` over valid entries (ddof=1); 0 when `var(R) = 0`."""
    count = jnp.sum(m)
    den = jnp.maximum(count - 1.0, 1.0)

    def var(x: Array) -> Array:
        mean = jnp.sum(x * m) / jnp.maximum(count, 1.0)
        return jnp.sum(jnp.where(m > 0, (x - mean) ** 2, 0.0)) / den

    var_ret = var(ret)
    safe = jnp.where(var_ret > 0, var_ret, 1.0)
    return jnp.where(var_ret > 0, 1.0 - var(ret - v) / safe, 0.0)


class RunningMoments(NamedTuple):
    """Running statistics of a stream: `count`, `mean` and `m2 = Σ (x − mean)²` (float32 scalars).

    The variance of everything seen so far is `m2 / count`. A pytree: it travels through
    `jax.jit` and `lax.scan`.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = running_moments_update(init_running_moments(), jnp.array([1.0, 3.0]))
      >>> float(s.m2 / s.count)
      1.0
    """

    count: Array
    mean: Array
    m2: Array


def init_running_moments() -> RunningMoments:
    """The empty state: count 0, mean 0, m2 0.

    Examples:
      >>> init_running_moments().count.tolist()
      0.0
    """
    zero = jnp.zeros((), jnp.float32)
    return RunningMoments(zero, zero, zero)


def _check_state(state: Any, where: str) -> RunningMoments:
    if not isinstance(state, RunningMoments):
        raise ValueError(
            f"{where}: `state` must be a RunningMoments(count, mean, m2) from "
            f"`init_running_moments()`, got {type(state).__name__}."
        )
    for name, value in zip(RunningMoments._fields, state, strict=True):
        if jnp.ndim(value) != 0:
            raise ValueError(
                f"{where}: `state.{name}` must be a scalar, got shape {jnp.shape(value)}."
            )
    return RunningMoments(*(as_float32(value) for value in state))


def running_moments_update(
    state: RunningMoments, x: ArrayLike, mask: ArrayLike | None = None
) -> RunningMoments:
    """Merge a batch `x` (its valid entries) into running moments (ALGORITHMS.md §7.3).

    Parallel (Chan et al. / Welford) rule: with the batch's `n_b = Σ m`, `μ_b = Σ x·m / max(n_b, 1)`,
    `M2_b = Σ m (x − μ_b)²` and the state `(n_a, μ_a, M2_a)`, `δ = μ_b − μ_a`, `n = n_a + n_b`:

        μ  = μ_a + δ·n_b / max(n, 1)
        M2 = M2_a + M2_b + δ²·n_a·n_b / max(n, 1)

    so merging two batches one after the other equals merging their concatenation. An empty batch
    leaves the state unchanged. Used for PPO-max reward normalisation ("Secrets of RLHF in Large
    Language Models Part I: PPO", arXiv 2307.04964) and BCO's running reward mean; the state is a
    pytree and travels through `jax.jit` / `lax.scan`. Counts are float32 (exact up to 2²⁴).
    On sharded inputs the batch sums are global (under `jax.jit`).

    Args:
      state: a `RunningMoments` (start from `init_running_moments()`).
      x: batch values, any shape (e.g. rewards `[N]` or per-token rewards `[N,T]`).
      mask: {0,1} of the shape of `x`; None counts every entry.

    Returns:
      The updated `RunningMoments` (float32 scalars).

    Examples:
      >>> import jax.numpy as jnp
      >>> s = running_moments_update(init_running_moments(), jnp.array([1.0, 2.0, 3.0]))
      >>> [float(v) for v in s]
      [3.0, 2.0, 2.0]
    """
    where = "running_moments_update"
    state = _check_state(state, where)
    check_floating(x, "x", where=where)
    x = as_float32(x)
    m = jnp.ones(x.shape, jnp.float32) if mask is None else as_mask(mask, x.shape, where=where)
    x = zero_outside(x, m > 0)
    n_b = jnp.sum(m)
    mean_b = jnp.sum(x) / jnp.maximum(n_b, 1.0)
    m2_b = jnp.sum(jnp.where(m > 0, (x - mean_b) ** 2, 0.0))
    n = state.count + n_b
    delta = mean_b - state.mean
    inv_n = 1.0 / jnp.maximum(n, 1.0)
    mean = state.mean + delta * n_b * inv_n
    m2 = state.m2 + m2_b + delta**2 * state.count * n_b * inv_n
    return RunningMoments(n, mean, m2)


def normalize_rewards(
    x: ArrayLike,
    state: RunningMoments,
    *,
    clip: float | None = None,
    shift_mean: bool = True,
    eps: float = 1e-8,
    mask: ArrayLike | None = None,
) -> Array:
    """Standardise `x` with running moments, then optionally clip (ALGORITHMS.md §7.3).

        σ = sqrt(M2 / count + eps)              (population variance of the stream)
        y = (x − mean) / σ   (+ mean if not shift_mean)
        y = clip(y, −clip, clip)                (if clip is given)

    `shift_mean=False` adds the mean back, the convention of `masked_whiten` (§1.4) and TRL's
    `whiten_rewards`. An empty state (count 0) returns `x` unchanged, so a first call before any
    update does not blow rewards up by `1/sqrt(eps)`. PPO-max ("Secrets of RLHF in Large Language
    Models Part I: PPO", arXiv 2307.04964) normalises rewards with running statistics and clips
    them; its exact choices (variance estimator, eps, clip value, update before or after use) are
    (reconstructed — verify against the paper). Update the state first
    (`running_moments_update`) to include the current batch in the statistics.

    Args:
      x: rewards, any shape.
      state: `RunningMoments` of the reward stream.
      clip: symmetric bound on the normalised rewards (> 0); None: no clipping.
      shift_mean: subtract the running mean (True) or keep it (False).
      eps: added to the variance before the square root (with `eps = 0`, a stream of equal
        values scales by 1 instead of dividing by 0).
      mask: optional {0,1} of the shape of `x`; outputs are 0 outside it (NaN there never leaks).

    Returns:
      float32 array of the shape of `x`.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = running_moments_update(init_running_moments(), jnp.array([1.0, 3.0]))
      >>> normalize_rewards(jnp.array([1.0, 3.0, 5.0]), s, clip=1.5).tolist()
      [-1.0, 1.0, 1.5]
    """
    where = "normalize_rewards"
    state = _check_state(state, where)
    check_floating(x, "x", where=where)
    if clip is not None:
        check_positive(clip, "clip", where=where)
    check_positive(eps, "eps", where=where, allow_zero=True)
    x = as_float32(x)
    if mask is not None:
        x = zero_outside(x, as_mask(mask, x.shape, where=where) > 0)
    empty = state.count <= 0
    var = state.m2 / jnp.maximum(state.count, 1.0)
    # a constant stream with eps = 0 has no scale to divide by: 1, as for the empty state
    scale = jnp.where(empty | (var + eps <= 0), 1.0, jax.lax.rsqrt(jnp.maximum(var + eps, 1e-30)))
    mean = jnp.where(empty, 0.0, state.mean)
    y = (x - mean) * scale
    if not shift_mean:
        y = y + mean
    if clip is not None:
        y = jnp.clip(y, -clip, clip)
    if mask is not None:
        y = zero_outside(y, as_mask(mask, x.shape, where=where) > 0)
    return y
