"""Value loss and running reward moments (ALGORITHMS.md §7.1, §7.3) against float64 NumPy."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.aggregation import AGG_MODES
from losses.value import (
    RunningMoments,
    init_running_moments,
    normalize_rewards,
    running_moments_update,
    value_loss,
)
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, np_aggregate

N, T = 7, 11


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(N, T)).astype(np.float32)
    old = (v + 0.4 * rng.normal(size=(N, T))).astype(np.float32)
    ret = rng.normal(size=(N, T)).astype(np.float32)
    return rng, v, old, ret, make_mask(rng, N, T)


def np_value_per_token(v, old, ret, clip):
    """§7.1 in float64: ℓ = ½ max((v − R)², (v_c − R)²) and whether the clipped branch is larger."""
    v, old, ret = (np.asarray(a, np.float64) for a in (v, old, ret))
    err = (v - ret) ** 2
    if clip is None:
        return 0.5 * err, np.zeros(v.shape, bool)
    v_c = old + np.clip(v - old, -clip, clip)
    err_c = (v_c - ret) ** 2
    return 0.5 * np.maximum(err, err_c), err_c > err


def np_value_grad(v, old, ret, clip):
    """dℓ/dv of the reference: the active branch's derivative (0 when clipped and it binds)."""
    v, old, ret = (np.asarray(a, np.float64) for a in (v, old, ret))
    if clip is None:
        return v - ret
    v_c = old + np.clip(v - old, -clip, clip)
    clipped_larger = (v_c - ret) ** 2 > (v - ret) ** 2
    inside = np.abs(v - old) < clip
    return np.where(clipped_larger, (v_c - ret) * inside, v - ret)


# Jitted entry points: one compilation per static option set instead of one per primitive.
_value_loss = jax.jit(value_loss, static_argnames=("clip", "agg"))
_update = jax.jit(running_moments_update)
_normalize = jax.jit(normalize_rewards, static_argnames=("clip", "shift_mean"))


def test_anchor():
    v = jnp.array([[0.5, 1.0]])
    old = jnp.array([[0.2, 0.9]])
    ret = jnp.array([[1.0, 0.0]])
    one_hot = (jnp.array([[1.0, 0.0]]), jnp.array([[0.0, 1.0]]))  # token_mean of one token = ℓ_t
    per_token = [float(_value_loss(v, old, ret, m, clip=0.2)[0]) for m in one_hot]
    assert_close(per_token, [0.18, 0.5])
    loss, metrics = _value_loss(v, old, ret, jnp.ones((1, 2)), clip=0.2, agg="token_sum")
    assert_close(loss, 0.68)
    assert_close(metrics["value/clip_frac"], 0.5)
    assert_close(metrics["value/mean"], 0.75)


@functools.partial(jax.jit, static_argnames="clip")
def _value_loss_all_modes(v, old, ret, m, *, clip):
    """`value_loss` under every aggregation mode (one compilation per `clip`)."""
    return {agg: value_loss(v, old, ret, m, clip=clip, agg=agg) for agg in AGG_MODES}


@pytest.mark.parametrize("clip", [0.2, 0.5, None])
def test_matches_float64_reference(clip):
    _, v, old, ret, m = _inputs(0)
    per_token, clipped = np_value_per_token(v, old, ret, clip)
    valid = m > 0
    diff = (ret - v).astype(np.float64)[valid]
    expected_ev = 1.0 - np.var(diff, ddof=1) / np.var(ret.astype(np.float64)[valid], ddof=1)
    for agg, (loss, metrics) in _value_loss_all_modes(v, old, ret, m, clip=clip).items():
        assert_close(loss, np_aggregate(per_token, m, agg))
        assert_close(metrics["value/clip_frac"], clipped[valid].mean())
        assert_close(metrics["value/mean"], v[valid].astype(np.float64).mean())
        assert_close(metrics["value/explained_var"], expected_ev)
        assert set(metrics) == {"value/clip_frac", "value/mean", "value/explained_var"}
        assert all(x.dtype == jnp.float32 and x.shape == () for x in metrics.values())
    if clip == 0.2:
        assert 0 < clipped[valid].mean() < 1  # both branches are exercised


def test_huge_clip_is_half_mse():
    _, v, old, ret, m = _inputs(1)
    big, _ = _value_loss(v, old, ret, m, clip=1e6)
    plain, _ = _value_loss(v, None, ret, m, clip=None)
    assert_close(big, plain)
    assert_close(plain, np_aggregate(0.5 * (v.astype(np.float64) - ret) ** 2, m, "token_mean"))


@pytest.mark.parametrize("clip", [0.2, None])
def test_gradient_matches_analytic(clip):
    _, v, old, ret, m = _inputs(2)
    grad = jax.jit(jax.grad(lambda x: value_loss(x, old, ret, m, clip=clip)[0]))(v)
    expected = np_value_grad(v, old, ret, clip) * m / m.sum()
    assert_close(grad, expected)


def test_zero_gradient_where_the_clipped_branch_binds():
    _, v, old, ret, m = _inputs(3)
    grad = np.asarray(jax.jit(jax.grad(lambda x: value_loss(x, old, ret, m, clip=0.2)[0]))(v))
    _, clipped = np_value_per_token(v, old, ret, 0.2)
    binds = clipped & (m > 0)
    assert binds.sum() >= 3, "the test inputs must exercise the clipped branch"
    assert np.all(grad[binds] == 0.0)
    free = (~clipped) & (m > 0) & (np.abs(v - ret) > 1e-3)
    assert np.all(grad[free] != 0.0)


def test_nan_outside_mask_does_not_leak():
    rng, v, old, ret, m = _inputs(4)
    assert_nan_safe(lambda a, b, c: value_loss(a, b, c, m, clip=0.2), (v, old, ret), m, rng)
    assert_nan_safe(lambda a, c: value_loss(a, None, c, m, clip=None), (v, ret), m, rng)


def test_explained_variance_edge_cases():
    m = np.ones((2, 3), np.float32)
    ret = np.arange(6, dtype=np.float32).reshape(2, 3)
    _, perfect = _value_loss(ret, ret, ret, m)
    assert_close(perfect["value/explained_var"], 1.0)
    _, constant = _value_loss(ret, ret, np.ones_like(ret), m)
    assert float(constant["value/explained_var"]) == 0.0  # var(R) = 0: 0, not inf/NaN
    loss, metrics = _value_loss(ret, ret, ret, np.zeros_like(m))
    assert float(loss) == 0.0 and all(np.isfinite(float(x)) for x in metrics.values())


def test_bfloat16_inputs_give_float32():
    _, v, old, ret, m = _inputs(5)
    loss, metrics = _value_loss(
        jnp.asarray(v, jnp.bfloat16), jnp.asarray(old, jnp.bfloat16), ret, m
    )
    assert loss.dtype == jnp.float32
    assert metrics["value/mean"].dtype == jnp.float32


def test_value_loss_errors_name_the_problem():
    v = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="`old_values` is required"):
        value_loss(v, None, v, v, clip=0.2)
    with pytest.raises(ValueError, match="`values` must have rank 2"):
        value_loss(jnp.ones(3), jnp.ones(3), jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match="`returns` must have the shape of `values`"):
        value_loss(v, v, jnp.ones((2, 2)), v)
    with pytest.raises(ValueError, match="`clip` must be > 0"):
        value_loss(v, v, v, v, clip=0.0)
    with pytest.raises(ValueError, match="`mode` must be one of"):
        value_loss(v, v, v, v, agg="mean")
    with pytest.raises(ValueError, match="`values` must be a floating-point array"):
        value_loss(jnp.ones((2, 3), jnp.int32), v, v, v)


# --------------------------------------------------------------------------------------------------
# running moments and reward normalisation (§7.3)
# --------------------------------------------------------------------------------------------------


def _np_state(values):
    values = np.asarray(values, np.float64)
    if values.size == 0:
        return 0.0, 0.0, 0.0
    return float(values.size), values.mean(), ((values - values.mean()) ** 2).sum()


def test_two_merged_batches_equal_one_concatenated_batch():
    rng = np.random.default_rng(6)
    a = (3.0 + 2.0 * rng.normal(size=(7, 11))).astype(np.float32)
    b = (-1.0 + 0.5 * rng.normal(size=(5, 11))).astype(np.float32)
    ma, mb = make_mask(rng, 7, 11), make_mask(rng, 5, 11)
    s = _update(_update(init_running_moments(), a, ma), b, mb)
    one = _update(init_running_moments(), np.concatenate([a, b]), np.concatenate([ma, mb]))
    for merged, concatenated in zip(s, one, strict=True):
        assert_close(merged, float(concatenated), rtol=1e-5)
    values = np.concatenate([a[ma > 0], b[mb > 0]])
    assert_close(list(s), list(_np_state(values)), rtol=1e-5)


def test_moments_without_mask_and_empty_batch():
    x = np.array([1.0, 2.0, 4.0, 8.0], np.float32)
    s = _update(init_running_moments(), x, None)
    assert_close(list(s), list(_np_state(x)))
    same = _update(s, np.full((3,), np.nan, np.float32), np.zeros(3))
    assert_close(list(same), list(_np_state(x)))
    assert isinstance(same, RunningMoments)


def test_normalize_rewards_against_numpy():
    rng = np.random.default_rng(8)
    history = rng.normal(2.0, 3.0, size=(13,)).astype(np.float32)
    x = rng.normal(2.0, 3.0, size=(7,)).astype(np.float32)
    s = _update(init_running_moments(), history, None)
    mean, var = history.astype(np.float64).mean(), history.astype(np.float64).var()
    z = (x - mean) / np.sqrt(var + 1e-8)
    assert_close(_normalize(x, s), z)
    assert_close(_normalize(x, s, clip=0.5), np.clip(z, -0.5, 0.5))
    assert_close(_normalize(x, s, shift_mean=False), z + mean)


def test_normalize_rewards_empty_state_and_mask():
    x = np.array([[1.0, np.nan], [3.0, np.inf]], np.float32)
    m = np.array([[1, 0], [1, 0]], np.float32)
    assert_close(_normalize(x, init_running_moments(), mask=m), [[1.0, 0.0], [3.0, 0.0]])
    s = _update(init_running_moments(), x, m)
    assert_close(_normalize(x, s, mask=m), [[-1.0, 0.0], [1.0, 0.0]])


def test_running_moments_errors_name_the_problem():
    with pytest.raises(ValueError, match="`state` must be a RunningMoments"):
        running_moments_update((0.0, 0.0, 0.0), jnp.ones(3))
    with pytest.raises(ValueError, match=r"`state.mean` must be a scalar"):
        running_moments_update(RunningMoments(0.0, jnp.zeros(2), 0.0), jnp.ones(3))
    with pytest.raises(ValueError, match="`mask` must have shape"):
        running_moments_update(init_running_moments(), jnp.ones(3), jnp.ones(2))
    with pytest.raises(ValueError, match="`clip` must be > 0"):
        normalize_rewards(jnp.ones(3), init_running_moments(), clip=-1.0)
    with pytest.raises(ValueError, match="`x` must be a floating-point array"):
        normalize_rewards(jnp.ones(3, jnp.int32), init_running_moments())
