"""`simpo_loss`, `cpo_loss`, `orpo_loss` (ALGORITHMS.md §8.2–§8.4) against float64 NumPy."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from losses.dpo import dpo_loss
from losses.logprobs import sequence_logprob
from losses.ref_free_preference import cpo_loss, orpo_loss, simpo_loss
from tests.losses.helpers import assert_close, assert_nan_safe, plant_nonfinite

N = 13


def nls(x):
    return np.logaddexp(0.0, -np.asarray(x, np.float64))


def fd_grad(f, x, h=1e-6):
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for i in range(x.size):
        up, dn = x.copy(), x.copy()
        up[i] += h
        dn[i] -= h
        g[i] = (f(up) - f(dn)) / (2 * h)
    return g


def avg_batch(seed, n=N):
    rng = np.random.default_rng(seed)
    c = -rng.uniform(0.2, 3.0, n).astype(np.float32)
    r = -rng.uniform(0.2, 3.0, n).astype(np.float32)
    valid = rng.uniform(size=n) > 0.25
    valid[:2] = [True, False]
    return rng, c, r, valid


def vmean(x, v, w=None, den=None):
    v = np.asarray(v, bool)
    w = np.ones(v.shape) if w is None else np.asarray(w, np.float64)
    return np.sum(np.where(v, x * w, 0.0)) / (den if den is not None else max(v.sum(), 1))


# --------------------------------------------------------------------------------------------------
# SimPO / AlphaPO
# --------------------------------------------------------------------------------------------------


def np_simpo(c, r, v, beta=2.0, gamma=0.5, eps=0.0, alpha=0.0, w=None, den=None):
    c, r = np.asarray(c, np.float64), np.asarray(r, np.float64)
    if alpha == 0:
        uc, ur = c, r
    else:
        uc, ur = (1 - np.exp(-alpha * c)) / alpha, (1 - np.exp(-alpha * r)) / alpha
    x = beta * (uc - ur) - gamma
    return vmean((1 - eps) * nls(x) + eps * nls(-x), v, w, den)


def test_simpo_anchor():
    loss, _ = simpo_loss(np.array([-2.0], np.float32), np.array([-2.0], np.float32))
    assert_close(loss, 0.974077)
    loss, _ = simpo_loss(np.array([-3.0], np.float32), np.array([-2.75], np.float32))
    assert_close(loss, 1.313262)


def test_alphapo_stays_finite_for_very_unlikely_responses():
    """α = 1 and π̄_c = −100: e^{−α·π̄} overflowed float32 (loss inf); its exponent is capped
    at 80, where the loss is already saturated."""
    far, near = np.array([-100.0], np.float32), np.array([-1.0], np.float32)
    (loss, metrics), grads = jax.value_and_grad(
        lambda c, r: simpo_loss(c, r, alpha=1.0), argnums=(0, 1), has_aux=True
    )(far, near)
    assert np.isfinite(float(loss)) and float(loss) > 1e30
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)
    assert all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(metrics))


@pytest.mark.parametrize("alpha", [0.0, 0.7, -0.4])
def test_simpo_matches_reference_and_gradient(alpha):
    rng, c, r, valid = avg_batch(1)
    beta = rng.uniform(1.0, 3.0, N).astype(np.float32)
    eps = rng.uniform(0.0, 0.3, N).astype(np.float32)
    w = rng.uniform(0.5, 2.0, N).astype(np.float32)
    dirty_c, dirty_r = plant_nonfinite(c, valid, rng), plant_nonfinite(r, valid, rng)

    def fn(c, r):
        return simpo_loss(
            c,
            r,
            beta=beta,
            gamma=0.7,
            label_smoothing=eps,
            alpha=alpha,
            valid=valid,
            pair_weights=w,
        )

    (loss, metrics), (g_c, g_r) = jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(
        dirty_c, dirty_r
    )

    def ref(c_, r_):
        return np_simpo(c_, r_, valid, beta, 0.7, eps, alpha, w)

    assert_close(loss, ref(c, r))
    assert_close(g_c, fd_grad(lambda x: ref(x, r), c), rtol=1e-4, atol=1e-6)
    assert_close(g_r, fd_grad(lambda x: ref(c, x), r), rtol=1e-4, atol=1e-6)
    u = (
        (lambda x: x)
        if alpha == 0
        else (lambda x: (1 - np.exp(-alpha * x.astype(np.float64))) / alpha)
    )
    assert_close(metrics["pref/reward_chosen"], vmean(beta * u(c), valid), atol=1e-5)
    assert_close(metrics["pref/accuracy"], vmean((u(c) > u(r)).astype(float), valid))


def test_simpo_without_margin_is_reference_free_dpo_on_averages():
    rng = np.random.default_rng(2)
    lp_c = -rng.uniform(0.1, 3.0, (N, 7)).astype(np.float32)
    lp_r = -rng.uniform(0.1, 3.0, (N, 5)).astype(np.float32)
    m_c = (rng.uniform(size=(N, 7)) > 0.3).astype(np.float32)
    m_r = (rng.uniform(size=(N, 5)) > 0.3).astype(np.float32)
    m_c[:, 0] = m_r[:, 0] = 1.0
    avg_c = sequence_logprob(lp_c, m_c, reduce="mean")
    avg_r = sequence_logprob(lp_r, m_r, reduce="mean")
    a, _ = simpo_loss(avg_c, avg_r, beta=2.5, gamma=0.0)
    b, _ = dpo_loss(avg_c, avg_r, None, None, beta=2.5, reference_free=True)
    assert_close(a, float(b))


def test_alphapo_is_continuous_at_zero():
    _, c, r, _ = avg_batch(3)
    at_zero = float(simpo_loss(c, r)[0])
    for alpha in (1e-4, -1e-4):
        assert_close(simpo_loss(c, r, alpha=alpha)[0], at_zero, rtol=1e-3)


# --------------------------------------------------------------------------------------------------
# CPO
# --------------------------------------------------------------------------------------------------


def np_cpo(c, r, v, kind, beta=0.1, eps=0.0, w=None):
    x = np.asarray(c, np.float64) - r
    if kind == "sigmoid":
        items = (1 - eps) * nls(beta * x) + eps * nls(-beta * x)
    elif kind == "hinge":
        items = np.maximum(1 - beta * x, 0.0)
    else:
        items = (x - 1 / (2 * beta)) ** 2
    return vmean(items, v, w)


@pytest.mark.parametrize("kind", ["sigmoid", "hinge", "ipo"])
def test_cpo_matches_reference_and_gradient(kind):
    rng, c, r, valid = avg_batch(4)
    c, r = c * 4, r * 4  # sums
    beta = rng.uniform(0.05, 0.4, N).astype(np.float32)
    eps = 0.15 if kind == "sigmoid" else 0.0
    w = rng.uniform(0.5, 2.0, N).astype(np.float32)

    def fn(c, r):
        return cpo_loss(
            c, r, beta=beta, loss_type=kind, label_smoothing=eps, valid=valid, pair_weights=w
        )

    (loss, metrics), (g_c, g_r) = jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(
        plant_nonfinite(c, valid, rng), plant_nonfinite(r, valid, rng)
    )

    def ref(c_, r_):
        return np_cpo(c_, r_, valid, kind, beta, eps, w)

    assert_close(loss, ref(c, r))
    assert_close(g_c, fd_grad(lambda x: ref(x, r), c), rtol=1e-4, atol=1e-6)
    assert_close(g_r, fd_grad(lambda x: ref(c, x), r), rtol=1e-4, atol=1e-6)
    assert_close(metrics["pref/margin"], vmean(beta * (c.astype(np.float64) - r), valid), atol=1e-5)


def test_cpo_sigmoid_is_reference_free_dpo():
    _, c, r, valid = avg_batch(5)
    for eps in (0.0, 0.2):
        a, _ = cpo_loss(c, r, beta=0.3, label_smoothing=eps, valid=valid)
        b, _ = dpo_loss(
            c, r, None, None, beta=0.3, label_smoothing=eps, reference_free=True, valid=valid
        )
        assert_close(a, float(b))


# --------------------------------------------------------------------------------------------------
# ORPO
# --------------------------------------------------------------------------------------------------


def np_log_odds(c, r):
    c = np.minimum(np.asarray(c, np.float64), -1e-6)
    r = np.minimum(np.asarray(r, np.float64), -1e-6)
    return (c - r) - (np.log1p(-np.exp(c)) - np.log1p(-np.exp(r)))


def test_orpo_anchor():
    c, r = np.array([-2.0, -3.0], np.float32), np.array([-2.0, -2.75], np.float32)
    _, m = orpo_loss(c, r)
    for i, (lo, term) in enumerate(zip([0.0, -0.264994], [0.069315, 0.083440], strict=True)):
        valid = np.arange(2) == i
        loss, m = orpo_loss(c, r, valid=valid)
        assert_close(loss, term)
        assert_close(m["pref/log_odds"], lo)


def test_orpo_matches_reference_and_gradient_including_near_zero_averages():
    rng, c, r, valid = avg_batch(6)
    c[2], r[3] = -1e-3, -0.5  # both sides of −ln 2 and the clamp region
    c[4] = -1e-8  # clamped at −1e-6: zero gradient
    beta = 0.3
    w = rng.uniform(0.5, 2.0, N).astype(np.float32)

    def fn(c, r):
        return orpo_loss(c, r, beta=beta, valid=valid, pair_weights=w)

    (loss, m), (g_c, g_r) = jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(c, r)

    def ref(c_, r_):
        return vmean(beta * nls(np_log_odds(c_, r_)), valid, w)

    assert_close(loss, ref(c, r))
    ref_gc = fd_grad(lambda x: ref(x, r), c, h=1e-9)
    keep = np.arange(N) != 4
    assert_close(np.asarray(g_c)[keep], ref_gc[keep], rtol=1e-4, atol=1e-5)
    assert float(g_c[4]) == 0.0
    assert_close(g_r, fd_grad(lambda x: ref(c, x), r, h=1e-9), rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(g_c)[valid & keep] < 0) and np.all(np.asarray(g_r)[valid] > 0)
    assert_close(m["pref/log_odds"], vmean(np_log_odds(c, r), valid), atol=1e-5)


def test_orpo_equal_averages_give_beta_log_two():
    _, c, _, _ = avg_batch(7)
    loss, _ = orpo_loss(c, c, beta=0.25)
    assert_close(loss, 0.25 * np.log(2.0))


def test_nan_outside_valid_never_leaks():
    rng, c, r, valid = avg_batch(8)
    m = valid.astype(np.float32)
    assert_nan_safe(lambda a, b: simpo_loss(a, b, valid=valid), (c, r), m, rng, argnums=(0, 1))
    assert_nan_safe(
        lambda a, b: cpo_loss(a, b, loss_type="ipo", valid=valid), (c, r), m, rng, argnums=(0, 1)
    )
    assert_nan_safe(lambda a, b: orpo_loss(a, b, valid=valid), (c, r), m, rng, argnums=(0, 1))


def test_num_pairs_is_the_global_denominator():
    _, c, r, valid = avg_batch(9)
    for fn in (simpo_loss, cpo_loss, orpo_loss):
        a = float(fn(c, r, valid=valid)[0])
        assert_close(fn(c, r, valid=valid, num_pairs=50.0)[0], a * valid.sum() / 50.0)


x3 = np.zeros(3, np.float32) - 1.0


def test_bad_input_raises():
    with pytest.raises(ValueError, match="`beta` must be > 0"):
        simpo_loss(x3, x3, beta=0.0)
    with pytest.raises(ValueError, match="`alpha` must be a Python number"):
        simpo_loss(x3, x3, alpha=np.float32(0.1))
    with pytest.raises(ValueError, match="`label_smoothing` must lie in"):
        simpo_loss(x3, x3, label_smoothing=-0.1)
    with pytest.raises(ValueError, match="`label_smoothing` must lie in"):
        cpo_loss(x3, x3, label_smoothing=np.array([0.1, 0.2, 1.2]))
    with pytest.raises(ValueError, match="`pair_weights` must be >= 0"):
        simpo_loss(x3, x3, pair_weights=np.array([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="`rejected_avg_logp` must have shape"):
        simpo_loss(x3, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="`loss_type` must be one of"):
        cpo_loss(x3, x3, loss_type="simpo")
    with pytest.raises(ValueError, match="read only by loss_type='sigmoid'"):
        cpo_loss(x3, x3, loss_type="hinge", label_smoothing=0.1)
    with pytest.raises(ValueError, match="`chosen_avg_logp` must have rank 1"):
        orpo_loss(np.zeros((3, 2)), x3)
    with pytest.raises(ValueError, match="`chosen_avg_logp` must be a floating-point"):
        orpo_loss(np.zeros(3, np.int32), x3)
    with pytest.raises(ValueError, match="`beta` must be a scalar or have shape"):
        orpo_loss(x3, x3, beta=np.ones(2))
