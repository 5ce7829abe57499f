"""GMPO: the geometric mean of the token ratios, clipped in log space, times the sequence advantage."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_positive, global_count
from losses._policy import (
    inclusive_clip,
    log_ratio,
    masked_fraction,
    prepare_policy_inputs,
    prepare_weights,
    ratio_metrics,
    stop_gradient_metrics,
    zero_outside,
)

_ALLOWED_AGG = (None, "seq_mean_token_mean")
_IS_LOG_EPS = 1e-10  # log(w + 1e-10) of the rollout-correction weights, as in the spec (§5.6)


def gmpo_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    clip_low: float = 0.4,
    clip_high: float = 0.4,
    agg: str | None = None,
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_seqs: Any = None,
    num_tokens: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Geometric-Mean Policy Optimization loss (ALGORITHMS.md §5.6).

    With `logr = logp − old_logp` (clamped to `±log_ratio_clamp` if given) and the weights of the
    means `w_nt = m_nt · token_weights_nt`:

        c_nt  = clip(logr_nt, −ε_low, ε_high)                           (log-space clip)
        ℓr_nt = min(logr_nt, c_nt) if A_nt > 0;  max(logr_nt, c_nt) if A_nt < 0;  0 if A_nt = 0
        ρ_n   = exp(Σ_t w_nt ℓr_nt / max(Σ_t w_nt, 1))                   (geometric-mean ratio)
                · exp(Σ_t w_nt log(is_weights_nt + 1e-10) / max(Σ_t w_nt, 1))   (if is_weights; sg)
        Ā_n   = Σ_t w_nt A_nt / max(Σ_t w_nt, 1)
        loss  = Σ_n valid_n · (−Ā_n ρ_n) / D_seq,   valid_n = [Σ_t m_nt > 0],
                D_seq = num_seqs or max(Σ_n valid_n, 1)

    The sign-aware `min`/`max` is PPO's pessimistic bound written in log space: a token whose
    log-ratio has left `[−ε_low, ε_high]` in the direction its advantage pushes stops
    contributing a gradient. The loss is always a mean over sequences (the `1/|o|` exponent of the
    geometric mean already normalises by length), so `agg` only accepts None or
    `"seq_mean_token_mean"` and raises for any other mode. `token_weights` (e.g. TRL's entropy
    mask) select the tokens of the means; they are meant to be {0,1}. A row whose tokens are all
    deselected keeps `valid_n` (it counts in `D_seq`) but contributes 0. The advantage enters
    through its per-sequence mean; GMPO is meant for sequence-level (outcome) advantages.

    Source: "GMPO: Geometric-Mean Policy Optimization" (arXiv 2507.20673); the default ±0.4 is the
    paper's clip range in log space (ratios in `[e^−0.4, e^0.4]`), wider than PPO's because the
    geometric mean is robust to outlier token ratios. `log_ratio_clamp=20.0` (the common contract
    of ALGORITHMS.md §5.0) bounds `ρ` for very off-policy batches; verl's `geo_mean` does not
    clamp (`log_ratio_clamp=None`).

    Peers (reproducing keywords): verl `geo_mean` = `clip_low=clip_high=0.2` (its
    `clip_ratio_low/high`), `log_ratio_clamp=None`; TRL experimental `GMPOTrainer` = `clip_low=epsilon_low,
    clip_high=epsilon_high`, `token_weights=entropy_mask`, `num_seqs=N` (TRL averages over all
    rows; its `A = 0` tokens take the max branch, which gives the same value and gradient when
    the advantage is constant along the sequence).

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      old_logp: `[N,T]` log-probs of the policy the batch is reused from; None means `sg(logp)`
        (ratio ≡ 1, on-policy).
      advantages: `[N,T]` (no gradient); usually one value per sequence broadcast to its tokens.
      mask: `[N,T]` {0,1} completion tokens that count.
      clip_low: ε_low, the log-ratio floor `−ε_low` for negative advantages.
      clip_high: ε_high, the log-ratio ceiling `ε_high` for positive advantages.
      agg: None or `"seq_mean_token_mean"` (both mean the same); other modes raise ValueError.
      is_weights: `[N,T]` rollout-correction weights (stop-gradient); their geometric mean over
        the sequence multiplies `ρ_n`.
      token_weights: `[N,T]` {0,1} selections of the tokens entering the means.
      log_ratio_clamp: bound of `|logp − old_logp|` before the clip (None: no clamp).
      num_seqs: global sequence count `D_seq` (micro-batching / multi-device).
      num_tokens, norm_length: accepted as every policy loss accepts the keywords of
        `aggregate`, but must be None: the loss is a mean over sequences (ValueError otherwise).

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/clip_frac`, `policy/clip_frac_high`
      (`A > 0`, `logr > ε_high`), `policy/clip_frac_low` (`A < 0`, `logr < −ε_low`),
      `policy/approx_kl`, `policy/ratio_mean`, `policy/ratio_max` (token ratios) and
      `policy/seq_ratio_mean` (mean of `ρ_n` over valid sequences).

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[0.2, -0.1, 0.9]]); old = jnp.zeros((1, 3))
      >>> loss, m = gmpo_loss(logp, old, jnp.ones((1, 3)), jnp.ones((1, 3)))
      >>> round(float(loss), 6), round(float(m["policy/clip_frac_high"]), 4)
      (-1.18136, 0.3333)
    """
    where = "gmpo_loss"
    if agg not in _ALLOWED_AGG:
        raise ValueError(
            f"{where}: `agg` must be None or 'seq_mean_token_mean' (GMPO is a mean over "
            f"sequences of the geometric-mean ratio), got {agg!r}."
        )
    for name, value in (("num_tokens", num_tokens), ("norm_length", norm_length)):
        if value is not None:
            raise ValueError(
                f"{where}: `{name}` does not apply (GMPO is a mean over sequences); give the "
                f"global sequence count as `num_seqs`, got {name}={value!r}."
            )
    check_positive(clip_low, "clip_low", where=where, allow_zero=True)
    check_positive(clip_high, "clip_high", where=where, allow_zero=True)
    if log_ratio_clamp is not None:
        check_positive(log_ratio_clamp, "log_ratio_clamp", where=where)
    inputs = prepare_policy_inputs(logp, old_logp, advantages, mask, where=where)
    adv = inputs.advantages

    raw_logr, ratio = log_ratio(inputs, log_ratio_clamp, where=where)  # zero outside the mask
    logr = raw_logr
    if log_ratio_clamp is not None:
        logr = jnp.clip(raw_logr, -log_ratio_clamp, log_ratio_clamp)
    clipped = inclusive_clip(logr, -clip_low, clip_high)
    pessimistic = jnp.where(
        adv > 0,
        jnp.minimum(logr, clipped),
        jnp.where(adv < 0, jnp.maximum(logr, clipped), 0.0),
    )

    weights = inputs.mask
    if token_weights is not None:
        weights = weights * prepare_weights(token_weights, "token_weights", inputs, where, True)
    denom = jnp.maximum(jnp.sum(weights, axis=1), 1.0)  # [N]
    log_rho = jnp.sum(pessimistic * weights, axis=1) / denom
    if is_weights is not None:
        w = prepare_weights(is_weights, "is_weights", inputs, where, True)
        log_w = zero_outside(jnp.log(w + _IS_LOG_EPS), inputs.valid)
        log_rho = log_rho + jax.lax.stop_gradient(jnp.sum(log_w * weights, axis=1) / denom)
    rho = jnp.exp(log_rho)  # [N]
    adv_mean = jnp.sum(adv * weights, axis=1) / denom  # [N]

    seq_valid = jnp.sum(inputs.mask, axis=1) > 0
    n_valid = jnp.maximum(jnp.sum(seq_valid.astype(jnp.float32)), 1.0)
    d_seq = (
        n_valid if num_seqs is None else global_count(num_seqs, n_valid, "num_seqs", where=where)
    )
    loss = jnp.sum(jnp.where(seq_valid, -adv_mean * rho, 0.0)) / d_seq

    high = (adv > 0) & (logr > clip_high)
    low = (adv < 0) & (logr < -clip_low)
    metrics = {
        "policy/clip_frac": masked_fraction(high | low, inputs),
        "policy/clip_frac_high": masked_fraction(high, inputs),
        "policy/clip_frac_low": masked_fraction(low, inputs),
        "policy/seq_ratio_mean": jnp.sum(jnp.where(seq_valid, rho, 0.0)) / n_valid,
    }
    metrics.update(ratio_metrics(raw_logr, ratio, inputs))
    return loss, stop_gradient_metrics(metrics)
