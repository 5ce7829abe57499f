"""Outcome-level (group) advantage estimators: GRPO, Dr.GRPO, RLOO, GPG, pass@k, OPO, BNPO, GDPO.

Conventions (ALGORITHMS.md §4.0):

* `rewards[B,G]` holds the scalar score `s` of sample `g` of prompt `b` (groups are contiguous rows
  `n = b·G + g` of the `[N]` batch, see `losses.to_groups`). `G` is static and must be >= 2.
  Estimators return `[B,G]` float32; broadcast them to tokens with `losses.broadcast_to_tokens`.
* `valid[B,G]` (optional, bool or {0,1}) excludes unscorable samples from every statistic and gives
  them advantage 0. Their rewards are replaced by 0 with `where(valid, s, 0)` before any
  arithmetic, so NaN/inf there (TRL marks missing rewards with NaN) never reach a value.
* Groups with fewer than two valid samples: `singleton="zero"` (default; TRL, verl's
  `rloo_vectorized`, Tunix) gives advantage 0; `singleton="raw"` reproduces verl's loop
  estimators and its `grpo_vectorized`, which use mean 0 and std 1 for such a group.
* Zero-variance groups (`max = min` over the valid samples) get *exactly* 0 whatever `eps` is, so
  float residue `s − μ ≈ 1e-9` is never amplified by `1/eps`.
* Ragged groups: `group_advantages_flat` / `rloo_advantages_flat` take `rewards[N]` plus
  `group_ids[N]` and reduce with `jax.ops.segment_sum` (`num_groups` static).
* Estimators run under stop-gradient (§0.6): inputs and outputs are `jax.lax.stop_gradient`-ed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.scipy.special import betaln, xlog1py, xlogy
from jax.sharding import AxisType, PartitionSpec
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_choice,
    check_concrete_range,
    check_positive,
    check_rank,
    check_real,
    check_valid_range,
)
from losses.masked import masked_whiten

Scale = Literal["group", "batch", "none"]
Singleton = Literal["zero", "raw"]

_SCALES = ("group", "batch", "none")
_SINGLETONS = ("zero", "raw")


# --------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------


def _grouped_inputs(rewards: Any, valid: Any, *, where: str, rank: int = 2) -> tuple[Array, Array]:
    """Validate `rewards[B,G(,K)]` and `valid[B,G]`; return `(s, v)` zeroed outside `valid`.

    `s` is float32 (float64 kept) under stop-gradient; `v` is float32 {0,1} of `s`'s shape.
    """
    check_rank(rewards, rank, "rewards", where=where)
    check_real(rewards, "rewards", where=where)
    shape = jnp.shape(rewards)
    if shape[1] < 2:
        raise ValueError(
            f"{where}: group estimators need G >= 2 samples per group (axis 1 of `rewards`), "
            f"got G={shape[1]} (shape {shape})."
        )
    s = jax.lax.stop_gradient(as_float32(rewards))
    if valid is None:
        return s, jnp.ones_like(s)
    v = as_mask(valid, shape[:2], "valid", where=where)
    if rank == 3:
        v = v[..., None]
    v = jnp.broadcast_to(v, s.shape)
    return jnp.where(v > 0, s, jnp.zeros((), s.dtype)), v


def _flat_inputs(
    rewards: Any, group_ids: Any, valid: Any, num_groups: Any, *, where: str
) -> tuple[Array, Array, Array]:
    """Validate the flat form; return `(s, v, ids)` with out-of-range ids marked invalid.

    Rows whose id lies outside `[0, num_groups)` get `v = 0` (advantage 0, excluded from every
    statistic) and the safe id 0, which they cannot influence because everything they contribute
    to a segment reduction is 0 (sums) or ∓inf (max/min).
    """
    check_rank(rewards, 1, "rewards", where=where)
    check_real(rewards, "rewards", where=where)
    check_rank(group_ids, 1, "group_ids", where=where)
    if jnp.shape(group_ids) != jnp.shape(rewards):
        raise ValueError(
            f"{where}: `group_ids` must have the shape of `rewards` {jnp.shape(rewards)}, "
            f"got {jnp.shape(group_ids)}."
        )
    if not jnp.issubdtype(jnp.result_type(group_ids), jnp.integer):
        raise ValueError(
            f"{where}: `group_ids` must be an integer array, got dtype {jnp.result_type(group_ids)}."
        )
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(
            f"{where}: `num_groups` must be a positive Python int (static), got {num_groups!r}."
        )
    s = jax.lax.stop_gradient(as_float32(rewards))
    ids = jnp.asarray(group_ids)
    in_range = (ids >= 0) & (ids < num_groups)
    v = jnp.where(in_range, 1.0, 0.0).astype(jnp.float32)
    if valid is not None:
        v = v * as_mask(valid, jnp.shape(rewards), "valid", where=where)
    ids = jnp.where(in_range, ids, 0)
    return jnp.where(v > 0, s, jnp.zeros((), s.dtype)), v, ids


def _check_eps(eps: Any, name: str, *, where: str) -> None:
    check_positive(eps, name, where=where, allow_zero=True)


# --------------------------------------------------------------------------------------------------
# per-group statistics (groups along the last axis, or segments of a flat batch)
# --------------------------------------------------------------------------------------------------


class _GroupOps(NamedTuple):
    """Per-group reductions, each broadcast back to the samples of the group."""

    sum: Callable[[Array], Array]
    max: Callable[[Array], Array]
    min: Callable[[Array], Array]


def _axis_ops() -> _GroupOps:
    """Groups along the last axis (`[..., G]`); results keep that axis with size 1."""
    return _GroupOps(
        sum=lambda x: jnp.sum(x, axis=-1, keepdims=True),
        max=lambda x: jnp.max(x, axis=-1, keepdims=True),
        min=lambda x: jnp.min(x, axis=-1, keepdims=True),
    )


def _segment_ops(ids: Array, num_groups: int) -> _GroupOps:
    """Groups given by `ids[N]`: segment reductions over `num_groups`, gathered back to the rows.

    Under a mesh with explicit axes the scatter and the gather need their output shardings: the
    `[num_groups]` segment results are replicated and the gathered rows keep the sharding of `ids`.
    """
    seg_sharding = row_sharding = None
    if _explicit_mesh():
        seg_sharding = PartitionSpec()
        row_sharding = jax.typeof(ids).sharding.spec

    def lift(reduce: Callable[..., Array]) -> Callable[[Array], Array]:
        def per_row(x: Array) -> Array:
            per_group = reduce(x, ids, num_segments=num_groups, out_sharding=seg_sharding)
            return per_group.at[ids].get(out_sharding=row_sharding)

        return per_row

    return _GroupOps(
        sum=lift(jax.ops.segment_sum),
        max=lift(jax.ops.segment_max),
        min=lift(jax.ops.segment_min),
    )


def _explicit_mesh() -> bool:
    """Whether the trace runs under a mesh with explicit axes (`jax.set_mesh`)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and any(t == AxisType.Explicit for t in mesh.axis_types)


class _Moments(NamedTuple):
    """Statistics of each sample's group over its valid members."""

    count: Array  # n: number of valid samples in the group
    centred: Array  # where(valid, s − μ, 0)
    var: Array  # Σ (s − μ)² / max(n − ddof, 1)
    constant: Array  # n >= 2 and max == min (zero variance; advantage exactly 0)
    single: Array  # n < 2


def _moments(s: Array, v: Array, ops: _GroupOps, ddof: int) -> _Moments:
    valid = v > 0
    n = ops.sum(v)
    mean = ops.sum(s) / jnp.maximum(n, 1.0)
    centred = jnp.where(valid, s - mean, 0.0)
    var = ops.sum(centred**2) / jnp.maximum(n - ddof, 1.0)
    hi = ops.max(jnp.where(valid, s, -jnp.inf))
    lo = ops.min(jnp.where(valid, s, jnp.inf))
    single = n < 2
    return _Moments(n, centred, var, (hi == lo) & ~single, single)


def _batch_std(s: Array, v: Array, ddof: int) -> Array:
    """Std of all valid rewards of the batch (raw rewards, not `s − μ_b`)."""
    count = jnp.sum(v)
    mean = jnp.sum(s) / jnp.maximum(count, 1.0)
    sq = jnp.where(v > 0, (s - mean) ** 2, 0.0)
    return jnp.sqrt(jnp.sum(sq) / jnp.maximum(count - ddof, 1.0))


def _finish(a: Array, v: Array, mom: _Moments, singleton: str) -> Array:
    """Zero invalid samples, zero-variance groups and (singleton="zero") small groups."""
    keep = (v > 0) & ~mom.constant
    if singleton == "zero":
        keep = keep & ~mom.single
    return jax.lax.stop_gradient(jnp.where(keep, a, 0.0))


def _safe(den: Array) -> Array:
    """A denominator that is never 0 (where it would be, the numerator is 0 or masked)."""
    return jnp.where(den > 0, den, 1.0)


def _standardise(
    s: Array, v: Array, ops: _GroupOps, *, scale: str, eps: Any, ddof: int, singleton: str
) -> Array:
    """Core of `group_advantages` for `[..., G]` groups or segments (see its docstring)."""
    mom = _moments(s, v, ops, ddof)
    centred = jnp.where(mom.single, s, mom.centred) if singleton == "raw" else mom.centred
    if scale == "group":
        den = jnp.where(mom.single, 1.0, jnp.sqrt(mom.var)) + eps
    elif scale == "batch":
        # every valid reward equal: only "raw" singletons are non-zero; std 1 for them, as a
        # float-residue std would amplify them by up to 1/eps
        constant = jnp.max(jnp.where(v > 0, s, -jnp.inf)) <= jnp.min(jnp.where(v > 0, s, jnp.inf))
        den = jnp.where(constant, 1.0, _batch_std(s, v, ddof)) + eps
    else:
        den = jnp.ones((), s.dtype)
    return _finish(centred / _safe(den), v, mom, singleton)


def _leave_one_out(
    s: Array, v: Array, ops: _GroupOps, *, singleton: str, normalize: str, norm_eps: Any
) -> Array:
    """Core of `rloo_advantages`: `n/(n−1)·(s − μ)`, optional batch whitening."""
    mom = _moments(s, v, ops, 1)
    n = mom.count
    a = n / jnp.maximum(n - 1.0, 1.0) * mom.centred
    if singleton == "raw":
        a = jnp.where(mom.single, s, a)
    a = _finish(a, v, mom, singleton)
    if normalize == "batch":
        a = jax.lax.stop_gradient(masked_whiten(a, v, eps=norm_eps, eps_mode="std"))
    return a


# --------------------------------------------------------------------------------------------------
# GRPO / Dr.GRPO / batch-std
# --------------------------------------------------------------------------------------------------


def group_advantages(
    rewards: ArrayLike,
    *,
    scale: Scale = "group",
    eps: float = 1e-6,
    ddof: int = 1,
    valid: ArrayLike | None = None,
    singleton: Singleton = "zero",
) -> Array:
    """Group-relative advantages of GRPO, Dr.GRPO and the batch-std variant (ALGORITHMS.md §4.1).

    Over the valid samples of each group `b` (statistics never see invalid samples):

        μ_b = mean_g s_bg
        a   = (s − μ_b) / (σ + eps),  σ = std_g(s_b, ddof)       scale="group"  (GRPO)
                                      σ = std(all valid s, ddof) scale="batch"  (Lite PPO)
        a   = s − μ_b                                            scale="none"   (Dr.GRPO; eps unused)

    The batch std is the std of the *raw* rewards over the batch, not of `s − μ_b`. Groups whose
    valid rewards are all equal get exactly 0; groups with fewer than two valid samples follow
    `singleton`; invalid samples get 0.

    Sources: GRPO, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
    Models" (arXiv 2402.03300); `scale="none"`: Dr.GRPO, "Understanding R1-Zero-Like Training: A
    Critical Perspective" (arXiv 2503.20783); `scale="batch"`: "Part I: Tricks or Traps? A Deep
    Dive into RL for LLM Reasoning" (Lite PPO, arXiv 2508.08221).

    Peers (all: unbiased group std, eps added to the std): verl `grpo` / `grpo_vectorized`
    (`norm_adv_by_std_in_grpo=False` is `scale="none"`; reproduce with `eps=1e-6, ddof=1,
    singleton="raw"`); TRL `scale_rewards` ∈ {group, batch, none} with `eps=1e-4`; OpenRLHF
    `group_norm` / `dr_grpo` with `eps=1e-9`; Tunix `grpo` / `drgrpo` with the defaults.
    Defaults: `ddof=1` and `eps=1e-6` as verl and Tunix; `singleton="zero"` as TRL and Tunix,
    because a lone sample carries no relative signal.

    Args:
      rewards: `[B,G]` sequence scores (bool, int or float; computed in float32). `G >= 2`.
      scale: "group", "batch" or "none" (see the formula).
      eps: added to the std (>= 0). Irrelevant for zero-variance groups, which get exactly 0.
      ddof: delta degrees of freedom of the std (1: unbiased, as every peer; 0: population).
      valid: optional `[B,G]` bool; False samples leave the statistics and get advantage 0.
      singleton: groups with < 2 valid samples: "zero" (advantage 0) or "raw" (verl's loop
        estimators: mean 0, std 1, so `a = s/(1 + eps)` for "group", `s` for "none" and
        `s/(σ_batch + eps)` for "batch", with σ_batch = 1 when every valid reward of the batch
        is equal, so that nothing is amplified by `1/eps`).

    Returns:
      `[B,G]` float32 advantages under stop-gradient, 0 for invalid samples.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.array([[1.0, 0.0, 0.0, 0.75, 0.5], [0.1, 0.1, 0.1, 0.1, 0.1]])
      >>> [[round(float(a), 4) for a in row] for row in group_advantages(s)]
      [[1.2298, -1.0062, -1.0062, 0.6708, 0.1118], [0.0, 0.0, 0.0, 0.0, 0.0]]
      >>> [round(float(a), 2) for a in group_advantages(s, scale="none")[0]]
      [0.55, -0.45, -0.45, 0.3, 0.05]
    """
    where = "group_advantages"
    check_choice(scale, _SCALES, "scale", where=where)
    check_choice(ddof, (0, 1), "ddof", where=where)
    check_choice(singleton, _SINGLETONS, "singleton", where=where)
    _check_eps(eps, "eps", where=where)
    s, v = _grouped_inputs(rewards, valid, where=where)
    return _standardise(s, v, _axis_ops(), scale=scale, eps=eps, ddof=ddof, singleton=singleton)


def group_advantages_flat(
    rewards: ArrayLike,
    group_ids: ArrayLike,
    *,
    num_groups: int,
    scale: Scale = "group",
    eps: float = 1e-6,
    ddof: int = 1,
    valid: ArrayLike | None = None,
    singleton: Singleton = "zero",
) -> Array:
    """`group_advantages` for a flat batch with ragged groups: `rewards[N]` plus `group_ids[N]`.

    Same formula, defaults and peers as `group_advantages` (ALGORITHMS.md §4.1), with the group
    statistics computed by `jax.ops.segment_sum` / `segment_max` / `segment_min` over
    `num_groups` segments. Groups may have different sizes and their rows may come in any order;
    with contiguous equal-sized groups (`group_ids = n // G`) the result equals
    `group_advantages(rewards.reshape(B, G)).reshape(N)`. Groups with fewer than two valid rows
    follow `singleton` (the static `G >= 2` check of the `[B,G]` form cannot apply here).

    Ids cannot be range-checked when traced: rows whose id lies outside `[0, num_groups)` are
    treated as invalid, i.e. they get advantage 0 and enter no statistic (plain `segment_sum`
    would drop them from the sums but the gather back would clamp their index).

    Args:
      rewards: `[N]` sequence scores.
      group_ids: `[N]` integer group index of each row, in `[0, num_groups)`.
      num_groups: static number of segments (an upper bound on the number of groups is fine:
        empty segments are ignored).
      scale: "group", "batch" (std over all valid rows) or "none".
      eps: added to the std (>= 0).
      ddof: delta degrees of freedom of the std.
      valid: optional `[N]` bool; False rows leave the statistics and get advantage 0.
      singleton: groups with < 2 valid rows: "zero" or "raw" (see `group_advantages`).

    Returns:
      `[N]` float32 advantages under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.array([1.0, 5.0, 0.0, 3.0, 1.0])
      >>> ids = jnp.array([0, 1, 0, 1, 1])
      >>> [round(float(a), 2) for a in group_advantages_flat(s, ids, num_groups=2, scale="none")]
      [0.5, 2.0, -0.5, 0.0, -2.0]
    """
    where = "group_advantages_flat"
    check_choice(scale, _SCALES, "scale", where=where)
    check_choice(ddof, (0, 1), "ddof", where=where)
    check_choice(singleton, _SINGLETONS, "singleton", where=where)
    _check_eps(eps, "eps", where=where)
    s, v, ids = _flat_inputs(rewards, group_ids, valid, num_groups, where=where)
    ops = _segment_ops(ids, num_groups)
    return _standardise(s, v, ops, scale=scale, eps=eps, ddof=ddof, singleton=singleton)


# --------------------------------------------------------------------------------------------------
# RLOO
# --------------------------------------------------------------------------------------------------


def rloo_advantages(
    rewards: ArrayLike,
    *,
    valid: ArrayLike | None = None,
    singleton: Singleton = "zero",
    normalize: Literal["none", "batch"] = "none",
    norm_eps: float = 1e-4,
) -> Array:
    """REINFORCE leave-one-out advantages (ALGORITHMS.md §4.2).

    Over the `n` valid samples of each group:

        a_g = s_g − (Σ_j s_j − s_g)/(n − 1) = n/(n − 1)·(s_g − μ)
        normalize="batch":  a ← masked_whiten(a, valid, eps=norm_eps, eps_mode="std")
                            = (a − mean(a)) / (std(a, ddof=1) + norm_eps) over the valid samples

    so `rloo_advantages·(G−1)/G = group_advantages(scale="none")` for full groups.
    Zero-variance groups get exactly 0, invalid samples 0, groups with < 2 valid samples follow
    `singleton` (before the optional whitening, whose statistics include them).

    Sources: "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
    Feedback in LLMs" (arXiv 2402.14740). Peers: verl `rloo` (`singleton="raw"`: a lone sample
    keeps `a = s`) and `rloo_vectorized`; TRL `RLOOTrainer` (`normalize_advantages=True` is
    `normalize="batch"`, norm eps 1e-4 added to the std; it puts the KL into the sequence reward,
    §3.3); OpenRLHF `rloo`; Tunix `rloo`. Defaults: no whitening (verl, OpenRLHF, Tunix) and
    TRL's eps for when it is switched on.

    Args:
      rewards: `[B,G]` sequence scores, `G >= 2`.
      valid: optional `[B,G]` bool; False samples leave the statistics and get advantage 0.
      singleton: groups with < 2 valid samples: "zero" or "raw" (`a = s`).
      normalize: "none" or "batch" (whitening over the valid samples of the batch).
      norm_eps: added to the batch std when `normalize="batch"`.

    Returns:
      `[B,G]` float32 advantages under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> a = rloo_advantages(jnp.array([[1.0, 0.0, 0.0, 0.75, 0.5]]))
      >>> [round(float(x), 4) for x in a[0]]
      [0.6875, -0.5625, -0.5625, 0.375, 0.0625]
    """
    where = "rloo_advantages"
    check_choice(singleton, _SINGLETONS, "singleton", where=where)
    check_choice(normalize, ("none", "batch"), "normalize", where=where)
    _check_eps(norm_eps, "norm_eps", where=where)
    s, v = _grouped_inputs(rewards, valid, where=where)
    return _leave_one_out(
        s, v, _axis_ops(), singleton=singleton, normalize=normalize, norm_eps=norm_eps
    )


def rloo_advantages_flat(
    rewards: ArrayLike,
    group_ids: ArrayLike,
    *,
    num_groups: int,
    valid: ArrayLike | None = None,
    singleton: Singleton = "zero",
    normalize: Literal["none", "batch"] = "none",
    norm_eps: float = 1e-4,
) -> Array:
    """`rloo_advantages` for a flat batch with ragged groups: `rewards[N]` plus `group_ids[N]`.

    Same formula and peers as `rloo_advantages` (ALGORITHMS.md §4.2); each group's `n` is its own
    number of valid rows, so groups of different sizes are handled. Statistics use
    `jax.ops.segment_sum` over `num_groups` segments; rows may come in any order. Rows whose id lies
    outside `[0, num_groups)` (not checkable when traced) are treated as invalid: advantage 0, no
    contribution to any statistic.

    Args:
      rewards: `[N]` sequence scores.
      group_ids: `[N]` integer group index of each row.
      num_groups: static number of segments.
      valid: optional `[N]` bool.
      singleton: groups with < 2 valid rows: "zero" or "raw" (`a = s`).
      normalize: "none" or "batch".
      norm_eps: added to the batch std when `normalize="batch"`.

    Returns:
      `[N]` float32 advantages under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> a = rloo_advantages_flat(jnp.array([1.0, 4.0, 0.0, 1.0]), jnp.array([0, 1, 0, 1]), num_groups=2)
      >>> [round(float(x), 2) for x in a]
      [1.0, 3.0, -1.0, -3.0]
    """
    where = "rloo_advantages_flat"
    check_choice(singleton, _SINGLETONS, "singleton", where=where)
    check_choice(normalize, ("none", "batch"), "normalize", where=where)
    _check_eps(norm_eps, "norm_eps", where=where)
    s, v, ids = _flat_inputs(rewards, group_ids, valid, num_groups, where=where)
    ops = _segment_ops(ids, num_groups)
    return _leave_one_out(s, v, ops, singleton=singleton, normalize=normalize, norm_eps=norm_eps)


# --------------------------------------------------------------------------------------------------
# GPG, pass@k, OPO
# --------------------------------------------------------------------------------------------------


def gpg_advantages(
    rewards: ArrayLike,
    *,
    f_norm: float = 1.0,
    count: Literal["nonzero_reward", "nonzero_advantage"] = "nonzero_reward",
) -> Array:
    """GPG advantages: batch-rescaled group-centred rewards (ALGORITHMS.md §4.3).

        α = N / max(#{n : c_n ≠ 0}, 1)          over the whole batch, N = B·G
        a = α·(s − μ_b) / f_norm

    with `c = s` for `count="nonzero_reward"` (default; verl counts non-zero scores) or
    `c = s − μ_b` for `count="nonzero_advantage"`. Which one the paper means is
    (reconstructed — verify against the paper). Zero-variance groups get exactly 0 (and are not
    counted by "nonzero_advantage"); so is a reward equal to its group's mean (a tie such as
    0.5 in {0, 0.5, 1, 0.5}): "nonzero_advantage" counts `|c| > (G + 1)·ε₃₂·max_g |s_bg|`, the
    float32 rounding bound of `μ_b`, so the count is the same on every backend (one that
    divides by `G` through a reciprocal gives `c ≈ 1e-8` at a tie). Pair with `reinforce_loss`.

    Source: "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning"
    (arXiv 2504.02546). Peer: verl `gpg` (its `alpha` argument is silently ignored; `f_norm`
    defaults to 1).

    Args:
      rewards: `[B,G]` sequence scores, `G >= 2`.
      f_norm: constant divisor (> 0).
      count: what the batch count of `α` counts ("nonzero_reward" or "nonzero_advantage").

    Returns:
      `[B,G]` float32 advantages under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> a = gpg_advantages(jnp.array([[1.0, 0.0, 0.0, 0.75, 0.5]]))
      >>> [round(float(x), 4) for x in a[0]]
      [0.9167, -0.75, -0.75, 0.5, 0.0833]
    """
    where = "gpg_advantages"
    check_choice(count, ("nonzero_reward", "nonzero_advantage"), "count", where=where)
    check_positive(f_norm, "f_norm", where=where)
    s, v = _grouped_inputs(rewards, None, where=where)
    mom = _moments(s, v, _axis_ops(), 1)
    centred = _finish(mom.centred, v, mom, "raw")
    if count == "nonzero_reward":
        counted = s != 0
    else:  # |c| within the float32 rounding of μ_b (a sum of G terms) is a tie with the mean
        tie = (
            (s.shape[-1] + 1) * jnp.finfo(jnp.float32).eps * jnp.max(jnp.abs(s), -1, keepdims=True)
        )
        counted = jnp.abs(centred) > tie
    nonzero = jnp.sum(jnp.where(counted, 1.0, 0.0))
    alpha = s.size / jnp.maximum(nonzero, 1.0)
    return jax.lax.stop_gradient(alpha * centred / f_norm)


def passk_advantages(
    rewards: ArrayLike, *, eps: float = 1e-6, scale: bool = True, ddof: int = 1
) -> Array:
    """Pass@k advantages: only the best sample of each group is credited (ALGORITHMS.md §4.4).

        g* = first index of max_g s_bg ;  s_2nd = max_{g ≠ g*} s_bg
        a_{b g*} = (s_max − s_2nd) / (std_b(s, ddof) + eps)   (no division if not `scale`)
        a_{b g}  = 0 for g ≠ g*

    A tie at the top gives 0 (so do zero-variance groups).

    Source: the pass@k training objective that verl cites as arXiv 2503.19595. Peer: verl
    `grpo_passk` (its tie winner depends on `torch.topk`; ours is the first index). Defaults follow
    verl (`eps=1e-6`, unbiased std, `norm_adv_by_std_in_grpo=True`).

    Args:
      rewards: `[B,G]` sequence scores, `G >= 2`.
      eps: added to the group std (>= 0).
      scale: divide by the group std (verl's `norm_adv_by_std_in_grpo`).
      ddof: delta degrees of freedom of the std.

    Returns:
      `[B,G]` float32 with at most one non-zero per group, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> a = passk_advantages(jnp.array([[1.0, 0.0, 0.0, 0.75, 0.5]]))
      >>> [round(float(x), 6) for x in a[0]]
      [0.559016, 0.0, 0.0, 0.0, 0.0]
    """
    where = "passk_advantages"
    check_choice(ddof, (0, 1), "ddof", where=where)
    check_choice(scale, (True, False), "scale", where=where)
    _check_eps(eps, "eps", where=where)
    s, v = _grouped_inputs(rewards, None, where=where)
    G = s.shape[1]
    best = jnp.argmax(s, axis=1)
    is_best = jnp.arange(G)[None, :] == best[:, None]
    top = jnp.max(s, axis=1, keepdims=True)
    second = jnp.max(jnp.where(is_best, -jnp.inf, s), axis=1, keepdims=True)
    gap = top - second
    if scale:
        mom = _moments(s, v, _axis_ops(), ddof)
        gap = gap / _safe(jnp.sqrt(mom.var) + eps)
    return jax.lax.stop_gradient(jnp.where(is_best & (top > second), gap, 0.0))


def opo_advantages(
    rewards: ArrayLike,
    lengths: ArrayLike,
    *,
    valid: ArrayLike | None = None,
    singleton: Singleton = "zero",
) -> Array:
    """OPO advantages: rewards minus the length-weighted group mean (ALGORITHMS.md §4.5).

        b_b = Σ_g L_bg s_bg / Σ_g L_bg      (valid samples only)
        a   = s − b_b

    `L` are the completion token counts; with equal lengths this is `group_advantages(scale=
    "none")`, and `Σ_g L_g a_g = 0` per group. Zero-variance groups get exactly 0; groups whose
    valid lengths sum to 0 use `b = 0`. Negative concrete lengths raise ValueError; traced
    lengths cannot be checked for sign.

    Source: "On-Policy RL with Optimal Reward Baseline" (arXiv 2505.23585). Peer: verl `opo`
    (singleton groups get baseline 0, i.e. `singleton="raw"`).

    Args:
      rewards: `[B,G]` sequence scores, `G >= 2`.
      lengths: `[B,G]` completion lengths `L` (e.g. `mask.sum(-1)` reshaped to groups), >= 0.
      valid: optional `[B,G]` bool.
      singleton: groups with < 2 valid samples: "zero" or "raw" (`a = s`).

    Returns:
      `[B,G]` float32 advantages under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.array([[1.0, 0.0, 0.0, 0.75, 0.5]]); L = jnp.array([[2, 5, 3, 4, 6]])
      >>> [round(float(x), 4) for x in opo_advantages(s, L)[0]]
      [0.6, -0.4, -0.4, 0.35, 0.1]
    """
    where = "opo_advantages"
    check_choice(singleton, _SINGLETONS, "singleton", where=where)
    s, v = _grouped_inputs(rewards, valid, where=where)
    check_real(lengths, "lengths", where=where)
    if jnp.shape(lengths) != s.shape:
        raise ValueError(
            f"{where}: `lengths` must have the shape of `rewards` {s.shape}, "
            f"got {jnp.shape(lengths)}."
        )
    # the lengths of valid samples only: an invalid slot may hold anything (e.g. −1 padding)
    check_valid_range(lengths, v, "lengths", where=where, low=0)
    ops = _axis_ops()
    L = jnp.where(v > 0, jax.lax.stop_gradient(as_float32(lengths)), 0.0)
    baseline = ops.sum(L * s) / _safe(ops.sum(L))
    mom = _moments(s, v, ops, 1)
    a = jnp.where(v > 0, s - baseline, 0.0)
    if singleton == "raw":
        a = jnp.where(mom.single, s, a)
    return _finish(a, v, mom, singleton)


# --------------------------------------------------------------------------------------------------
# BNPO
# --------------------------------------------------------------------------------------------------


def bnpo_advantages(
    rewards: ArrayLike,
    *,
    alpha: float | None = None,
    beta: float | None = None,
    max_weight: float = 1e6,
) -> Array:
    """BNPO advantages: group-centred rewards normalised by a Beta density (ALGORITHMS.md §4.6).

        p_b = mean_g s_bg
        a   = (s − p_b) · min(1 / BetaPDF(p_b; α, β), max_weight)
        BetaPDF(p; α, β) = p^(α−1) (1−p)^(β−1) / B(α, β)     (log form via `betaln`)

    If `alpha` and `beta` are None they are moment-matched over the batch of `p`:
    `m̄ = mean_b p_b`, `v = var_b p_b` (ddof 0), `k = m̄(1−m̄)/v − 1`, `α = max(1 + k·m̄/3, 1)`,
    `β = max(1 + k·(1−m̄)/3, 1)`, and `α = β = 1` if `v = 0`. The moment matching follows the
    authors' code; its ddof and the `v = 0` fallback are (reconstructed — verify against the
    paper). Passing numbers fixes α and β (both or neither).

    Properties: `α = β = 1` gives `s − p_b` (Dr.GRPO); `α = β = 3/2` with binary rewards gives
    `(π/8)·(s − p)/sqrt(p(1−p))`, i.e. `(π/8)·group_advantages(ddof=0, eps=0)`. Zero-variance
    groups get exactly 0; where the density vanishes (p at 0 or 1 with α or β > 1) the weight is
    capped at `max_weight`.

    Rewards must lie in [0, 1] (`p_b` is a success probability): concrete rewards outside it raise
    ValueError; traced ones cannot be checked, and there they give NaN or meaningless weights.

    Source: "BNPO: Beta Normalization Policy Optimization" (arXiv 2506.02864). No peer library.

    Args:
      rewards: `[B,G]` rewards in [0, 1], `G >= 2`.
      alpha: Beta shape α (> 0), or None to moment-match.
      beta: Beta shape β (> 0), or None to moment-match.
      max_weight: cap of the weight `1/BetaPDF` (> 0).

    Returns:
      `[B,G]` float32 advantages under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
      >>> [[round(float(x), 4) for x in row] for row in bnpo_advantages(r, alpha=2.0, beta=3.0)]
      [[0.3333, -0.3333, -0.3333, 0.3333], [0.4444, 0.4444, 0.4444, -1.3333]]
    """
    where = "bnpo_advantages"
    if (alpha is None) != (beta is None):
        raise ValueError(
            f"{where}: `alpha` and `beta` must both be numbers or both be None (moment matching), "
            f"got alpha={alpha!r}, beta={beta!r}."
        )
    if alpha is not None:
        check_positive(alpha, "alpha", where=where)
        check_positive(beta, "beta", where=where)
    check_positive(max_weight, "max_weight", where=where)
    check_concrete_range(rewards, "rewards", where=where, low=0.0, high=1.0)
    s, v = _grouped_inputs(rewards, None, where=where)
    ops = _axis_ops()
    mom = _moments(s, v, ops, 0)
    p = ops.sum(s) / s.shape[1]  # [B,1]
    if alpha is None:
        a_shape, b_shape = _moment_matched_beta(p)
    else:
        a_shape = jnp.asarray(alpha, jnp.float32)
        b_shape = jnp.asarray(beta, jnp.float32)
    log_pdf = xlogy(a_shape - 1.0, p) + xlog1py(b_shape - 1.0, -p) - betaln(a_shape, b_shape)
    weight = jnp.minimum(jnp.exp(-log_pdf), max_weight)
    return _finish(mom.centred * weight, v, mom, "zero")


def _moment_matched_beta(p: Array) -> tuple[Array, Array]:
    """BNPO's α, β from the batch mean and population variance of the group means `p[B,1]`."""
    m = jnp.mean(p)
    var = jnp.mean((p - m) ** 2)
    k = m * (1.0 - m) / _safe(var) - 1.0
    alpha = jnp.where(var > 0, jnp.maximum(1.0 + k * m / 3.0, 1.0), 1.0)
    beta = jnp.where(var > 0, jnp.maximum(1.0 + k * (1.0 - m) / 3.0, 1.0), 1.0)
    return alpha, beta


# --------------------------------------------------------------------------------------------------
# GDPO
# --------------------------------------------------------------------------------------------------


def gdpo_advantages(
    rewards: ArrayLike,
    *,
    weights: ArrayLike | None = None,
    eps: float = 1e-6,
    ddof: int = 1,
    valid: ArrayLike | None = None,
    singleton: Singleton = "zero",
) -> Array:
    """GDPO: each reward component normalised within its group, then summed (ALGORITHMS.md §4.7).

        A = Σ_k w_k · group_advantages(rewards[..., k], scale="group", eps=eps, ddof=ddof,
                                       valid=valid, singleton=singleton)   (w = 1 by default)

    Normalising per component keeps components with different spreads from collapsing into the
    same advantage (GRPO on summed rewards maps groups `((1,1),(0,0))` and `((1,0),(0,0))` both to
    `±0.707`; GDPO gives `±1.414` and `±0.707`). With `K = 1` and no weights this is exactly
    `group_advantages`.

    The paper's final batch normalisation is *not* applied here, because the peers place it
    differently: TRL `multi_objective_aggregation="normalize_then_sum"` standardises over sequences
    (`masked_whiten(gdpo_advantages(r, eps=1e-4), valid, eps=1e-4, eps_mode="std")`); verl `gdpo`
    (its loop GRPO per component, so `singleton="raw"`) whitens over tokens, length-weighted
    (`masked_whiten(broadcast_to_tokens(A, mask), mask)`). TRL's default `"sum_then_normalize"`
    is `group_advantages` of the weighted reward sum. `valid` is per sample, for every
    component: TRL drops a NaN component from that component's group statistics only, which
    this function cannot express (mark the sample invalid, or fill the component).

    Source: "GDPO: Group reward-Decoupled Normalization Policy Optimization" (arXiv 2601.05242).

    Args:
      rewards: `[B,G,K]` reward components, `G >= 2`.
      weights: optional `[K]` component weights (default all 1).
      eps: added to each component's group std (>= 0).
      ddof: delta degrees of freedom of the std.
      valid: optional `[B,G]` bool (applies to every component).
      singleton: groups with < 2 valid samples, as in `group_advantages`: "zero" (default) or
        "raw" (verl's `gdpo`: each component's `s/(1 + eps)`).

    Returns:
      `[B,G]` float32 advantages under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[[1.0, 1.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 0.0]]])
      >>> [[round(float(x), 4) for x in row] for row in gdpo_advantages(r)]
      [[1.4142, -1.4142], [0.7071, -0.7071]]
    """
    where = "gdpo_advantages"
    check_choice(ddof, (0, 1), "ddof", where=where)
    check_choice(singleton, _SINGLETONS, "singleton", where=where)
    _check_eps(eps, "eps", where=where)
    s, v = _grouped_inputs(rewards, valid, where=where, rank=3)
    K = s.shape[2]
    if weights is not None:
        check_real(weights, "weights", where=where)
        if jnp.shape(weights) != (K,):
            raise ValueError(
                f"{where}: `weights` must have shape (K,) = ({K},) for `rewards` of shape "
                f"{s.shape}, got {jnp.shape(weights)}."
            )
    # components first: groups on the last axis, as in `group_advantages` (bitwise equal for K=1)
    adv = _standardise(
        jnp.moveaxis(s, 2, 0),
        jnp.moveaxis(v, 2, 0),
        _axis_ops(),
        scale="group",
        eps=eps,
        ddof=ddof,
        singleton=singleton,
    )  # [K,B,G]
    if weights is not None:
        adv = adv * jax.lax.stop_gradient(as_float32(weights))[:, None, None]
    return jax.lax.stop_gradient(jnp.sum(adv, axis=0))


# --------------------------------------------------------------------------------------------------
# degenerate groups and metrics
# --------------------------------------------------------------------------------------------------


def zero_variance_mask(
    rewards: ArrayLike,
    *,
    valid: ArrayLike | None = None,
    min_std: float = 0.0,
    ddof: int = 1,
) -> Array:
    """Which groups carry a learning signal: `keep[B]` (ALGORITHMS.md §4.18).

        keep_b = max_g s_bg − min_g s_bg > 0      if min_std = 0   (over valid samples)
        keep_b = std_g(s_b, ddof) > min_std       if min_std > 0

    Groups with fewer than two valid samples are never kept. What to do with degenerate groups:
    (a) keep them with advantage 0 (the estimators' default; their tokens still dilute
    `token_mean`'s denominator); (b) drop them in-graph with `mask' = mask·keep[b(n)]`, e.g.
    `mask * jnp.repeat(keep, G)[:, None]`: the loss then equals the loss of the batch without
    those groups (the in-graph analogue of DAPO's dynamic sampling, which over-samples prompts on
    the host); (c) filter by a std threshold (`min_std > 0`; ReST-RL, RLPR); (d) avoid them on the
    host.

    Source: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476).

    Args:
      rewards: `[B,G]` sequence scores, `G >= 2`.
      valid: optional `[B,G]` bool.
      min_std: std threshold (>= 0; Python or traced). 0 uses the exact spread test.
      ddof: delta degrees of freedom of the std when `min_std > 0`.

    Returns:
      `[B]` bool, True for groups to keep.

    Examples:
      >>> import jax.numpy as jnp
      >>> zero_variance_mask(jnp.array([[1.0, 0.0], [0.5, 0.5], [0.2, 0.3]])).tolist()
      [True, False, True]
    """
    where = "zero_variance_mask"
    check_choice(ddof, (0, 1), "ddof", where=where)
    check_positive(min_std, "min_std", where=where, allow_zero=True)
    s, v = _grouped_inputs(rewards, valid, where=where)
    mom = _moments(s, v, _axis_ops(), ddof)
    ops = _axis_ops()
    spread = ops.max(jnp.where(v > 0, s, -jnp.inf)) - ops.min(jnp.where(v > 0, s, jnp.inf))
    keep = jnp.where(min_std > 0, jnp.sqrt(mom.var) > min_std, spread > 0) & ~mom.single
    return jax.lax.stop_gradient(keep[:, 0])


def group_advantage_metrics(
    rewards: ArrayLike, *, valid: ArrayLike | None = None
) -> dict[str, Array]:
    """Reward statistics of a grouped batch, for logging (ALGORITHMS.md §4.0, §4.18).

    * `adv/frac_zero_std`: fraction of the `B` groups without a learning signal, i.e. whose
      valid rewards are all equal or that have fewer than two valid samples
      (`1 − mean(zero_variance_mask(rewards, valid=valid))`; TRL's `frac_reward_zero_std`).
    * `adv/reward_mean`: mean of the valid rewards.
    * `adv/reward_std`: std (ddof 1) of the valid rewards over the batch.

    Args:
      rewards: `[B,G]` sequence scores, `G >= 2`.
      valid: optional `[B,G]` bool.

    Returns:
      Flat dict of float32 scalars under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> m = group_advantage_metrics(jnp.array([[1.0, 0.0], [0.5, 0.5]]))
      >>> {k: round(float(x), 4) for k, x in m.items()}
      {'adv/frac_zero_std': 0.5, 'adv/reward_mean': 0.5, 'adv/reward_std': 0.4082}
    """
    where = "group_advantage_metrics"
    s, v = _grouped_inputs(rewards, valid, where=where)
    keep = zero_variance_mask(s, valid=v)
    count = jnp.sum(v)
    metrics = {
        "adv/frac_zero_std": 1.0 - jnp.mean(keep.astype(jnp.float32)),
        "adv/reward_mean": jnp.sum(s) / jnp.maximum(count, 1.0),
        "adv/reward_std": _batch_std(s, v, 1),
    }
    return {k: jax.lax.stop_gradient(jnp.asarray(x, jnp.float32)) for k, x in metrics.items()}
