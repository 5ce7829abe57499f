"""DisCO: a discriminative objective on sequence scores with a squared-hinge KL constraint (§5.12)."""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_choice, check_positive, check_rank, check_real, global_count
from losses._policy import (
    PolicyInputs,
    log_ratio,
    prepare_policy_inputs,
    prepare_weights,
    ratio_metrics,
    stop_gradient_metrics,
)

Score = Literal["log_l", "l_ratio"]
Objective = Literal["log_sum_exp", "mean"]
SCORES: tuple[str, ...] = ("log_l", "l_ratio")
OBJECTIVES: tuple[str, ...] = ("log_sum_exp", "mean")
_DEFAULT_TAU = {"log_l": 10.0, "l_ratio": 1.0}


def _correctness_labels(correct: Any, logp_shape: tuple[int, ...], *, where: str) -> Array:
    """Validate `correct[B,G]` against `logp[N,T]` (`N = B·G`, `G ≥ 2`); return bool `[B,G]`.

    A sample is positive iff `correct > 0` (bool, {0,1} or ±1 labels). Shared by `disco_loss`
    and `nft_loss`.
    """
    check_rank(correct, 2, "correct", where=where)
    check_real(correct, "correct", where=where)
    b, g = jnp.shape(correct)
    if g < 2:
        raise ValueError(
            f"{where}: `correct` must be [B,G] with G >= 2 samples per prompt, got shape "
            f"{jnp.shape(correct)}."
        )
    if b * g != logp_shape[0]:
        raise ValueError(
            f"{where}: `correct` {jnp.shape(correct)} must hold one label per row of `logp` "
            f"(B·G = N = {logp_shape[0]}), got B·G = {b * g}."
        )
    return jax.lax.stop_gradient(jnp.asarray(correct) > 0)


def _sequence_scores(
    inputs: PolicyInputs, ratio: Array, score: str, weights: Array
) -> tuple[Array, Array]:
    """`(s[N], has_tokens[N])`: `s_n = Σ_t w·x / Σ_t w` of `logp` or the ratio, `w` the masked
    token weights; a row whose weights sum to 0 (no valid or no selected token) has no score."""
    per_token = inputs.logp if score == "log_l" else ratio
    total = jnp.sum(weights, axis=1)
    has_tokens = total > 0
    s = jnp.sum(per_token * weights, axis=1) / jnp.where(has_tokens, total, 1.0)
    return s, has_tokens


def _group_objective(
    s: Array, pos: Array, neg: Array, tau: Any, objective: str
) -> tuple[Array, Array]:
    """`(J[B], informative[B])`: mean_pos s − τ·log mean_neg exp(s/τ) (or − mean_neg s)."""
    n_pos = jnp.sum(pos, axis=1)
    n_neg = jnp.sum(neg, axis=1)
    informative = (n_pos > 0) & (n_neg > 0)
    pos_mean = jnp.sum(jnp.where(pos, s, 0.0), axis=1) / jnp.maximum(n_pos, 1.0)
    if objective == "mean":
        neg_term = jnp.sum(jnp.where(neg, s, 0.0), axis=1) / jnp.maximum(n_neg, 1.0)
    else:
        x = jnp.where(neg, s / tau, 0.0)
        top = jax.lax.stop_gradient(jnp.max(jnp.where(neg, x, -jnp.inf), axis=1, keepdims=True))
        top = jnp.where(jnp.isfinite(top), top, 0.0)
        total = jnp.sum(jnp.where(neg, jnp.exp(x - top), 0.0), axis=1)
        log_mean = jnp.log(jnp.maximum(total, 1e-30)) + top[:, 0] - jnp.log(jnp.maximum(n_neg, 1.0))
        neg_term = tau * log_mean
    return jnp.where(informative, pos_mean - neg_term, 0.0), informative


def disco_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    correct: ArrayLike,
    mask: ArrayLike,
    *,
    score: Score = "log_l",
    tau: float | None = None,
    objective: Objective = "log_sum_exp",
    delta: float = 1e-4,
    penalty: float = 1e3,
    token_weights: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_groups: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Discriminative Constrained Optimization loss (ALGORITHMS.md §5.12).

    Rows are contiguous groups (`n = b·G + g`); `correct[B,G] > 0` marks positive samples. With
    `r = exp(clip(logp − old_logp, ±log_ratio_clamp))`:

        score="log_l":   s_n = masked_mean_t(logp)          score="l_ratio":  s_n = masked_mean_t(r)
        per group b with ≥ 1 positive and ≥ 1 negative sample (else J_b = 0):
            objective="log_sum_exp":  J_b = mean_pos s − τ·log mean_neg exp(s/τ)
            objective="mean":         J_b = mean_pos s − mean_neg s
        kl   = masked_mean(old_logp − logp)                  (over all valid tokens of the batch)
        loss = −Σ_b J_b / D_grp + penalty·max(kl − δ, 0)²    D_grp = num_groups or B

    The log-sum-exp term is a smooth maximum over the negatives: as τ → 0 it pushes down the
    highest-scoring negative only (distributionally robust, for imbalanced groups), as τ → ∞ it
    becomes the mean. The squared hinge keeps `KL(π_old‖π_θ)` below δ without clipping. With a
    single negative per group both objectives are equal.

    Assumptions (reconstructed — verify against the paper): the objective structure and the KL
    estimate follow ALGORITHMS.md §5.12; samples with no valid token are excluded from both sets
    (their score would be an empty mean); the group mean runs over all `B` groups, degenerate
    groups contributing 0; `token_weights` weight the tokens of the score means,
    `s_n = Σ_t w·m·x / Σ_t w·m` (a sample whose weights are all 0, e.g. no token kept by an
    entropy mask, is excluded like one with no valid token; the KL estimate keeps every valid
    token). `l_ratio` uses the clamped token ratio. There is no `agg` (scores are
    sequence means) and no `is_weights` (no per-token loss to weight).

    Source: "DisCO: Reinforcing Large Reasoning Models with Discriminative Constrained
    Optimization" (arXiv 2505.12366); `tau` defaults to 10 for `log_l` and 1 for `l_ratio`,
    `delta=1e-4` and `penalty=1e3`, the authors' recipe. Peers: verl recipe `disco`
    (`score_func` logL/Lratio, `delta`, `beta` = our `penalty`, `tau`).

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable), `N = B·G`.
      old_logp: `[N,T]` log-probs of the sampling policy; None means `sg(logp)` (kl = 0).
      correct: `[B,G]` correctness labels (bool or numeric; positive iff > 0). `G ≥ 2`.
      mask: `[N,T]` {0,1} completion tokens that count.
      score: `"log_l"` (mean log-likelihood) or `"l_ratio"` (mean likelihood ratio).
      tau: temperature τ > 0 of the log-sum-exp; None: 10 (`log_l`) or 1 (`l_ratio`).
      objective: `"log_sum_exp"` (DisCO) or `"mean"` (DisCO-b, the plain score difference).
      delta: KL budget δ (≥ 0).
      penalty: coefficient of the squared hinge (≥ 0).
      token_weights: `[N,T]` selections of the tokens entering the score means.
      log_ratio_clamp: bound of |logp − old_logp| inside `exp` (None: no clamp).
      num_groups: global group count `D_grp` (micro-batching); None: `B`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/objective` (`Σ_b J_b / D_grp`),
      `policy/score_pos_mean` and `policy/score_neg_mean` (over positive / negative samples with
      tokens), `policy/informative_group_frac`, `kl/mean` (the constrained kl), `kl/penalty`,
      `policy/approx_kl`, `policy/ratio_mean`, `policy/ratio_max`.

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[-0.5, -0.5], [-1.0, -2.0]]); correct = jnp.array([[1, 0]])
      >>> loss, m = disco_loss(logp, logp, correct, jnp.ones((2, 2)))
      >>> round(float(loss), 4), float(m["kl/penalty"])
      (-1.0, 0.0)
    """
    where = "disco_loss"
    check_choice(score, SCORES, "score", where=where)
    check_choice(objective, OBJECTIVES, "objective", where=where)
    tau = _DEFAULT_TAU[score] if tau is None else tau
    check_positive(tau, "tau", where=where)
    check_positive(delta, "delta", where=where, allow_zero=True)
    check_positive(penalty, "penalty", where=where, allow_zero=True)
    # no advantages: a zero placeholder lets the shared validation run on logp/old_logp/mask
    placeholder = jnp.zeros(jnp.shape(logp), jnp.float32)
    inputs = prepare_policy_inputs(logp, old_logp, placeholder, mask, where=where)
    labels = _correctness_labels(correct, jnp.shape(logp), where=where)
    logr, ratio = log_ratio(inputs, log_ratio_clamp, where=where)

    weights = inputs.mask
    if token_weights is not None:
        weights = weights * prepare_weights(token_weights, "token_weights", inputs, where, True)
    s, has_tokens = _sequence_scores(inputs, ratio, score, weights)
    shape = labels.shape
    s_g = s.reshape(shape)
    has_g = has_tokens.reshape(shape)
    pos, neg = labels & has_g, ~labels & has_g
    j, informative = _group_objective(s_g, pos, neg, tau, objective)
    local = jnp.float32(shape[0])
    d_grp = (
        local if num_groups is None else global_count(num_groups, local, "num_groups", where=where)
    )
    mean_j = jnp.sum(j) / d_grp

    count = jnp.maximum(jnp.sum(inputs.mask), 1.0)
    kl = jnp.sum(-logr) / count
    hinge = jnp.maximum(kl - delta, 0.0)
    kl_penalty = penalty * hinge**2
    loss = -mean_j + kl_penalty

    n_pos = jnp.maximum(jnp.sum(pos), 1.0)
    n_neg = jnp.maximum(jnp.sum(neg), 1.0)
    metrics = {
        "policy/objective": mean_j,
        "policy/score_pos_mean": jnp.sum(jnp.where(pos, s_g, 0.0)) / n_pos,
        "policy/score_neg_mean": jnp.sum(jnp.where(neg, s_g, 0.0)) / n_neg,
        "policy/informative_group_frac": jnp.mean(informative.astype(jnp.float32)),
        "kl/mean": kl,
        "kl/penalty": kl_penalty,
    }
    metrics.update(ratio_metrics(logr, ratio, inputs))
    return loss, stop_gradient_metrics(metrics)
