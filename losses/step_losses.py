"""Losses on steps and on soft-Bellman residuals: progress attribution, OREO, DAPO-step, AWR.

Conventions: step inputs are `[N,M]` with a `mask[N,M]` (1 = valid step); token inputs `[N,T]`.
Masked entries are replaced by 0 before any arithmetic, so NaN/inf there reaches neither the loss
nor a gradient. Per-entry losses are reduced with `aggregate` (§1.5; for step layouts a "token"
is a step), whose global normalisers (`num_tokens`, `num_seqs`, `norm_length`) keep a batch's
loss equal to the sum of its micro-batches' losses. Every loss returns `(loss, metrics)`; the
metrics are float32 scalars under stop-gradient (§0.8). All formulas here come from §11 rows
marked `new*`: (reconstructed — verify against the paper).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_choice,
    check_floating,
    check_positive,
    check_rank,
    check_real,
    check_same_shape,
    global_count,
)
from losses._policy import stop_gradient_metrics
from losses.aggregation import AGG_MODES, AggMode, aggregate
from losses.segments import _zero_outside

_sg = jax.lax.stop_gradient


def _masked_inputs(
    where: str, mask: Any, first: tuple[str, Any], **others: Any
) -> tuple[list[Array], Array]:
    """Validate rank-2 float inputs of one shape and a mask; return them zeroed off-mask."""
    name, x = first
    check_rank(x, 2, name, where=where)
    check_same_shape(x, name, where, **others)
    arrays = []
    for key, value in ((name, x), *others.items()):
        check_floating(value, key, where=where)
        arrays.append(as_float32(value))
    m = as_mask(mask, jnp.shape(x), where=where)
    valid = m > 0
    return [_zero_outside(a, valid) for a in arrays], m


def _masked_mean(x: Array, m: Array) -> Array:
    return jnp.sum(_zero_outside(x, m > 0)) / jnp.maximum(jnp.sum(m), 1.0)


def _masked_max(x: Array, m: Array) -> Array:
    return jnp.where(jnp.any(m > 0), jnp.max(jnp.where(m > 0, x, -jnp.inf)), 0.0)


def progress_attribution_loss(
    contributions: ArrayLike,
    mask: ArrayLike,
    returns: ArrayLike,
    *,
    num_seqs: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Return decomposition: step contributions must add up to the outcome (ALGORITHMS.md §11).

        ℓ_n  = (Σ_m c_nm m_nm − R_n)²
        loss = Σ_n valid_n ℓ_n / D_seq,   D_seq = num_seqs or max(#rows with a valid step, 1)

    `c_nm` is a progress estimator's contribution of step `m` (differentiable), `R_n` the episode
    return. Once trained, `c` (plus a grounding bonus, `c + α·grounded` in SPA-RL, added by the
    caller) serves as a dense step reward. Rows without a valid step contribute 0 and are not
    counted. The mean over rows is (reconstructed — verify against the paper).

    Sources: SPA-RL (stepwise progress attribution; seed paper); LaRe (return decomposition;
    seed paper). No peer.

    Args:
      contributions: `[N,M]` predicted per-step contributions `c` (differentiable).
      mask: `[N,M]` {0,1} valid steps.
      returns: `[N]` episode returns `R` (no gradient).
      num_seqs: global number of rows with a valid step (micro-batching); None: this batch's.

    Returns:
      `(loss, metrics)`: float32 scalar and `rm/progress_abs_error` (mean |Σc − R| over counted
      rows), `rm/progress_sum_mean` (mean Σc over counted rows).

    Examples:
      >>> import jax.numpy as jnp
      >>> c = jnp.array([[0.25, 0.5, 0.0], [1.0, 0.0, 0.0]]); m = jnp.array([[1, 1, 0], [1, 0, 0]])
      >>> loss, _ = progress_attribution_loss(c, m, jnp.array([1.0, 0.5]))
      >>> float(loss)                          # ((0.75 − 1)² + (1 − 0.5)²) / 2
      0.15625
    """
    where = "progress_attribution_loss"
    (c,), m = _masked_inputs(where, mask, ("contributions", contributions))
    check_rank(returns, 1, "returns", where=where)
    check_real(returns, "returns", where=where)
    N = c.shape[0]
    if jnp.shape(returns) != (N,):
        raise ValueError(
            f"{where}: `returns` must hold one return per row of `contributions` ({N},), "
            f"got shape {jnp.shape(returns)}."
        )
    rows = jnp.sum(m, axis=1) > 0
    R = _sg(_zero_outside(as_float32(returns), rows))
    residual = _zero_outside(jnp.sum(c, axis=1) - R, rows)
    count = jnp.maximum(jnp.sum(rows.astype(jnp.float32)), 1.0)
    den = count if num_seqs is None else global_count(num_seqs, count, "num_seqs", where=where)
    loss = jnp.sum(residual**2) / den
    metrics = {
        "rm/progress_abs_error": jnp.sum(jnp.abs(residual)) / count,
        "rm/progress_sum_mean": jnp.sum(_zero_outside(jnp.sum(c, axis=1), rows)) / count,
    }
    return loss, stop_gradient_metrics(metrics)


def soft_bellman_losses(
    logp: ArrayLike,
    ref_logp: ArrayLike,
    values: ArrayLike,
    returns: ArrayLike,
    mask: ArrayLike,
    *,
    beta: float,
    value_coef: float = 1.0,
    agg: AggMode = "token_mean",
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """OREO's soft-Bellman policy and value losses (ALGORITHMS.md §11).

        S_t  = Σ_{u≥t} (logp_u − ref_logp_u)·m_u              (KL-to-go of the sampled tokens)
        δ_t  = V_t − R + β·S_t                               (0 under the soft Bellman equation)
        ℓ_V  = (V_t − R + β·sg(S_t))²   ;   ℓ_π = (sg(V_t) − R + β·S_t)²
        loss = aggregate(ℓ_π, m, agg) + value_coef·aggregate(ℓ_V, m, agg)

    Each side sees the other under stop-gradient, so the one scalar trains both: the value head
    only through `ℓ_V`, the policy only through `ℓ_π` (both metrics are reported). `V_t` is the
    value of the state before token `t`; the terminal value is 0 and `R` (the outcome reward of
    the response) sits at the end, so `V_t` must predict `R − β·S_t`. The per-token form of the
    policy term, the aggregation and `value_coef` are (reconstructed — verify against the
    paper); ALGORITHMS.md's `v[N,T+1]` is taken as `[N,T]` since only `V_t`, `t < T`, enters.

    Source: "Offline Reinforcement Learning for LLM Multi-Step Reasoning" (OREO, arXiv
    2412.16145). No peer.

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      ref_logp: `[N,T]` log-probs of the reference policy (no gradient).
      values: `[N,T]` value predictions `V_t` (differentiable).
      returns: `[N]` outcome reward `R` of each response (no gradient).
      mask: `[N,T]` {0,1} valid tokens.
      beta: KL coefficient β (> 0).
      value_coef: weight of the value loss in the returned scalar (>= 0).
      agg: aggregation mode of `losses.aggregate`.
      num_tokens: global token count for `agg`.
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: float32 scalar and `policy/soft_bellman_loss`,
      `value/soft_bellman_loss`, `value/mean` (masked mean of `V`), `kl/log_ratio_mean` (masked
      mean of `logp − ref_logp`).

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-1.0, -1.0]]); ref = jnp.array([[-1.5, -1.0]]); v = jnp.array([[0.5, 1.0]])
      >>> loss, m = soft_bellman_losses(lp, ref, v, jnp.array([1.0]), jnp.ones((1, 2)), beta=0.5)
      >>> round(float(loss), 4), round(float(m["value/soft_bellman_loss"]), 4)   # δ = [−0.25, 0]
      (0.0625, 0.0312)
    """
    where = "soft_bellman_losses"
    check_positive(beta, "beta", where=where)
    check_positive(value_coef, "value_coef", where=where, allow_zero=True)
    check_choice(agg, AGG_MODES, "agg", where=where)
    (lp, ref, V), m = _masked_inputs(where, mask, ("logp", logp), ref_logp=ref_logp, values=values)
    check_rank(returns, 1, "returns", where=where)
    check_real(returns, "returns", where=where)
    N = lp.shape[0]
    if jnp.shape(returns) != (N,):
        raise ValueError(
            f"{where}: `returns` must hold one reward per row of `logp` ({N},), "
            f"got shape {jnp.shape(returns)}."
        )
    rows = jnp.sum(m, axis=1) > 0
    R = _sg(_zero_outside(as_float32(returns), rows))[:, None]
    log_ratio = lp - _sg(ref)
    kl_to_go = jnp.flip(jnp.cumsum(jnp.flip(log_ratio, 1), axis=1), 1)
    b = jnp.asarray(beta, lp.dtype)
    value_residual = V - R + b * _sg(kl_to_go)
    policy_residual = _sg(V) - R + b * kl_to_go
    agg_kw = {
        "mode": agg,
        "num_tokens": num_tokens,
        "num_seqs": num_seqs,
        "norm_length": norm_length,
    }
    policy_loss = aggregate(_zero_outside(policy_residual**2, m > 0), m, **agg_kw)
    value_loss = aggregate(_zero_outside(value_residual**2, m > 0), m, **agg_kw)
    loss = policy_loss + jnp.asarray(value_coef, lp.dtype) * value_loss
    metrics = {
        "policy/soft_bellman_loss": policy_loss,
        "value/soft_bellman_loss": value_loss,
        "value/mean": _masked_mean(V, m),
        "kl/log_ratio_mean": _masked_mean(log_ratio, m),
    }
    return loss, stop_gradient_metrics(metrics)


def direct_advantage_step_loss(
    step_log_ratio: ArrayLike,
    step_adv: ArrayLike,
    mask: ArrayLike,
    *,
    beta: float,
    agg: AggMode = "token_mean",
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Direct Advantage Policy Optimization's quadratic step loss (ALGORITHMS.md §11).

        ℓ_nk = (β·lr_nk − A_nk)² ;   loss = aggregate(ℓ, mask, agg)   (token_mean = masked mean)

    `lr_nk = Σ_{t∈step k} (logp_t − ref_logp_t)` is the step's log-ratio to the reference
    (`segment_reduce(logp − ref_logp, seg, mask, op="sum")`), `A_nk` its advantage from a critic
    or from Monte-Carlo boundary values (`step_advantages`). The loss regresses the step's
    scaled log-ratio onto its advantage, the offline analogue of a KL-regularised policy step.
    The plain masked mean over steps and the absence of a ½ factor are (reconstructed — verify
    against the paper).

    Source: "Direct Advantage Policy Optimization" (DAPO-step, arXiv 2412.18279). No peer.

    Args:
      step_log_ratio: `[N,M]` step log-ratios (differentiable).
      step_adv: `[N,M]` step advantages (no gradient).
      mask: `[N,M]` {0,1} valid steps.
      beta: β (> 0).
      agg: aggregation mode of `losses.aggregate` over steps.
      num_tokens: global step count for `agg`.
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: float32 scalar and `policy/step_log_ratio_mean`,
      `policy/step_residual_abs` (masked mean of |β·lr − A|).

    Examples:
      >>> import jax.numpy as jnp
      >>> lr = jnp.array([[0.5, -1.0]]); A = jnp.array([[1.0, 0.0]])
      >>> loss, _ = direct_advantage_step_loss(lr, A, jnp.ones((1, 2)), beta=1.0)
      >>> float(loss)                          # ((0.5 − 1)² + (−1)²) / 2
      0.625
    """
    where = "direct_advantage_step_loss"
    check_positive(beta, "beta", where=where)
    check_choice(agg, AGG_MODES, "agg", where=where)
    (lr, adv), m = _masked_inputs(
        where, mask, ("step_log_ratio", step_log_ratio), step_adv=step_adv
    )
    residual = jnp.asarray(beta, lr.dtype) * lr - _sg(adv)
    loss = aggregate(
        residual**2,
        m,
        mode=agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    metrics = {
        "policy/step_log_ratio_mean": _masked_mean(lr, m),
        "policy/step_residual_abs": _masked_mean(jnp.abs(residual), m),
    }
    return loss, stop_gradient_metrics(metrics)


_MAX_LOG_WEIGHT = 60.0  # AWR's weights stay below e^60 ≈ 1e26: a sum of w·logp stays finite


def awr_loss(
    step_logp: ArrayLike,
    step_adv: ArrayLike,
    mask: ArrayLike,
    *,
    beta: float,
    max_weight: float | None = None,
    agg: AggMode = "token_mean",
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Advantage-weighted regression on steps (ALGORITHMS.md §11).

        w_nk = sg(min(exp(A_nk/β), max_weight)) ;   ℓ_nk = −w_nk·lp_nk ;   loss = aggregate(ℓ, mask, agg)

    `lp_nk` is the log-prob of step `k` (`segment_reduce(logp, seg, mask, op="sum")`), `A_nk` its
    advantage (e.g. `step_advantages` from Monte-Carlo rollouts of the prefix). Steps with a high
    advantage are imitated more; with `token_mean` the loss is `−masked_mean(exp(A/β)·lp)`.
    `max_weight=None` leaves the weights unclipped, as the formula, up to `e^60` (`exp(A/β)`
    overflowed float32 from `A/β > 88.7` and the loss became inf or NaN); AWR implementations usually
    cap them (e.g. 20) because `exp(A/β)` grows without bound. The step-level form and the
    masked mean are (reconstructed — verify against the paper).

    Sources: "RL on Incorrect Synthetic Data Scales the Efficiency of LLM Math Reasoning by
    Eight-Fold" (arXiv 2406.14532); AWR, "Advantage-Weighted Regression: Simple and Scalable
    Off-Policy Reinforcement Learning" (arXiv 1910.00177). No peer.

    Args:
      step_logp: `[N,M]` step log-probs (differentiable).
      step_adv: `[N,M]` step advantages (no gradient).
      mask: `[N,M]` {0,1} valid steps.
      beta: temperature β (> 0).
      max_weight: cap of the weights (> 0), or None.
      agg: aggregation mode of `losses.aggregate` over steps.
      num_tokens: global step count for `agg`.
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: float32 scalar and `policy/awr_weight_mean`, `policy/awr_weight_max`,
      `policy/logp_mean` (masked means over valid steps).

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-1.0, -2.0]]); A = jnp.array([[0.0, 0.0]])
      >>> loss, m = awr_loss(lp, A, jnp.ones((1, 2)), beta=1.0)
      >>> float(loss), float(m["policy/awr_weight_mean"])
      (1.5, 1.0)
    """
    where = "awr_loss"
    check_positive(beta, "beta", where=where)
    if max_weight is not None:
        check_positive(max_weight, "max_weight", where=where)
    check_choice(agg, AGG_MODES, "agg", where=where)
    (lp, adv), m = _masked_inputs(where, mask, ("step_logp", step_logp), step_adv=step_adv)
    exponent = _sg(adv) / jnp.asarray(beta, lp.dtype)
    cap = _MAX_LOG_WEIGHT if max_weight is None else jnp.log(jnp.asarray(max_weight, lp.dtype))
    exponent = jnp.minimum(exponent, cap)
    weights = _sg(_zero_outside(jnp.exp(exponent), m > 0))
    loss = aggregate(
        -weights * lp,
        m,
        mode=agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    metrics = {
        "policy/awr_weight_mean": _masked_mean(weights, m),
        "policy/awr_weight_max": _masked_max(weights, m),
        "policy/logp_mean": _masked_mean(lp, m),
    }
    return loss, stop_gradient_metrics(metrics)
