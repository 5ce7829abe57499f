"""BAPO: adaptive, balanced PPO clip bounds (ALGORITHMS.md §5.11).

BAPO moves the PPO clip bounds each step until the positive-advantage tokens contribute at least
`target` times as much to the policy gradient as the negative ones. `bapo_clip_bounds` finds the
bounds; `bapo_loss` is `ppo_clip_loss` with them (and verl's dual clip 3.0).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_positive
from losses._policy import log_ratio, prepare_policy_inputs, stop_gradient_metrics
from losses.ppo import ppo_clip_loss


def _check_static(value: Any, name: str, where: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(
            f"{where}: `{name}` must be a finite Python number (it sets the search grid), got "
            f"{value!r}."
        )
    return float(value)


def clip_bound_grid(start: float, stop: float, step: float) -> tuple[float, ...]:
    """The static search grid `start, start + step, ...` up to and including `stop`; finite
    Python numbers with `start <= stop` and `step > 0` (ValueError otherwise).

    Examples:
      >>> [round(v, 2) for v in clip_bound_grid(0.6, 0.8, 0.05)]
      [0.6, 0.65, 0.7, 0.75, 0.8]
      >>> clip_bound_grid(0.6, 0.8, 0.0)
      Traceback (most recent call last):
      ...
      ValueError: clip_bound_grid: `step` must be > 0, got 0.0.
    """
    where = "clip_bound_grid"
    start, stop = _check_static(start, "start", where), _check_static(stop, "stop", where)
    step = _check_static(step, "step", where)
    check_positive(step, "step", where=where)
    if start > stop:
        raise ValueError(f"{where}: need start <= stop, got start={start!r}, stop={stop!r}.")
    count = max(math.ceil((stop - start) / step - 1e-9), 0)
    return tuple(min(start + k * step, stop) for k in range(count + 1))


def bapo_clip_bounds(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    c_low: float = 0.6,
    c_low_max: float = 0.8,
    c_high: float = 1.2,
    c_high_max: float = 2.0,
    step: float = 0.05,
    target: Any = 1.0,
    axis_name: Any = None,
    log_ratio_clamp: float | None = 20.0,
) -> tuple[Array, Array, dict[str, Array]]:
    """BAPO's adaptive clip bounds `(c_lo, c_hi)` on the ratio (ALGORITHMS.md §5.11).

    All under stop-gradient. With `r = exp(clip(logp − old_logp, ±log_ratio_clamp))`, the
    contributions of the tokens that still carry gradient are

        pos(c_hi) = Σ [A > 0]·[r ≤ c_hi]·r·A·m        neg(c_lo) = Σ [A < 0]·[r ≥ c_lo]·r·|A|·m

    (global sums: `psum` over `axis_name` when given, so every shard picks the same bounds).
    Search on the static grids `c_low, c_low + step, ..., c_low_max` and `c_high, ...,
    c_high_max`: take the first `c_lo` with `pos(c_high) ≥ target·neg(c_lo)` (and `c_hi =
    c_high`); if there is none, fix `c_lo = c_low_max` and take the first `c_hi` with `pos(c_hi) ≥
    target·neg(c_low_max)`; if there is still none, return `(c_low_max, c_high_max)`. `neg = 0`
    meets the target. The whole grid is evaluated at once and the first hit is an `argmax` over a
    boolean vector. Use the bounds as `ppo_clip_loss(clip_low=1 − c_lo, clip_high=c_hi − 1,
    dual_clip=3.0)` (`bapo_loss`).

    Source: "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy
    Optimization with Adaptive Clipping" (seed paper; no arXiv id in our sources); defaults
    (`c_low` 0.6 → 0.8, `c_high` 1.2 → 2.0, step 0.05, target 1.0) from the authors' code. The
    contribution definition above is (reconstructed — verify against the paper): the authors'
    code is reported to count clipped tokens at the bound (`min(r, c_hi)`, `max(r, c_lo)`),
    under which raising `c_lo` cannot raise the positive share.

    Args:
      logp: `[N,T]` current log-probs.
      old_logp: `[N,T]` behaviour log-probs (None: ratio ≡ 1).
      advantages: `[N,T]`.
      mask: `[N,T]` {0,1}.
      c_low: initial lower ratio bound (static, in (0, 1]).
      c_low_max: largest lower bound tried (static, `c_low ≤ c_low_max ≤ 1`).
      c_high: initial upper ratio bound (static, ≥ 1).
      c_high_max: largest upper bound tried (static, ≥ `c_high`).
      step: grid step of both searches (static, > 0).
      target: required `pos/neg` ratio (> 0; may be traced).
      axis_name: mapped axis (`shard_map` / `pmap` / `vmap`) to `psum` the contributions over;
        None when the arrays are the whole batch (also when they are sharded under `jax.jit`).
      log_ratio_clamp: bound of `|logp − old_logp|` inside `exp` (None: no clamp).

    Returns:
      `(c_lo, c_hi, metrics)`: float32 scalars and `bapo/c_low`, `bapo/c_high`, `bapo/pos`,
      `bapo/neg` (contributions at the chosen bounds) and `bapo/pos_neg_ratio` (`pos/neg`, 0 when
      `neg = 0`).

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[-1.0, -1.0, -1.0]]); old = jnp.array([[-1.0, -0.7, -1.0]])
      >>> adv = jnp.array([[1.0, -1.0, -0.5]])  # pos = 1; neg = 0.741 + 0.5 until c_lo > 0.741
      >>> c_lo, c_hi, _ = bapo_clip_bounds(logp, old, adv, jnp.ones((1, 3)))
      >>> round(float(c_lo), 2), round(float(c_hi), 2)
      (0.75, 1.2)
    """
    where = "bapo_clip_bounds"
    c_low = _check_static(c_low, "c_low", where)
    c_low_max = _check_static(c_low_max, "c_low_max", where)
    c_high = _check_static(c_high, "c_high", where)
    c_high_max = _check_static(c_high_max, "c_high_max", where)
    step = _check_static(step, "step", where)
    check_positive(step, "step", where=where)
    check_positive(target, "target", where=where)
    if not 0.0 < c_low <= c_low_max <= 1.0:
        raise ValueError(
            f"{where}: need 0 < c_low <= c_low_max <= 1, got c_low={c_low!r}, "
            f"c_low_max={c_low_max!r}."
        )
    if not 1.0 <= c_high <= c_high_max:
        raise ValueError(
            f"{where}: need 1 <= c_high <= c_high_max, got c_high={c_high!r}, "
            f"c_high_max={c_high_max!r}."
        )
    inputs = prepare_policy_inputs(logp, old_logp, advantages, mask, where=where)
    _, ratio = log_ratio(inputs, log_ratio_clamp, where=where)
    ratio = jax.lax.stop_gradient(ratio)
    adv = inputs.advantages
    lows = jnp.asarray(clip_bound_grid(c_low, c_low_max, step), jnp.float32)  # [K]
    highs = jnp.asarray(clip_bound_grid(c_high, c_high_max, step), jnp.float32)  # [J]

    pos_term = jnp.where(inputs.valid & (adv > 0), ratio * adv, 0.0)
    neg_term = jnp.where(inputs.valid & (adv < 0), ratio * -adv, 0.0)
    pos = jnp.sum(
        jnp.where(ratio[None] <= highs[:, None, None], pos_term[None], 0.0), axis=(1, 2)
    )  # [J]
    neg = jnp.sum(
        jnp.where(ratio[None] >= lows[:, None, None], neg_term[None], 0.0), axis=(1, 2)
    )  # [K]
    if axis_name is not None:
        pos, neg = jax.lax.psum((pos, neg), axis_name)

    target = jnp.asarray(target, jnp.float32)
    ok_low = pos[0] >= target * neg  # phase 1: raise c_lo with c_hi = c_high
    ok_high = pos >= target * neg[-1]  # phase 2: c_lo = c_low_max, raise c_hi
    any_low, any_high = jnp.any(ok_low), jnp.any(ok_high)
    i = jnp.argmax(ok_low)
    j = jnp.where(any_high, jnp.argmax(ok_high), highs.shape[0] - 1)
    c_lo = jnp.where(any_low, lows[i], lows[-1])
    c_hi = jnp.where(any_low, highs[0], highs[j])
    pos_at = jnp.where(any_low, pos[0], pos[j])
    neg_at = jnp.where(any_low, neg[i], neg[-1])
    metrics = {
        "bapo/c_low": c_lo,
        "bapo/c_high": c_hi,
        "bapo/pos": pos_at,
        "bapo/neg": neg_at,
        "bapo/pos_neg_ratio": jnp.where(
            neg_at > 0, pos_at / jnp.where(neg_at > 0, neg_at, 1.0), 0.0
        ),
    }
    c_lo, c_hi = jax.lax.stop_gradient(c_lo), jax.lax.stop_gradient(c_hi)
    return c_lo, c_hi, stop_gradient_metrics(metrics)


def bapo_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    c_low: float = 0.6,
    c_low_max: float = 0.8,
    c_high: float = 1.2,
    c_high_max: float = 2.0,
    step: float = 0.05,
    target: Any = 1.0,
    axis_name: Any = None,
    dual_clip: float | None = 3.0,
    **ppo_kwargs: Any,
) -> tuple[Array, dict[str, Array]]:
    """PPO clipped loss with BAPO's adaptive bounds (ALGORITHMS.md §5.11).

        (c_lo, c_hi) = bapo_clip_bounds(logp, old_logp, advantages, mask, ...)
        loss = ppo_clip_loss(..., clip_low=1 − c_lo, clip_high=c_hi − 1, dual_clip=3.0)

    The bounds carry no gradient. The search keywords are those of `bapo_clip_bounds` (see it for
    the formula, the source and the (reconstructed — verify against the paper) warning); every
    other keyword (`agg`, `is_weights`, `token_weights`, `log_ratio_clamp`, `num_tokens`,
    `num_seqs`, `norm_length`, `ratio_cap`) goes to `ppo_clip_loss`. The dual clip 3.0 follows
    verl's `vanilla` loss, on which the authors' code builds.

    Args:
      logp: `[N,T]` current log-probs (differentiable).
      old_logp: `[N,T]` behaviour log-probs (None: ratio ≡ 1).
      advantages: `[N,T]`.
      mask: `[N,T]` {0,1}.
      c_low: initial lower ratio bound.
      c_low_max: largest lower bound tried.
      c_high: initial upper ratio bound.
      c_high_max: largest upper bound tried.
      step: grid step.
      target: required positive/negative contribution ratio.
      axis_name: mapped axis to `psum` the contributions over (None under plain `jax.jit`).
      dual_clip: `dual_clip` of `ppo_clip_loss` (None disables it).
      **ppo_kwargs: forwarded to `ppo_clip_loss` (not `clip_low` / `clip_high`).

    Returns:
      `(loss, metrics)`: the metrics of `ppo_clip_loss` and of `bapo_clip_bounds`.

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[-1.0, -1.0, -1.0]]); old = jnp.array([[-1.0, -0.7, -1.0]])
      >>> loss, m = bapo_loss(logp, old, jnp.array([[1.0, -1.0, -0.5]]), jnp.ones((1, 3)))
      >>> round(float(loss), 4), round(float(m["bapo/c_low"]), 2)
      (0.0833, 0.75)
    """
    where = "bapo_loss"
    for name in ("clip_low", "clip_high"):
        if name in ppo_kwargs:
            raise ValueError(
                f"{where}: `{name}` is set by the adaptive bounds and cannot be passed "
                f"(got {name}={ppo_kwargs[name]!r}); tune c_low/c_high/... instead."
            )
    c_lo, c_hi, bapo_metrics = bapo_clip_bounds(
        logp,
        old_logp,
        advantages,
        mask,
        c_low=c_low,
        c_low_max=c_low_max,
        c_high=c_high,
        c_high_max=c_high_max,
        step=step,
        target=target,
        axis_name=axis_name,
        log_ratio_clamp=ppo_kwargs.get("log_ratio_clamp", 20.0),
    )
    loss, metrics = ppo_clip_loss(
        logp,
        old_logp,
        advantages,
        mask,
        clip_low=1.0 - c_lo,
        clip_high=c_hi - 1.0,
        dual_clip=dual_clip,
        **ppo_kwargs,
    )
    return loss, {**metrics, **bapo_metrics}
