"""Rollout/train mismatch correction (ALGORITHMS.md §6.1-§6.4).

The sampler's log-probs `rollout_logp` differ from the trainer's `old_logp` (kernels, precision,
truncated sampling, stale weights). In the decoupled scheme the PPO ratio stays `π_θ/π_old` and
every per-token loss is multiplied by stop-gradient importance weights `w(π_old/π_roll)` passed as
`is_weights`; in the bypass scheme `old_logp = rollout_logp` and no weights are used.

* `rollout_correction_weights`: truncated (TIS) or masked (MIS / IcePop) IS weights at token,
  sequence or geometric-mean level.
* `rollout_rejection_mask`: rejection sampling on KL estimates between the two policies.
* `rollout_mismatch_metrics`: `rollout/...` diagnostics of the mismatch.
* `off_policy_sequence_mask`: DeepSeek-V3.2 masking of off-policy negative-advantage sequences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

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
from losses._policy import stop_gradient_metrics, zero_outside

Level = Literal["token", "sequence", "geometric"]
LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")
MODES: tuple[str, ...] = ("truncate", "mask")
_KL_NAMES = ("k1", "k2", "k3")
REJECTION_CRITERIA: tuple[str, ...] = (
    *(f"token_{k}" for k in _KL_NAMES),
    *(f"seq_sum_{k}" for k in _KL_NAMES),
    *(f"seq_mean_{k}" for k in _KL_NAMES),
    "seq_max_k2",
    "seq_max_k3",
)


def _prepare(old_logp: Any, rollout_logp: Any, mask: Any, where: str) -> tuple[Array, Array, Array]:
    """Validate; return `(log ρ = old − roll, zero off-mask, no gradient), mask, valid`."""
    check_rank(old_logp, 2, "old_logp", where=where)
    check_floating(old_logp, "old_logp", where=where)
    check_floating(rollout_logp, "rollout_logp", where=where)
    check_same_shape(old_logp, "old_logp", where, rollout_logp=rollout_logp)
    m = as_mask(mask, jnp.shape(old_logp), where=where)
    valid = m > 0
    old = zero_outside(as_float32(old_logp), valid)
    roll = zero_outside(as_float32(rollout_logp), valid)
    return jax.lax.stop_gradient(old - roll), m, valid


def _check_bound(value: Any, name: str, where: str) -> None:
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        raise ValueError(f"{where}: `{name}` must be a Python number or None, got {value!r}.")
    check_positive(value, name, where=where, allow_zero=True)


def _log_weight(log_rho: Array, m: Array, level: str, clamp: float | None) -> Array:
    """Log of ρ at `level`: `[N,T]` for "token", `[N,1]` for the sequence levels."""
    if level == "token":
        log_w = log_rho
    elif level == "sequence":
        log_w = jnp.sum(log_rho, axis=1, keepdims=True)
    else:  # geometric
        lengths = jnp.sum(m, axis=1, keepdims=True)
        log_w = jnp.sum(log_rho, axis=1, keepdims=True) / jnp.maximum(lengths, 1.0)
    if clamp is not None:
        log_w = jnp.clip(log_w, -clamp, clamp)
    return log_w


def rollout_correction_weights(
    old_logp: ArrayLike,
    rollout_logp: ArrayLike,
    mask: ArrayLike,
    *,
    level: Level = "token",
    mode: Literal["truncate", "mask"] = "truncate",
    low: float | None = None,
    high: float | None = 2.0,
    mask_level: Level | None = None,
    batch_normalize: bool = False,
    log_ratio_clamp: float | None = 20.0,
) -> Array:
    """Importance weights `w(π_old/π_rollout)` that correct the sampler/trainer mismatch (§6.1).

    With `d = (old_logp − rollout_logp)·m` and `clamp(x) = clip(x, ±log_ratio_clamp)`:

        ρ  = exp(clamp(d))                          level="token"
        ρ_n = exp(clamp(Σ_t d))                     level="sequence"  (product of token ratios)
        ρ_n = exp(clamp(Σ_t d / max(L_n, 1)))       level="geometric" (geometric mean)
        mode="truncate":  w = clip(ρ, low or 0, high or ∞)                 (TIS)
        mode="mask":      w = ρ · [low ≤ ρ' ≤ high]  with ρ' = ρ at `mask_level` (MIS / IcePop)
        batch_normalize:  w ← w / mean(w)   (masked mean over tokens for level="token", mean over
                                             non-empty sequences for the sequence levels, of
                                             each one's ρ_n, or 0 when its gate kept no token:
                                             a token-level gate's partial rejections do not
                                             lower the sequence's weight in the mean)
        return sg(w)·m                       (sequence levels broadcast over t)

    Pass the result as `is_weights=` to a policy loss (decoupled correction). Sources: "Your
    Efficient RL Framework Secretly Brings You Off-Policy RL Training" (TIS; blog, 2025, no arXiv
    id); IcePop (Ring-1T report; no id in our sources); AIPO in LlamaRL (seed paper). Peers and
    the keywords that reproduce them:

    * verl `rollout_is` token / sequence truncation at 2.0 and Tunix `sampler_is="token"`: the
      defaults (with `level=`); verl's lower/upper masking: `mode="mask"` with its two thresholds
      as `low` and `high`.
    * TRL `vllm_importance_sampling_mode` default `sequence_mask`: `level="sequence",
      mode="mask", high=3.0, log_ratio_clamp=None`.
    * OpenRLHF `tis`: `low=0.5, high=5.0`; `icepop`: `mode="mask", low=0.5, high=5.0`;
      `seq-mask-tis`: `mode="mask", mask_level="geometric", low=0.5, high=5.0`.

    Default `high=2.0` follows verl and Tunix; `low=None` means no floor (truncate) / no lower
    bound (mask); the clamp ±20 keeps `exp` finite as verl and OpenRLHF do.

    Args:
      old_logp: `[N,T]` log-probs of π_old recomputed by the trainer.
      rollout_logp: `[N,T]` log-probs reported by the sampler.
      mask: `[N,T]` {0,1}.
      level: "token", "sequence" or "geometric" (static).
      mode: "truncate" (clip the weight) or "mask" (zero the weight outside [low, high]) (static).
      low: lower bound (Python number ≥ 0) or None.
      high: upper bound (Python number ≥ 0, may be `inf`) or None.
      mask_level: level whose ratio decides the mask in `mode="mask"`; None: `level`.
      batch_normalize: divide by the batch mean of the weights (mean 1 afterwards).
      log_ratio_clamp: bound of the log-weight before `exp` (None: no clamp).

    Returns:
      `[N,T]` float32 weights, 0 outside the mask; no gradient flows through them.

    Examples:
      >>> import jax.numpy as jnp
      >>> old = jnp.array([[-1.0, -2.0, -0.5]]); roll = jnp.array([[-1.5, -1.0, -0.5]])
      >>> w = rollout_correction_weights(old, roll, jnp.ones((1, 3)))
      >>> [round(float(v), 4) for v in w[0]]
      [1.6487, 0.3679, 1.0]
      >>> w = rollout_correction_weights(old, roll, jnp.ones((1, 3)), level="sequence")
      >>> round(float(w[0, 0]), 4)
      0.6065
    """
    where = "rollout_correction_weights"
    check_choice(level, LEVELS, "level", where=where)
    check_choice(mode, MODES, "mode", where=where)
    if mask_level is not None:
        check_choice(mask_level, LEVELS, "mask_level", where=where)
        if mode != "mask":
            raise ValueError(
                f"{where}: `mask_level` applies only to mode='mask', got mode={mode!r} and "
                f"mask_level={mask_level!r}."
            )
    _check_bound(low, "low", where)
    _check_bound(high, "high", where)
    if low is not None and high is not None and low > high:
        raise ValueError(f"{where}: `low` must be <= `high`, got low={low!r} > high={high!r}.")
    if log_ratio_clamp is not None:
        check_positive(log_ratio_clamp, "log_ratio_clamp", where=where)
    if not isinstance(batch_normalize, bool):
        raise ValueError(f"{where}: `batch_normalize` must be a bool, got {batch_normalize!r}.")

    log_rho, m, valid = _prepare(old_logp, rollout_logp, mask, where)
    rho = jnp.exp(_log_weight(log_rho, m, level, log_ratio_clamp))
    if mode == "truncate":
        w = jnp.clip(rho, 0.0 if low is None else low, None if high is None else high)
    else:
        gate_level = level if mask_level is None else mask_level
        gate_rho = (
            rho
            if gate_level == level
            else jnp.exp(_log_weight(log_rho, m, gate_level, log_ratio_clamp))
        )
        keep = jnp.ones(gate_rho.shape, bool)
        if low is not None:
            keep = keep & (gate_rho >= low)
        if high is not None:
            keep = keep & (gate_rho <= high)
        w = rho * keep
    w = jnp.broadcast_to(w, m.shape) if w.shape != m.shape else w
    w = zero_outside(w, valid)
    if batch_normalize:
        if level == "token":
            mean = jnp.sum(w) / jnp.maximum(jnp.sum(m), 1.0)
        else:
            seq_valid = jnp.any(valid, axis=1)
            seq_w = jnp.max(w, axis=1)  # the (non-negative) sequence weight, 0 for empty rows
            mean = jnp.sum(seq_w) / jnp.maximum(jnp.sum(seq_valid.astype(jnp.float32)), 1.0)
        w = w / jnp.where(mean > 0, mean, 1.0)
    return jax.lax.stop_gradient(w)


def _kl_terms(log_rho: Array, valid: Array) -> dict[str, Array]:
    """`k1 = −log ρ`, `k2 = ½ (log ρ)²`, `k3 = ρ − 1 − log ρ` (0 off-mask; k3 may be +inf)."""
    return {
        "k1": -log_rho,
        "k2": 0.5 * log_rho**2,
        "k3": zero_outside(jnp.exp(log_rho) - 1.0 - log_rho, valid),
    }


def _check_criteria(criteria: Any, where: str) -> tuple[tuple[str, Any, Any], ...]:
    if not isinstance(criteria, Sequence) or isinstance(criteria, str):
        raise ValueError(
            f"{where}: `criteria` must be a sequence of (name, low, high) tuples, got {criteria!r}."
        )
    out = []
    for item in criteria:
        if not isinstance(item, Sequence) or isinstance(item, str) or len(item) != 3:
            raise ValueError(
                f"{where}: each entry of `criteria` must be a (name, low, high) tuple, got {item!r}."
            )
        name, low, high = item
        check_choice(name, REJECTION_CRITERIA, "criteria name", where=where)
        for bound_name, bound in (("low", low), ("high", high)):
            if bound is not None and (
                not isinstance(bound, int | float) or isinstance(bound, bool) or math.isnan(bound)
            ):
                raise ValueError(
                    f"{where}: the {bound_name} bound of criterion {name!r} must be a Python "
                    f"number or None, got {bound!r}."
                )
        if low is not None and high is not None and low > high:
            raise ValueError(
                f"{where}: criterion {name!r} needs low <= high, got low={low!r} > high={high!r}."
            )
        out.append((name, low, high))
    return tuple(out)


def rollout_rejection_mask(
    old_logp: ArrayLike,
    rollout_logp: ArrayLike,
    mask: ArrayLike,
    *,
    criteria: Sequence[tuple[str, float | None, float | None]],
) -> Array:
    """Reject tokens or whole sequences whose sampler/trainer KL estimate is out of range (§6.2).

    With `log ρ = old_logp − rollout_logp` the per-token estimates of KL(π_roll‖π_old) are
    `k1 = −log ρ`, `k2 = ½(log ρ)²`, `k3 = ρ − 1 − log ρ`. Each criterion `(name, low, high)`
    keeps what satisfies `low ≤ stat ≤ high` (a None bound is open); criteria are AND-combined:

        token_k{1,2,3}      stat = k_nt                      (masks tokens)
        seq_sum_k{1,2,3}    stat = Σ_t k_nt m_nt             (masks whole sequences)
        seq_mean_k{1,2,3}   stat = Σ_t k_nt m_nt / max(L_n, 1)
        seq_max_k{2,3}      stat = max over valid t of k_nt

    Peer: verl `rollout_rs` (rejection sampling of the rollout-correction module). Apply the result
    through `token_weights` (the normaliser is unchanged) or multiply it into `is_weights`.

    Args:
      old_logp: `[N,T]` trainer log-probs of π_old.
      rollout_logp: `[N,T]` sampler log-probs.
      mask: `[N,T]` {0,1}.
      criteria: sequence of `(name, low, high)` (static); names as above. An empty sequence keeps
        every valid token.

    Returns:
      `[N,T]` float32 {0,1}, 0 outside the mask (no gradient).

    Examples:
      >>> import jax.numpy as jnp
      >>> old = jnp.array([[-1.0, -2.0], [-1.0, -1.0]]); roll = jnp.array([[-1.0, -1.0], [-1.1, -1.0]])
      >>> rollout_rejection_mask(old, roll, jnp.ones((2, 2)), criteria=[("seq_max_k2", None, 0.1)]).tolist()
      [[0.0, 0.0], [1.0, 1.0]]
    """
    where = "rollout_rejection_mask"
    checked = _check_criteria(criteria, where)
    log_rho, m, valid = _prepare(old_logp, rollout_logp, mask, where)
    terms = _kl_terms(log_rho, valid)
    keep = valid
    lengths = jnp.sum(m, axis=1, keepdims=True)
    for name, low, high in checked:
        scope, kind = name.rsplit("_", 1)
        k = zero_outside(terms[kind], valid)
        if scope == "token":
            stat = k
        elif scope == "seq_sum":
            stat = jnp.sum(k, axis=1, keepdims=True)
        elif scope == "seq_mean":
            stat = jnp.sum(k, axis=1, keepdims=True) / jnp.maximum(lengths, 1.0)
        else:  # seq_max
            stat = jnp.max(jnp.where(valid, k, -jnp.inf), axis=1, keepdims=True)
        if low is not None:
            keep = keep & (stat >= low)
        if high is not None:
            keep = keep & (stat <= high)
    return jax.lax.stop_gradient(keep.astype(jnp.float32))


def rollout_mismatch_metrics(
    old_logp: ArrayLike,
    rollout_logp: ArrayLike,
    mask: ArrayLike,
    *,
    weights: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
) -> dict[str, Array]:
    """Diagnostics of the sampler/trainer mismatch (ALGORITHMS.md §6.4).

    With `log ρ = old_logp − rollout_logp` over the valid tokens (`ρ` computed as
    `exp(clip(log ρ, ±log_ratio_clamp))` so the metrics stay finite):

        rollout/k1        = masked_mean(rollout_logp − old_logp)     (OpenRLHF's `vllm_kl`)
        rollout/k3        = masked_mean(ρ − 1 − log ρ)
        rollout/ratio_max = max over valid tokens of ρ
        rollout/ppl_ratio = exp(masked_mean(rollout_logp − old_logp))  (= PPL(old) / PPL(rollout))

    and, when `weights` (e.g. from `rollout_correction_weights`) are given, `rollout/weight_mean`
    (masked mean of the weights) and `rollout/masked_frac` (fraction of valid tokens whose weight
    is 0). k1 and k3 estimate KL(π_roll‖π_old) on the sampler's tokens.

    Args:
      old_logp: `[N,T]` trainer log-probs of π_old.
      rollout_logp: `[N,T]` sampler log-probs.
      mask: `[N,T]` {0,1}.
      weights: optional `[N,T]` importance weights.
      log_ratio_clamp: bound of `log ρ` inside `exp` (None: no clamp).

    Returns:
      A flat dict of float32 scalars (no gradient).

    Examples:
      >>> import jax.numpy as jnp
      >>> m = rollout_mismatch_metrics(jnp.array([[-1.0, -2.0]]), jnp.array([[-1.0, -1.0]]), jnp.ones((1, 2)))
      >>> round(float(m["rollout/k1"]), 4), round(float(m["rollout/ratio_max"]), 4)
      (0.5, 1.0)
    """
    where = "rollout_mismatch_metrics"
    if log_ratio_clamp is not None:
        check_positive(log_ratio_clamp, "log_ratio_clamp", where=where)
    log_rho, m, valid = _prepare(old_logp, rollout_logp, mask, where)
    count = jnp.maximum(jnp.sum(m), 1.0)
    clamped = (
        log_rho if log_ratio_clamp is None else jnp.clip(log_rho, -log_ratio_clamp, log_ratio_clamp)
    )
    rho = jnp.exp(clamped)
    k1 = jnp.sum(-log_rho) / count
    k3 = zero_outside(rho - 1.0 - log_rho, valid)
    ratio_max = jnp.max(jnp.where(valid, rho, -jnp.inf))
    metrics = {
        "rollout/k1": k1,
        "rollout/k3": jnp.sum(k3) / count,
        "rollout/ratio_max": jnp.where(jnp.any(valid), ratio_max, 0.0),
        "rollout/ppl_ratio": jnp.exp(k1),
    }
    if weights is not None:
        check_floating(weights, "weights", where=where)
        check_same_shape(old_logp, "old_logp", where, weights=weights)
        w = zero_outside(as_float32(weights), valid)
        metrics["rollout/weight_mean"] = jnp.sum(w) / count
        metrics["rollout/masked_frac"] = jnp.sum(jnp.where(valid & (w == 0), 1.0, 0.0)) / count
    return stop_gradient_metrics(metrics)


def off_policy_sequence_mask(
    logp: ArrayLike,
    rollout_logp: ArrayLike,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    threshold: Any,
) -> Array:
    """Drop negative-advantage sequences that drifted too far off-policy (ALGORITHMS.md §6.3).

        D_n    = Σ_t (rollout_logp − sg(logp))·m / max(L_n, 1)     (k1 estimate of KL(π_roll‖π_θ))
        keep_n = [L_n > 0] · ((A_n ≥ 0) ∨ (D_n ≤ δ))

    A sequence with a negative advantage whose sampling policy has drifted more than `δ` (mean
    per-token log-ratio) from the current policy is masked out: pushing down an off-policy sample
    the current policy would not produce mostly adds noise. Sequences with `A_n ≥ 0` are always
    kept, and so is any sequence with `D_n ≤ δ`. `A_n` is the sequence's advantage: pass `[N]`
    (or `[N,1]`), or `[N,T]` per-token advantages, which are reduced by their masked mean (equal to
    the sequence advantage when it is broadcast to the tokens). Apply the result through
    `token_weights=keep * mask` so the normaliser still counts the dropped sequences.

    Source: DeepSeek-V3.2 technical report (off-policy sequence masking; no arXiv id in our
    sources). Peer: TRL `off_policy_mask_threshold` (`δ`; it uses the sampler's log-probs and falls
    back to `old_logp` when they are not stored: pass `old_logp` as `rollout_logp` for that).

    Args:
      logp: `[N,T]` current-policy log-probs (no gradient flows through the mask).
      rollout_logp: `[N,T]` log-probs of the sampling policy (or `old_logp`).
      advantages: `[N]`, `[N,1]` or `[N,T]` advantages.
      mask: `[N,T]` {0,1}.
      threshold: `δ`, the largest tolerated mean log-ratio of a negative-advantage sequence (a
        Python number or a traced scalar; required, as TRL leaves it unset by default).

    Returns:
      `[N,1]` float32 {0,1} (no gradient); 0 for empty rows.

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-1.0, -1.0], [-3.0, -3.0], [-3.0, -3.0]])
      >>> roll = jnp.full((3, 2), -1.0)
      >>> keep = off_policy_sequence_mask(lp, roll, jnp.array([-1.0, -1.0, 2.0]), jnp.ones((3, 2)), threshold=0.5)
      >>> keep.tolist()
      [[1.0], [0.0], [1.0]]
    """
    where = "off_policy_sequence_mask"
    check_rank(logp, 2, "logp", where=where)
    check_floating(logp, "logp", where=where)
    check_floating(rollout_logp, "rollout_logp", where=where)
    check_same_shape(logp, "logp", where, rollout_logp=rollout_logp)
    shape = jnp.shape(logp)
    check_floating(advantages, "advantages", where=where)
    if jnp.shape(advantages) not in (shape, (shape[0],), (shape[0], 1)):
        raise ValueError(
            f"{where}: `advantages` must have shape [N] = ({shape[0]},), [N,1] or [N,T] = "
            f"{shape}, got {jnp.shape(advantages)}."
        )
    if isinstance(threshold, bool) or (
        isinstance(threshold, int | float) and math.isnan(threshold)
    ):
        raise ValueError(f"{where}: `threshold` must be a number, got {threshold!r}.")
    if jnp.ndim(threshold) != 0:
        raise ValueError(
            f"{where}: `threshold` must be a scalar, got shape {jnp.shape(threshold)}."
        )
    m = as_mask(mask, shape, where=where)
    valid = m > 0
    lengths = jnp.sum(m, axis=1, keepdims=True)
    denom = jnp.maximum(lengths, 1.0)
    lp = jax.lax.stop_gradient(zero_outside(as_float32(logp), valid))
    roll = jax.lax.stop_gradient(zero_outside(as_float32(rollout_logp), valid))
    drift = jnp.sum(roll - lp, axis=1, keepdims=True) / denom
    adv = jax.lax.stop_gradient(as_float32(advantages))
    if adv.shape == shape:
        seq_adv = jnp.sum(zero_outside(adv, valid), axis=1, keepdims=True) / denom
    else:
        seq_adv = adv.reshape(shape[0], 1)
    keep = ((seq_adv >= 0) | (drift <= threshold)) & (lengths > 0)
    return jax.lax.stop_gradient(keep.astype(jnp.float32))
