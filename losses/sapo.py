"""SAPO: a soft sigmoid gate on the importance ratio instead of PPO's hard clip (ALGORITHMS.md §5.4)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_positive
from losses._policy import (
    log_ratio,
    prepare_policy_inputs,
    ratio_metrics,
    reduce_policy_loss,
    stop_gradient_metrics,
    zero_outside,
)
from losses.aggregation import AggMode


def sapo_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    agg: AggMode = "seq_mean_token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Soft Adaptive Policy Optimization loss: a temperature-controlled sigmoid gate (§5.4).

    With `r = exp(clip(logp − old_logp, ±log_ratio_clamp))` and advantages `A`:

        τ = tau_pos if A > 0 else tau_neg
        g = (4/τ)·σ(τ·(r − 1)) ;  ℓ = −g·A
        loss = aggregate(ℓ · sg(is_weights) · token_weights, mask, agg)

    `dg/dr = 4·σ·(1 − σ)` is 1 at `r = 1` and decays smoothly away from it (faster for larger τ),
    so off-policy tokens are down-weighted instead of being cut off as by PPO's clip. At `r = 1`
    the gradient is the plain policy gradient (`reinforce_loss`), but the *value* is `−(2/τ)·A`,
    not `−A`: compare gradients, not values, with PPO. `A = 0` takes `tau_neg` (its loss is 0).

    Source: "Soft Adaptive Policy Optimization" (arXiv 2511.20347). Peers: verl `sapo` (forces
    `seq-mean-token-mean`), TRL `loss_type="sapo"`; both use these defaults (`tau_pos=1.0`,
    `tau_neg=1.05`, the paper's: the larger `tau_neg` makes the gate decay faster for negative
    advantages). `agg="seq_mean_token_mean"` is verl's forced mode.
    verl and TRL differ only in the ratio clamp (TRL: `log_ratio_clamp=None`).

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      old_logp: `[N,T]` log-probs of the policy that the batch is reused from; None means
        `sg(logp)` (ratio ≡ 1, on-policy).
      advantages: `[N,T]` (no gradient flows into them).
      mask: `[N,T]` {0,1} completion tokens that count.
      tau_pos: gate temperature for `A > 0` (> 0).
      tau_neg: gate temperature for `A ≤ 0` (> 0).
      agg: aggregation mode of `losses.aggregate`.
      is_weights: `[N,T]` rollout-correction weights (stop-gradient).
      token_weights: `[N,T]` selections that must not change the normaliser.
      log_ratio_clamp: bound of |logp − old_logp| inside `exp` (None: no clamp).
      num_tokens: global token count for `agg` (see `aggregate`).
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/gate_mean` (masked mean of `g`),
      `policy/approx_kl`, `policy/ratio_mean`, `policy/ratio_max`.

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[-1.0, -0.5]]); old = jnp.array([[-1.5, -0.5]])
      >>> loss, m = sapo_loss(logp, old, jnp.array([[1.0, -1.0]]), jnp.ones((1, 2)))
      >>> round(float(loss), 4), round(float(m["policy/gate_mean"]), 4)
      (-0.3611, 2.2658)
    """
    where = "sapo_loss"
    check_positive(tau_pos, "tau_pos", where=where)
    check_positive(tau_neg, "tau_neg", where=where)
    inputs = prepare_policy_inputs(logp, old_logp, advantages, mask, where=where)
    logr, ratio = log_ratio(inputs, log_ratio_clamp, where=where)
    adv = inputs.advantages

    tau = jnp.where(adv > 0, jnp.asarray(tau_pos, jnp.float32), jnp.asarray(tau_neg, jnp.float32))
    gate = zero_outside((4.0 / tau) * jax.nn.sigmoid(tau * (ratio - 1.0)), inputs.valid)
    per_token = -gate * adv

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
    metrics = {"policy/gate_mean": jnp.sum(gate) / count}
    metrics.update(ratio_metrics(logr, ratio, inputs))
    return loss, stop_gradient_metrics(metrics)
