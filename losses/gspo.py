"""GSPO: PPO's clipped surrogate on a sequence-level (geometric-mean) importance ratio."""

from __future__ import annotations

import warnings
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_choice, check_positive
from losses._policy import (
    log_ratio,
    prepare_policy_inputs,
    prepare_weights,
    ratio_metrics,
    stop_gradient_metrics,
    zero_outside,
)
from losses.aggregation import AGG_MODES, AggMode
from losses.ppo import ppo_clip_loss

GSPOLevel = Literal["sequence_token", "sequence"]
_LEVELS: tuple[str, ...] = ("sequence_token", "sequence")
_SEQUENCE_AGG = "seq_mean_token_mean"


def gspo_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    level: GSPOLevel = "sequence_token",
    seq_log_ratio_max: float | None = 10.0,
    agg: AggMode = "seq_mean_token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Group Sequence Policy Optimization loss (ALGORITHMS.md §5.3).

    The importance ratio is the geometric mean of the token ratios of a sequence,
    `s_n = exp(masked_mean_t(logp − old_logp))`, and PPO's clip acts on it:

        ŝl_n = Σ_t m_nt (logp_nt − old_logp_nt) / max(L_n, 1)          (no ±20 clamp)
        level="sequence_token": log ŝ_nt = min(logp_nt − sg(logp_nt) + sg(ŝl_n), seq_log_ratio_max)
                                 value s_n, gradient s_n·∇logp_nt (each token its own A_nt)
        level="sequence":       log ŝ_nt = min(ŝl_n, seq_log_ratio_max)
                                 gradient through the mean, s_n·(1/L_n)·Σ_t ∇logp_nt
        ℓ_nt = max(−A_nt·ŝ_nt, −A_nt·clip(ŝ_nt, 1 − ε_low, 1 + ε_high))
        loss = aggregate(ℓ · sg(is_weights) · token_weights, mask, agg)

    With advantages constant along each sequence the two levels give the same value and
    gradient; `"sequence_token"` (GSPO-token) also admits per-token advantages. It is computed
    as `ppo_clip_loss` on the log-ratio `log ŝ` (with `log_ratio_clamp=None`), so the clip math
    is PPO's; with `T = 1` GSPO is PPO-clip. The default level is the token form because it also
    serves per-token advantages and is what verl and Tunix run. The log-ratio cap
    `seq_log_ratio_max` (verl's 10, which keeps `exp` finite for a far off-policy sequence; None
    disables it) takes the place of the ±20 token clamp: beyond it the value is
    `exp(seq_log_ratio_max)` and the row gets no gradient.

    Source: "Group Sequence Policy Optimization" (arXiv 2507.18071); the default clip range
    3e-4/4e-4 is the paper's (sequence ratios stay much closer to 1 than token ratios, so PPO's
    0.2 would never clip). `agg="seq_mean_token_mean"` is GSPO's objective, a mean over
    sequences; any other mode weights sequences by their length, so it warns at trace time (as
    TRL does).

    Peers (reproducing keywords): verl `gspo` = the defaults with its `clip_ratio_low/high`
    (its default 0.2 must be overridden; it forces `seq-mean-token-mean`); TRL
    `importance_sampling_level="sequence"` = `level="sequence"` with `seq_log_ratio_max=None`
    (TRL has no cap; TRL 1.16 offers `"token"`, plain `ppo_clip_loss`, and `"sequence"`, not
    GSPO-token); OpenRLHF `gspo` = `level="sequence", seq_log_ratio_max=None` (it differentiates
    through the sequence mean; pass `old_logp=rollout_logp` when its IS correction is on); Tunix
    `gspo-token` = `level="sequence_token"` while every `|logp − old| ≤ 20` (Tunix clamps each
    token's log-ratio at ±20 before the mean; no keyword here reproduces that clamp).

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      old_logp: `[N,T]` log-probs of the policy the batch is reused from; None means `sg(logp)`
        (ratio ≡ 1, on-policy).
      advantages: `[N,T]` (no gradient); usually one value per sequence broadcast to its tokens.
      mask: `[N,T]` {0,1} completion tokens that count.
      clip_low: ε_low (sequence-ratio floor `1 − ε_low` for negative advantages).
      clip_high: ε_high (sequence-ratio ceiling `1 + ε_high` for positive advantages).
      level: `"sequence_token"` (GSPO-token gradient form) or `"sequence"`.
      seq_log_ratio_max: cap on the sequence log-ratio `ŝl_n`; None: no cap.
      agg: aggregation mode of `losses.aggregate` (warns unless `"seq_mean_token_mean"`).
      is_weights: `[N,T]` rollout-correction weights (stop-gradient).
      token_weights: `[N,T]` selections that must not change the normaliser (entropy masks).
      num_tokens: global token count for `agg`.
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/clip_frac`, `policy/clip_frac_high`
      (`A > 0`, `ŝ > 1 + ε_high`), `policy/clip_frac_low` (`A < 0`, `ŝ < 1 − ε_low`),
      `policy/approx_kl` (masked token mean of `−logr`), `policy/ratio_mean` and
      `policy/ratio_max` (of the sequence ratio `ŝ`, over valid tokens).

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[0.2, -0.1]]); old = jnp.zeros((1, 2))
      >>> loss, m = gspo_loss(logp, old, jnp.ones((1, 2)), jnp.ones((1, 2)))
      >>> round(float(loss), 4), round(float(m["policy/ratio_mean"]), 6)
      (-1.0004, 1.051271)
    """
    where = "gspo_loss"
    check_choice(level, _LEVELS, "level", where=where)
    check_choice(agg, AGG_MODES, "agg", where=where)
    check_positive(clip_low, "clip_low", where=where, allow_zero=True)
    check_positive(clip_high, "clip_high", where=where, allow_zero=True)
    if seq_log_ratio_max is not None:
        check_positive(seq_log_ratio_max, "seq_log_ratio_max", where=where)
    inputs = prepare_policy_inputs(logp, old_logp, advantages, mask, where=where)
    for name, w in (("is_weights", is_weights), ("token_weights", token_weights)):
        if w is not None:
            prepare_weights(w, name, inputs, where, stop_gradient=True)  # validates shape and dtype
    if agg != _SEQUENCE_AGG:
        warnings.warn(
            f"{where}: agg={agg!r} weights each sequence by its length; GSPO's objective is a "
            f"mean over sequences (agg={_SEQUENCE_AGG!r}).",
            UserWarning,
            stacklevel=2,
        )

    logr, _ = log_ratio(inputs, None, where=where)  # zero outside the mask
    lengths = jnp.sum(inputs.mask, axis=1, keepdims=True)
    seq_log_ratio = jnp.sum(logr, axis=1, keepdims=True) / jnp.maximum(lengths, 1.0)  # ŝl [N,1]
    if level == "sequence_token":
        lp = inputs.logp
        log_s = lp - jax.lax.stop_gradient(lp) + jax.lax.stop_gradient(seq_log_ratio)
    else:
        log_s = jnp.broadcast_to(seq_log_ratio, logr.shape)
    if seq_log_ratio_max is not None:
        log_s = jnp.minimum(log_s, seq_log_ratio_max)
    log_s = zero_outside(log_s, inputs.valid)

    loss, ppo_metrics = ppo_clip_loss(
        log_s,
        jnp.zeros_like(log_s),
        inputs.advantages,
        inputs.mask,
        clip_low=clip_low,
        clip_high=clip_high,
        agg=agg,
        is_weights=is_weights,
        token_weights=token_weights,
        log_ratio_clamp=None,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    seq_ratio = jnp.where(inputs.valid, jnp.exp(log_s), 0.0)
    metrics = {
        key: ppo_metrics[key]
        for key in ("policy/clip_frac", "policy/clip_frac_high", "policy/clip_frac_low")
    }
    metrics.update(ratio_metrics(logr, seq_ratio, inputs))
    return loss, stop_gradient_metrics(metrics)
