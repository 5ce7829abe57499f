"""Process reward models: step labels, PRM losses, step-score aggregation, implicit PRMs.

ALGORITHMS.md §9.2 (Monte-Carlo step labels, BCE / MSE step losses, aggregation of step scores to
an outcome score), §9.4 (implicit process rewards from a policy/reference log-ratio and the
cross-entropy ORM objective that trains them) and the §11 row "step scores onto step-end tokens".

Layouts: a step layout is `[N,M]` (M steps per sequence, `step_mask[N,M]` marks the steps that
exist); the same losses work on a token layout `[N,T]` whose mask marks the step-label tokens
(e.g. the step-separator positions where a PRM head is read out). Token ↔ step maps use
`segment_ids[N,T]` (int, −1 on tokens that belong to no step, ALGORITHMS.md §4.15) or step-end
positions `end[N,M]`. Masked entries are replaced by 0 before any arithmetic, so NaN/inf there
never reach values or gradients. Labels and targets carry no gradient.
"""

from __future__ import annotations

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
    check_real,
    check_same_shape,
    check_valid_range,
)
from losses._policy import stop_gradient_metrics, zero_outside
from losses.aggregation import AGG_MODES, AggMode, aggregate
from losses.reward_model import _bce_with_logits, _masked_mean, _optional_valid

StepAggregation = Literal["min", "last", "prod", "mean"]
STEP_AGGREGATIONS: tuple[str, ...] = ("min", "last", "prod", "mean")


def _step_inputs(x: Any, y: Any, mask: Any, names: tuple[str, str, str], *, where: str) -> tuple:
    """Validate two `[N,M]` arrays and their mask (`names`: the three argument names); return
    float32 `(x, sg(y), m, valid)`."""
    check_rank(x, 2, names[0], where=where)
    check_floating(x, names[0], where=where)
    check_real(y, names[1], where=where)
    check_same_shape(x, names[0], where, **{names[1]: y})
    m = as_mask(mask, jnp.shape(x), names[2], where=where)
    valid = m > 0
    xs = zero_outside(as_float32(x), valid)
    ys = jax.lax.stop_gradient(zero_outside(as_float32(y), valid))
    return xs, ys, m, valid


def _check_static_int(value: Any, name: str, *, where: str, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(
            f"{where}: `{name}` must be a static Python int >= {minimum}, got {value!r}."
        )


# --------------------------------------------------------------------------------------------------
# Monte-Carlo step labels and the PRM losses (§9.2)
# --------------------------------------------------------------------------------------------------


def mc_step_labels(
    rollout_correct: ArrayLike,
    *,
    mode: Literal["hard", "soft"] = "hard",
    valid: ArrayLike | None = None,
) -> Array:
    """Monte-Carlo step labels from K continuations per step (ALGORITHMS.md §9.2).

        hard: y_nm = [∃k valid: correct_nmk > 0]          (Math-Shepherd "HE")
        soft: y_nm = Σ_k valid·correct_nmk / max(Σ_k valid, 1)   ("SE", the estimated value)

    `rollout_correct[n,m,k]` is the outcome (1 correct / 0 wrong, or a score in [0, 1] for `soft`)
    of the k-th continuation sampled from the prefix that ends with step m. Steps without a valid
    continuation get 0.

    Sources: "Math-Shepherd: Verify and Reinforce LLMs Step-by-step without Human Annotations"
    (arXiv 2312.08935); "The Lessons of Developing Process Reward Models in Mathematical Reasoning"
    (arXiv 2501.07301).

    Args:
      rollout_correct: `[N,M,K]` continuation outcomes (bool or numeric).
      mode: "hard" (any continuation correct) or "soft" (fraction correct).
      valid: optional `[N,M,K]` {0,1} continuations that were sampled.

    Returns:
      `[N,M]` float32 labels in [0, 1], under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> c = jnp.array([[[1, 0, 0, 0], [0, 0, 0, 0]]])
      >>> mc_step_labels(c).tolist(), mc_step_labels(c, mode="soft").tolist()
      ([[1.0, 0.0]], [[0.25, 0.0]])
    """
    where = "mc_step_labels"
    check_rank(rollout_correct, 3, "rollout_correct", where=where)
    check_real(rollout_correct, "rollout_correct", where=where)
    check_choice(mode, ("hard", "soft"), "mode", where=where)
    shape = jnp.shape(rollout_correct)
    v = _optional_valid(valid, shape, where=where) > 0
    check_valid_range(rollout_correct, v, "rollout_correct", where=where, low=0.0, high=1.0)
    c = zero_outside(as_float32(rollout_correct), v)
    if mode == "hard":
        labels = jnp.any(c > 0, axis=-1).astype(jnp.float32)
    else:
        labels = jnp.sum(c, axis=-1) / jnp.maximum(jnp.sum(v.astype(jnp.float32), axis=-1), 1.0)
    return jax.lax.stop_gradient(labels)


def prm_bce_loss(
    step_logits: ArrayLike,
    labels: ArrayLike,
    step_mask: ArrayLike,
    *,
    agg: AggMode = "token_mean",
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Binary cross-entropy of a process reward model on its step labels (ALGORITHMS.md §9.2).

        ℓ_nm = −y_nm·logσ(z_nm) − (1 − y_nm)·logσ(−z_nm)
        loss = aggregate(ℓ, step_mask, agg)         (default: masked mean over the steps)

    `z` is the PRM's logit at each step-label position (for a two-token "+"/"−" head,
    `z = z₊ − z₋`); `y` is hard (0/1) or soft (e.g. `mc_step_labels(mode="soft")`). With `y = ½`
    the loss is minimised at `z = 0`. Works on a step layout `[N,M]` or on a token layout `[N,T]`
    whose mask selects the step-label tokens.

    Sources: "The Lessons of Developing Process Reward Models in Mathematical Reasoning"
    (arXiv 2501.07301); "Math-Shepherd" (arXiv 2312.08935). Peers: — .

    Args:
      step_logits: `[N,M]` PRM logits (differentiable).
      labels: `[N,M]` labels in [0, 1] (no gradient).
      step_mask: `[N,M]` {0,1} steps (or step-label tokens) that count.
      agg: aggregation mode of `losses.aggregate`.
      num_tokens: global step count for `agg` (see `aggregate`).
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar; `rm/step_accuracy` (`mean[(z > 0) = (y > ½)]`),
      `rm/step_prob_mean` (`mean σ(z)`), `rm/step_label_mean` over the valid steps.

    Examples:
      >>> import jax.numpy as jnp
      >>> z = jnp.array([[2.0, -1.0, 7.0]]); y = jnp.array([[1.0, 0.0, 0.0]])
      >>> loss, m = prm_bce_loss(z, y, jnp.array([[1, 1, 0]]))
      >>> round(float(loss), 4), float(m["rm/step_accuracy"])
      (0.2201, 1.0)
    """
    where = "prm_bce_loss"
    check_choice(agg, AGG_MODES, "agg", where=where)
    z, y, m, valid = _step_inputs(
        step_logits, labels, step_mask, ("step_logits", "labels", "step_mask"), where=where
    )
    check_valid_range(labels, step_mask, "labels", where=where, low=0.0, high=1.0)
    per_step = zero_outside(_bce_with_logits(z, y), valid)
    loss = aggregate(
        per_step, m, mode=agg, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )
    metrics = {
        "rm/step_accuracy": _masked_mean(((z > 0) == (y > 0.5)).astype(jnp.float32), m),
        "rm/step_prob_mean": _masked_mean(jax.nn.sigmoid(z), m),
        "rm/step_label_mean": _masked_mean(y, m),
    }
    return loss, stop_gradient_metrics(metrics)


def prm_mse_loss(
    values: ArrayLike,
    targets: ArrayLike,
    mask: ArrayLike,
    *,
    agg: AggMode = "token_mean",
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Squared error of a step value head against Monte-Carlo / tree targets (ALGORITHMS.md §9.2).

        loss = aggregate((v − y)², mask, agg)       (default: masked mean; no ½ factor)

    For value heads trained on Monte-Carlo or MCTS value targets (ReST-MCTS*, AlphaMath, MedS³,
    TVM with `prefix_tree_values` targets). Unlike `value_loss` there is no ½ factor and no
    clipping. Works on `[N,M]` step layouts and `[N,T]` token layouts alike.

    Sources: "The Lessons of Developing Process Reward Models in Mathematical Reasoning"
    (arXiv 2501.07301); seed papers ReST-MCTS*, AlphaMath, MedS³, TVM. Peers: — .

    Args:
      values: `[N,M]` predicted step values (differentiable).
      targets: `[N,M]` regression targets (no gradient).
      mask: `[N,M]` {0,1} entries that count.
      agg: aggregation mode of `losses.aggregate`.
      num_tokens: global entry count for `agg`.
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar; `rm/value_mean`, `rm/target_mean` over valid entries.

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, _ = prm_mse_loss(jnp.array([[0.5, 1.0]]), jnp.array([[1.0, 1.0]]), jnp.ones((1, 2)))
      >>> float(loss)
      0.125
    """
    where = "prm_mse_loss"
    check_choice(agg, AGG_MODES, "agg", where=where)
    v, y, m, valid = _step_inputs(values, targets, mask, ("values", "targets", "mask"), where=where)
    loss = aggregate(
        zero_outside((v - y) ** 2, valid),
        m,
        mode=agg,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    metrics = {"rm/value_mean": _masked_mean(v, m), "rm/target_mean": _masked_mean(y, m)}
    return loss, stop_gradient_metrics(metrics)


def aggregate_step_scores(
    scores: ArrayLike, step_mask: ArrayLike, *, how: StepAggregation = "min"
) -> Array:
    """Reduce per-step PRM scores to one score per sequence (ALGORITHMS.md §9.2).

        min:  min_m s_m      last: s at the last valid step
        prod: Π_m s_m        mean: Σ_m s_m / #steps          (over valid steps)

    `min` (the default) and `prod` treat a solution as only as good as its weakest step; `last`
    is the PRM's judgement after the whole solution. Rows without a valid step give 0. The result
    is differentiable w.r.t. `scores` (wrap it in `stop_gradient` to use it as a reward).

    Sources: "The Lessons of Developing Process Reward Models in Mathematical Reasoning"
    (arXiv 2501.07301); "Math-Shepherd" (arXiv 2312.08935).

    Args:
      scores: `[N,M]` step scores (e.g. probabilities `σ(z)`).
      step_mask: `[N,M]` {0,1} steps that exist (holes allowed).
      how: "min", "last", "prod" or "mean".

    Returns:
      `[N]` float32 sequence scores.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.array([[0.9, 0.5, 0.8, jnp.nan]]); m = jnp.array([[1, 1, 1, 0]])
      >>> [round(float(aggregate_step_scores(s, m, how=h)[0]), 4) for h in STEP_AGGREGATIONS]
      [0.5, 0.8, 0.36, 0.7333]
    """
    where = "aggregate_step_scores"
    check_rank(scores, 2, "scores", where=where)
    check_real(scores, "scores", where=where)
    check_choice(how, STEP_AGGREGATIONS, "how", where=where)
    if jnp.shape(scores)[1] < 1:
        raise ValueError(
            f"{where}: `scores` must hold at least one step, got shape {jnp.shape(scores)}."
        )
    valid = as_mask(step_mask, jnp.shape(scores), "step_mask", where=where) > 0
    s = zero_outside(as_float32(scores), valid)
    has_step = jnp.any(valid, axis=-1)
    if how == "min":
        out = jnp.min(jnp.where(valid, s, jnp.inf), axis=-1)
    elif how == "prod":
        out = _row_product(jnp.where(valid, s, 1.0))
    elif how == "mean":
        out = jnp.sum(s, axis=-1) / jnp.maximum(jnp.sum(valid, axis=-1), 1).astype(s.dtype)
    else:  # last valid step: the highest index with mask = 1
        M = s.shape[-1]
        last = jnp.max(jnp.where(valid, jnp.arange(M)[None, :], -1), axis=-1)
        out = jnp.sum(jnp.where(jnp.arange(M)[None, :] == last[:, None], s, 0.0), axis=-1)
    return jnp.where(has_step, out, 0.0)


def _row_product(x: Array) -> Array:
    """`Π_m x[:, m]` as a chain of multiplies (`jnp.prod`'s gradient reshapes the sharded batch axis
    under explicit mesh axes; `M` is small and static)."""
    out = x[:, 0]
    for m in range(1, x.shape[1]):
        out = out * x[:, m]
    return out


def scatter_step_rewards(
    score: ArrayLike,
    end: ArrayLike,
    T: int,
    *,
    step_mask: ArrayLike | None = None,
) -> Array:
    """Place step scores on their step-end tokens: `r[n, end[n,m]] = score[n,m]` (ALGORITHMS.md §11).

    The token-level reward layout that `gae`, `discounted_returns` or `min_form_returns` consume:
    every other token gets 0. Steps whose end position lies outside `[0, T)` (e.g. −1 padding) or
    whose `step_mask` is 0 are dropped; two steps ending on the same token add up. Differentiable
    w.r.t. `score` (a one-hot contraction over `T`, no scatter).

    Source: "Easy-to-Hard Generalization: Scalable Alignment Beyond Human Supervision"
    (arXiv 2403.09472).

    Args:
      score: `[N,M]` step scores.
      end: `[N,M]` integer completion position (0-based, `< T`) of each step's last token.
      T: static completion length of the output.
      step_mask: optional `[N,M]` {0,1} steps that exist.

    Returns:
      `[N,T]` float32 token rewards.

    Examples:
      >>> import jax.numpy as jnp
      >>> scatter_step_rewards(jnp.array([[0.5, -1.0]]), jnp.array([[1, 3]]), 5).tolist()
      [[0.0, 0.5, 0.0, -1.0, 0.0]]
    """
    where = "scatter_step_rewards"
    check_rank(score, 2, "score", where=where)
    check_real(score, "score", where=where)
    _check_static_int(T, "T", where=where)
    end = jnp.asarray(end)
    if end.shape != jnp.shape(score):
        raise ValueError(
            f"{where}: `end` must have the shape of `score` {jnp.shape(score)}, got {end.shape}."
        )
    if not jnp.issubdtype(end.dtype, jnp.integer):
        raise ValueError(f"{where}: `end` must be an integer array, got dtype {end.dtype}.")
    v = _optional_valid(step_mask, jnp.shape(score), where=where) > 0
    s = zero_outside(as_float32(score), v)
    hit = (end[:, :, None] == jnp.arange(T)[None, None, :]) & v[:, :, None]  # [N,M,T]
    return jnp.sum(jnp.where(hit, s[:, :, None], 0.0), axis=1)


# --------------------------------------------------------------------------------------------------
# implicit PRM (§9.4)
# --------------------------------------------------------------------------------------------------


def _log_ratio_inputs(logp: Any, ref_logp: Any, mask: Any, *, where: str) -> tuple[Array, Array]:
    """`(where(m, lp − sg(ref), 0), valid)` for `[N,T]` log-probs."""
    check_rank(logp, 2, "logp", where=where)
    check_floating(logp, "logp", where=where)
    check_floating(ref_logp, "ref_logp", where=where)
    check_same_shape(logp, "logp", where, ref_logp=ref_logp)
    valid = as_mask(mask, jnp.shape(logp), where=where) > 0
    lp = zero_outside(as_float32(logp), valid)
    ref = jax.lax.stop_gradient(zero_outside(as_float32(ref_logp), valid))
    return lp - ref, valid


def _row_beta(beta: Any, N: int, *, where: str) -> Array:
    """`β` as a scalar or one value per row, returned as `[N]` float32 (no gradient)."""
    check_positive(beta, "beta", where=where)
    check_real(beta, "beta", where=where)
    b = jax.lax.stop_gradient(as_float32(beta))
    if b.ndim == 0:
        return jnp.broadcast_to(b, (N,))
    if b.shape != (N,):
        raise ValueError(
            f"{where}: `beta` must be a scalar or have one value per row ({N},), got {b.shape}."
        )
    return b


def implicit_process_rewards(
    logp: ArrayLike,
    ref_logp: ArrayLike,
    segment_ids: ArrayLike,
    mask: ArrayLike,
    *,
    beta: float | ArrayLike,
    num_segments: int,
) -> Array:
    """Step rewards of an implicit PRM: per-step sums of `β·(lp − ref)` (ALGORITHMS.md §9.4).

        q_t    = β Σ_{u ≤ t} (lp_u − ref_u)·m_u                  (prefix value)
        r_nm   = Σ_{t : seg_nt = m} β·(lp_nt − ref_nt)·m_nt
               = q at the end of step m − q at the end of step m − 1

    so `Σ_m r_nm = β·Σ_t (lp − ref)·m`, the sequence's implicit reward. `lp` are the log-probs of
    a model trained as an outcome reward model with `implicit_prm_loss` (or with DPO); `ref` its
    reference. Tokens with `segment_ids` outside `[0, num_segments)` (e.g. −1) belong to no step.
    Differentiable w.r.t. `logp`; wrap in `stop_gradient` to use the result as rewards (e.g. in
    `dual_level_advantages`, as OPRL does).

    Sources: "Free Process Rewards without Process Labels" (arXiv 2412.01981); OPRL ("Online
    Process Reward Learning", seed paper).

    Args:
      logp: `[N,T]` token log-probs of the implicit PRM.
      ref_logp: `[N,T]` token log-probs of its reference model (no gradient).
      segment_ids: `[N,T]` integer step index of each token (see `segment_ids_from_boundaries`).
      mask: `[N,T]` {0,1} completion tokens.
      beta: the implicit-reward scale `β` (required; no default in the spec): a scalar or
        `[N]`, one value per row.
      num_segments: static number of steps `M`.

    Returns:
      `[N,M]` float32 step rewards (0 for empty steps).

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-1.0, -2.0, -0.5]]); ref = jnp.array([[-1.5, -1.0, -1.0]])
      >>> seg = jnp.array([[0, 0, 1]])
      >>> implicit_process_rewards(lp, ref, seg, jnp.ones((1, 3)), beta=0.5, num_segments=2).tolist()
      [[-0.25, 0.25]]
    """
    where = "implicit_process_rewards"
    _check_static_int(num_segments, "num_segments", where=where)
    lr, valid = _log_ratio_inputs(logp, ref_logp, mask, where=where)
    b = _row_beta(beta, lr.shape[0], where=where)
    seg = jnp.asarray(segment_ids)
    if seg.shape != lr.shape:
        raise ValueError(
            f"{where}: `segment_ids` must have the shape of `logp` {lr.shape}, got {seg.shape}."
        )
    if not jnp.issubdtype(seg.dtype, jnp.integer):
        raise ValueError(f"{where}: `segment_ids` must be an integer array, got dtype {seg.dtype}.")
    member = (seg[:, :, None] == jnp.arange(num_segments)[None, None, :]) & valid[:, :, None]
    token_rewards = b[:, None] * lr
    return jnp.sum(jnp.where(member, token_rewards[:, :, None], 0.0), axis=1)


def implicit_prm_loss(
    logp: ArrayLike,
    ref_logp: ArrayLike,
    mask: ArrayLike,
    labels: ArrayLike,
    *,
    beta: float | ArrayLike,
    valid: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Cross-entropy outcome objective that trains an implicit PRM (ALGORITHMS.md §9.4).

        r_n  = β·Σ_t (lp_nt − ref_nt)·m_nt                        (implicit outcome reward)
        loss = mean_n [−y_n·logσ(r_n) − (1 − y_n)·logσ(−r_n)]      (mean over valid sequences)

    Trained on outcome labels only, the model's token-level log-ratios then give process rewards
    for free (`implicit_process_rewards`). The DPO-style variant on (better, worse) trajectory
    pairs is `dpo_loss` (OPRL's trajectory DPO).

    Sources: "Free Process Rewards without Process Labels" (arXiv 2412.01981); OPRL (seed).

    Args:
      logp: `[N,T]` token log-probs of the model being trained (differentiable).
      ref_logp: `[N,T]` reference token log-probs (no gradient).
      mask: `[N,T]` {0,1} completion tokens.
      labels: `[N]` outcome labels `y ∈ [0, 1]` (no gradient).
      beta: the implicit-reward scale `β` (required; no default in the spec): a scalar or
        `[N]`, one value per row.
      valid: optional `[N]` {0,1} sequences that count.

    Returns:
      `(loss, metrics)`: a float32 scalar; `rm/accuracy` (`mean[(r > 0) = (y > ½)]`),
      `rm/reward_mean` (`mean r`), `rm/prob_mean` (`mean σ(r)`) over the valid sequences.

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-1.0, -1.0], [-3.0, -1.0]]); ref = jnp.full((2, 2), -1.5)
      >>> loss, m = implicit_prm_loss(lp, ref, jnp.ones((2, 2)), jnp.array([1.0, 0.0]), beta=1.0)
      >>> round(float(loss), 4), float(m["rm/accuracy"])
      (0.3133, 1.0)
    """
    where = "implicit_prm_loss"
    lr, _ = _log_ratio_inputs(logp, ref_logp, mask, where=where)
    N = lr.shape[0]
    b = _row_beta(beta, N, where=where)
    check_rank(labels, 1, "labels", where=where)
    check_real(labels, "labels", where=where)
    if jnp.shape(labels) != (N,):
        raise ValueError(
            f"{where}: `labels` must have one value per row of `logp` ({N},), "
            f"got {jnp.shape(labels)}."
        )
    v = _optional_valid(valid, (N,), where=where)
    check_valid_range(labels, v, "labels", where=where, low=0.0, high=1.0)
    y = jax.lax.stop_gradient(zero_outside(as_float32(labels), v > 0))
    r = zero_outside(b * jnp.sum(lr, axis=-1), v > 0)
    loss = _masked_mean(_bce_with_logits(r, y), v)
    metrics = {
        "rm/accuracy": _masked_mean(((r > 0) == (y > 0.5)).astype(jnp.float32), v),
        "rm/reward_mean": _masked_mean(r, v),
        "rm/prob_mean": _masked_mean(jax.nn.sigmoid(r), v),
    }
    return loss, stop_gradient_metrics(metrics)
