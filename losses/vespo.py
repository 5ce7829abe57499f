"""VESPO: REINFORCE weighted by a gamma-shaped function of the sequence importance ratio (§5.13)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_positive
from losses._policy import (
    clamp_log_ratio,
    log_ratio,
    prepare_policy_inputs,
    prepare_weights,
    ratio_metrics,
    reduce_policy_loss,
    stop_gradient_metrics,
    zero_outside,
)
from losses.aggregation import AggMode

_LOG_W_MIN = math.log(1e-8)
_LOG_W_MAX = 20.0


def _sequence_log_weight(
    logr: Array, log_ratio_clamp: Any, is_weights: Any, inputs: Any, where: str
) -> Array:
    """`log w_n` `[N,1]`: the clipped sum of token log-ratios and log rollout-IS weights."""
    clamped = clamp_log_ratio(logr, log_ratio_clamp, where=where)
    total = jnp.sum(zero_outside(clamped, inputs.valid), axis=1, keepdims=True)
    if is_weights is not None:
        w = prepare_weights(is_weights, "is_weights", inputs, where, stop_gradient=True)
        log_is = jnp.clip(jnp.log(w), _LOG_W_MIN, _LOG_W_MAX)  # log 0 = −inf → log 1e-8
        total = total + jnp.sum(zero_outside(log_is, inputs.valid), axis=1, keepdims=True)
    return jnp.clip(total, _LOG_W_MIN, _LOG_W_MAX)


def vespo_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    agg: AggMode = "token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """VESPO loss: a smooth, sign-dependent reweighting of the sequence ratio (§5.13).

    With `logr = logp − old_logp` and rollout-correction weights `is_w` (1 if None):

        log w_n = clip(Σ_t clip(logr, ±log_ratio_clamp)·m + Σ_t clip(log is_w, log 1e-8, 20)·m,
                       log 1e-8, 20)                                   (sequence ratio, product)
        (k, λ)  = (k_pos, λ_pos) if A ≥ 0 else (k_neg, λ_neg)          (per token)
        φ       = sg(exp(λ + k·log w − λ·w)) = sg(w^k·e^{λ(1 − w)})    (non-finite → 0)
        ℓ       = −φ·A·logp ;  loss = aggregate(ℓ · token_weights, mask, agg)

    `φ` is an unnormalised gamma density in `w`: 1 at `w = 1`, peaking at `w = k/λ` and decaying
    to 0 for both vanishing and exploding ratios, so far off-policy sequences lose weight
    smoothly instead of being clipped. The default shapes let positive advantages trust slightly
    stale sequences less (peak 2/3) than negative ones (peak 3/2). On-policy (`w = 1`) the loss
    is `reinforce_loss`. Rollout IS weights enter only through `w` (they are not multiplied into
    `ℓ` again), unlike every other policy loss.

    Source: the VESPO loss of TRL (the paper is not recorded in ALGORITHMS.md); defaults are
    TRL's. Peer: TRL `loss_type="vespo"` (`agg="token_mean"` with `num_tokens` = tokens of the
    generation batch).

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      old_logp: `[N,T]` log-probs of the policy that the batch is reused from; None means
        `sg(logp)` (w ≡ 1, on-policy).
      advantages: `[N,T]` (no gradient); usually one value per sequence.
      mask: `[N,T]` {0,1} completion tokens that count.
      k_pos: shape `k` for `A ≥ 0` (> 0).
      lambda_pos: rate `λ` for `A ≥ 0` (> 0).
      k_neg: shape `k` for `A < 0` (> 0).
      lambda_neg: rate `λ` for `A < 0` (> 0).
      agg: aggregation mode of `losses.aggregate`.
      is_weights: `[N,T]` rollout-correction weights (stop-gradient), folded into `w`.
      token_weights: `[N,T]` selections that must not change the normaliser.
      log_ratio_clamp: bound of each token's |logp − old_logp| in the sum (None: no clamp).
      num_tokens: global token count for `agg` (see `aggregate`).
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/vespo_weight_mean` (masked token mean of
      `φ`), `policy/seq_ratio_mean` (mean of `w` over sequences with tokens),
      `policy/approx_kl`, `policy/ratio_mean`, `policy/ratio_max` (token ratios).

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[-1.0, -0.5]]); old = jnp.array([[-1.2, -0.5]])
      >>> loss, m = vespo_loss(logp, old, jnp.ones((1, 2)), jnp.ones((1, 2)))
      >>> round(float(loss), 4), round(float(m["policy/vespo_weight_mean"]), 4)
      (0.5759, 0.7678)
    """
    where = "vespo_loss"
    for name, value in (
        ("k_pos", k_pos),
        ("lambda_pos", lambda_pos),
        ("k_neg", k_neg),
        ("lambda_neg", lambda_neg),
    ):
        check_positive(value, name, where=where)
    inputs = prepare_policy_inputs(logp, old_logp, advantages, mask, where=where)
    logr, ratio = log_ratio(inputs, log_ratio_clamp, where=where)
    adv = inputs.advantages

    log_w = jax.lax.stop_gradient(
        _sequence_log_weight(logr, log_ratio_clamp, is_weights, inputs, where)
    )
    w = jnp.exp(log_w)
    k = jnp.where(adv >= 0, jnp.asarray(k_pos, jnp.float32), jnp.asarray(k_neg, jnp.float32))
    lam = jnp.where(
        adv >= 0, jnp.asarray(lambda_pos, jnp.float32), jnp.asarray(lambda_neg, jnp.float32)
    )
    phi = jnp.exp(lam + k * log_w - lam * w)
    phi = jax.lax.stop_gradient(zero_outside(jnp.where(jnp.isfinite(phi), phi, 0.0), inputs.valid))
    per_token = -phi * adv * inputs.logp

    loss = reduce_policy_loss(
        per_token,
        inputs,
        agg=agg,
        token_weights=token_weights,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
        where=where,
    )
    count = jnp.maximum(jnp.sum(inputs.mask), 1.0)
    has_tokens = jnp.sum(inputs.mask, axis=1) > 0
    n_seq = jnp.maximum(jnp.sum(has_tokens.astype(jnp.float32)), 1.0)
    metrics = {
        "policy/vespo_weight_mean": jnp.sum(phi) / count,
        "policy/seq_ratio_mean": jnp.sum(jnp.where(has_tokens, w[:, 0], 0.0)) / n_seq,
    }
    metrics.update(ratio_metrics(logr, ratio, inputs))
    return loss, stop_gradient_metrics(metrics)
