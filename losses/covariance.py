"""Covariance-based entropy control: Clip-Cov and KL-Cov (ALGORITHMS.md §5.8).

Both losses score each valid token by the centred covariance of its advantage and its log-prob,

    cov_nt = (A_nt − Ā)·(sg(logp_nt) − mean(sg(logp)))      (means over all valid tokens)

and treat a small fraction `k = max(⌊ratio·Σm⌋, 1)` of high-covariance tokens specially, because
those tokens drive the entropy collapse of policy-gradient training. Selection is done with rank
comparisons (a stable sort of the flattened scores, then `rank < k`), never `lax.top_k`, so `k`
may be a traced value; ties are broken by the flat index `n·T + t`. Under `jax.jit` on a mesh
the sort sees the whole global batch (explicitly sharded inputs are gathered for it); inside
`shard_map` each shard selects among its own tokens, as verl does per rank.

Source: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
(arXiv 2505.22617). Peer: verl `clip_cov` / `kl_cov`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_positive, replicated
from losses._policy import (
    PolicyInputs,
    clip_terms,
    log_ratio,
    masked_fraction,
    prepare_policy_inputs,
    ratio_metrics,
    reduce_policy_loss,
    stop_gradient_metrics,
    zero_outside,
)
from losses.aggregation import AggMode

# --------------------------------------------------------------------------------------------------
# private helpers
# --------------------------------------------------------------------------------------------------


def _token_cov(inputs: PolicyInputs) -> Array:
    """`cov = (A − Ā)·(sg(logp) − mean(sg(logp)))` over valid tokens; 0 outside the mask."""
    count = jnp.maximum(jnp.sum(inputs.mask), 1.0)
    lp = jax.lax.stop_gradient(inputs.logp)
    adv = inputs.advantages
    adv_c = adv - jnp.sum(adv) / count
    lp_c = lp - jnp.sum(lp) / count
    return jax.lax.stop_gradient(zero_outside(adv_c * lp_c, inputs.valid))


def _num_selected(ratio: Any, inputs: PolicyInputs) -> Array:
    """`k = max(⌊ratio·Σm⌋, 1)` as int32 (computed in float32; `ratio` may be traced)."""
    k = jnp.floor(jnp.asarray(ratio, jnp.float32) * jnp.sum(inputs.mask))
    return jnp.maximum(k, 1.0).astype(jnp.int32)


def _select_top_k(scores: Array, candidates: Array, k: Array) -> Array:
    """Boolean `[N,T]`: the `min(k, |candidates|)` candidates with the largest `scores`.

    Each token's rank among the candidates comes from one stable sort of the flattened arrays
    with keys `(not candidate, −score)`, so ties go to the smaller flat index; the selection is
    `candidate ∧ rank < k`, which works for a traced `k`.
    """
    shape = scores.shape
    flat_scores = replicated(scores.reshape(-1))
    flat_cand = replicated(candidates.reshape(-1))
    index = jnp.arange(flat_scores.shape[0], dtype=jnp.int32)
    group = jnp.where(flat_cand, 0, 1).astype(jnp.int32)
    key = jnp.where(flat_cand, -flat_scores, 0.0)
    _, _, order = jax.lax.sort((group, key, index), num_keys=2, is_stable=True)
    rank = jnp.zeros_like(index).at[order].set(index)
    return (flat_cand & (rank < k)).reshape(shape)


def _check_key(key: Any, where: str) -> None:
    """Raise unless `key` is one PRNG key: typed (`jax.random.key`) or raw uint32 (`PRNGKey`)."""
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if jnp.ndim(key) == 0:
            return
    elif dtype == jnp.uint32 and jnp.ndim(key) == 1:
        return
    raise ValueError(
        f"{where}: `key` must be None or a single PRNG key (`jax.random.key(seed)`), got "
        f"{type(key).__name__} with dtype {dtype} and shape {jnp.shape(key)}."
    )


def _check_ratio(value: Any, name: str, where: str) -> None:
    """Raise if a static selection ratio lies outside (0, 1]."""
    check_positive(value, name, where=where)
    if isinstance(value, int | float) and value > 1.0:
        raise ValueError(f"{where}: `{name}` must be in (0, 1], got {value!r}.")


# --------------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------------


def clip_cov_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    key: Any = None,
    agg: AggMode = "token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Clip-Cov: PPO's clipped loss with the gradient of a few high-covariance tokens removed.

    With `r = exp(clip(logp − old_logp, ±log_ratio_clamp))` (±20 by default; None: no clamp, as
    verl), advantages `A` and `cov` as in the module docstring:

        ℓ1 = −A·r ;  ℓ2 = −A·clip(r, 1 − ε_low, 1 + ε_high) ;  clipped = [ℓ2 > ℓ1]
        candidates = m ∧ ¬clipped ∧ (lb < cov < ub) ;  k = max(⌊clip_cov_ratio·Σm⌋, 1)
        selected   = min(k, |candidates|) candidates: at random with `key`, else largest cov first
        ℓ = max(ℓ1, ℓ2)·(1 − sg(selected)) ;  loss = aggregate(ℓ · sg(is_weights) · token_weights)

    Selected tokens contribute neither value nor gradient (ℓ = 0) but stay in the normaliser
    (the mask is unchanged). With `key`, every
    candidate draws `u ~ U(0, 1)` and the `k` smallest `u` are taken: a uniformly random subset,
    as verl's `randperm` (the same distribution, not the same draws). With `key=None` the
    largest covariances are taken first, ties by flat index; this deterministic variant is our
    choice (verl always samples). `k` counts the valid tokens of this call (verl: of the
    micro-batch), not `num_tokens`; it is computed in float32, so a product `ratio·Σm` that is an
    integer in decimal arithmetic may round down by one.

    Source: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
    (arXiv 2505.22617); defaults are the paper's and verl's (`clip_cov_ratio=2e-4`, bounds
    `(1, 5)`, ε = 0.2/0.2). Peer: verl `clip_cov`, reproduced (up to the random draw) by the
    defaults with a `key`, verl's `clip_ratio_low/high` as `clip_low/clip_high` and
    `log_ratio_clamp=None` (verl has no ratio clamp; the default 20.0 is the common contract of
    ALGORITHMS.md §5.0 and only acts where `|logp − old_logp| > 20`).

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      old_logp: `[N,T]` log-probs of the policy that the batch is reused from; None means
        `sg(logp)` (ratio ≡ 1, on-policy).
      advantages: `[N,T]` (no gradient flows into them).
      mask: `[N,T]` {0,1} completion tokens that count.
      clip_low: ε_low of the PPO clip.
      clip_high: ε_high of the PPO clip.
      clip_cov_ratio: fraction of the valid tokens to select, in (0, 1] (may be traced).
      clip_cov_lb: exclusive lower bound on `cov` for a candidate.
      clip_cov_ub: exclusive upper bound on `cov` for a candidate.
      key: PRNG key for the random selection; None selects deterministically.
      agg: aggregation mode of `losses.aggregate`.
      is_weights: `[N,T]` rollout-correction weights (stop-gradient).
      token_weights: `[N,T]` selections that must not change the normaliser.
      log_ratio_clamp: bound of |logp − old_logp| inside `exp` (None: no clamp, as verl).
      num_tokens: global token count for `agg` (see `aggregate`).
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/clip_frac`, `policy/clip_frac_high`,
      `policy/clip_frac_low` (as `ppo_clip_loss`), `policy/cov_selected_frac` (verl's
      `pg_clipfrac`), `policy/approx_kl`, `policy/ratio_mean`, `policy/ratio_max`.

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[-1.0, -2.0, -3.0, -4.0]]); adv = jnp.array([[2.0, 0.0, 0.0, -2.0]])
      >>> loss, m = clip_cov_loss(logp, logp, adv, jnp.ones((1, 4)), clip_cov_ratio=0.25)
      >>> round(float(loss), 4), float(m["policy/cov_selected_frac"])
      (0.5, 0.25)
    """
    where = "clip_cov_loss"
    check_positive(clip_low, "clip_low", where=where, allow_zero=True)
    check_positive(clip_high, "clip_high", where=where, allow_zero=True)
    _check_ratio(clip_cov_ratio, "clip_cov_ratio", where)
    if (
        isinstance(clip_cov_lb, int | float)
        and isinstance(clip_cov_ub, int | float)
        and not clip_cov_lb < clip_cov_ub  # NaN included: no token would be a candidate
    ):
        raise ValueError(
            f"{where}: `clip_cov_lb` must be < `clip_cov_ub` (neither NaN), got "
            f"{clip_cov_lb!r} and {clip_cov_ub!r}."
        )
    if key is not None:
        _check_key(key, where)
    inputs = prepare_policy_inputs(logp, old_logp, advantages, mask, where=where)
    logr, ratio = log_ratio(inputs, log_ratio_clamp, where=where)
    adv = inputs.advantages

    loss_unclipped, loss_clipped = clip_terms(adv, ratio, clip_low, clip_high)
    clipped = loss_clipped > loss_unclipped
    cov = _token_cov(inputs)
    candidates = inputs.valid & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    k = _num_selected(clip_cov_ratio, inputs)
    # key: the smallest u ~ U(0, 1) first (a uniform random subset); None: the largest cov first
    scores = cov if key is None else -jax.random.uniform(key, cov.shape, jnp.float32)
    selected = jax.lax.stop_gradient(_select_top_k(scores, candidates, k))
    per_token = jnp.where(selected, 0.0, jnp.maximum(loss_unclipped, loss_clipped))

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
    metrics = {
        "policy/clip_frac": masked_fraction(clipped, inputs),
        "policy/clip_frac_high": masked_fraction((adv > 0) & (ratio > 1.0 + clip_high), inputs),
        "policy/clip_frac_low": masked_fraction((adv < 0) & (ratio < 1.0 - clip_low), inputs),
        "policy/cov_selected_frac": masked_fraction(selected, inputs),
    }
    metrics.update(ratio_metrics(logr, ratio, inputs))
    return loss, stop_gradient_metrics(metrics)


def kl_cov_loss(
    logp: ArrayLike,
    old_logp: ArrayLike | None,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 1.0,
    agg: AggMode = "token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """KL-Cov: the unclipped surrogate plus a |log-ratio| penalty on the top-covariance tokens.

    With `r = exp(clip(logp − old_logp, ±log_ratio_clamp))` (±20 by default; None: no clamp, as
    verl), `logr = logp − old_logp`, advantages `A` and `cov` as in the module docstring:

        k = max(⌊kl_cov_ratio·Σm⌋, 1) ;  selected = the k valid tokens with the largest cov
        ℓ = −A·r + ppo_kl_coef·|logr|·sg(selected)
        loss = aggregate(ℓ · sg(is_weights) · token_weights, mask, agg)

    No clipping. Ties in `cov` go to the smaller flat index (verl's `torch.topk` leaves them
    unspecified). `|logr|` has gradient `sign(logr)·∇logp`, 0 at `logr = 0` as in PyTorch, so at
    ratio 1 the gradient is exactly `reinforce_loss`'s. `k` counts the valid tokens of this call
    (verl: of the micro-batch), in float32.

    Source: "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
    (arXiv 2505.22617). Peer: verl `kl_cov` (no ratio clamp: `log_ratio_clamp=None`);
    its shipped config is reproduced by `ppo_kl_coef=0.1`. `ppo_kl_coef` is 0.1 in that config
    and 1.0 in verl's code fallback; 1.0 is the default of DESIGN.md. `kl_cov_ratio=2e-4` is
    verl's default.

    Args:
      logp: `[N,T]` log-probs of the current policy (differentiable).
      old_logp: `[N,T]` log-probs of the policy that the batch is reused from; None means
        `sg(logp)` (ratio ≡ 1, on-policy).
      advantages: `[N,T]` (no gradient flows into them).
      mask: `[N,T]` {0,1} completion tokens that count.
      kl_cov_ratio: fraction of the valid tokens to penalise, in (0, 1] (may be traced).
      ppo_kl_coef: weight of the `|logr|` penalty (≥ 0).
      agg: aggregation mode of `losses.aggregate`.
      is_weights: `[N,T]` rollout-correction weights (stop-gradient).
      token_weights: `[N,T]` selections that must not change the normaliser.
      log_ratio_clamp: bound of |logp − old_logp| inside `exp` (None: no clamp, as verl); the
        penalty always uses the unclamped `|logr|`.
      num_tokens: global token count for `agg` (see `aggregate`).
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/cov_selected_frac`, `policy/approx_kl`
      (`masked_mean|logr|`, as verl), `policy/ratio_mean`, `policy/ratio_max`.

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.array([[-1.0, -2.0, -3.0, -4.0]]); old = logp - 0.5
      >>> adv = jnp.array([[4.0, 0.0, 0.0, -4.0]])
      >>> loss, m = kl_cov_loss(logp, old, adv, jnp.ones((1, 4)), kl_cov_ratio=0.25)
      >>> round(float(loss), 4), float(m["policy/cov_selected_frac"])
      (0.125, 0.25)
    """
    where = "kl_cov_loss"
    _check_ratio(kl_cov_ratio, "kl_cov_ratio", where)
    check_positive(ppo_kl_coef, "ppo_kl_coef", where=where, allow_zero=True)
    inputs = prepare_policy_inputs(logp, old_logp, advantages, mask, where=where)
    logr, ratio = log_ratio(inputs, log_ratio_clamp, where=where)
    adv = inputs.advantages

    cov = _token_cov(inputs)
    k = _num_selected(kl_cov_ratio, inputs)
    selected = jax.lax.stop_gradient(_select_top_k(cov, inputs.valid, k))
    abs_logr = jnp.sign(logr) * logr  # |logr| with gradient sign(logr): 0 at logr = 0
    penalty = jnp.where(selected, ppo_kl_coef * abs_logr, 0.0)
    per_token = -adv * ratio + penalty

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
    metrics = ratio_metrics(logr, ratio, inputs)
    metrics["policy/approx_kl"] = jnp.sum(zero_outside(abs_logr, inputs.valid)) / count
    metrics["policy/cov_selected_frac"] = masked_fraction(selected, inputs)
    return loss, stop_gradient_metrics(metrics)
