"""Segments, multi-turn masks and suffix masks (ALGORITHMS.md §4.15, §10.4, §11) vs NumPy loops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.masked import masked_sum
from losses.ppo import reinforce_loss
from losses.segments import (
    SEGMENT_OPS,
    divergence_suffix_mask,
    multi_turn_loss_mask,
    run_length_segments,
    segment_broadcast,
    segment_ids_from_boundaries,
    segment_reduce,
    segment_standardize,
    turn_ids_from_roles,
)
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, plant_nonfinite

N, T, M = 6, 12, 4


@jax.jit
def _all_ops(x, seg, m):
    """Every op of `segment_reduce` in one compilation (num_segments static = M)."""
    return {op: segment_reduce(x, seg, m, num_segments=M, op=op) for op in SEGMENT_OPS}


_broadcast = jax.jit(segment_broadcast)
_ids_from_boundaries = jax.jit(segment_ids_from_boundaries)


# --------------------------------------------------------------------------------------------------
# references and data
# --------------------------------------------------------------------------------------------------


def np_ids_from_boundaries(is_end, m):
    out = np.full(m.shape, -1, np.int64)
    for n in range(m.shape[0]):
        count = 0
        for t in range(m.shape[1]):
            if m[n, t] > 0:
                out[n, t] = count
                count += int(is_end[n, t] > 0)
    return out


def np_segment_reduce(x, seg, m, op, num_segments=M):
    y = np.zeros((x.shape[0], num_segments))
    present = np.zeros((x.shape[0], num_segments))
    for n in range(x.shape[0]):
        for k in range(num_segments):
            vals = [float(x[n, t]) for t in range(x.shape[1]) if m[n, t] > 0 and seg[n, t] == k]
            if not vals:
                continue
            present[n, k] = 1.0
            y[n, k] = {
                "sum": np.sum,
                "mean": np.mean,
                "max": np.max,
                "min": np.min,
                "first": lambda v: v[0],
                "last": lambda v: v[-1],
            }[op](vals)
    return y, present


def random_segments(seed, n=N, t=T, *, out_of_range=True):
    """x with NaN/inf off-mask, ids from random boundaries (some beyond M, some −1), mask."""
    rng = np.random.default_rng(seed)
    m = make_mask(rng, n, t)
    is_end = (rng.uniform(size=(n, t)) < 0.3).astype(np.int32)
    seg = np_ids_from_boundaries(is_end, m)
    if out_of_range:
        seg[3, :] = np.where(m[3] > 0, np.arange(t) % (M + 2) - 1, -1)  # −1 and ids ≥ M inside
    else:
        seg = np.where(seg >= M, M - 1, seg)
    x = plant_nonfinite(rng.normal(size=(n, t)), m, rng)
    return rng, x, seg.astype(np.int32), m


# --------------------------------------------------------------------------------------------------
# segment_ids_from_boundaries / segment_reduce / segment_broadcast (§4.15)
# --------------------------------------------------------------------------------------------------


def test_segment_ids_from_boundaries_matches_reference():
    rng = np.random.default_rng(0)
    m = make_mask(rng, N, T)
    is_end = rng.uniform(size=(N, T)) < 0.3
    out = _ids_from_boundaries(is_end, m)
    assert out.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(out), np_ids_from_boundaries(is_end, m))


def test_segment_reduce_matches_reference_for_every_op():
    _, x, seg, m = random_segments(1)
    out = _all_ops(x, seg, m)
    for op in SEGMENT_OPS:
        y, present = out[op]
        ref_y, ref_present = np_segment_reduce(x, seg, m, op)
        assert y.dtype == jnp.float32 and y.shape == (N, M), op
        assert_close(y, ref_y)
        np.testing.assert_array_equal(np.asarray(present), ref_present)


def test_sum_over_segments_is_the_masked_sum():
    _, x, seg, m = random_segments(2, out_of_range=False)
    y, _ = _all_ops(x, seg, m)["sum"]
    assert_close(jnp.sum(y, axis=1), np.asarray(masked_sum(x, m, axis=1), np.float64), atol=1e-5)


def test_broadcast_of_segment_mean_is_idempotent():
    _, x, seg, m = random_segments(3)
    once = _broadcast(_all_ops(x, seg, m)["mean"][0], seg, m)
    twice = _broadcast(_all_ops(once, seg, m)["mean"][0], seg, m)
    assert_close(twice, np.asarray(once, np.float64))
    # tokens of no segment (id −1 or ≥ M) and masked tokens get 0
    keep = (m > 0) & (seg >= 0) & (seg < M)
    assert np.all(np.asarray(once)[~keep] == 0.0)


def test_segment_broadcast_matches_reference():
    rng, _, seg, m = random_segments(4)
    y = rng.normal(size=(N, M)).astype(np.float32)
    expected = np.zeros((N, T))
    for n, t in np.ndindex(N, T):
        if m[n, t] > 0 and 0 <= seg[n, t] < M:
            expected[n, t] = y[n, seg[n, t]]
    assert_close(_broadcast(y, seg, m), expected)


def test_segment_reduce_gradients_and_nan_safety():
    rng, x, seg, m = random_segments(5)
    w = rng.normal(size=(N, M)).astype(np.float32)
    clean = np.where(m > 0, x, 0.0).astype(np.float32)

    def scalar(x, op):
        return jnp.sum(w * segment_reduce(x, seg, m, num_segments=M, op=op)[0])

    grads = jax.jit(lambda x: {op: jax.grad(scalar)(x, op) for op in SEGMENT_OPS})(clean)
    counts = np_segment_reduce(np.ones((N, T)), seg, m, "sum")[0]
    for op in SEGMENT_OPS:
        expected = np.zeros((N, T))
        for n in range(N):
            for k in range(M):
                idx = [t for t in range(T) if m[n, t] > 0 and seg[n, t] == k]
                if not idx:
                    continue
                vals = clean[n, idx].astype(np.float64)
                pick = {
                    "max": idx[int(np.argmax(vals))],
                    "min": idx[int(np.argmin(vals))],
                    "first": idx[0],
                    "last": idx[-1],
                }
                if op in ("sum", "mean"):
                    expected[n, idx] = w[n, k] / (counts[n, k] if op == "mean" else 1.0)
                else:
                    expected[n, pick[op]] = w[n, k]
        assert_close(grads[op], expected)
    for op in ("mean", "max", "last"):
        assert_nan_safe(lambda x, op=op: scalar(x, op), (clean,), m, rng)


def test_segment_broadcast_gradient_sums_the_tokens_of_each_segment():
    rng, _, seg, m = random_segments(6)
    y = rng.normal(size=(N, M)).astype(np.float32)
    v = rng.normal(size=(N, T)).astype(np.float32)
    grad = jax.jit(jax.grad(lambda y: jnp.sum(v * segment_broadcast(y, seg, m))))(y)
    expected, _ = np_segment_reduce(v, seg, m, "sum")
    assert_close(grad, expected)


def test_segment_ops_in_a_jitted_step_with_static_num_segments():
    _, x, seg, m = random_segments(7)

    @jax.jit
    def step_mean_tokens(x, seg, m):
        y, _ = segment_reduce(x, seg, m, num_segments=M, op="mean")
        return segment_broadcast(y, seg, m)

    out = step_mean_tokens(x, seg, m)
    assert out.shape == (N, T) and np.all(np.isfinite(np.asarray(out)))


# --------------------------------------------------------------------------------------------------
# segment_standardize (§10.4), run_length_segments (§11)
# --------------------------------------------------------------------------------------------------


def test_segment_standardize_matches_reference():
    rng = np.random.default_rng(8)
    r = rng.normal(size=20).astype(np.float32) * np.repeat([1.0, 10.0, 100.0, 1.0], 5)
    task = np.repeat([0, 1, 2, 3], 5).astype(np.int32)
    r[15:] = 0.5  # task 3: zero variance
    task[0] = 7  # out of range: invalid
    valid = np.ones(20, bool)
    valid[6] = False
    out = jax.jit(segment_standardize, static_argnames=("num_tasks", "ddof"))(
        r, task, num_tasks=4, valid=valid
    )
    expected = np.zeros(20)
    for k in range(4):
        rows = (task == k) & valid
        vals = r[rows].astype(np.float64)
        if vals.max() > vals.min():
            expected[rows] = (vals - vals.mean()) / (vals.std(ddof=1) + 1e-6)
    assert_close(out, expected)
    # per-task standardisation removes the scale of each task (10× and 100× here)
    for k in (1, 2):
        assert_close(np.std(np.asarray(out)[(task == k) & valid], ddof=1), 1.0, atol=1e-4)


def test_run_length_segments_matches_reference():
    rng = np.random.default_rng(9)
    ok = rng.integers(0, 2, size=(N, 8))
    step_mask = make_mask(rng, N, 8)
    out = jax.jit(run_length_segments)(ok, step_mask)
    expected = np.full((N, 8), -1)
    for n in range(N):
        unit, prev = -1, None
        for k in range(8):
            if step_mask[n, k] == 0:
                continue
            if prev is None or ok[n, k] != prev:
                unit += 1
            prev = ok[n, k]
            expected[n, k] = unit
    np.testing.assert_array_equal(np.asarray(out), expected)
    assert run_length_segments(np.array([[True, False, False]])).tolist() == [[0, 1, 1]]


# --------------------------------------------------------------------------------------------------
# multi-turn masks and turn ids
# --------------------------------------------------------------------------------------------------

SYSTEM, USER, ASSISTANT, TOOL = 0, 1, 2, 3


def multi_turn_batch(seed):
    rng = np.random.default_rng(seed)
    roles = np.array(
        [
            [2, 2, 3, 3, 3, 2, 2, 2, 1, 1, 2, 2],
            [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2],
            [3, 3, 2, 2, 3, 2, 3, 2, 2, 0, 0, 0],
            [2, 2, 2, 3, 3, 2, 2, 3, 3, 2, 2, 2],
        ],
        np.int32,
    )
    m = np.ones(roles.shape, np.float32)
    m[2, 9:] = 0.0  # padding
    m[3, :] = 0.0  # empty row
    return rng, roles, m


def test_multi_turn_loss_mask_keeps_only_trainable_roles():
    _, roles, m = multi_turn_batch(10)
    out = jax.jit(multi_turn_loss_mask, static_argnames="trainable_roles")(
        m, roles, trainable_roles=(ASSISTANT,)
    )
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), m * (roles == ASSISTANT))
    both = multi_turn_loss_mask(m, roles, trainable_roles=(ASSISTANT, USER))
    np.testing.assert_array_equal(np.asarray(both), m * np.isin(roles, (ASSISTANT, USER)))


def test_tool_tokens_leave_the_loss_and_its_normaliser():
    rng, roles, m = multi_turn_batch(11)
    loss_mask = np.asarray(multi_turn_loss_mask(m, roles, trainable_roles=ASSISTANT))
    logp = plant_nonfinite(-rng.uniform(0.1, 2.0, size=roles.shape), loss_mask, rng)
    adv = plant_nonfinite(rng.normal(size=roles.shape), loss_mask, rng)
    loss, _ = jax.jit(reinforce_loss)(logp, adv, loss_mask)
    keep = loss_mask > 0
    expected = -np.sum(adv[keep].astype(np.float64) * logp[keep]) / keep.sum()
    assert_close(loss, expected)


def test_turn_ids_from_roles_matches_reference():
    _, roles, m = multi_turn_batch(12)
    out = jax.jit(turn_ids_from_roles, static_argnames="trainable_roles")(
        roles, m, trainable_roles=ASSISTANT
    )
    expected = np.full(roles.shape, -1)
    for n in range(roles.shape[0]):
        turn = -1
        for t in range(roles.shape[1]):
            on = m[n, t] > 0 and roles[n, t] == ASSISTANT
            prev_on = t > 0 and m[n, t - 1] > 0 and roles[n, t - 1] == roles[n, t]
            if on and not prev_on:
                turn += 1
            if on:
                expected[n, t] = turn
    np.testing.assert_array_equal(np.asarray(out), expected)
    assert expected[0].tolist() == [0, 0, -1, -1, -1, 1, 1, 1, -1, -1, 2, 2]
    # the loss mask as `mask`: its gaps end turns the same way
    loss_mask = multi_turn_loss_mask(m, roles, trainable_roles=ASSISTANT)
    again = turn_ids_from_roles(roles, loss_mask, trainable_roles=ASSISTANT)
    np.testing.assert_array_equal(np.asarray(again), expected)


def test_turn_ids_feed_segment_reduce():
    rng, roles, m = multi_turn_batch(13)
    turns = turn_ids_from_roles(roles, m, trainable_roles=ASSISTANT)
    loss_mask = multi_turn_loss_mask(m, roles, trainable_roles=ASSISTANT)
    x = rng.normal(size=roles.shape).astype(np.float32)
    y, present = segment_reduce(x, turns, loss_mask, num_segments=4)
    assert_close(y[0, :3], [x[0, :2].sum(), x[0, 5:8].sum(), x[0, 10:].sum()])
    assert np.asarray(present).tolist()[0] == [1.0, 1.0, 1.0, 0.0]


# --------------------------------------------------------------------------------------------------
# divergence_suffix_mask (§11, R³L)
# --------------------------------------------------------------------------------------------------


def test_divergence_suffix_mask_matches_reference():
    rng = np.random.default_rng(14)
    m = make_mask(rng, N, T)
    a = rng.integers(0, 3, size=(N, T)).astype(np.int32)
    b = np.where(
        np.arange(T)[None, :] < rng.integers(0, T, size=(N, 1)), a, rng.integers(0, 3, (N, T))
    )
    b[4] = a[4]  # identical: no divergence
    mask_b = make_mask(rng, N, T, empty_row=False)
    run = jax.jit(divergence_suffix_mask)
    for with_b in (False, True):
        out = run(a, b, m, mask_b=mask_b if with_b else None)
        expected = np.zeros((N, T))
        for n in range(N):
            hits = [
                t
                for t in range(T)
                if m[n, t] > 0 and (a[n, t] != b[n, t] or (with_b and mask_b[n, t] == 0))
            ]
            if hits:
                expected[n, hits[0] :] = m[n, hits[0] :]
        np.testing.assert_array_equal(np.asarray(out), expected)
    assert np.all(np.asarray(run(a, a, m, mask_b=None)) == 0.0)


# --------------------------------------------------------------------------------------------------
# bad inputs
# --------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    x = np.zeros((2, 5), np.float32)
    seg = np.zeros((2, 5), np.int32)
    m = np.ones((2, 5))
    with pytest.raises(ValueError, match="segment_reduce: `op` must be one of 'sum'"):
        segment_reduce(x, seg, m, num_segments=2, op="median")
    with pytest.raises(ValueError, match="`num_segments` must be a positive Python int"):
        segment_reduce(x, seg, m, num_segments=0)
    with pytest.raises(ValueError, match="`num_segments` must be a positive Python int"):
        segment_reduce(x, seg, m, num_segments=jnp.array(3))
    with pytest.raises(ValueError, match="`segment_ids` must be an integer array"):
        segment_reduce(x, seg.astype(np.float32), m, num_segments=2)
    with pytest.raises(ValueError, match=r"`segment_ids` must have shape \(2, 5\)"):
        segment_reduce(x, seg[:, :4], m, num_segments=2)
    with pytest.raises(ValueError, match="segment_reduce: `x` must have rank 2"):
        segment_reduce(x[0], seg[0], m[0], num_segments=2)
    with pytest.raises(ValueError, match=r"segment_reduce: `mask` must have shape \(2, 5\)"):
        segment_reduce(x, seg, m[:, :3], num_segments=2)
    with pytest.raises(ValueError, match="segment_broadcast: `segment_ids` must have one row"):
        segment_broadcast(np.zeros((3, 2)), seg, m)
    with pytest.raises(ValueError, match="segment_ids_from_boundaries: `is_end` must have rank 2"):
        segment_ids_from_boundaries(np.zeros(5), np.ones(5))
    with pytest.raises(ValueError, match="segment_standardize: `task_ids` must be an integer"):
        segment_standardize(np.zeros(4), np.zeros(4), num_tasks=2)
    with pytest.raises(ValueError, match="segment_standardize: `num_tasks` must be a positive"):
        segment_standardize(np.zeros(4), np.zeros(4, np.int32), num_tasks=0)
    with pytest.raises(ValueError, match="`trainable_roles` must be a non-empty tuple"):
        multi_turn_loss_mask(m, seg, trainable_roles=())
    with pytest.raises(ValueError, match="`trainable_roles` must be a non-empty tuple"):
        turn_ids_from_roles(seg, m, trainable_roles=("assistant",))
    with pytest.raises(ValueError, match="multi_turn_loss_mask: `role_ids` must be an integer"):
        multi_turn_loss_mask(m, x, trainable_roles=2)
    with pytest.raises(ValueError, match="divergence_suffix_mask: `tok_b` must have the shape"):
        divergence_suffix_mask(seg, seg[:1], m)
    with pytest.raises(ValueError, match=r"run_length_segments: `step_mask` must have shape"):
        run_length_segments(seg, m[:, :2])
