"""Advantage transforms (ALGORITHMS.md §5.17, §11) against float64 NumPy references: identity at the
neutral settings, signs that never flip, masks with NaN/inf planted outside, errors, jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.advantage_transforms import (
    anchored_group_advantages,
    planning_token_advantages,
    risk_weights,
    shaped_advantages,
    sign_weighted_advantages,
    token_advantage_reweight,
)
from losses.advantages import group_advantages
from tests.losses.helpers import assert_close, make_mask, plant_nonfinite

N, T = 7, 11
B, G = 6, 5

_sign = jax.jit(sign_weighted_advantages)
_planning = jax.jit(planning_token_advantages)
_thr = jax.jit(token_advantage_reweight)
_shaped = jax.jit(shaped_advantages)
_anchored = jax.jit(anchored_group_advantages, static_argnames=("scale", "singleton", "ddof"))
_risk = jax.jit(risk_weights, static_argnames=("alphas", "weights"))


def _tokens(seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(N, T)).astype(np.float32)
    A[3, :4] = 0.0  # exact zeros
    return rng, A, make_mask(rng, N, T)


def _check_masked(fn, arrays, mask, rng, **kw):
    """NaN/inf planted outside the mask in every input change nothing; output is 0 there."""
    clean = np.asarray(fn(*arrays, mask=mask, **kw))
    dirty = np.asarray(fn(*[plant_nonfinite(a, mask, rng) for a in arrays], mask=mask, **kw))
    assert np.all(np.isfinite(dirty))
    np.testing.assert_array_equal(dirty, clean)
    assert np.all(dirty[mask == 0] == 0)
    return clean


# --------------------------------------------------------------------------------------------------
# sign_weighted_advantages
# --------------------------------------------------------------------------------------------------


def np_sign_weighted(A, pos, neg, select=None):
    A = A.astype(np.float64)
    out = np.where(A > 0, pos * A, neg * A)
    return out if select is None else np.where(select, out, A)


@pytest.mark.parametrize(
    ("pos", "neg"), [(1.0, 1.0), (0.0, 1.0), (0.1, 1.0), (1.0, 0.0), (2.5, 0.3)]
)
def test_sign_weighted_matches_numpy(pos, neg):
    rng, A, m = _tokens(0)
    select = rng.uniform(size=A.shape) < 0.5
    assert_close(_sign(A, pos_weight=pos, neg_weight=neg), np_sign_weighted(A, pos, neg))
    traced = _sign(A, pos_weight=jnp.float32(pos), neg_weight=jnp.float32(neg), select=select)
    assert_close(traced, np_sign_weighted(A, pos, neg, select))
    masked = _check_masked(
        lambda a, mask: _sign(a, pos_weight=pos, neg_weight=neg, mask=mask), (A,), m, rng
    )
    assert_close(masked, np.where(m > 0, np_sign_weighted(A, pos, neg), 0.0))


def test_sign_weighted_identity_and_signs():
    rng, A, _ = _tokens(1)
    np.testing.assert_array_equal(np.asarray(_sign(A)), A)  # weights 1/1
    for _ in range(5):
        pos, neg = rng.uniform(0.0, 3.0, size=2)
        out = np.asarray(_sign(A, pos_weight=pos, neg_weight=neg))
        assert np.all(out * A >= 0)  # never flips a sign
    nsr = np.asarray(_sign(A, pos_weight=0.0))  # negative samples only
    assert np.all(nsr[A > 0] == 0) and np.array_equal(nsr[A < 0], A[A < 0])


def test_sign_weighted_protects_selected_tokens_like_gtpo():
    A = np.array([[1.0, 1.0, -1.0, -1.0]], np.float32)
    conflict = np.array([[True, False, True, False]])
    out = _sign(A, pos_weight=2.0, neg_weight=0.0, select=conflict)
    assert np.asarray(out).tolist() == [[2.0, 1.0, 0.0, -1.0]]


def test_sign_weighted_errors_name_the_problem():
    A = jnp.ones((2, 3))
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"`pos_weight` must be a finite number in \[0, inf\]"):
            sign_weighted_advantages(A, pos_weight=bad)
    with pytest.raises(ValueError, match="`pos_weight` must be a number, got True"):
        sign_weighted_advantages(A, pos_weight=True)
    with pytest.raises(ValueError, match="`neg_weight` must be a scalar"):
        sign_weighted_advantages(A, neg_weight=jnp.ones(2))
    with pytest.raises(ValueError, match="`select` must have the shape of `advantages`"):
        sign_weighted_advantages(A, select=jnp.ones((3, 2), bool))
    with pytest.raises(ValueError, match="`mask` must have shape"):
        sign_weighted_advantages(A, mask=jnp.ones((3,)))
    with pytest.raises(ValueError, match="`advantages` must be a floating-point array"):
        sign_weighted_advantages(jnp.ones((2, 3), jnp.int32))


# --------------------------------------------------------------------------------------------------
# planning_token_advantages (HICRA) and token_advantage_reweight (THR)
# --------------------------------------------------------------------------------------------------


def test_planning_matches_numpy_and_scales_by_one_plus_minus_alpha():
    rng, A, m = _tokens(2)
    plan = rng.uniform(size=A.shape) < 0.4
    for alpha in (0.0, 0.2, 0.5, 1.0):
        out = np.asarray(_planning(A, plan, alpha=alpha))
        assert_close(out, A + alpha * np.abs(A.astype(np.float64)) * plan)
        on = plan & (A != 0)
        ratio = out[on] / A[on]
        assert_close(ratio, np.where(A[on] > 0, 1 + alpha, 1 - alpha))
        np.testing.assert_array_equal(out[~plan], A[~plan])
        assert np.all(out * A >= 0)
    np.testing.assert_array_equal(np.asarray(_planning(A, plan, alpha=0.0)), A)  # identity
    traced = _planning(A, plan.astype(np.float32), alpha=jnp.float32(0.3))
    assert_close(traced, A + 0.3 * np.abs(A.astype(np.float64)) * plan)
    masked = _check_masked(
        lambda a, p, mask: _planning(a, p, alpha=0.3, mask=mask),
        (A, plan.astype(np.float32)),
        m,
        rng,
    )
    assert_close(masked, np.where(m > 0, A + 0.3 * np.abs(A.astype(np.float64)) * plan, 0.0))


def test_thr_reweight_matches_numpy():
    rng, A, m = _tokens(3)
    thr = rng.normal(size=A.shape).astype(np.float32)
    thr[0, :5] = 0.0
    for p in (-1.0, -0.3, 0.0, 0.5, 1.0):
        out = np.asarray(_thr(A, thr, p=p))
        assert_close(out, A.astype(np.float64) * (1 + p * np.sign(thr)))
        assert np.all(out * A >= 0)  # |p| <= 1 never flips a sign
    np.testing.assert_array_equal(np.asarray(_thr(A, thr, p=0.0)), A)  # identity at p = 0
    np.testing.assert_array_equal(np.asarray(_thr(A, np.zeros_like(thr), p=0.7)), A)
    # exploitation with p on THR is exploration with −p on −THR
    assert_close(_thr(A, thr, p=0.4), np.asarray(_thr(A, -thr, p=-0.4)))
    masked = _check_masked(lambda a, h, mask: _thr(a, h, p=0.5, mask=mask), (A, thr), m, rng)
    assert_close(masked, np.where(m > 0, A * (1 + 0.5 * np.sign(thr.astype(np.float64))), 0.0))


def test_planning_and_thr_errors_name_the_problem():
    A = jnp.ones((2, 3))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"`alpha` must be a finite number in \[0, 1\]"):
            planning_token_advantages(A, A, alpha=bad)
    with pytest.raises(ValueError, match="`plan_mask` must have the shape of `advantages`"):
        planning_token_advantages(A, jnp.ones((2, 4)), alpha=0.2)
    for bad in (-1.5, 2.0):
        with pytest.raises(ValueError, match=r"`p` must be a finite number in \[-1, 1\]"):
            token_advantage_reweight(A, A, p=bad)
    with pytest.raises(ValueError, match="`thr` must be a real numeric array"):
        token_advantage_reweight(A, jnp.ones((2, 3), jnp.complex64), p=0.2)


# --------------------------------------------------------------------------------------------------
# shaped_advantages (ASPO)
# --------------------------------------------------------------------------------------------------


def np_shaped(A, bonus, correct, c):
    A = A.astype(np.float64)
    bound = c * np.abs(A)
    return A + np.where(correct > 0, np.clip(bonus, -bound, bound), 0.0)


def test_shaped_matches_numpy_and_is_bounded():
    rng = np.random.default_rng(4)
    A = rng.normal(size=(B, G)).astype(np.float32)
    bonus = rng.normal(scale=2.0, size=(B, G)).astype(np.float32)
    correct = (rng.uniform(size=(B, G)) < 0.5).astype(np.float32)
    for c in (0.0, 0.1, 0.5, 1.0):
        out = np.asarray(_shaped(A, bonus, correct, c=c))
        assert_close(out, np_shaped(A, bonus, correct, c))
        assert np.all(np.abs(out - A) <= c * np.abs(A) + 1e-6)
        assert np.all(out * A >= 0)  # c <= 1: the correctness signal never flips
        np.testing.assert_array_equal(out[correct == 0], A[correct == 0])
    np.testing.assert_array_equal(np.asarray(_shaped(A, bonus, correct, c=0.0)), A)
    np.testing.assert_array_equal(np.asarray(_shaped(A, 0 * bonus, correct, c=0.7)), A)
    traced = _shaped(A, bonus, correct > 0, c=jnp.float32(0.5))  # bool labels, traced c
    assert_close(traced, np_shaped(A, bonus, correct, 0.5))
    m = make_mask(rng, B, G)
    masked = _check_masked(
        lambda a, b_, k, mask: _shaped(a, b_, k, c=0.5, mask=mask), (A, bonus, correct), m, rng
    )
    assert_close(masked, np.where(m > 0, np_shaped(A, bonus, correct, 0.5), 0.0))


def test_shaped_errors_name_the_problem():
    A = jnp.ones((2, 3))
    for bad in (-0.1, 1.01, float("nan")):
        with pytest.raises(ValueError, match=r"`c` must be a finite number in \[0, 1\]"):
            shaped_advantages(A, A, A, c=bad)
    with pytest.raises(ValueError, match="`bonus` must have the shape of `advantages`"):
        shaped_advantages(A, jnp.ones(3), A, c=0.5)
    with pytest.raises(ValueError, match="`correct` must have the shape of `advantages`"):
        shaped_advantages(A, A, jnp.ones((2, 1)), c=0.5)


# --------------------------------------------------------------------------------------------------
# anchored_group_advantages (VGPO / COPO)
# --------------------------------------------------------------------------------------------------


def _group_batch(seed):
    rng = np.random.default_rng(seed)
    r = rng.integers(0, 2, size=(B, G)).astype(np.float32)
    r[0] = 1.0  # all correct
    r[1] = 0.0  # all wrong
    valid = rng.uniform(size=(B, G)) > 0.2
    valid[0] = True
    valid[1] = True
    valid[2] = [True, False, False, False, False]  # a singleton group
    return rng, r, valid


def np_group_std(r, valid, eps):
    out = np.zeros(r.shape)
    for b in range(r.shape[0]):
        s = r[b][valid[b]].astype(np.float64)
        if s.size < 2 or s.max() == s.min():
            continue
        out[b][valid[b]] = (s - s.mean()) / (s.std(ddof=1) + eps)
    return out


def test_anchored_matches_numpy():
    rng, r, valid = _group_batch(5)
    dirty = np.where(valid, r, np.nan).astype(np.float32)
    for anchor, coef in ((0.5, 0.2), (0.3, 1.0)):
        got = np.asarray(_anchored(dirty, anchor=anchor, coef=coef, valid=valid))
        expected = np_group_std(r, valid, 1e-6) + coef * np.where(valid, r - anchor, 0.0)
        assert_close(got, expected)
        # degenerate groups keep a signal of the right sign
        assert np.all(got[0] > 0) and np.all(got[1] < 0)
        assert_close(got[2, 0], coef * (r[2, 0] - anchor))
        assert np.all(got[~valid] == 0)
    # a per-prompt anchor [B,1] (e.g. a value estimate), traced
    anchor = rng.uniform(size=(B, 1)).astype(np.float32)
    got = _anchored(dirty, anchor=anchor, coef=jnp.float32(0.4), valid=valid)
    expected = np_group_std(r, valid, 1e-6) + 0.4 * np.where(valid, r - anchor, 0.0)
    assert_close(got, expected)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_anchored_with_zero_coef_is_group_advantages(scale):
    _, r, valid = _group_batch(6)
    got = _anchored(r, anchor=0.5, coef=0.0, valid=valid, scale=scale, singleton="raw")
    expected = group_advantages(r, valid=valid, scale=scale, singleton="raw")
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_anchored_errors_name_the_problem():
    r = jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"`coef` must be a finite number in \[0, inf\]"):
        anchored_group_advantages(r, anchor=0.5, coef=-1.0)
    with pytest.raises(ValueError, match="`anchor` must be a scalar or broadcast to `rewards`"):
        anchored_group_advantages(r, anchor=jnp.ones(2), coef=0.1)
    with pytest.raises(ValueError, match="need G >= 2"):
        anchored_group_advantages(jnp.ones((2, 1)), anchor=0.5, coef=0.1)
    with pytest.raises(ValueError, match="`scale` must be one of"):
        anchored_group_advantages(r, anchor=0.5, coef=0.1, scale="prompt")


# --------------------------------------------------------------------------------------------------
# risk_weights (RiskPO)
# --------------------------------------------------------------------------------------------------


def np_risk_weights(r, valid, alphas, weights):
    out = np.zeros(r.shape)
    for b in range(r.shape[0]):
        s = r[b][valid[b]].astype(np.float64)
        if s.size == 0:
            continue
        w = np.zeros(s.shape)
        for alpha, c in zip(alphas, weights, strict=True):
            w += c * (s <= np.quantile(s, alpha)) / alpha  # linear interpolation
        out[b][valid[b]] = w
    return out


@pytest.mark.parametrize(
    ("alphas", "weights"),
    [
        ((0.2,), (1.0,)),
        ((0.2, 1.0), (0.5, 0.5)),
        ((0.25, 0.8), (1.25, -0.25)),
        ((0.5, 0.7, 1.0), (0.2, 0.3, 0.5)),
    ],
)
def test_risk_weights_match_numpy(alphas, weights):
    rng = np.random.default_rng(7)
    r = rng.normal(size=(B, 8)).astype(np.float32)
    r[1] = rng.integers(0, 2, size=8)  # binary rewards: ties at the quantile
    valid = rng.uniform(size=r.shape) > 0.2
    valid[0] = False  # no valid sample
    dirty = np.where(valid, r, np.inf).astype(np.float32)
    got = np.asarray(_risk(dirty, alphas=alphas, weights=weights, valid=valid))
    assert_close(got, np_risk_weights(r, valid, alphas, weights))
    assert np.all(got[~valid] == 0)


def test_risk_weights_neutral_setting_and_tail_emphasis():
    rng = np.random.default_rng(8)
    r = rng.normal(size=(B, 10)).astype(np.float32)
    np.testing.assert_array_equal(
        np.asarray(_risk(r, alphas=(1.0,), weights=(1.0,))), np.ones(r.shape)
    )
    w = np.asarray(_risk(r, alphas=(0.3, 1.0), weights=(0.5, 0.5)))
    for b in range(B):  # positive mixture weights: the weight never increases with the reward
        order = np.argsort(r[b])
        assert np.all(np.diff(w[b][order]) <= 0)
    # multiplying advantages by the CVaR weight leaves only the lower tail, scaled by 1/α
    tail = np.asarray(_risk(r, alphas=(0.3,), weights=(1.0,)))
    assert_close(tail, np.where(r <= np.quantile(r, 0.3, axis=1, keepdims=True), 1 / 0.3, 0.0))
    assert np.all((tail == 0) | np.isclose(tail, 1 / 0.3))


def test_risk_weights_errors_name_the_problem():
    r = jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"every entry of `alphas` must be in \(0, 1\]"):
        risk_weights(r, alphas=(0.0,), weights=(1.0,))
    with pytest.raises(ValueError, match="same length"):
        risk_weights(r, alphas=(0.2, 0.5), weights=(1.0,))
    with pytest.raises(ValueError, match="`alphas` must be a non-empty sequence"):
        risk_weights(r, alphas=(), weights=())
    with pytest.raises(ValueError, match="`weights` must hold Python numbers"):
        risk_weights(r, alphas=(0.5,), weights=(jnp.float32(1.0),))
    with pytest.raises(ValueError, match="every entry of `weights` must be finite"):
        risk_weights(r, alphas=(0.5,), weights=(float("inf"),))
    with pytest.raises(ValueError, match="`rewards` must have rank 2"):
        risk_weights(jnp.ones(3), alphas=(0.5,), weights=(1.0,))


def test_bfloat16_inputs_and_traced_coefficients_give_float32():
    rng, A, m = _tokens(9)
    thr = rng.normal(size=A.shape).astype(np.float32)
    Ab = jnp.asarray(A, jnp.bfloat16)
    A32 = np.asarray(Ab.astype(jnp.float32), np.float64)
    out = _thr(Ab, thr, p=jnp.float32(0.5), mask=m)
    assert out.dtype == jnp.float32
    assert_close(out, np.where(m > 0, A32 * (1 + 0.5 * np.sign(thr)), 0.0))
    out = _sign(Ab, pos_weight=jnp.float32(0.3), neg_weight=jnp.float32(2.0))
    assert out.dtype == jnp.float32
    assert_close(out, np.where(A32 > 0, 0.3 * A32, 2.0 * A32))


def test_risk_weights_compare_with_the_quantile_not_its_float32_rounding():
    """VaR_α between two neighbouring float32 rewards, 0.89 of the way up: in float32 the
    interpolated quantile rounds to the upper one, but only the rewards up to the lower one are
    ≤ VaR_α (NumPy's float64 quantile)."""
    x = np.float32(0.3)
    r = np.array([[0.0, x, np.nextafter(x, np.float32(1)), 1.0]], np.float32)
    alphas, weights = (0.63,), (1.0,)  # position 3 · 0.63 = 1.89
    got = np.asarray(_risk(r, alphas=alphas, weights=weights))
    want = np_risk_weights(r, np.ones(r.shape, bool), alphas, weights)
    assert_close(got, want)
    assert (got[0] > 0).tolist() == [True, True, False, False]
