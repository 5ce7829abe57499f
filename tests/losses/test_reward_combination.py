"""Reward combination and gating (ALGORITHMS.md §10.4, §11) against float64 NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.advantages import group_advantages
from losses.reward_combination import (
    WeightedRewards,
    constraint_gated_rewards,
    format_gated_rewards,
    gap_rewards,
    gated_accumulated_rewards,
    rubric_rewards,
    self_correction_bonus,
    weighted_rewards,
)
from tests.losses.helpers import assert_close, make_mask, plant_nonfinite

N, K, C, M = 11, 3, 5, 6

_weighted = jax.jit(weighted_rewards)
_rubric = jax.jit(rubric_rewards)
_format = jax.jit(format_gated_rewards, static_argnames=("fail_value",))
_constraint = jax.jit(constraint_gated_rewards, static_argnames=("floor",))
_gated = jax.jit(gated_accumulated_rewards)
_gap = jax.jit(gap_rewards)
_bonus = jax.jit(self_correction_bonus, static_argnames=("alpha",))


def assert_no_gradient(fn, *args):
    """Reward functions run under stop-gradient: d(sum out)/d(float args) is exactly 0."""
    floats = tuple(i for i, a in enumerate(args) if np.issubdtype(np.asarray(a).dtype, np.floating))
    grads = jax.grad(lambda *a: jnp.sum(fn(*a)), argnums=floats)(*[jnp.asarray(a) for a in args])
    for g in grads:
        assert np.all(np.asarray(g) == 0.0)


# --------------------------------------------------------------------------------------------------
# weighted_rewards
# --------------------------------------------------------------------------------------------------


def test_weighted_rewards_match_reference_with_missing_components():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(4, 3, K)).astype(np.float32)  # [B,G,K]
    valid = rng.uniform(size=r.shape) > 0.3
    valid[0, 0] = False  # no valid component
    w = np.array([0.5, -1.0, 2.0], np.float32)
    dirty = plant_nonfinite(r, valid, rng)  # TRL marks missing components with NaN
    out = _weighted(dirty, w, valid=valid)
    assert isinstance(out, WeightedRewards)
    expected = np.where(valid, r.astype(np.float64), 0.0) @ w.astype(np.float64)
    assert_close(out.rewards, expected)
    np.testing.assert_array_equal(np.asarray(out.valid), valid.any(-1))
    assert out.rewards[0, 0] == 0.0 and not bool(out.valid[0, 0])


def test_weighted_rewards_one_hot_weights_select_a_component():
    rng = np.random.default_rng(1)
    r = rng.normal(size=(N, K)).astype(np.float32)
    for k in range(K):
        out = _weighted(r, np.eye(K, dtype=np.float32)[k])
        np.testing.assert_array_equal(np.asarray(out.rewards), r[:, k])
        assert bool(jnp.all(out.valid))


def test_weighted_rewards_invalid_samples_get_zero_group_advantage():
    r = np.array([[[1.0, 0.0], [np.nan, np.nan], [0.0, 1.0], [1.0, 1.0]]], np.float32)
    out = _weighted(r, np.array([1.0, 1.0], np.float32), valid=np.isfinite(r))
    adv = group_advantages(out.rewards, valid=out.valid)
    assert np.asarray(adv)[0, 1] == 0.0
    assert np.all(np.isfinite(np.asarray(adv)))


def test_weighted_rewards_traced_weights_and_no_gradient():
    rng = np.random.default_rng(2)
    r = rng.normal(size=(N, K)).astype(np.float32)
    w = rng.normal(size=K).astype(np.float32)
    assert_close(jax.jit(lambda w: weighted_rewards(r, w).rewards)(w), r @ w)
    assert_no_gradient(lambda x, w: weighted_rewards(x, w).rewards, r, w)


def test_weighted_rewards_rejects_bad_shapes():
    with pytest.raises(ValueError, match="weights"):
        weighted_rewards(jnp.ones((3, K)), jnp.ones(K + 1))
    with pytest.raises(ValueError, match="valid"):
        weighted_rewards(jnp.ones((3, K)), jnp.ones(K), valid=jnp.ones((3,)))
    with pytest.raises(ValueError, match="rewards"):
        weighted_rewards(jnp.ones((3, K), jnp.complex64), jnp.ones(K))


# --------------------------------------------------------------------------------------------------
# rubric_rewards
# --------------------------------------------------------------------------------------------------


def np_rubric(met, w, valid):
    w = np.broadcast_to(w, met.shape)
    out = np.zeros(met.shape[0])
    for n in range(met.shape[0]):
        v = valid[n]
        score = float(np.sum(met[n][v].astype(np.float64) * w[n][v]))
        attainable = float(np.sum(np.maximum(w[n][v], 0.0)))
        out[n] = score / attainable if attainable > 0 else score
    return out


@pytest.mark.parametrize("per_sample", [False, True])
def test_rubric_rewards_match_reference(per_sample):
    rng = np.random.default_rng(3)
    met = (rng.uniform(size=(N, C)) > 0.5).astype(np.float32)
    w = rng.normal(size=(N, C) if per_sample else (C,)).astype(np.float32)
    valid = rng.uniform(size=(N, C)) > 0.2
    dirty = plant_nonfinite(met, valid, rng)
    out = _rubric(dirty, w, valid=valid)
    assert out.shape == (N,)
    assert_close(out, np_rubric(met, w, valid))


def test_rubric_rewards_perfect_response_scores_one():
    w = np.array([2.0, 1.0, -3.0, 0.5], np.float32)  # one pitfall criterion
    met = np.array([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    assert_close(_rubric(met, w), [1.0, (3.5 - 3.0) / 3.5, 0.0])
    assert_close(_rubric(met, -np.abs(w)), [-3.5, -6.5, 0.0])  # no positive weight: raw sum
    with pytest.raises(ValueError, match="`w`"):
        rubric_rewards(met, w[:3])


# --------------------------------------------------------------------------------------------------
# format / constraint / G-RA gates
# --------------------------------------------------------------------------------------------------


def test_format_gated_rewards():
    rng = np.random.default_rng(4)
    s = rng.normal(size=N).astype(np.float32)
    ok = rng.uniform(size=N) > 0.5
    dirty = np.where(ok, s, np.nan).astype(np.float32)
    out = _format(dirty, ok, fail_value=-2.0)
    np.testing.assert_array_equal(np.asarray(out), np.where(ok, s, -2.0).astype(np.float32))
    assert_no_gradient(lambda x: format_gated_rewards(x, ok), s)
    with pytest.raises(ValueError, match="format_ok"):
        format_gated_rewards(s, ok[:4])


def test_constraint_gated_rewards():
    rng = np.random.default_rng(5)
    r = rng.normal(size=N).astype(np.float32)
    violated = rng.uniform(size=(N, 4)) > 0.8
    out = _constraint(r, violated, floor=-1.0)
    np.testing.assert_array_equal(
        np.asarray(out), np.where(violated.any(1), -1.0, r).astype(np.float32)
    )
    # no judge flags anything → identity; zero judges → identity
    assert_close(_constraint(r, np.zeros((N, 4), bool), floor=-1.0), r)
    assert_close(_constraint(r, np.zeros((N, 0), bool), floor=-1.0), r)
    with pytest.raises(ValueError, match="violated"):
        constraint_gated_rewards(r, violated[:3], floor=0.0)


def test_gated_accumulated_rewards_match_reference_and_extreme_thresholds():
    rng = np.random.default_rng(6)
    outcome = rng.normal(size=N).astype(np.float32)
    steps = rng.normal(size=(N, M)).astype(np.float32)
    step_mask = make_mask(rng, N, M)
    dirty = plant_nonfinite(steps, step_mask, rng)
    dense = np.where(step_mask > 0, steps.astype(np.float64), 0.0).sum(1)
    out = _gated(outcome, dirty, step_mask, threshold=0.1)
    assert_close(out, outcome + np.where(outcome >= 0.1, dense, 0.0))
    assert_close(_gated(outcome, dirty, step_mask, threshold=-np.inf), outcome + dense)
    assert_close(_gated(outcome, dirty, step_mask, threshold=np.inf), outcome)
    assert_no_gradient(
        lambda o, s: gated_accumulated_rewards(o, s, step_mask, threshold=0.0), outcome, steps
    )
    with pytest.raises(ValueError, match="step_rewards"):
        gated_accumulated_rewards(outcome, steps[:3], step_mask[:3], threshold=0.0)
    with pytest.raises(ValueError, match="step_mask"):
        gated_accumulated_rewards(outcome, steps, step_mask[:, :2], threshold=0.0)


# --------------------------------------------------------------------------------------------------
# gap_rewards (PIT) / self_correction_bonus (SCoRe)
# --------------------------------------------------------------------------------------------------


def test_gap_rewards_and_self_correction_bonus():
    rng = np.random.default_rng(7)
    r1 = rng.normal(size=N).astype(np.float32)
    r2 = rng.normal(size=N).astype(np.float32)
    assert_close(_gap(r2, r1), r2.astype(np.float64) - r1)
    assert_close(_gap(r2, np.float32(0.5)), r2 - 0.5)  # a shared reference broadcasts
    assert_close(_bonus(r1, r2, alpha=2.5), r2 + 2.5 * (r2.astype(np.float64) - r1))
    assert_close(_bonus(r1, r2, alpha=0.0), r2)
    # binary rewards: wrong→right earns the most, right→wrong the least
    out = np.asarray(
        _bonus(jnp.array([0.0, 1.0, 1.0, 0.0]), jnp.array([1.0, 1.0, 0.0, 0.0]), alpha=1.0)
    )
    assert out.argmax() == 0 and out.argmin() == 2
    assert_no_gradient(lambda a, b: self_correction_bonus(a, b, alpha=1.0), r1, r2)
    with pytest.raises(ValueError, match="r_ref"):
        gap_rewards(r1, np.ones((2, N), np.float32))
    with pytest.raises(ValueError, match="r_ref"):
        gap_rewards(r1, np.ones(N + 1, np.float32))
    with pytest.raises(ValueError, match="r2"):
        self_correction_bonus(r1, r2[:3], alpha=1.0)
