"""KL estimators, the KL loss, KL-penalised rewards and KL-coefficient control (ALGORITHMS.md §3).

With `d = logp − ref_logp` on tokens sampled from `π_θ` (Schulman, "Approximating KL Divergence",
2020): `E[k1] = E[k3] = KL(π_θ‖π_ref)`, k3 ≥ 0 with lower variance. As a loss, `∇k1 = ∇logp` has
zero mean, `∇k2 = d·∇logp` is unbiased for `∇KL(π_θ‖π_ref)`, and `∇k3 = (1 − e^{−d})·∇logp`
estimates `∇KL(π_ref‖π_θ)` ("A Comedy of Estimators", arXiv 2512.21852). Hence (§3.4): in the
reward use k1; as a loss use k3, k2 or k3 with `straight_through` — never k1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

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
    check_same_shape,
)
from losses._policy import EXP_SAFE_MAX, clamp_log_ratio
from losses.aggregation import AggMode, aggregate
from losses.logprobs import (
    _check_chunk_size,
    _check_logits,
    _check_temperature,
    _full_kl_chunk,
    _map_over_positions,
)

Estimator = Literal["k1", "k2", "k3", "abs"]
ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "abs")


def _zero_outside(x: Array, valid: Array | None) -> Array:
    return x if valid is None else jnp.where(valid, x, jnp.zeros((), x.dtype))


def _check_clamp(value: Any, name: str, *, where: str) -> None:
    if value is not None:
        check_positive(value, name, where=where)


def _masked_max(x: Array, valid: Array) -> Array:
    best = jnp.max(jnp.where(valid, x, -jnp.inf))
    return jnp.where(jnp.any(valid), best, 0.0)


# --------------------------------------------------------------------------------------------------
# estimators
# --------------------------------------------------------------------------------------------------


_ST_CAP = 1e18  # |d| cap inside the straight-through term: ½·(1e18)² is still finite


def _estimate(
    d: Array,
    estimator: str,
    straight_through: bool,
    clamp: Any,
    log_ratio_clamp: Any,
) -> Array:
    """The estimator's value at `d = logp − ref_logp` (already zero outside the mask)."""
    if estimator == "k1":
        value = d
    elif estimator == "abs":
        value = jnp.abs(d)
    elif estimator == "k2":
        # clamped through `d` (the same value as clipping ½d², whose gradient is inf·0 = NaN
        # where the reference gives the token probability 0: d = +inf)
        bound = None if clamp is None else jnp.sqrt(2.0 * jnp.asarray(clamp, jnp.float32))
        dc = d if bound is None else jnp.clip(d, -bound, bound)
        value = 0.5 * jnp.square(dc)
    else:  # k3
        # no clamp: exp(−d) still finite (d ≥ −80), so a value clamp's gradient is 0, not NaN
        dh = (
            jnp.maximum(d, -EXP_SAFE_MAX)
            if log_ratio_clamp is None
            else jnp.clip(d, -log_ratio_clamp, log_ratio_clamp)
        )
        value = jnp.expm1(-dh) + dh
    if clamp is not None:
        value = jnp.clip(value, -clamp, clamp)
    if straight_through and estimator != "k2":
        # the value of the estimator, the gradient of k2: sg(f) + (b − sg(b)), b = ½d²
        b = 0.5 * jnp.square(jnp.clip(d, -_ST_CAP, _ST_CAP))  # d = ±inf: finite, not inf − inf
        value = jax.lax.stop_gradient(value) + (b - jax.lax.stop_gradient(b))
    return value


def kl_estimate(
    logp: ArrayLike,
    ref_logp: ArrayLike,
    *,
    estimator: Estimator = "k1",
    straight_through: bool = False,
    clamp: float | None = None,
    log_ratio_clamp: float | None = 20.0,
    mask: ArrayLike | None = None,
) -> Array:
    """Per-token KL estimate from sampled log-probs, `d = logp − ref_logp` (ALGORITHMS.md §3.1).

        k1 = d ;  abs = |d| ;  k2 = ½d² ;  k3 = exp(−d̂) − 1 + d̂,  d̂ = clip(d, ±log_ratio_clamp)

    `clamp=c` clips the value of any estimator to `[−c, c]`. `straight_through=True` (verl's
    `"<name>+"`) returns `sg(f) + (b − sg(b))` with `f` the chosen (clamped) estimator and
    `b = ½d²`: the value of `f` with the gradient of k2 (`d·∇logp`); for `k2` itself it is plain
    k2, as in verl. ALGORITHMS.md writes `f + (b − sg(b))`, whose gradient would be
    `∇f + d·∇logp`; the `sg(f)` gives the gradient it states and verl's.

    Sources: J. Schulman, "Approximating KL Divergence" (blog, 2020; no arXiv id); gradient
    analysis in "A Comedy of Estimators" (arXiv 2512.21852).
    Peers (keywords that reproduce them): verl `kl`/`k1`, `abs`, `mse`/`k2`, `"<name>+"`
    (defaults + `straight_through=True`) and `low_var_kl`/`k3` (`clamp=10.0`); OpenRLHF
    `k1`/`k2`/`k3` (`clamp=10.0, log_ratio_clamp=None`; its `unbiased_gradient=True` is
    `straight_through=True` for k1 and k3 without old log-probs, with no equivalent for k2's
    clamped values or with old log-probs); TRL GRPO k3 (`clamp=None,
    log_ratio_clamp=None`; its default bias-corrected KL is `kl_loss(..., is_correction=True)`)
    and PPO k1/k3 (`log_ratio_clamp=None`); Tunix `kl`/`mse_kl`/`low_var_kl`
    (`clamp=kl_clamp_value, log_ratio_clamp=None`). Default k1: DESIGN.md's choice, the estimator
    for KL in the reward; `log_ratio_clamp=20` (verl) only guards `exp` and changes values only
    where `|d| > 20`.

    Args:
      logp: `[N,T]` (or any shape) log-probs of the policy whose KL is measured.
      ref_logp: log-probs of the reference policy, same shape.
      estimator: "k1", "k2", "k3" or "abs".
      straight_through: value of `estimator`, gradient of k2.
      clamp: bound `c > 0` of the returned value (None: no clamp).
      log_ratio_clamp: bound of `|d|` inside the exponent of k3 (None: no clamp, except
        `d ≥ −80`, where `exp(−d)` is still finite in float32: a `clamp`ed value then has
        gradient 0, not NaN).
      mask: optional {0,1} mask of the same shape; inputs are zeroed outside it before any
        arithmetic and the output is 0 there.

    Returns:
      float32 array of the shape of `logp`.

    Examples:
      >>> import jax.numpy as jnp
      >>> d = jnp.array([0.5, -1.0, 0.0])
      >>> [round(float(v), 6) for v in kl_estimate(d, jnp.zeros(3), estimator="k3")]
      [0.106531, 0.718282, 0.0]
    """
    where = "kl_estimate"
    check_choice(estimator, ESTIMATORS, "estimator", where=where)
    check_choice(straight_through, (True, False), "straight_through", where=where)
    _check_clamp(clamp, "clamp", where=where)
    _check_clamp(log_ratio_clamp, "log_ratio_clamp", where=where)
    check_floating(logp, "logp", where=where)
    check_floating(ref_logp, "ref_logp", where=where)
    check_same_shape(logp, "logp", where, ref_logp=ref_logp)
    lp = as_float32(logp)
    m = None if mask is None else as_mask(mask, lp.shape, where=where)
    valid = None if m is None else m > 0
    d = _zero_outside(lp, valid) - _zero_outside(as_float32(ref_logp), valid)
    value = _estimate(d, estimator, straight_through, clamp, log_ratio_clamp)
    return value if m is None else value * m


# --------------------------------------------------------------------------------------------------
# KL as a loss
# --------------------------------------------------------------------------------------------------


def kl_loss(
    logp: ArrayLike,
    ref_logp: ArrayLike,
    mask: ArrayLike,
    *,
    estimator: Estimator = "k3",
    clamp: float | None = 10.0,
    straight_through: bool = False,
    agg: AggMode = "token_mean",
    is_correction: bool = False,
    old_logp: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """KL penalty as a loss term: `aggregate(kl_estimate(logp, ref_logp)·w, mask, agg)` (§3.2).

        w = exp(clip(logp − old_logp, ±log_ratio_clamp))  (not detached)  if is_correction, else 1

    The correction is the off-policy unbiased KL of "DeepSeek-V3.2" (TRL
    `use_bias_correction_kl`); `old_logp=None` means `sg(logp)` (w ≡ 1 in value, gradient
    `k·∇logp`). The actor adds `c_KL·loss`. The KL term is never multiplied by IS weights or
    token selections. Coefficients: 0 in the GRPO-family recipes (TRL `beta=0`, DAPO, Dr.GRPO);
    0.001 when enabled (verl `kl_loss_coef` with `low_var_kl`); 0.04 in DeepSeekMath
    ("DeepSeekMath", arXiv 2402.03300) and Tunix GRPO. Defaults `estimator="k3", clamp=10.0` are
    verl's `low_var_kl` (k3 is ≥ 0 with low variance; §3.4 rules out k1 as a loss).

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      ref_logp: `[N,T]` reference log-probs (no gradient flows into them).
      mask: `[N,T]` {0,1}.
      estimator: "k1", "k2", "k3" or "abs" (see `kl_estimate`).
      clamp: bound of the estimate (None: no clamp).
      straight_through: value of `estimator`, gradient of k2.
      agg: aggregation mode of `losses.aggregate`.
      is_correction: multiply by the (differentiable) ratio `π_θ/π_old`.
      old_logp: `[N,T]` behaviour log-probs for `is_correction` (None: `sg(logp)`).
      log_ratio_clamp: bound of the log-ratios inside `exp` (k3 and the correction weight).
      num_tokens: global token count for `agg` (see `aggregate`).
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)` with `kl/mean` (masked mean of the estimate, before `w`) and `kl/max`.

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, m = kl_loss(jnp.array([[0.5, -1.0, 9.0]]), jnp.zeros((1, 3)), jnp.array([[1, 1, 0]]))
      >>> round(float(loss), 5), round(float(m["kl/max"]), 5)
      (0.41241, 0.71828)
    """
    where = "kl_loss"
    check_rank(logp, 2, "logp", where=where)
    check_choice(is_correction, (True, False), "is_correction", where=where)
    check_same_shape(logp, "logp", where, old_logp=old_logp)
    m = as_mask(mask, jnp.shape(logp), where=where)
    valid = m > 0
    ref = jax.lax.stop_gradient(jnp.asarray(ref_logp))
    kl = kl_estimate(
        logp,
        ref,
        estimator=estimator,
        straight_through=straight_through,
        clamp=clamp,
        log_ratio_clamp=log_ratio_clamp,
        mask=m,
    )
    per_token = kl
    if is_correction:
        lp = _zero_outside(as_float32(logp), valid)
        if old_logp is None:
            old = jax.lax.stop_gradient(lp)
        else:
            check_floating(old_logp, "old_logp", where=where)
            old = jax.lax.stop_gradient(_zero_outside(as_float32(old_logp), valid))
        logr = clamp_log_ratio(lp - old, log_ratio_clamp, where=where)
        per_token = kl * jnp.where(valid, jnp.exp(logr), 0.0)
    loss = aggregate(
        per_token, m, mode=agg, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )
    kl_sg = jax.lax.stop_gradient(kl)
    metrics = {
        "kl/mean": jnp.sum(kl_sg) / jnp.maximum(jnp.sum(m), 1.0),
        "kl/max": _masked_max(kl_sg, valid),
    }
    return loss, {k: jax.lax.stop_gradient(jnp.asarray(v, jnp.float32)) for k, v in metrics.items()}


# --------------------------------------------------------------------------------------------------
# KL in the reward
# --------------------------------------------------------------------------------------------------


def _check_scores(scores: Any, N: int, *, where: str) -> Array:
    check_rank(scores, 1, "scores", where=where)
    check_floating(scores, "scores", where=where)
    if jnp.shape(scores) != (N,):
        raise ValueError(
            f"{where}: `scores` must have shape ({N},) (one score per row of `old_logp`), got "
            f"{jnp.shape(scores)}."
        )
    return jax.lax.stop_gradient(as_float32(scores))


def kl_penalized_rewards(
    scores: ArrayLike,
    old_logp: ArrayLike,
    ref_logp: ArrayLike,
    mask: ArrayLike,
    *,
    beta: float | ArrayLike,
    estimator: Estimator = "k1",
    score_position: Literal["last", "after_last"] = "last",
    clamp: float | None = None,
    log_ratio_clamp: float | None = 20.0,
) -> Array:
    """Per-token rewards of PPO with a KL penalty: `r = −β·kl·m + score·[t = t*]` (§3.3).

        kl_nt = kl_estimate(old_lp, ref_lp, estimator)        (no gradient flows)
        r_nt  = −β·kl_nt·m_nt + score_n·[t = t*(n)]
        t*(n) = the last valid position              (score_position="last": verl, OpenRLHF)
              = the first position after it, or the last slot if the row is full
                                                     (score_position="after_last": TRL PPO)

    A row without valid tokens puts its score at `t = 0` in both modes (TRL's placement; verl
    and OpenRLHF index the last slot), so `Σ_t r_nt = score_n − β·Σ_t kl_nt` holds for every row.
    With "after_last" the score usually sits on a padding slot, outside the mask. Always the
    behaviour policy's `old_logp`, never the trained `logp`; k1 by default because its value
    enters the returns (§3.4).
    Source: "Fine-Tuning Language Models from Human Preferences" (arXiv 1909.08593).
    Peers: verl `apply_kl_penalty` (k1, off by default), OpenRLHF `compute_reward`
    (`clamp=10.0`; it also clips the scores to (−10, 10) first, the caller's job here), TRL PPO
    (`score_position="after_last"`, β 0.05), Tunix PPO (`estimator="k3"`).

    Args:
      scores: `[N]` sequence scores (rewards of the verifier / reward model).
      old_logp: `[N,T]` log-probs of the behaviour policy.
      ref_logp: `[N,T]` log-probs of the reference policy.
      mask: `[N,T]` {0,1}.
      beta: KL coefficient β (Python number or traced scalar, e.g. a controller's state).
      estimator: "k1", "k2", "k3" or "abs" (see `kl_estimate`).
      score_position: "last" or "after_last".
      clamp: bound of the KL estimate (None: no clamp).
      log_ratio_clamp: bound of `|d|` inside the exponent of k3.

    Returns:
      `[N,T]` float32 rewards under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = kl_penalized_rewards(jnp.array([1.0]), jnp.array([[-1.0, -2.0, 0.0]]),
      ...                          jnp.array([[-1.5, -1.0, 0.0]]), jnp.array([[1, 1, 0]]), beta=0.1)
      >>> [round(float(v), 4) for v in r[0]]
      [-0.05, 1.1, 0.0]
    """
    where = "kl_penalized_rewards"
    check_choice(score_position, ("last", "after_last"), "score_position", where=where)
    check_rank(old_logp, 2, "old_logp", where=where)
    check_floating(old_logp, "old_logp", where=where)
    check_floating(ref_logp, "ref_logp", where=where)
    check_same_shape(old_logp, "old_logp", where, ref_logp=ref_logp)
    N, T = jnp.shape(old_logp)
    s = _check_scores(scores, N, where=where)
    m = as_mask(mask, (N, T), where=where)
    kl = kl_estimate(
        jax.lax.stop_gradient(old_logp),
        jax.lax.stop_gradient(ref_logp),
        estimator=estimator,
        clamp=clamp,
        log_ratio_clamp=log_ratio_clamp,
        mask=m,
    )
    positions = jnp.arange(T)
    last = jnp.max(jnp.where(m > 0, positions[None, :], -1), axis=1)  # −1 for an empty row
    # an empty row (last = −1) puts its score at t = 0 in both modes
    after = score_position == "after_last"
    t_star = jnp.minimum(last + 1, T - 1) if after else jnp.maximum(last, 0)
    at_star = positions[None, :] == t_star[:, None]
    check_positive(beta, "beta", where=where, allow_zero=True)  # NaN too; traced: unchecked
    beta = jax.lax.stop_gradient(jnp.asarray(beta, jnp.float32))
    rewards = -beta * kl + jnp.where(at_star, s[:, None], 0.0)
    return jax.lax.stop_gradient(rewards)


def kl_penalized_scores(
    scores: ArrayLike,
    old_logp: ArrayLike,
    ref_logp: ArrayLike,
    mask: ArrayLike,
    *,
    beta: float | ArrayLike,
) -> Array:
    """Sequence-level KL-penalised scores: `s_n − β·Σ_t (old_lp − ref_lp)·m` (§3.3, TRL RLOO).

    The k1 sum over the sequence is `log π_old(y|x) − log π_ref(y|x)`; no gradient flows. Peer:
    TRL RLOO (β 0.05). Source: "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs" (RLOO, arXiv 2402.14740).

    Args:
      scores: `[N]` sequence scores.
      old_logp: `[N,T]` behaviour log-probs.
      ref_logp: `[N,T]` reference log-probs.
      mask: `[N,T]` {0,1}.
      beta: KL coefficient β (Python number or traced scalar).

    Returns:
      `[N]` float32 under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = kl_penalized_scores(jnp.array([1.0]), jnp.array([[-1.0, -2.0, jnp.nan]]),
      ...                         jnp.array([[-1.5, -1.0, 0.0]]), jnp.array([[1, 1, 0]]), beta=0.1)
      >>> round(float(s[0]), 4)
      1.05
    """
    where = "kl_penalized_scores"
    check_rank(old_logp, 2, "old_logp", where=where)
    check_floating(old_logp, "old_logp", where=where)
    check_floating(ref_logp, "ref_logp", where=where)
    check_same_shape(old_logp, "old_logp", where, ref_logp=ref_logp)
    N, T = jnp.shape(old_logp)
    s = _check_scores(scores, N, where=where)
    m = as_mask(mask, (N, T), where=where)
    kl = kl_estimate(
        jax.lax.stop_gradient(old_logp),
        jax.lax.stop_gradient(ref_logp),
        estimator="k1",
        log_ratio_clamp=None,
        mask=m,
    )
    check_positive(beta, "beta", where=where, allow_zero=True)  # NaN too; traced: unchecked
    beta = jax.lax.stop_gradient(jnp.asarray(beta, jnp.float32))
    return jax.lax.stop_gradient(s - beta * jnp.sum(kl, axis=1))


# --------------------------------------------------------------------------------------------------
# KL coefficient control
# --------------------------------------------------------------------------------------------------


def _check_controller(target: Any, horizon: Any, *, where: str) -> None:
    check_positive(target, "target", where=where)
    check_positive(horizon, "horizon", where=where)


def adaptive_kl_update(
    beta: float | ArrayLike,
    current_kl: float | ArrayLike,
    n_steps: int | ArrayLike,
    *,
    target: float = 0.1,
    horizon: float = 10000,
) -> Array:
    """One step of the adaptive KL controller (ALGORITHMS.md §3.5).

        e = clip(current_kl/target − 1, −0.2, 0.2) ;  β ← β·max(1 + e·n_steps/horizon, 0)

    Source: "Fine-Tuning Language Models from Human Preferences" (Ziegler et al., arXiv
    1909.08593). Peers: verl `AdaptiveKLController` (β₀ 0.001, target 0.1, horizon 10000,
    `n_steps` = batch size), OpenRLHF (β₀ 0.01, horizon 10000); TRL has none. The relative change
    is bounded by `0.2·n_steps/horizon`. `current_kl` is the batch's KL, e.g. `kl/mean`. The
    peers' factor `1 + e·n_steps/horizon` turns β negative (a KL *bonus*) once `n_steps` exceeds
    `5·horizon` at a KL far below target; here β stops at 0 instead. A non-finite KL (a
    diverged batch) leaves β unchanged.

    Args:
      beta: current coefficient β (float32 scalar, may be traced).
      current_kl: measured KL of the batch.
      n_steps: samples (or steps) since the last update.
      target: the KL the controller steers to.
      horizon: samples over which a full 20 % correction accumulates.

    Returns:
      The new β as a float32 scalar.

    Examples:
      >>> round(float(adaptive_kl_update(0.001, 0.15, 256)), 8)
      0.00100512
    """
    _check_controller(target, horizon, where="adaptive_kl_update")
    beta = jnp.asarray(beta, jnp.float32)
    kl = jnp.asarray(current_kl, jnp.float32)
    error = jnp.clip(kl / target - 1.0, -0.2, 0.2)
    factor = jnp.maximum(1.0 + error * jnp.asarray(n_steps, jnp.float32) / horizon, 0.0)
    return jnp.where(jnp.isfinite(kl), beta * factor, beta)


class KLControllerState(NamedTuple):
    """State of a KL controller: the current coefficient β (float32 scalar).

    Examples:
      >>> KLControllerState(beta=0.05).beta
      0.05
    """

    beta: Array


class KLController(NamedTuple):
    """A pure KL controller (optax-style `init`/`update` pair; jittable, no optax import).

    `init() -> KLControllerState`; `update(state, current_kl, n_steps) -> KLControllerState`.
    Build one with `adaptive_kl_controller` or `fixed_kl_controller`.

    Examples:
      >>> ctrl = fixed_kl_controller(0.1)
      >>> isinstance(ctrl, KLController), round(float(ctrl.init().beta), 4)
      (True, 0.1)
    """

    init: Callable[[], KLControllerState]
    update: Callable[[KLControllerState, Any, Any], KLControllerState]


def adaptive_kl_controller(
    init_beta: float, *, target: float = 0.1, horizon: float = 10000
) -> KLController:
    """Adaptive KL controller: `update` applies `adaptive_kl_update` to the state's β (§3.5).

    Source: "Fine-Tuning Language Models from Human Preferences" (arXiv 1909.08593). verl's
    defaults: `init_beta=0.001, target=0.1, horizon=10000`.

    Args:
      init_beta: initial coefficient β₀ ≥ 0.
      target: the KL the controller steers to.
      horizon: samples over which a full 20 % correction accumulates.

    Returns:
      A `KLController`.

    Examples:
      >>> ctrl = adaptive_kl_controller(0.001)
      >>> state = ctrl.update(ctrl.init(), 0.15, 256)
      >>> round(float(state.beta), 8)
      0.00100512
    """
    where = "adaptive_kl_controller"
    check_positive(init_beta, "init_beta", where=where, allow_zero=True)
    _check_controller(target, horizon, where=where)

    def init() -> KLControllerState:
        return KLControllerState(jnp.asarray(init_beta, jnp.float32))

    def update(state: KLControllerState, current_kl: Any, n_steps: Any) -> KLControllerState:
        beta = adaptive_kl_update(state.beta, current_kl, n_steps, target=target, horizon=horizon)
        return KLControllerState(beta)

    return KLController(init, update)


def fixed_kl_controller(init_beta: float) -> KLController:
    """Fixed KL controller: `update` returns the state unchanged (§3.5; verl `FixedKLController`).

    Args:
      init_beta: the constant coefficient β ≥ 0.

    Returns:
      A `KLController` with the same interface as `adaptive_kl_controller`.

    Examples:
      >>> ctrl = fixed_kl_controller(0.05)
      >>> round(float(ctrl.update(ctrl.init(), 3.0, 256).beta), 4)
      0.05
    """
    check_positive(init_beta, "init_beta", where="fixed_kl_controller", allow_zero=True)

    def init() -> KLControllerState:
        return KLControllerState(jnp.asarray(init_beta, jnp.float32))

    def update(state: KLControllerState, current_kl: Any, n_steps: Any) -> KLControllerState:
        del current_kl, n_steps
        return KLControllerState(jnp.asarray(state.beta, jnp.float32))

    return KLController(init, update)


# --------------------------------------------------------------------------------------------------
# exact KL over the vocabulary
# --------------------------------------------------------------------------------------------------


def full_kl(
    logits_p: ArrayLike,
    logits_q: ArrayLike,
    mask: ArrayLike,
    *,
    temperature: float | ArrayLike = 1.0,
    chunk_size: int | None = None,
) -> Array:
    """Exact per-token `KL(p‖q) = Σ_v p_v (log p_v − log q_v)` over the vocabulary (§3.6).

    `p = softmax(float32(z_p)/τ)`, `q = softmax(float32(z_q)/τ)`; entries with `p_v = 0`
    contribute 0. For token-level distillation ("AlignDistil", arXiv 2503.02832; on-policy
    distillation); verl's `full` estimator is an unimplemented stub. It is the expectation of
    `k1 = log p(y) − log q(y)` under `y ~ p`. Gradients flow into both logits (apply
    `jax.lax.stop_gradient` to a frozen teacher's). Chunked over `T` like `token_logprobs`.

    Args:
      logits_p: `[N,T,V]` logits of `p` (any float dtype).
      logits_q: `[N,T,V]` logits of `q`.
      mask: `[N,T]` {0,1}; logits outside it never reach the value or the gradient.
      temperature: the temperature `τ` applied to both.
      chunk_size: positions of the `T` axis per chunk (see `losses.logprobs`). None: one chunk.

    Returns:
      `[N,T]` float32, ≥ 0, 0 outside the mask.

    Examples:
      >>> import jax.numpy as jnp
      >>> p = jnp.log(jnp.array([[[0.5, 0.5]]])); q = jnp.log(jnp.array([[[0.9, 0.1]]]))
      >>> round(float(full_kl(p, q, jnp.ones((1, 1)))[0, 0]), 4)
      0.5108
    """
    where = "full_kl"
    zp = _check_logits(logits_p, "logits_p", where=where)
    zq = _check_logits(logits_q, "logits_q", where=where)
    check_same_shape(zp, "logits_p", where, logits_q=zq)
    m = as_mask(mask, zp.shape[:2], where=where)
    _check_temperature(temperature, where)
    _check_chunk_size(chunk_size, where=where)

    def chunk(p: Array, q: Array, mc: Array) -> Array:
        return _full_kl_chunk(p, q, temperature, mc)

    return _map_over_positions(chunk, (zp, zq, m), chunk_size)
