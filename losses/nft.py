"""NFT: negative-aware fine-tuning, a likelihood loss on positives and on an implicit negative policy."""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_choice, check_positive
from losses._policy import (
    PolicyInputs,
    log_ratio,
    masked_fraction,
    prepare_policy_inputs,
    ratio_metrics,
    reduce_policy_loss,
    stop_gradient_metrics,
    zero_outside,
)
from losses.aggregation import AggMode
from losses.disco import _correctness_labels

NftNorm = Literal["none", "one_minus", "sqrt"]
RatioLevel = Literal["token", "sequence"]
NORMS: tuple[str, ...] = ("none", "one_minus", "sqrt")
RATIO_LEVELS: tuple[str, ...] = ("token", "sequence")


def _log_ratio_nft(inputs: PolicyInputs, level: str, log_ratio_max: Any) -> Array:
    """`log R` `[N,T]`: token log-ratio, or the sequence sum broadcast, capped at `log_ratio_max`."""
    logr = inputs.logp - inputs.old_logp  # zero outside the mask
    if level == "sequence":
        logr = jnp.broadcast_to(jnp.sum(logr, axis=1, keepdims=True), logr.shape)
    if log_ratio_max is not None:
        logr = jnp.minimum(logr, log_ratio_max)
    return zero_outside(logr, inputs.valid)


def _straight_through_log(x: Array, floor: Any) -> Array:
    """`log stclamp(x, c)` with `stclamp(x, c) = x + sg(max(x, c) − x)`: clamped value, gradient ∂x/max(x, c).

    Written as `sg(log max(x, c)) + (x − sg(x)) / sg(max(x, c))`, the same value and gradient
    without adding `c` to `x`: for `x ≪ −c` (a negative sample with a large ratio) float32
    rounds `x + (c − x)` to 0, and the log to −inf.
    """
    clamped = jax.lax.stop_gradient(jnp.maximum(x, floor))
    return jnp.log(clamped) + (x - jax.lax.stop_gradient(x)) / clamped


def _check_acc_clip(acc_clip: Any, where: str) -> tuple[float, float]:
    if not (isinstance(acc_clip, tuple | list) and len(acc_clip) == 2):
        raise ValueError(f"{where}: `acc_clip` must be a pair (low, high), got {acc_clip!r}.")
    low, high = acc_clip
    if not (0.0 < low <= high < 1.0):
        raise ValueError(
            f"{where}: `acc_clip` must satisfy 0 < low <= high < 1 (the accuracy enters "
            f"1/(1 − r) and 1/r), got {acc_clip!r}."
        )
    return float(low), float(high)


def nft_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    correct: ArrayLike,
    mask: ArrayLike,
    *,
    clamp_neg: float,
    clamp_pos: float | None = None,
    neg_weight: float = 1.0,
    norm: NftNorm = "none",
    ratio_level: RatioLevel = "token",
    acc_clip: tuple[float, float] = (0.02, 0.98),
    log_ratio_max: float | None = 10.0,
    agg: AggMode = "token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Negative-aware Fine-Tuning loss (ALGORITHMS.md §5.14).

    Rows are contiguous groups (`n = b·G + g`); sample `n` is positive iff `correct[b,g] > 0`.
    With `logr = logp − old_logp`:

        r_q = clip(mean_g [correct > 0], acc_clip)                      (prompt accuracy, sg)
        R   = exp(min(logr, log_ratio_max))              ratio_level="token"
            = exp(min(Σ_t logr·m, log_ratio_max))        ratio_level="sequence" (broadcast over t)
        stclamp(x, c) = x + sg(max(x, c) − x)            (clamped value, unclamped gradient)
        positive:  ℓ = −log stclamp(R, clamp_pos)                     (no clamp if None)
        negative:  ℓ = −neg_weight·log stclamp((1 − r_q·R)/(1 − r_q), clamp_neg)
        norm="one_minus": ℓ ·= (1 − r_q) ;  norm="sqrt": ℓ ·= sqrt((1 − r_q)/r_q)
        loss = aggregate(ℓ · sg(is_weights) · token_weights, mask, agg)

    Positives are fitted by maximum likelihood; negatives train the *implicit negative policy*
    `(π_old − r_q·π_θ)/(1 − r_q)`, whose likelihood rises as π_θ moves probability away from
    them. `clamp_neg` keeps its argument positive. On-policy (`R ≡ 1`) the per-token gradients
    are those of a policy gradient with advantages `+1` (positives) and `−r_q/(1 − r_q)`
    (negatives), times the norm factor: `norm="sqrt"` equals GRPO
    (`group_advantages(scale="group", ddof=0, eps=0)`), `norm="one_minus"` equals Dr.GRPO
    (`scale="none"`). The accuracy counts every sample of the prompt, also those without valid
    tokens. Without `clamp_pos` the positive loss is computed as `−log R` directly (no `log 0`).

    Source: "Bridging Supervised Learning and Reinforcement Learning in Math Reasoning" (NFT,
    arXiv 2505.18116); formula from the authors' public code. `clamp_neg` is required: its value
    must be copied from the authors' code (none is recorded in ALGORITHMS.md). The sequence-level
    ratio and the authors' aggregation (sum per sequence over a constant 1000:
    `agg="seq_mean_token_sum_norm", norm_length=1000`) are (reconstructed — verify against the
    paper). No peer implements NFT.

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable), `N = B·G`.
      old_logp: `[N,T]` log-probs of the sampling policy; None means `sg(logp)` (R ≡ 1).
      correct: `[B,G]` correctness labels (bool or numeric; positive iff > 0). `G ≥ 2`.
      mask: `[N,T]` {0,1} completion tokens that count.
      clamp_neg: floor of the negative likelihood ratio (> 0; required).
      clamp_pos: floor of the positive ratio (> 0); None: no clamp.
      neg_weight: weight of the negative loss (≥ 0).
      norm: `"none"`, `"one_minus"` or `"sqrt"` (per-prompt factor, see above).
      ratio_level: `"token"` or `"sequence"`.
      acc_clip: `(low, high)` bounds of `r_q`, `0 < low ≤ high < 1`.
      log_ratio_max: cap on the log-ratio before `exp` (beyond it no gradient); None: no cap.
      agg: aggregation mode of `losses.aggregate`.
      is_weights: `[N,T]` rollout-correction weights (stop-gradient).
      token_weights: `[N,T]` selections that must not change the normaliser.
      num_tokens: global token count for `agg` (see `aggregate`).
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/accuracy_mean` (mean of the clipped `r_q`
      over prompts), `policy/clamp_frac_pos` and `policy/clamp_frac_neg` (valid tokens whose
      argument is below its floor), `policy/approx_kl`, `policy/ratio_mean`, `policy/ratio_max`
      (token ratios, clamped at ±20).

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[-1.0], [-2.0], [-1.0], [-3.0]])
      >>> loss, m = nft_loss(logp, None, jnp.array([[1, 0, 0, 0]]), jnp.ones((4, 1)), clamp_neg=0.1)
      >>> float(loss), float(m["policy/accuracy_mean"])
      (0.0, 0.25)
    """
    where = "nft_loss"
    if clamp_neg is None:
        raise ValueError(f"{where}: `clamp_neg` is required (> 0, from the authors' code).")
    check_positive(clamp_neg, "clamp_neg", where=where)
    if clamp_pos is not None:
        check_positive(clamp_pos, "clamp_pos", where=where)
    check_positive(neg_weight, "neg_weight", where=where, allow_zero=True)
    check_choice(norm, NORMS, "norm", where=where)
    check_choice(ratio_level, RATIO_LEVELS, "ratio_level", where=where)
    low, high = _check_acc_clip(acc_clip, where)
    if log_ratio_max is not None:
        check_positive(log_ratio_max, "log_ratio_max", where=where)
    placeholder = jnp.zeros(jnp.shape(logp), jnp.float32)  # no advantages: labels instead
    inputs = prepare_policy_inputs(logp, old_logp, placeholder, mask, where=where)
    labels = _correctness_labels(correct, jnp.shape(logp), where=where)

    acc = jnp.clip(jnp.mean(labels.astype(jnp.float32), axis=1, keepdims=True), low, high)  # [B,1]
    # [B,G] → [N] → [N,1] (merging into a rank-1 array keeps an explicit sharding of B valid)
    r_q = jnp.broadcast_to(acc, labels.shape).reshape(-1)[:, None]  # [N,1]
    positive = labels.reshape(-1)[:, None]  # [N,1]

    log_r = _log_ratio_nft(inputs, ratio_level, log_ratio_max)
    big_r = jnp.exp(log_r)
    pos_loss = -log_r if clamp_pos is None else -_straight_through_log(big_r, clamp_pos)
    neg_arg = (1.0 - r_q * big_r) / (1.0 - r_q)
    neg_loss = -neg_weight * _straight_through_log(neg_arg, clamp_neg)
    per_token = jnp.where(positive, pos_loss, neg_loss)
    if norm == "one_minus":
        per_token = per_token * (1.0 - r_q)
    elif norm == "sqrt":
        per_token = per_token * jnp.sqrt((1.0 - r_q) / r_q)

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
    logr, ratio = log_ratio(inputs, 20.0, where=where)
    below_pos = jnp.zeros_like(inputs.valid) if clamp_pos is None else big_r < clamp_pos
    metrics = {
        "policy/accuracy_mean": jnp.mean(acc),
        "policy/clamp_frac_pos": masked_fraction(positive & below_pos, inputs),
        "policy/clamp_frac_neg": masked_fraction(~positive & (neg_arg < clamp_neg), inputs),
    }
    metrics.update(ratio_metrics(logr, ratio, inputs))
    return loss, stop_gradient_metrics(metrics)
