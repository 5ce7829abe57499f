"""Transforms applied to advantages after the estimator (ALGORITHMS.md §5.17, §11).

Sign weighting (NSR / W-REINFORCE / R³L), planning-token amplification (HICRA), token hidden-reward
reweighting (THR), clipped shaping after normalisation (ASPO), anchored group advantages for
degenerate groups (VGPO / COPO) and risk-sensitive sample weights (RiskPO).

Conventions: like the estimators (§0.6) every transform runs under stop-gradient. The pointwise
transforms accept advantages of any shape (`[B,G]`, `[N]` or `[N,T]`) and an optional `mask` of
that shape: with a mask, every input is replaced by 0 outside it *before* any arithmetic and the
output is 0 there (NaN/inf outside the mask never reach a value). Coefficients are Python numbers,
checked at trace time, or traced scalars (not checked). Every transform has a neutral setting at
which it is the identity (weights 1/1, `alpha = 0`, `p = 0`, `c = 0`, `coef = 0`, `alphas = (1,)`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import as_float32, as_mask, check_finite, check_floating, check_rank, check_real
from losses._position import order_statistics
from losses.advantages import Scale, Singleton, _grouped_inputs, group_advantages


def _check_coefficient(
    value: Any, name: str, *, where: str, low: float | None, high: float | None
) -> None:
    """A static coefficient must be a finite number in [low, high]; a traced one a scalar."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: `{name}` must be a number, got {value!r}.")
    if isinstance(value, int | float):
        in_range = (
            math.isfinite(value)
            and (low is None or value >= low)
            and (high is None or value <= high)
        )
        if not in_range:
            lo = "-inf" if low is None else f"{low:g}"
            hi = "inf" if high is None else f"{high:g}"
            raise ValueError(
                f"{where}: `{name}` must be a finite number in [{lo}, {hi}], got {value!r}."
            )
    elif jnp.ndim(value) != 0:
        raise ValueError(f"{where}: `{name}` must be a scalar, got shape {jnp.shape(value)}.")


def _pointwise_inputs(
    advantages: Any, others: dict[str, Any], mask: Any, *, where: str
) -> tuple[Array, dict[str, Array], Array | None]:
    """Validate same-shape inputs; return float32 copies zeroed outside `mask`, under sg.

    `others` maps names to arrays that must have the shape of `advantages` (real-valued, bool
    allowed); the returned `valid` is None without a mask.
    """
    check_floating(advantages, "advantages", where=where)
    shape = jnp.shape(advantages)
    for name, value in others.items():
        check_real(value, name, where=where)
        if jnp.shape(value) != shape:
            raise ValueError(
                f"{where}: `{name}` must have the shape of `advantages` {shape}, "
                f"got {jnp.shape(value)}."
            )
    valid = None if mask is None else as_mask(mask, shape, where=where) > 0

    def clean(x: Any) -> Array:
        x = as_float32(x)  # bool and integer inputs become float32
        if valid is not None:
            x = jnp.where(valid, x, jnp.zeros((), x.dtype))
        return jax.lax.stop_gradient(x)

    return clean(advantages), {k: clean(v) for k, v in others.items()}, valid


def _finish(out: Array, valid: Array | None) -> Array:
    if valid is not None:
        out = jnp.where(valid, out, 0.0)
    return jax.lax.stop_gradient(out)


def sign_weighted_advantages(
    advantages: ArrayLike,
    *,
    pos_weight: Any = 1.0,
    neg_weight: Any = 1.0,
    select: ArrayLike | None = None,
    mask: ArrayLike | None = None,
) -> Array:
    """Weight positive and negative advantages separately (ALGORITHMS.md §5.17).

        out = pos_weight·A  where A > 0,   neg_weight·A  where A < 0,   0 where A = 0
        select given: the weighting applies only where `select`; other entries keep A

    Weights are non-negative, so signs never flip (a weight of 0 removes that side). Recipes:
    NSR (negative samples only): `pos_weight=0`; PSR (positive only): `neg_weight=0`;
    W-REINFORCE: ±1 rewards as advantages with `pos_weight≈0.1` (reconstructed — verify against
    the paper); R³L's positive amplification: `pos_weight > 1`; GTPO's protection of conflict
    tokens: `pos_weight=w, neg_weight=0, select=conflict_token_mask(...)`.

    Source: "The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning"
    (arXiv 2506.01347). No peer.

    Args:
      advantages: advantages of any shape (`[B,G]`, `[N]`, `[N,T]`).
      pos_weight: factor on positive advantages (>= 0; may be traced).
      neg_weight: factor on negative advantages (>= 0; may be traced).
      select: optional bool/{0,1} array of the shape of `advantages`: where to apply the weights.
      mask: optional {0,1} validity of the shape of `advantages` (output 0 outside).

    Returns:
      float32 array of the shape of `advantages`, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> A = jnp.array([1.5, -1.0, 0.0, -0.5])
      >>> sign_weighted_advantages(A, pos_weight=0.1).tolist()
      [0.15000000596046448, -1.0, 0.0, -0.5]
      >>> sign_weighted_advantages(A, pos_weight=2.0, neg_weight=0.0, select=A != -1.0).tolist()
      [3.0, -1.0, 0.0, 0.0]
    """
    where = "sign_weighted_advantages"
    _check_coefficient(pos_weight, "pos_weight", where=where, low=0.0, high=None)
    _check_coefficient(neg_weight, "neg_weight", where=where, low=0.0, high=None)
    others = {} if select is None else {"select": select}
    a, extra, valid = _pointwise_inputs(advantages, others, mask, where=where)
    weighted = jnp.where(a > 0, pos_weight * a, neg_weight * a)
    if select is not None:
        weighted = jnp.where(extra["select"] > 0, weighted, a)
    return _finish(weighted, valid)


def planning_token_advantages(
    advantages: ArrayLike,
    plan_mask: ArrayLike,
    *,
    alpha: Any,
    mask: ArrayLike | None = None,
) -> Array:
    """Amplify the credit of planning tokens (HICRA, ALGORITHMS.md §5.17).

        out = A + α·|A|·plan      (plan ∈ {0,1})

    On planning tokens a positive advantage is scaled by `1 + α` and a negative one by `1 − α`
    (less blame on strategic moves); other tokens are unchanged. `α ∈ [0, 1]` keeps every sign.
    Which tokens are planning tokens (HICRA's "strategic grams", n-grams of logical moves such as
    "let's try a different approach") is decided by the data pipeline.

    Source: "Emergent Hierarchical Reasoning in LLMs through Reinforcement Learning" (HICRA,
    arXiv 2509.03646); the formula follows public ports of the method (reconstructed — verify
    against the paper). No peer.

    Args:
      advantages: `[N,T]` (or any shape) per-token advantages.
      plan_mask: bool/{0,1} of the shape of `advantages`: planning tokens.
      alpha: amplification in [0, 1] (may be traced).
      mask: optional {0,1} validity of the shape of `advantages`.

    Returns:
      float32 array of the shape of `advantages`, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> A = jnp.array([[1.0, 1.0, -1.0, -1.0]]); plan = jnp.array([[1, 0, 1, 0]])
      >>> planning_token_advantages(A, plan, alpha=0.2).tolist()
      [[1.2000000476837158, 1.0, -0.800000011920929, -1.0]]
    """
    where = "planning_token_advantages"
    _check_coefficient(alpha, "alpha", where=where, low=0.0, high=1.0)
    a, extra, valid = _pointwise_inputs(advantages, {"plan_mask": plan_mask}, mask, where=where)
    plan = (extra["plan_mask"] > 0).astype(a.dtype)
    return _finish(a + alpha * jnp.abs(a) * plan, valid)


def token_advantage_reweight(
    advantages: ArrayLike,
    thr: ArrayLike,
    *,
    p: Any,
    mask: ArrayLike | None = None,
) -> Array:
    """Reweight token advantages by the sign of their token hidden reward (THR, ALGORITHMS.md §11).

        out = A·(1 + p·sign(thr))

    `p > 0` amplifies tokens with positive THR and damps those with negative THR (exploitation:
    greedy accuracy); `p < 0` does the reverse (exploration: pass@k). `|p| ≤ 1` keeps every sign;
    `thr = 0` or `p = 0` leaves `A` unchanged. THR itself (each token's influence on the likelihood
    of the group's correct responses) is computed by the training stack.

    Source: "Token Hidden Reward: Steering Exploration-Exploitation in Group Relative Deep
    Reinforcement Learning" (arXiv 2510.03669). The reweighting form `1 + p·sign(thr)` is
    (reconstructed — verify against the paper). No peer.

    Args:
      advantages: `[N,T]` (or any shape) advantages.
      thr: token hidden rewards of the shape of `advantages`.
      p: strength in [−1, 1] (may be traced).
      mask: optional {0,1} validity of the shape of `advantages`.

    Returns:
      float32 array of the shape of `advantages`, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> A = jnp.array([[1.0, 1.0, -2.0]]); thr = jnp.array([[0.3, -0.1, 0.0]])
      >>> token_advantage_reweight(A, thr, p=0.5).tolist()
      [[1.5, 0.5, -2.0]]
    """
    where = "token_advantage_reweight"
    _check_coefficient(p, "p", where=where, low=-1.0, high=1.0)
    a, extra, valid = _pointwise_inputs(advantages, {"thr": thr}, mask, where=where)
    return _finish(a * (1.0 + p * jnp.sign(extra["thr"])), valid)


def shaped_advantages(
    advantages: ArrayLike,
    bonus: ArrayLike,
    correct: ArrayLike,
    *,
    c: Any,
    mask: ArrayLike | None = None,
) -> Array:
    """Add a shaping bonus after normalisation, bounded by the advantage itself (ASPO, §11).

        out = A + [correct]·clip(bonus, −c·|A|, c·|A|)

    The bonus (e.g. a length or tool-use preference) only touches correct responses and never
    moves an advantage by more than the fraction `c` of its own magnitude, so with `c ≤ 1` the
    sign of the correctness signal never flips (at `c = 1` it can reach 0) and the bonus cannot
    dominate the outcome. Shaping the reward instead would be re-normalised by the group and could
    turn a correct response's advantage negative. `c = 0` or `bonus = 0` is the identity.

    Source: ASPO, advantage shaping after normalisation (seed paper; title and arXiv id not
    recorded in our sources). The clipping form is (reconstructed — verify against the paper). No
    peer.

    Args:
      advantages: normalised advantages, any shape (`[B,G]` or `[N]` usually).
      bonus: shaping bonus of the shape of `advantages`.
      correct: bool/{0,1} of the shape of `advantages`: which responses may receive the bonus.
      c: bound on the shaping as a fraction of `|A|`, in [0, 1] (may be traced).
      mask: optional {0,1} validity of the shape of `advantages`.

    Returns:
      float32 array of the shape of `advantages`, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> A = jnp.array([1.0, 1.0, -1.0]); bonus = jnp.array([0.1, 2.0, 5.0])
      >>> shaped_advantages(A, bonus, jnp.array([1, 1, 0]), c=0.5).tolist()
      [1.100000023841858, 1.5, -1.0]
    """
    where = "shaped_advantages"
    _check_coefficient(c, "c", where=where, low=0.0, high=1.0)
    a, extra, valid = _pointwise_inputs(
        advantages, {"bonus": bonus, "correct": correct}, mask, where=where
    )
    bound = c * jnp.abs(a)
    shaping = jnp.where(extra["correct"] > 0, jnp.clip(extra["bonus"], -bound, bound), 0.0)
    return _finish(a + shaping, valid)


def anchored_group_advantages(
    rewards: ArrayLike,
    *,
    anchor: Any,
    coef: Any,
    scale: Scale = "group",
    eps: float = 1e-6,
    ddof: int = 1,
    valid: ArrayLike | None = None,
    singleton: Singleton = "zero",
) -> Array:
    """Group advantages plus an absolute term that keeps a signal in degenerate groups (§11).

        out = group_advantages(s, scale, eps, ddof, valid, singleton) + coef·(s − anchor)·valid

    A group whose rewards are all equal has zero group advantage; the absolute term still pushes
    an all-correct group up and an all-wrong group down relative to the `anchor` (a fixed level such
    as 0.5, or a per-prompt value estimate of shape `[B,1]`). `coef = 0` is `group_advantages`.
    Invalid samples get 0 and never enter a statistic.

    Sources: VGPO, "Value-Anchored Group Policy Optimization for Flow Models" (arXiv 2512.12387;
    group normalisation enhanced by absolute values); COPO, "COPO: Consistency-Aware Policy
    Optimization" (arXiv 2508.04138; a global signal for groups with identical outcomes). The
    additive form and its anchor are (reconstructed — verify against the paper): COPO blends its
    global term by an entropy gate, which the caller can pass as a traced `coef`. No peer.

    Args:
      rewards: `[B,G]` sequence rewards, `G >= 2`.
      anchor: reference level, a scalar or an array broadcastable to `[B,G]` (e.g. `[B,1]`).
      coef: weight of the absolute term (>= 0; may be traced).
      scale: "group", "batch" or "none" (see `group_advantages`).
      eps: added to the std of the group term.
      ddof: delta degrees of freedom of the std.
      valid: optional `[B,G]` bool.
      singleton: groups with < 2 valid samples: "zero" or "raw" (group term only).

    Returns:
      `[B,G]` float32 advantages under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
      >>> [[round(float(x), 3) for x in row]
      ...  for row in anchored_group_advantages(s, anchor=0.5, coef=0.2)]
      [[0.1, 0.1, 0.1], [1.255, -0.677, -0.677]]
    """
    where = "anchored_group_advantages"
    _check_coefficient(coef, "coef", where=where, low=0.0, high=None)
    s, v = _grouped_inputs(rewards, valid, where=where)
    check_real(anchor, "anchor", where=where)
    check_finite(anchor, "anchor", where=where)
    try:
        jnp.broadcast_shapes(jnp.shape(anchor), s.shape)
    except ValueError:
        raise ValueError(
            f"{where}: `anchor` must be a scalar or broadcast to `rewards` {s.shape}, "
            f"got shape {jnp.shape(anchor)}."
        ) from None
    base = group_advantages(s, scale=scale, eps=eps, ddof=ddof, valid=v, singleton=singleton)
    anchor = jax.lax.stop_gradient(as_float32(anchor))
    absolute = jnp.where(v > 0, s - anchor, 0.0)
    return jax.lax.stop_gradient(base + coef * absolute)


def _check_levels(alphas: Any, weights: Any, *, where: str) -> tuple[tuple[float, ...], ...]:
    """`alphas` in (0, 1] and finite `weights`, static sequences of equal non-zero length."""
    for name, value in (("alphas", alphas), ("weights", weights)):
        if not isinstance(value, Sequence) or isinstance(value, str) or len(value) == 0:
            raise ValueError(
                f"{where}: `{name}` must be a non-empty sequence of Python numbers, got {value!r}."
            )
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int | float):
                raise ValueError(
                    f"{where}: `{name}` must hold Python numbers (static), got {item!r}."
                )
    if len(alphas) != len(weights):
        raise ValueError(
            f"{where}: `alphas` and `weights` must have the same length, got {len(alphas)} and "
            f"{len(weights)}."
        )
    for alpha in alphas:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"{where}: every entry of `alphas` must be in (0, 1], got {alpha!r}.")
    for weight in weights:
        if not math.isfinite(weight):
            raise ValueError(f"{where}: every entry of `weights` must be finite, got {weight!r}.")
    return tuple(float(a) for a in alphas), tuple(float(w) for w in weights)


def risk_weights(
    rewards: ArrayLike,
    *,
    alphas: Sequence[float],
    weights: Sequence[float],
    valid: ArrayLike | None = None,
) -> Array:
    """Risk-sensitive sample weights: a mixture of CVaR tail indicators (RiskPO, ALGORITHMS.md §11).

    Per group, over its valid samples, with `VaR_α` the α-quantile of the rewards (linear
    interpolation, the quantile rule of §5.15):

        w_bg = Σ_i weights_i · [s_bg ≤ VaR_{α_i, b}] / α_i          (0 for invalid samples)

    `[s ≤ VaR_α]/α` is the per-sample weight of the gradient of `CVaR_α` (the mean of the lower
    α-tail); multiplying advantages by `w` turns the mean objective into the mixture of tail means,
    which concentrates the update on the hard (low-reward) outcomes. A band between two levels
    `α < β` is `β/(β−α)·w_β − α/(β−α)·w_α` (weights may be negative for that reason). With
    `alphas=(1.0,), weights=(1.0,)` every valid sample gets weight 1 (the risk-neutral mean).
    Samples tied with the quantile count as in the tail, so with discrete rewards the tail can hold
    more than a fraction α. Pass `rewards.reshape(1, -1)` for quantiles over the whole batch.

    Source: "RiskPO: Risk-based Policy Optimization via Verifiable Reward for LLM Post-Training"
    (arXiv 2510.00911), whose Mixed Value-at-Risk objective weights several regions of the reward
    distribution. The indicator form, the per-group quantiles and the use as a multiplier of the
    advantages are (reconstructed — verify against the paper); RiskPO's bundling of several
    questions into one reward is a data-pipeline concern. No peer.

    Args:
      rewards: `[B,G]` sequence rewards (quantiles per group, along `G`).
      alphas: static tail levels in (0, 1].
      weights: static mixture weights, one per level (finite; a convex mixture sums to 1).
      valid: optional `[B,G]` bool; invalid samples leave the quantiles and get weight 0.

    Returns:
      `[B,G]` float32 weights under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.array([[0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
      >>> risk_weights(s, alphas=(0.2, 1.0), weights=(0.5, 0.5)).tolist()
      [[3.0, 0.5, 0.5, 0.5, 3.0, 0.5, 0.5, 0.5, 0.5, 0.5]]
    """
    where = "risk_weights"
    levels, mix = _check_levels(alphas, weights, where=where)
    check_rank(rewards, 2, "rewards", where=where)
    check_real(rewards, "rewards", where=where)
    shape = jnp.shape(rewards)
    v = jnp.ones(shape, bool) if valid is None else as_mask(valid, shape, "valid", where=where) > 0
    s = jax.lax.stop_gradient(jnp.where(v, as_float32(rewards), 0.0))
    total = jnp.zeros(shape, jnp.float32)
    for alpha, weight in zip(levels, mix, strict=True):
        # s ≤ VaR_α, the quantile's interpolation left out: no value lies between the two
        # order statistics around it, so this is s ≤ the lower one (`order_statistics`)
        lower = jax.vmap(lambda x, m, q=alpha: order_statistics(x, m, q, where=where)[0])(s, v)
        total = total + (weight / alpha) * (s <= lower[:, None]).astype(jnp.float32)
    return jax.lax.stop_gradient(jnp.where(v, total, 0.0))
