"""PPO's clipped surrogate (with DAPO's clip-higher, dual clip and a ratio cap) and REINFORCE."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_above, check_positive
from losses._policy import (
    clip_terms,
    log_ratio,
    masked_fraction,
    prepare_policy_inputs,
    ratio_metrics,
    reduce_policy_loss,
    stop_gradient_metrics,
)
from losses.aggregation import AggMode


def ppo_clip_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ratio_cap: float | None = None,
    agg: AggMode = "token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """PPO clipped surrogate loss, as used by PPO, GRPO and DAPO (ALGORITHMS.md §5.1).

    With `r = exp(clip(logp − old_logp, ±log_ratio_clamp))` and advantages `A`:

        ℓ1 = −A·r ;  ℓ2 = −A·clip(r, 1 − ε_low, 1 + ε_high) ;  ℓ = max(ℓ1, ℓ2)
        ratio_cap δ:  ℓ = max(−A·min(r, δ), ℓ2)        (caps the unclipped branch; TRL's `delta`)
        dual_clip c:  ℓ = where(A < 0, min(ℓ, −c·A), ℓ)  (c > 1)
        loss = aggregate(ℓ · sg(is_weights) · token_weights, mask, agg)

    Sources: "Proximal Policy Optimization Algorithms" (arXiv 1707.06347); asymmetric clip-higher
    from "DAPO" (arXiv 2503.14476, ε_high = 0.28); dual clip from "Mastering Complex Control in MOBA
    Games with Deep Reinforcement Learning" (arXiv 1912.09729); two-sided ratio cap from the
    INTELLECT-2 report (arXiv 2505.07291). Peers: verl `vanilla` = `dual_clip=3.0`; TRL =
    `log_ratio_clamp=None, ratio_cap=delta`; OpenRLHF and Tunix `grpo_loss_fn` = defaults (+
    `dual_clip`); Tunix `ppo_policy_loss_fn` = `log_ratio_clamp=None, dual_clip=epsilon_c`.

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      old_logp: `[N,T]` log-probs of the policy that the batch is reused from; None means
        `sg(logp)` (ratio ≡ 1, on-policy).
      advantages: `[N,T]` (no gradient flows into them).
      mask: `[N,T]` {0,1} completion tokens that count.
      clip_low: ε_low (ratio floor 1 − ε_low for negative advantages).
      clip_high: ε_high (ratio ceiling 1 + ε_high for positive advantages).
      dual_clip: c > 1 floors the loss of negative advantages at `c·|A|`; None disables it.
      ratio_cap: δ caps the unclipped ratio from above; None disables it.
      agg: aggregation mode of `losses.aggregate`.
      is_weights: `[N,T]` rollout-correction weights (stop-gradient), e.g. from
        `rollout_correction_weights`.
      token_weights: `[N,T]` selections that must not change the normaliser (entropy masks).
      log_ratio_clamp: bound of |logp − old_logp| inside `exp` (None: no clamp).
      num_tokens: global token count for `agg` (see `aggregate`).
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/clip_frac`, `policy/clip_frac_high`,
      `policy/clip_frac_low`, `policy/dual_clip_frac`, `policy/approx_kl`, `policy/ratio_mean`,
      `policy/ratio_max`.

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[-1.0, -0.5]]); old = jnp.array([[-1.5, -0.5]])
      >>> loss, m = ppo_clip_loss(logp, old, jnp.array([[1.0, 1.0]]), jnp.ones((1, 2)))
      >>> round(float(loss), 4), float(m["policy/clip_frac_high"])
      (-1.1, 0.5)
    """
    where = "ppo_clip_loss"
    check_positive(clip_low, "clip_low", where=where, allow_zero=True)
    check_positive(clip_high, "clip_high", where=where, allow_zero=True)
    check_above(dual_clip, 1.0, "dual_clip", where=where, none_ok="no dual clip")
    check_above(ratio_cap, 1.0, "ratio_cap", where=where, none_ok="no cap")
    inputs = prepare_policy_inputs(logp, old_logp, advantages, mask, where=where)
    logr, ratio = log_ratio(inputs, log_ratio_clamp, where=where)
    adv = inputs.advantages

    loss_unclipped, loss_clipped = clip_terms(adv, ratio, clip_low, clip_high)
    per_token = jnp.maximum(loss_unclipped, loss_clipped)
    if ratio_cap is not None:
        per_token = jnp.maximum(-adv * jnp.minimum(ratio, ratio_cap), loss_clipped)
    metrics = {
        "policy/clip_frac": masked_fraction(loss_clipped > loss_unclipped, inputs),
        "policy/clip_frac_high": masked_fraction((adv > 0) & (ratio > 1.0 + clip_high), inputs),
        "policy/clip_frac_low": masked_fraction((adv < 0) & (ratio < 1.0 - clip_low), inputs),
    }
    if dual_clip is not None:
        per_token = jnp.where(adv < 0, jnp.minimum(per_token, -dual_clip * adv), per_token)
        metrics["policy/dual_clip_frac"] = masked_fraction((adv < 0) & (ratio > dual_clip), inputs)
    else:
        metrics["policy/dual_clip_frac"] = jnp.zeros((), jnp.float32)

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
    metrics.update(ratio_metrics(logr, ratio, inputs))
    return loss, stop_gradient_metrics(metrics)


def reinforce_loss(
    logp: ArrayLike,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    agg: AggMode = "token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Plain policy-gradient (REINFORCE / GPG) loss (ALGORITHMS.md §5.7).

        ℓ = −A·logp · sg(is_weights) · token_weights ;  loss = aggregate(ℓ, mask, agg)

    Its gradient `−A·w/D·∇logp` equals the gradient of `ppo_clip_loss` at ratio 1. With
    `is_weights = min(π_θ/π_rollout, c)` it is truncated-IS REINFORCE (AIPO in LlamaRL).
    Sources: Williams, "Simple statistical gradient-following algorithms for connectionist
    reinforcement learning" (1992); "GPG: A Simple and Strong Reinforcement Learning Baseline for
    Model Reasoning" (arXiv 2504.02546). Peers: verl `gpg`, `compute_policy_loss_reinforce`.

    Args:
      logp: `[N,T]` log-probs of the current policy.
      advantages: `[N,T]` (no gradient).
      mask: `[N,T]` {0,1}.
      agg: aggregation mode of `losses.aggregate`.
      is_weights: `[N,T]` stop-gradient importance weights.
      token_weights: `[N,T]` token selections that keep the normaliser.
      num_tokens: global token count for `agg`.
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)` with `policy/advantage_mean` (masked) and `policy/logp_mean`.

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, _ = reinforce_loss(jnp.array([[-1.0, -2.0]]), jnp.array([[1.0, 1.0]]), jnp.ones((1, 2)))
      >>> float(loss)
      1.5
    """
    where = "reinforce_loss"
    inputs = prepare_policy_inputs(logp, None, advantages, mask, where=where)
    per_token = -inputs.advantages * inputs.logp
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
    count = jnp.maximum(jnp.sum(inputs.mask), 1.0)
    metrics = {
        "policy/advantage_mean": jnp.sum(inputs.advantages) / count,
        "policy/logp_mean": jnp.sum(inputs.logp) / count,
    }
    return loss, stop_gradient_metrics(metrics)
