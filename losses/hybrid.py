"""DHPO: a mix of PPO's token-ratio surrogate and GSPO's sequence-ratio surrogate (ALGORITHMS.md §11)."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    check_choice,
    check_concrete_range,
    check_floating,
    check_positive,
    check_same_shape,
)
from losses._policy import prepare_policy_inputs
from losses.aggregation import AGG_MODES, AggMode
from losses.gspo import GSPOLevel, gspo_loss
from losses.ppo import ppo_clip_loss

_SEQUENCE_AGG = "seq_mean_token_mean"


def _mix_weights(mix: Any, logp: Any, token_weights: Any, where: str) -> tuple[Array, Array, Array]:
    """`(w, w·tw, (1 − w)·tw)` as `[N,T]` stop-gradient weights (tw = token_weights or 1)."""
    if isinstance(mix, bool) or not isinstance(mix, int | float):
        check_floating(mix, "mix", where=where)
        check_concrete_range(mix, "mix", where=where, low=0.0, high=1.0)
    elif not 0.0 <= mix <= 1.0:
        raise ValueError(f"{where}: `mix` must be in [0, 1], got {mix!r}.")
    shape = jnp.shape(logp)
    if jnp.ndim(mix) != 0 and jnp.shape(mix) != shape:
        raise ValueError(
            f"{where}: `mix` must be a scalar or [N,T] like `logp` {shape}, got shape "
            f"{jnp.shape(mix)}."
        )
    w = jax.lax.stop_gradient(jnp.broadcast_to(as_float32(mix), shape))
    base = jnp.ones(shape, jnp.float32)
    if token_weights is not None:
        if not jnp.issubdtype(jnp.result_type(token_weights), jnp.bool_):
            check_floating(token_weights, "token_weights", where=where)
        check_same_shape(logp, "logp", where, token_weights=token_weights)
        base = as_float32(token_weights)
    return w, w * base, (1.0 - w) * base


def hybrid_ratio_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    mix: ArrayLike = 0.5,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    seq_clip_low: float = 3e-4,
    seq_clip_high: float = 4e-4,
    level: GSPOLevel = "sequence_token",
    agg: AggMode = "seq_mean_token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Dynamic Hybrid Policy Optimization: `w·ℓ_ppo + (1 − w)·ℓ_gspo`, each clipped in its branch.

    Per token, with the token ratio `r` of `ppo_clip_loss` and the sequence ratio `ŝ` of
    `gspo_loss`, and `w = mix` (a scalar or a per-token `[N,T]` weight in [0, 1], no gradient):

        ℓ_ppo  = max(−A·r, −A·clip(r, 1 − clip_low, 1 + clip_high))
        ℓ_gspo = max(−A·ŝ, −A·clip(ŝ, 1 − seq_clip_low, 1 + seq_clip_high))
        loss   = aggregate((w·ℓ_ppo + (1 − w)·ℓ_gspo) · sg(is_weights) · token_weights, mask, agg)

    computed as `ppo_clip_loss` and `gspo_loss` with token weights `w·tw` and `(1 − w)·tw`
    (aggregation is linear, so this is the per-token mix). `mix=1` is exactly `ppo_clip_loss`
    (PPO-clip / GRPO) and `mix=0` exactly `gspo_loss`, with the same `agg`. A per-token `mix`
    implements the paper's entropy-guided mixing (compute `w` from the token entropies); a
    scalar is its averaged mixing.

    Assumptions (reconstructed — verify against the paper): the paper mixes the two *clipped
    ratios* inside one surrogate (branch-specific clipping before mixing); we mix the two clipped
    *losses*, as ALGORITHMS.md §11 specifies, which differs only where the branches pick
    different sides of their `max`. The defaults of each branch are those of `ppo_clip_loss`
    and `gspo_loss`; `agg` defaults to GRPO's / GSPO's `"seq_mean_token_mean"`, and any other
    mode warns (as `gspo_loss` does) unless `mix` is statically 1.

    Source: "Orchestrating Tokens and Sequences: Dynamic Hybrid Policy Optimization for RLVR"
    (DHPO; no arXiv id recorded in ALGORITHMS.md). No peer implements it.

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      old_logp: `[N,T]` log-probs of the policy that the batch is reused from; None means
        `sg(logp)` (ratio ≡ 1, on-policy).
      advantages: `[N,T]` (no gradient).
      mask: `[N,T]` {0,1} completion tokens that count.
      mix: weight `w` of the token branch: a float scalar or `[N,T]` in [0, 1] (may be traced).
      clip_low: ε_low of the token branch.
      clip_high: ε_high of the token branch.
      seq_clip_low: ε_low of the sequence branch.
      seq_clip_high: ε_high of the sequence branch.
      level: GSPO gradient form, `"sequence_token"` or `"sequence"`.
      agg: aggregation mode of `losses.aggregate` (shared by both branches).
      is_weights: `[N,T]` rollout-correction weights (stop-gradient).
      token_weights: `[N,T]` selections that must not change the normaliser.
      log_ratio_clamp: bound of |logp − old_logp| inside `exp` in the token branch.
      num_tokens: global token count for `agg`.
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar, the token branch's `policy/clip_frac`,
      `policy/clip_frac_high`, `policy/clip_frac_low`, `policy/approx_kl`, `policy/ratio_mean`,
      `policy/ratio_max`, the sequence branch's `policy/seq_clip_frac`,
      `policy/seq_clip_frac_high`, `policy/seq_clip_frac_low`, `policy/seq_ratio_mean`,
      `policy/seq_ratio_max`, and `policy/mix_mean` (mean `w` over valid tokens).

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[0.2, -0.1]]); old = jnp.zeros((1, 2)); one = jnp.ones((1, 2))
      >>> loss, m = hybrid_ratio_loss(logp, old, one, one, mix=0.5)
      >>> round(float(loss), 4), float(m["policy/clip_frac_high"])
      (-1.0264, 0.5)
    """
    where = "hybrid_ratio_loss"
    check_choice(agg, AGG_MODES, "agg", where=where)
    check_choice(level, ("sequence_token", "sequence"), "level", where=where)
    for name, value in (
        ("clip_low", clip_low),
        ("clip_high", clip_high),
        ("seq_clip_low", seq_clip_low),
        ("seq_clip_high", seq_clip_high),
    ):
        check_positive(value, name, where=where, allow_zero=True)
    prepare_policy_inputs(logp, old_logp, advantages, mask, where=where)  # errors name this loss
    w, w_ppo, w_gspo = _mix_weights(mix, logp, token_weights, where)
    common = {
        "agg": agg,
        "is_weights": is_weights,
        "num_tokens": num_tokens,
        "num_seqs": num_seqs,
        "norm_length": norm_length,
    }
    loss_ppo, m_ppo = ppo_clip_loss(
        logp,
        old_logp,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        token_weights=w_ppo,
        log_ratio_clamp=log_ratio_clamp,
        **common,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # re-issued below unless mix is static 1
        loss_gspo, m_gspo = gspo_loss(
            logp,
            old_logp,
            advantages,
            mask,
            clip_low=seq_clip_low,
            clip_high=seq_clip_high,
            level=level,
            token_weights=w_gspo,
            **common,
        )
    if agg != _SEQUENCE_AGG and not (isinstance(mix, int | float) and mix == 1):
        warnings.warn(
            f"{where}: agg={agg!r} weights each sequence by its length in the GSPO branch; its "
            f"objective is a mean over sequences (agg={_SEQUENCE_AGG!r}).",
            UserWarning,
            stacklevel=2,
        )
    valid = jnp.asarray(mask) > 0
    w_mean = jnp.sum(jnp.where(valid, w, 0.0)) / jnp.maximum(jnp.sum(valid), 1)
    metrics = {
        key: m_ppo[key]
        for key in (
            "policy/clip_frac",
            "policy/clip_frac_high",
            "policy/clip_frac_low",
            "policy/approx_kl",
            "policy/ratio_mean",
            "policy/ratio_max",
        )
    }
    for key in ("clip_frac", "clip_frac_high", "clip_frac_low", "ratio_mean", "ratio_max"):
        metrics[f"policy/seq_{key}"] = m_gspo[f"policy/{key}"]
    metrics["policy/mix_mean"] = jax.lax.stop_gradient(w_mean.astype(jnp.float32))
    return loss_ppo + loss_gspo, metrics
