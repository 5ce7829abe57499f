"""Segments of a sequence: steps, turns, thought units, and the masks that select them.

Conventions (ALGORITHMS.md §4.15):

* A segment layout is an integer array `segment_ids[N,T]`: token `t` of row `n` belongs to segment
  `segment_ids[n,t] ∈ [0, M)`, and `−1` (or any id outside `[0, M)`) marks a token of no segment.
  Per-segment values are `[N,M]` with a `segment_mask[N,M]` (1 = the segment has a valid token).
  `M = num_segments` is a static Python int (it sets a shape).
* Boundaries come from the host (step delimiters, turn ends), from fixed chunks (MA-RLHF macro
  actions) or from cut-points (SPO); `segment_ids_from_boundaries` turns them into ids.
* Masks are applied before arithmetic: values of tokens outside `mask` (or of an out-of-range
  segment) are replaced by 0 and routed to a discarded bucket, so NaN/inf there reaches neither a
  value nor a gradient. Outputs are 0 outside the mask.
* Reductions run per row (`vmap` of `jax.ops.segment_*` over `N`), so the batch axis can be
  sharded.

Multi-turn rollouts: `role_ids[N,T]` gives the role of each token (e.g. 0 system, 1 user, 2
assistant, 3 tool — the encoding is the caller's). `multi_turn_loss_mask` keeps only the trainable
roles (environment and tool tokens leave the loss, their positions stay in the sequence), and
`turn_ids_from_roles` numbers the trainable turns for step- or turn-level credit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_choice,
    check_positive,
    check_rank,
    check_real,
    check_valid_range,
)
from losses.advantages import group_advantages_flat

SegmentOp = Literal["sum", "mean", "max", "min", "first", "last"]
SEGMENT_OPS: tuple[str, ...] = ("sum", "mean", "max", "min", "first", "last")


# --------------------------------------------------------------------------------------------------
# validation and shared helpers (also used by step_credit, tree_credit and token_baseline)
# --------------------------------------------------------------------------------------------------


def _check_integer(x: Any, name: str, *, where: str) -> None:
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"{where}: `{name}` must be an integer array, got dtype {dtype}.")


def _check_num_segments(num_segments: Any, *, where: str, name: str = "num_segments") -> None:
    if isinstance(num_segments, bool) or not isinstance(num_segments, int) or num_segments < 1:
        raise ValueError(
            f"{where}: `{name}` must be a positive Python int (static), got {num_segments!r}."
        )


def _segment_ids(segment_ids: Any, shape: tuple[int, ...], *, where: str) -> Array:
    """Validate integer `segment_ids` of `shape`; return them as int32."""
    _check_integer(segment_ids, "segment_ids", where=where)
    if jnp.shape(segment_ids) != tuple(shape):
        raise ValueError(
            f"{where}: `segment_ids` must have shape {tuple(shape)}, got {jnp.shape(segment_ids)}."
        )
    return jnp.asarray(segment_ids).astype(jnp.int32)


def _token_values(x: Any, name: str, *, where: str) -> Array:
    """Validate a `[N,T]` real array and upcast it to float32 (float64 is kept)."""
    check_rank(x, 2, name, where=where)
    check_real(x, name, where=where)
    return as_float32(x)


def _zero_outside(x: Array, valid: Array) -> Array:
    """`where(valid, x, 0)`: the first operation on any masked input."""
    return jnp.where(valid, x, jnp.zeros((), x.dtype))


def _previous_valid_index(valid: Array) -> Array:
    """`prev[n,t] = max{u < t : valid[n,u]}` along the last axis, −1 if there is none (int32)."""
    T = valid.shape[-1]
    positions = jnp.where(valid, jnp.arange(T, dtype=jnp.int32), -1)
    last_at_or_before = jax.lax.cummax(positions, axis=valid.ndim - 1)
    pad = jnp.full_like(last_at_or_before[..., :1], -1)  # keeps the sharding of the rows
    return jnp.concatenate([pad, last_at_or_before[..., :-1]], axis=-1)


def _per_row(reduce: Callable[..., Array], x: Array, ids: Array, num_segments: int) -> Array:
    """`reduce` (a `jax.ops.segment_*`) applied row by row; bucket `num_segments` is dropped."""

    def row(xr: Array, ir: Array) -> Array:
        return reduce(xr, ir, num_segments=num_segments + 1)[:num_segments]

    return jax.vmap(row)(x, ids)


def _bucketed(ids: Array, valid: Array, num_segments: int) -> tuple[Array, Array]:
    """Route invalid tokens and out-of-range ids to the discarded bucket `num_segments`."""
    keep = valid & (ids >= 0) & (ids < num_segments)
    return jnp.where(keep, ids, num_segments), keep


# --------------------------------------------------------------------------------------------------
# segment ids, reductions and broadcasts (§4.15)
# --------------------------------------------------------------------------------------------------


def segment_ids_from_boundaries(is_end: ArrayLike, mask: ArrayLike) -> Array:
    """Segment index of every token from end-of-segment markers (ALGORITHMS.md §4.15).

        seg_t = Σ_{u<t} is_end_u·m_u     on valid tokens;   seg_t = −1 where m_t = 0

    A token with `is_end = 1` is the last token of its segment; the next valid token opens the
    next one. Markers on masked tokens are ignored. Boundaries may be step delimiters or turn ends
    (host-detected token patterns), fixed chunks (MA-RLHF macro actions: every `k`-th valid token),
    or SPO cut-points (tokens with `p_t < threshold`; which tokens SPO cuts at is
    (reconstructed — verify against the paper)).

    Sources: "Segment Policy Optimization" (SPO, arXiv 2505.23564); MA-RLHF (macro actions).

    Args:
      is_end: `[N,T]` bool or {0,1}: 1 on the last token of each segment.
      mask: `[N,T]` {0,1} valid tokens.

    Returns:
      `int32[N,T]` segment ids, −1 outside the mask.

    Examples:
      >>> import jax.numpy as jnp
      >>> is_end = jnp.array([[0, 1, 0, 0, 1, 0]]); m = jnp.array([[1, 1, 1, 1, 1, 0]])
      >>> segment_ids_from_boundaries(is_end, m).tolist()
      [[0, 0, 1, 1, 1, -1]]
    """
    where = "segment_ids_from_boundaries"
    check_rank(is_end, 2, "is_end", where=where)
    check_real(is_end, "is_end", where=where)
    valid = as_mask(mask, jnp.shape(is_end), where=where) > 0
    ends = (valid & (jnp.asarray(is_end) > 0)).astype(jnp.int32)
    inclusive = jnp.cumsum(ends, axis=1)
    return jnp.where(valid, inclusive - ends, -1).astype(jnp.int32)


def segment_reduce(
    x: ArrayLike,
    segment_ids: ArrayLike,
    mask: ArrayLike,
    *,
    num_segments: int,
    op: SegmentOp = "sum",
) -> tuple[Array, Array]:
    """Reduce the valid tokens of each segment to one value per segment (ALGORITHMS.md §4.15).

        y[n,k] = op{ x[n,t] : seg[n,t] = k, m[n,t] = 1 }       op ∈ {sum, mean, max, min, first, last}
        segment_mask[n,k] = [segment k of row n has a valid token]

    `mean` divides by the number of valid tokens of the segment, `first`/`last` take the value of
    its first/last valid token. Empty segments give 0; tokens with an id outside `[0, M)` belong
    to no segment. Differentiable in `x` (`max`/`min` route the gradient to the extremal tokens).
    Uses for credit assignment: a step's log-ratio (`sum`), its mean token log-ratio
    (`mean`, Rank-GRPO's per-item geometric-mean ratio), its PRM score on the step-end token
    (`last`), the value at its first token (`first`). Per-row `jax.ops.segment_*` (vmapped over
    `N`, so the batch axis shards); `num_segments` is static.

    Args:
      x: `[N,T]` per-token values.
      segment_ids: `int[N,T]` segment of each token (−1: none), e.g. from
        `segment_ids_from_boundaries`.
      mask: `[N,T]` {0,1} valid tokens.
      num_segments: static number `M` of segments per row.
      op: "sum", "mean", "max", "min", "first" or "last".

    Returns:
      `(y, segment_mask)`: `y[N,M]` float32 (0 for empty segments) and `segment_mask[N,M]` float32
      {0,1}.

    Examples:
      >>> import jax.numpy as jnp
      >>> x = jnp.array([[1.0, 2.0, 3.0, 4.0, jnp.nan]])
      >>> seg = jnp.array([[0, 0, 1, 1, -1]]); m = jnp.array([[1, 1, 1, 1, 0]])
      >>> y, sm = segment_reduce(x, seg, m, num_segments=3, op="mean")
      >>> y.tolist(), sm.tolist()
      ([[1.5, 3.5, 0.0]], [[1.0, 1.0, 0.0]])
      >>> segment_reduce(x, seg, m, num_segments=3, op="last")[0].tolist()
      [[2.0, 4.0, 0.0]]
    """
    where = "segment_reduce"
    check_choice(op, SEGMENT_OPS, "op", where=where)
    _check_num_segments(num_segments, where=where)
    xf = _token_values(x, "x", where=where)
    ids = _segment_ids(segment_ids, xf.shape, where=where)
    valid = as_mask(mask, xf.shape, where=where) > 0
    bucket, keep = _bucketed(ids, valid, num_segments)
    xz = _zero_outside(xf, keep)
    count = _per_row(jax.ops.segment_sum, keep.astype(xf.dtype), bucket, num_segments)
    present = count > 0
    if op in ("sum", "mean"):
        y = _per_row(jax.ops.segment_sum, xz, bucket, num_segments)
        if op == "mean":
            y = y / jnp.maximum(count, 1.0)
    elif op in ("max", "min"):
        reduce = jax.ops.segment_max if op == "max" else jax.ops.segment_min
        y = _per_row(reduce, xz, bucket, num_segments)
    else:
        T = xf.shape[1]
        positions = jnp.zeros_like(ids) + jnp.arange(T, dtype=jnp.int32)  # sharded like ids
        if op == "first":
            index = _per_row(jax.ops.segment_min, positions, bucket, num_segments)
        else:
            index = _per_row(jax.ops.segment_max, positions, bucket, num_segments)
        y = jnp.take_along_axis(xz, jnp.clip(index, 0, T - 1), axis=1)
    y = jnp.where(present, y, jnp.zeros((), xf.dtype))
    return y, present.astype(jnp.float32)


def segment_broadcast(y: ArrayLike, segment_ids: ArrayLike, mask: ArrayLike) -> Array:
    """Give every valid token the value of its segment (ALGORITHMS.md §4.15).

        out[n,t] = y[n, seg[n,t]]·m[n,t]        (0 where `seg` < 0: no segment)

    The inverse direction of `segment_reduce`: `segment_broadcast(segment_reduce(x, "mean"))` is
    idempotent. Differentiable in `y`.

    Args:
      y: `[N,M]` per-segment values (step advantages, step returns, ...).
      segment_ids: `int[N,T]` segment of each token (−1: none). A concrete id ≥ M on a valid
        token is an error (`y` has no value for it); traced ids there give 0.
      mask: `[N,T]` {0,1} valid tokens.

    Returns:
      `[N,T]` float32, 0 outside the mask and on tokens of no segment.

    Examples:
      >>> import jax.numpy as jnp
      >>> seg = jnp.array([[0, 0, 1, -1, -1]]); m = jnp.array([[1, 1, 1, 1, 0]])
      >>> segment_broadcast(jnp.array([[0.5, -1.0]]), seg, m).tolist()
      [[0.5, 0.5, -1.0, 0.0, 0.0]]
    """
    where = "segment_broadcast"
    check_rank(y, 2, "y", where=where)
    check_real(y, "y", where=where)
    check_rank(segment_ids, 2, "segment_ids", where=where)
    yf = as_float32(y)
    N, M = yf.shape
    if jnp.shape(segment_ids)[0] != N:
        raise ValueError(
            f"{where}: `segment_ids` must have one row per row of `y` ({N}), "
            f"got shape {jnp.shape(segment_ids)}."
        )
    ids = _segment_ids(segment_ids, jnp.shape(segment_ids), where=where)
    valid = as_mask(mask, ids.shape, where=where) > 0
    check_valid_range(segment_ids, valid, "segment_ids", where=where, high=M - 1)
    keep = valid & (ids >= 0) & (ids < M)
    gathered = jnp.take_along_axis(yf, jnp.clip(ids, 0, M - 1), axis=1)
    return _zero_outside(gathered, keep)


def segment_standardize(
    rewards: ArrayLike,
    task_ids: ArrayLike,
    *,
    num_tasks: int,
    eps: float = 1e-6,
    ddof: int = 1,
    valid: ArrayLike | None = None,
) -> Array:
    """Standardise rewards within each task of a flat batch (CGPO, Guru; ALGORITHMS.md §10.4).

        r'_n = (r_n − μ_task(n)) / (σ_task(n) + eps)      over the valid rows of each task

    Mixed-task batches (math, code, chat judged by different reward models) have rewards on
    different scales; standardising per task before the advantage estimator puts them on one
    scale. Tasks whose valid rewards are all equal, tasks with fewer than two valid rows, invalid
    rows and rows whose id lies outside `[0, num_tasks)` get 0. This is
    `group_advantages_flat(rewards, task_ids, num_groups=num_tasks, scale="group")`, i.e. the
    GRPO statistics with tasks in place of prompts. The std's ddof and eps are
    (reconstructed — verify against the paper): ddof=1 and eps=1e-6 as `group_advantages`.

    Sources: CGPO, "The Perfect Blend: Redefining RLHF with Mixture of Judges" (arXiv 2409.20370);
    Guru (per-domain reward standardisation). No peer.

    Args:
      rewards: `[N]` rewards of a mixed batch.
      task_ids: `int[N]` task of each row, in `[0, num_tasks)`.
      num_tasks: static number of tasks.
      eps: added to each task's std (>= 0).
      ddof: delta degrees of freedom of the std (0 or 1).
      valid: optional `[N]` bool; False rows leave the statistics and get 0.

    Returns:
      `[N]` float32 standardised rewards, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([1.0, 10.0, 3.0, 30.0]); task = jnp.array([0, 1, 0, 1])
      >>> [round(x, 4) for x in segment_standardize(r, task, num_tasks=2).tolist()]
      [-0.7071, -0.7071, 0.7071, 0.7071]
    """
    where = "segment_standardize"
    check_rank(rewards, 1, "rewards", where=where)
    check_real(rewards, "rewards", where=where)
    check_rank(task_ids, 1, "task_ids", where=where)
    _check_integer(task_ids, "task_ids", where=where)
    if jnp.shape(task_ids) != jnp.shape(rewards):
        raise ValueError(
            f"{where}: `task_ids` must have the shape of `rewards` {jnp.shape(rewards)}, "
            f"got {jnp.shape(task_ids)}."
        )
    _check_num_segments(num_tasks, where=where, name="num_tasks")
    check_positive(eps, "eps", where=where, allow_zero=True)
    check_choice(ddof, (0, 1), "ddof", where=where)
    return group_advantages_flat(
        rewards, task_ids, num_groups=num_tasks, scale="group", eps=eps, ddof=ddof, valid=valid
    )


# --------------------------------------------------------------------------------------------------
# step-level segments (§11)
# --------------------------------------------------------------------------------------------------


def run_length_segments(step_ok: ArrayLike, step_mask: ArrayLike | None = None) -> Array:
    """Group consecutive steps with the same verdict into thought units (TP-GRPO, ALGORITHMS.md §11).

        unit_k = Σ_{1≤j≤k} [ok_j ≠ ok_{j−1}]        (unit_0 = 0)

    i.e. a new unit starts wherever the step verdict flips (correct → incorrect or back). With a
    `step_mask`, masked steps get −1 and each valid step is compared with the previous *valid*
    step. Feed the result to `segment_reduce`/`segment_broadcast` on the `[N,M]` step layout.

    Source: TP-GRPO (thought units; seed paper). No peer.

    Args:
      step_ok: `[N,M]` bool or {0,1} per-step verdicts (values > 0 count as ok).
      step_mask: optional `[N,M]` {0,1} valid steps (default: all valid).

    Returns:
      `int32[N,M]` unit ids, −1 on masked steps.

    Examples:
      >>> import jax.numpy as jnp
      >>> run_length_segments(jnp.array([[1, 1, 0, 0, 1, 1]])).tolist()
      [[0, 0, 1, 1, 2, 2]]
    """
    where = "run_length_segments"
    check_rank(step_ok, 2, "step_ok", where=where)
    check_real(step_ok, "step_ok", where=where)
    shape = jnp.shape(step_ok)
    valid = (
        jnp.ones(shape, bool)
        if step_mask is None
        else as_mask(step_mask, shape, "step_mask", where=where) > 0
    )
    ok = jnp.where(valid, jnp.asarray(step_ok) > 0, False)
    prev = _previous_valid_index(valid)
    prev_ok = jnp.take_along_axis(ok, jnp.maximum(prev, 0), axis=1)
    flips = (valid & (prev >= 0) & (ok != prev_ok)).astype(jnp.int32)
    return jnp.where(valid, jnp.cumsum(flips, axis=1), -1).astype(jnp.int32)


# --------------------------------------------------------------------------------------------------
# multi-turn masks and turn ids
# --------------------------------------------------------------------------------------------------


def _trainable_role_mask(role_ids: Any, trainable_roles: Any, *, where: str) -> Array:
    """Validate `role_ids` and `trainable_roles`; return `[role ∈ trainable_roles]` (bool)."""
    check_rank(role_ids, 2, "role_ids", where=where)
    _check_integer(role_ids, "role_ids", where=where)
    roles = (trainable_roles,) if isinstance(trainable_roles, int) else trainable_roles
    if (
        not isinstance(roles, Sequence)
        or isinstance(roles, str)
        or len(roles) == 0
        or not all(isinstance(r, int) and not isinstance(r, bool) for r in roles)
    ):
        raise ValueError(
            f"{where}: `trainable_roles` must be a non-empty tuple of Python ints (static role "
            f"ids), got {trainable_roles!r}."
        )
    role = jnp.asarray(role_ids)
    hit = jnp.zeros(role.shape, bool)
    for r in roles:
        hit = hit | (role == r)
    return hit


def multi_turn_loss_mask(
    mask: ArrayLike, role_ids: ArrayLike, *, trainable_roles: int | Sequence[int]
) -> Array:
    """Loss mask of a multi-turn rollout: only tokens the policy generated count.

        loss_mask[n,t] = m[n,t] · [role_ids[n,t] ∈ trainable_roles]

    Environment, tool and user tokens stay in the sequence (they condition the policy) but leave
    the loss, and — because they enter through the mask, not through weights — they also leave
    every normaliser (`aggregate`'s token and sequence counts) and every masked statistic
    (`masked_whiten`; `gae(skip_masked=True)` lets values flow across them). Use it as the
    `mask` of every per-token estimator and loss of a multi-turn batch.

    Args:
      mask: `[N,T]` {0,1} real (non-padding) tokens of the completion.
      role_ids: `int[N,T]` role of each token; the encoding is the caller's (e.g. 0 system,
        1 user, 2 assistant, 3 tool).
      trainable_roles: static role id or tuple of role ids whose tokens are trained on.

    Returns:
      `[N,T]` float32 {0,1} loss mask.

    Examples:
      >>> import jax.numpy as jnp
      >>> roles = jnp.array([[2, 2, 3, 3, 2, 0]]); m = jnp.array([[1, 1, 1, 1, 1, 0]])
      >>> multi_turn_loss_mask(m, roles, trainable_roles=(2,)).tolist()
      [[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]]
    """
    where = "multi_turn_loss_mask"
    trainable = _trainable_role_mask(role_ids, trainable_roles, where=where)
    m = as_mask(mask, trainable.shape, where=where)
    return jnp.where(trainable, m, 0.0)


def turn_ids_from_roles(
    role_ids: ArrayLike, mask: ArrayLike, *, trainable_roles: int | Sequence[int]
) -> Array:
    """Number the trainable turns of a multi-turn rollout: segment ids for turn-level credit.

        start_t = v_t · [role_t trainable] · ([t = 0] ∨ ¬v_{t−1} ∨ [role_{t−1} ≠ role_t])
        turn_t  = Σ_{u≤t} start_u − 1   on valid tokens of a trainable role;   −1 elsewhere

    with `v = mask`. A turn is a maximal run of valid tokens of one trainable role; an
    environment/tool run, a role change or a masked gap ends it. Passing the loss mask of
    `multi_turn_loss_mask` as `mask` works too (its gaps end turns). The ids feed
    `segment_reduce`/`segment_broadcast` with `num_segments` = the maximum number of turns, e.g.
    to broadcast GiGPO step advantages (`dual_level_advantages`) or IGPO turn rewards to tokens.

    Args:
      role_ids: `int[N,T]` role of each token.
      mask: `[N,T]` {0,1} real tokens (or the loss mask).
      trainable_roles: static role id or tuple of role ids that the policy generates.

    Returns:
      `int32[N,T]` turn ids (0, 1, … per row), −1 on other tokens.

    Examples:
      >>> import jax.numpy as jnp
      >>> roles = jnp.array([[2, 2, 3, 3, 2, 2, 3, 2]]); m = jnp.ones((1, 8))
      >>> turn_ids_from_roles(roles, m, trainable_roles=2).tolist()
      [[0, 0, -1, -1, 1, 1, -1, 2]]
    """
    where = "turn_ids_from_roles"
    trainable = _trainable_role_mask(role_ids, trainable_roles, where=where)
    valid = as_mask(mask, trainable.shape, where=where) > 0
    role = jnp.asarray(role_ids)
    on = valid & trainable
    prev_role = jnp.concatenate([role[:, :1], role[:, :-1]], axis=1)
    prev_valid = jnp.concatenate([jnp.zeros_like(valid[:, :1]), valid[:, :-1]], axis=1)
    start = on & (~prev_valid | (prev_role != role))
    turns = jnp.cumsum(start.astype(jnp.int32), axis=1) - 1
    return jnp.where(on, turns, -1).astype(jnp.int32)


def divergence_suffix_mask(
    tok_a: ArrayLike, tok_b: ArrayLike, mask: ArrayLike, *, mask_b: ArrayLike | None = None
) -> Array:
    """Mask of the suffix of `a` from its first divergence from `b` on (R³L, ALGORITHMS.md §11).

        out_t = m_t · [t ≥ t*],   t* = min{ t : m_t = 1, a_t ≠ b_t }      (no divergence: all 0)

    Two responses that share a prefix carry no contrast on it; training only on the diverging
    suffix assigns the credit of the outcome difference to the tokens that caused it. With
    `mask_b`, a valid position of `a` where `b` is not valid (`b` ended earlier) also diverges;
    without it, tokens are compared at the valid positions of `a` only.

    Source: R³L (train only the diverging suffix; seed paper). No peer.

    Args:
      tok_a: `int[N,T]` tokens of the trained responses.
      tok_b: `int[N,T]` tokens of the responses they are contrasted with.
      mask: `[N,T]` {0,1} valid tokens of `a`.
      mask_b: optional `[N,T]` {0,1} valid tokens of `b`.

    Returns:
      `[N,T]` float32 {0,1} mask.

    Examples:
      >>> import jax.numpy as jnp
      >>> a = jnp.array([[5, 6, 7, 8]]); b = jnp.array([[5, 6, 9, 8]])
      >>> divergence_suffix_mask(a, b, jnp.ones((1, 4))).tolist()
      [[0.0, 0.0, 1.0, 1.0]]
    """
    where = "divergence_suffix_mask"
    check_rank(tok_a, 2, "tok_a", where=where)
    _check_integer(tok_a, "tok_a", where=where)
    _check_integer(tok_b, "tok_b", where=where)
    shape = jnp.shape(tok_a)
    if jnp.shape(tok_b) != shape:
        raise ValueError(
            f"{where}: `tok_b` must have the shape of `tok_a` {shape}, got {jnp.shape(tok_b)}."
        )
    m = as_mask(mask, shape, where=where)
    valid = m > 0
    differs = jnp.asarray(tok_a) != jnp.asarray(tok_b)
    if mask_b is not None:
        valid_b = as_mask(mask_b, shape, "mask_b", where=where) > 0
        differs = differs | ~valid_b
    first_hit = valid & differs
    after = jax.lax.cummax(first_hit.astype(jnp.int32), axis=1) > 0
    return jnp.where(after, m, 0.0)
