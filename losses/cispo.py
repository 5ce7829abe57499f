"""CISPO: REINFORCE weighted by a clipped, stop-gradient importance ratio (ALGORITHMS.md §5.5)."""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_choice, check_positive
from losses._policy import (
    log_ratio,
    masked_fraction,
    prepare_policy_inputs,
    ratio_metrics,
    reduce_policy_loss,
    stop_gradient_metrics,
)
from losses.aggregation import AggMode

CispoConvention = Literal["relative", "absolute"]
CISPO_CONVENTIONS: tuple[str, ...] = ("relative", "absolute")


def cispo_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    clip_low: float = 1.0,
    clip_high: float = 4.0,
    convention: CispoConvention = "relative",
    agg: AggMode = "token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Clipped IS-weight Policy Optimization loss (MiniMax-M1's CISPO, §5.5).

    With `r = exp(clip(logp − old_logp, ±log_ratio_clamp))` and advantages `A`:

        convention="relative":  w = clip(r, 1 − ε_low, 1 + ε_high)
        convention="absolute":  w = min(r, clip_high)                 (`clip_low` unused)
        ℓ = −sg(w)·A·logp ;  loss = aggregate(ℓ · sg(is_weights) · token_weights, mask, agg)

    Unlike PPO's clip, clipping bounds the *weight* and never drops a token: every token keeps
    the gradient `−w·A·∇logp`. At ratio 1 the loss (value and gradient) is `reinforce_loss`.

    Source: "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"
    (arXiv 2506.13585). Peers: verl `cispo` is relative with ε = 0.2/0.2
    (`clip_low=0.2, clip_high=0.2`); TRL `loss_type="cispo"` caps at `epsilon_high`
    (`convention="absolute", clip_high=epsilon_high, log_ratio_clamp=None`; TRL recommends 5.0,
    and left unset `epsilon_high` falls back to `epsilon=0.2`, which caps every weight at 0.2).
    Our default `w ∈ [0, 5]` (`clip_low=1.0, clip_high=4.0`) is the one-sided cap that MiniMax
    and ScaleRL recommend: no lower bound, an upper bound loose enough to keep rare tokens.

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      old_logp: `[N,T]` log-probs of the policy that the batch is reused from; None means
        `sg(logp)` (ratio ≡ 1, on-policy).
      advantages: `[N,T]` (no gradient flows into them).
      mask: `[N,T]` {0,1} completion tokens that count.
      clip_low: ε_low (weight floor `1 − ε_low`, relative convention only; ≥ 0).
      clip_high: ε_high (weight ceiling `1 + ε_high`, relative) or the cap itself (absolute).
      convention: "relative" (bounds around 1, verl) or "absolute" (a cap, TRL).
      agg: aggregation mode of `losses.aggregate`.
      is_weights: `[N,T]` rollout-correction weights (stop-gradient).
      token_weights: `[N,T]` selections that must not change the normaliser.
      log_ratio_clamp: bound of |logp − old_logp| inside `exp` (None: no clamp).
      num_tokens: global token count for `agg` (see `aggregate`).
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/clip_frac` (`masked_mean[w ≠ r]`), split
      into `policy/clip_frac_high` (r above the ceiling) and `policy/clip_frac_low` (r below the
      floor), `policy/approx_kl`, `policy/ratio_mean`, `policy/ratio_max`.

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[-1.0, -0.5]]); old = jnp.array([[-3.0, -0.5]])
      >>> loss, m = cispo_loss(logp, old, jnp.array([[1.0, 1.0]]), jnp.ones((1, 2)))
      >>> round(float(loss), 4), float(m["policy/clip_frac_high"])
      (2.75, 0.5)
    """
    where = "cispo_loss"
    check_choice(convention, CISPO_CONVENTIONS, "convention", where=where)
    if convention == "relative":
        check_positive(clip_low, "clip_low", where=where, allow_zero=True)
        check_positive(clip_high, "clip_high", where=where, allow_zero=True)
    else:
        check_positive(clip_high, "clip_high", where=where)
    inputs = prepare_policy_inputs(logp, old_logp, advantages, mask, where=where)
    logr, ratio = log_ratio(inputs, log_ratio_clamp, where=where)
    adv = inputs.advantages

    if convention == "relative":
        upper = 1.0 + clip_high
        weight = jnp.clip(ratio, 1.0 - clip_low, upper)
        below = ratio < 1.0 - clip_low
    else:
        upper = clip_high
        weight = jnp.minimum(ratio, upper)
        below = jnp.zeros_like(inputs.valid)
    above = ratio > upper
    per_token = -jax.lax.stop_gradient(weight) * adv * inputs.logp

    loss = reduce_policy_loss(
        per_token,
        inputs,
        agg=agg,
        is_weights=is_weights,
        token_weights=token_weights,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
        where=where,
    )
    metrics = {
        "policy/clip_frac": masked_fraction(above | below, inputs),
        "policy/clip_frac_high": masked_fraction(above, inputs),
        "policy/clip_frac_low": masked_fraction(below, inputs),
    }
    metrics.update(ratio_metrics(logr, ratio, inputs))
    return loss, stop_gradient_metrics(metrics)
