"""R²VPO: the unclipped IS surrogate with a ratio-variance constraint and its dual variable (§11)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import as_float32, check_choice, check_positive, check_real
from losses._policy import (
    log_ratio,
    prepare_policy_inputs,
    ratio_metrics,
    reduce_policy_loss,
    stop_gradient_metrics,
)
from losses.aggregation import AggMode


def ratio_variance_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    lam: ArrayLike,
    target: float,
    ddof: int = 1,
    agg: AggMode = "token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Ratio-variance regularised policy loss, the primal step of R²VPO (ALGORITHMS.md §11).

    With `r = exp(clip(logp − old_logp, ±log_ratio_clamp))`, advantages `A` and the dual
    variable `λ ≥ 0` (no gradient):

        loss = aggregate(−A·r · sg(is_weights) · token_weights, mask, agg)
               + λ·(masked_var(r, mask, ddof) − target)

    The surrogate is PPO's without the clip; instead of truncating the gradient of far
    off-policy tokens, the second central moment of the ratio over the valid tokens of the batch
    is kept near `target` by the Lagrangian term, whose multiplier `λ` is updated by
    `dual_ascent_update` from `metrics["policy/ratio_var"]`. At `r ≡ 1` the variance and its
    gradient vanish and the loss gradient is `reinforce_loss`'s.

    Assumptions (reconstructed — verify against the paper; the formula is ALGORITHMS.md §11's
    `new*` row): the variance is over all valid tokens of the (global) batch with `ddof`
    (default 1, as `masked_var`); `is_weights`/`token_weights` weight the surrogate only; the
    variance is not divided by any aggregation count. `lam` and `target` have no defaults (the
    paper's values are not recorded).

    Source: "Ratio-Variance Regularized Policy Optimization for Efficient LLM Fine-tuning"
    (R²VPO; no arXiv id recorded in ALGORITHMS.md). No peer implements it.

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      old_logp: `[N,T]` log-probs of the policy that the batch is reused from; None means
        `sg(logp)` (ratio ≡ 1).
      advantages: `[N,T]` (no gradient).
      mask: `[N,T]` {0,1} completion tokens that count.
      lam: the dual variable λ ≥ 0 (scalar, may be traced; required).
      target: the variance budget (≥ 0; required).
      ddof: delta degrees of freedom of the variance (0 or 1).
      agg: aggregation mode of the surrogate.
      is_weights: `[N,T]` rollout-correction weights (stop-gradient) of the surrogate.
      token_weights: `[N,T]` selections of the surrogate that keep the normaliser.
      log_ratio_clamp: bound of |logp − old_logp| inside `exp` (None: no clamp).
      num_tokens: global token count for `agg`.
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/ratio_var` (feed it to
      `dual_ascent_update`), `policy/surrogate` (the aggregated `−A·r`), `policy/lambda`,
      `policy/approx_kl`, `policy/ratio_mean`, `policy/ratio_max`.

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.log(jnp.array([[1.5, 0.5]])); old = jnp.zeros((1, 2))
      >>> loss, m = ratio_variance_loss(logp, old, jnp.ones((1, 2)), jnp.ones((1, 2)), lam=2.0, target=0.1)
      >>> round(float(loss), 4), round(float(m["policy/ratio_var"]), 4)
      (-0.2, 0.5)
    """
    where = "ratio_variance_loss"
    check_choice(ddof, (0, 1), "ddof", where=where)
    check_positive(target, "target", where=where, allow_zero=True)
    _check_dual(lam, "lam", where)
    inputs = prepare_policy_inputs(logp, old_logp, advantages, mask, where=where)
    logr, ratio = log_ratio(inputs, log_ratio_clamp, where=where)

    surrogate = reduce_policy_loss(
        -inputs.advantages * ratio,
        inputs,
        agg=agg,
        is_weights=is_weights,
        token_weights=token_weights,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
        where=where,
    )
    count = jnp.sum(inputs.mask)
    mean = jnp.sum(ratio) / jnp.maximum(count, 1.0)
    centred = jnp.where(inputs.valid, ratio - mean, 0.0)
    var = jnp.sum(centred**2) / jnp.maximum(count - ddof, 1.0)
    lam = jax.lax.stop_gradient(as_float32(lam))
    loss = surrogate + lam * (var - target)

    metrics = {"policy/ratio_var": var, "policy/surrogate": surrogate, "policy/lambda": lam}
    metrics.update(ratio_metrics(logr, ratio, inputs))
    return loss, stop_gradient_metrics(metrics)


def _check_dual(lam: Any, name: str, where: str) -> None:
    if lam is None:
        raise ValueError(f"{where}: `{name}` is required (the dual variable λ ≥ 0), got None.")
    check_real(lam, name, where=where)
    if jnp.ndim(lam) != 0:
        raise ValueError(f"{where}: `{name}` must be a scalar, got shape {jnp.shape(lam)}.")
    check_positive(lam, name, where=where, allow_zero=True)


def dual_ascent_update(lam: ArrayLike, ratio_var: ArrayLike, *, lr: float, target: float) -> Array:
    """One projected dual-ascent step on the R²VPO multiplier (ALGORITHMS.md §11).

        λ ← max(0, λ + lr·(ratio_var − target))

    λ grows while the measured ratio variance exceeds its budget and decays (never below 0)
    when it is within budget. Pure and jittable: the trainer keeps λ in its state and passes it
    to `ratio_variance_loss(lam=...)`. The step size and budget are (reconstructed — verify
    against the paper). Source: "Ratio-Variance Regularized Policy Optimization for Efficient
    LLM Fine-tuning" (R²VPO).

    Args:
      lam: current λ ≥ 0 (scalar).
      ratio_var: measured variance, e.g. `metrics["policy/ratio_var"]` (scalar, no gradient).
      lr: dual step size (> 0).
      target: the variance budget (≥ 0).

    Returns:
      The new λ, a float32 scalar under stop-gradient.

    Examples:
      >>> round(float(dual_ascent_update(0.5, 0.3, lr=2.0, target=0.1)), 4)
      0.9
      >>> float(dual_ascent_update(0.1, 0.0, lr=2.0, target=0.1))
      0.0
    """
    where = "dual_ascent_update"
    _check_dual(lam, "lam", where)
    check_real(ratio_var, "ratio_var", where=where)
    if jnp.ndim(ratio_var) != 0:
        raise ValueError(
            f"{where}: `ratio_var` must be a scalar, got shape {jnp.shape(ratio_var)}."
        )
    check_positive(lr, "lr", where=where)
    check_positive(target, "target", where=where, allow_zero=True)
    lam = as_float32(lam)
    step = lr * (as_float32(ratio_var) - target)
    return jax.lax.stop_gradient(jnp.maximum(lam + step, 0.0))
