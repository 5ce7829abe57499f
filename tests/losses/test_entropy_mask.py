"""High-entropy token selection (ALGORITHMS.md §5.15) against `np.quantile` (method "linear")."""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses._position import scaled_position, snapped_position
from losses.entropy_mask import high_entropy_mask, masked_quantile
from tests.losses.helpers import make_mask, plant_nonfinite

N, T = 7, 11

_mask_fn = jax.jit(high_entropy_mask)  # top_quantile and threshold traced
_mask_static = jax.jit(high_entropy_mask, static_argnames="top_quantile")
_quantile = jax.jit(masked_quantile)


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    H = rng.gamma(2.0, 0.5, size=(N, T)).astype(np.float32)
    return rng, H, make_mask(rng, N, T)


def np_high_entropy(H, m, rho):
    valid = m > 0
    q = np.quantile(H[valid].astype(np.float64), 1.0 - rho)  # linear interpolation
    return valid & (q <= H)


def test_anchor():
    H = np.array([[0.1, 2.0, 0.5, np.nan], [1.0, 3.0, 0.2, np.inf]], np.float32)
    m = np.array([[1, 1, 1, 0], [1, 1, 1, 0]], np.float32)
    assert float(_quantile(jnp.asarray(H), jnp.asarray(m > 0), 0.8)) == pytest.approx(2.0)
    keep = np.asarray(_mask_static(H, m, top_quantile=0.2))
    assert keep.tolist() == [[False, True, False, False], [False, True, False, False]]
    assert keep.sum() == 2


@pytest.mark.parametrize("rho", [0.05, 0.2, 0.37, 0.5, 0.9, 1.0])
def test_matches_numpy_quantile(rho):
    _, H, m = _inputs(0)
    expected = np_high_entropy(H, m, rho)
    np.testing.assert_array_equal(np.asarray(_mask_static(H, m, top_quantile=rho)), expected)
    traced = _mask_fn(H, m, top_quantile=jnp.float32(rho))
    np.testing.assert_array_equal(np.asarray(traced), expected)


def test_masked_quantile_matches_numpy_for_every_count():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(41,)).astype(np.float32)
    levels = [0.0, 0.1, 0.2, 0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 1.0]
    for n in range(1, 42):
        valid = np.arange(41) < n
        for level in levels:
            got = float(_quantile(x, valid, np.float32(level)))
            want = np.quantile(x[:n].astype(np.float64), level)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert float(_quantile(x, np.zeros(41, bool), np.float32(0.5))) == np.inf


def test_kept_count_and_fraction():
    """Distinct values: exactly floor(1 + ρ(n − 1)) kept, hence at least ρ·n for ρ = 0.2."""
    rng = np.random.default_rng(2)
    H = rng.permutation(N * T).reshape(N, T).astype(np.float32) / 7.0
    for n in range(1, N * T + 1):
        m = (np.arange(N * T) < n).reshape(N, T).astype(np.float32)
        kept = int(np.asarray(_mask_static(H, m, top_quantile=0.2)).sum())
        assert kept == int(np.floor(1 + 0.2 * (n - 1) + 1e-9)), n
        assert kept >= 0.2 * n, n


def test_invariant_to_monotone_transforms():
    _, H, m = _inputs(3)
    base = np.asarray(_mask_fn(H, m, top_quantile=0.3))
    for transformed in (np.exp(1.5 * H), 2.0 * H - 5.0, H**3 + H, np.log(H)):
        out = np.asarray(_mask_fn(transformed.astype(np.float32), m, top_quantile=0.3))
        np.testing.assert_array_equal(out, base)


def test_rho_one_keeps_every_valid_token():
    _, H, m = _inputs(4)
    np.testing.assert_array_equal(np.asarray(_mask_static(H, m, top_quantile=1.0)), m > 0)


def test_threshold_overrides_the_quantile():
    _, H, m = _inputs(5)
    out = _mask_fn(H, m, top_quantile=0.2, threshold=jnp.float32(1.0))
    np.testing.assert_array_equal(np.asarray(out), (m > 0) & (H >= 1.0))
    assert np.asarray(out).sum() > np_high_entropy(H, m, 0.2).sum()  # the override mattered


def test_empty_mask_keeps_nothing():
    _, H, _ = _inputs(6)
    out = _mask_fn(H, np.zeros((N, T), np.float32), top_quantile=0.2)
    assert out.dtype == jnp.bool_ and not np.asarray(out).any()


def test_nan_outside_mask_does_not_change_the_selection():
    rng, H, m = _inputs(7)
    clean = np.asarray(_mask_fn(H, m, top_quantile=0.2))
    dirty = np.asarray(_mask_fn(plant_nonfinite(H, m, rng), m, top_quantile=0.2))
    np.testing.assert_array_equal(dirty, clean)
    assert not dirty[m == 0].any()
    # the selection carries no gradient, so a loss weighted by it differentiates cleanly
    grad = jax.grad(lambda h: jnp.sum(h * high_entropy_mask(h, m).astype(jnp.float32)))(H)
    np.testing.assert_array_equal(np.asarray(grad), clean.astype(np.float32))


def test_bfloat16_entropy():
    _, H, m = _inputs(8)
    Hb = jnp.asarray(H, jnp.bfloat16)
    expected = np_high_entropy(np.asarray(Hb.astype(jnp.float32)), m, 0.2)
    np.testing.assert_array_equal(np.asarray(_mask_fn(Hb, m, top_quantile=0.2)), expected)


def test_errors_name_the_problem():
    H = jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"`top_quantile` must be in \(0, 1\]"):
        high_entropy_mask(H, H, top_quantile=0.0)
    with pytest.raises(ValueError, match=r"`top_quantile` must be in \(0, 1\]"):
        high_entropy_mask(H, H, top_quantile=1.5)
    with pytest.raises(ValueError, match="`top_quantile` must be a scalar"):
        high_entropy_mask(H, H, top_quantile=jnp.ones(2))
    with pytest.raises(ValueError, match="`threshold` must be a scalar"):
        high_entropy_mask(H, H, threshold=jnp.ones(2))
    with pytest.raises(ValueError, match="`entropy` must have rank 2"):
        high_entropy_mask(jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match="`mask` must have shape"):
        high_entropy_mask(H, jnp.ones((3, 2)))


def test_boolean_mask_is_accepted_as_token_weights():
    from losses.ppo import ppo_clip_loss

    rng = np.random.default_rng(11)
    H = rng.uniform(0, 3, size=(5, 7)).astype(np.float32)
    m = make_mask(rng, 5, 7)
    lp = -rng.uniform(0.1, 2.0, size=(5, 7)).astype(np.float32)
    adv = rng.normal(size=(5, 7)).astype(np.float32)
    keep = high_entropy_mask(H, m)
    as_bool, _ = ppo_clip_loss(lp, None, adv, m, token_weights=keep)
    as_float, _ = ppo_clip_loss(lp, None, adv, m, token_weights=np.asarray(keep, np.float32))
    assert float(as_bool) == float(as_float)


def test_the_position_m_times_q_is_exact_for_every_int32_count():
    """`scaled_position` against exact rational arithmetic (a float32 product near 10⁶ is off by
    up to 1/16); static levels are float64, traced ones float32."""
    rng = np.random.default_rng(11)
    counts = [0, 1, 5000, 999_999, 1_000_004, 2**24 + 1, 2**31 - 1]
    counts += rng.integers(0, 2**31 - 1, size=40).tolist()
    levels = [0.0, 0.05, 0.2, 0.3, 1 / 3, 0.7, 0.8, 0.95, 1.0, *rng.random(8).tolist()]
    traced = jax.jit(scaled_position)
    for m in counts:
        for q in levels:
            for exact, (whole, frac) in (
                (Fraction(q), scaled_position(jnp.int32(m), q)),
                (Fraction(float(np.float32(q))), traced(jnp.int32(m), jnp.float32(q))),
            ):
                got = int(whole) + Fraction(float(frac))
                assert 0.0 <= float(frac) < 1.0
                assert abs(got - m * exact) < Fraction(1, 10**6) + m * Fraction(1, 2**46), (m, q)


def test_positions_at_an_integer_are_that_integer():
    for m, q, whole in [
        (5000, 0.8, 4000),
        (3, 1 / 3, 1),
        (10, 0.3, 3),
        (2**31 - 1, 1.0, 2**31 - 1),
    ]:
        for level in (q, jnp.float32(q)):
            got = snapped_position(jnp.int32(m), level)
            assert (int(got[0]), float(got[1])) == (whole, 0.0), (m, q)
    # 1_000_004 · 0.8 = 800003.2: float32 gives 800003.1875, which a tolerance relative to the
    # position (2.5e-7 · 8e5 = 0.2) took for the integer 800003
    whole, frac = snapped_position(jnp.int32(1_000_004), 0.8)
    assert int(whole) == 800_003 and float(frac) == pytest.approx(0.2, abs=1e-6)


@pytest.mark.parametrize(("n", "rho"), [(1_000_005, 0.2), (1_000_004, 0.3)])
def test_a_million_tokens_keep_what_numpy_keeps(n, rho):
    """The fractional position 800003.2 (700002.1) and quantiles between neighbouring float32
    values: the mask is NumPy's `H ≥ np.quantile(H, 1 − ρ)` in float64."""
    H = np.random.default_rng(1).random((1, n)).astype(np.float32)
    want = np.quantile(H[0].astype(np.float64), 1.0 - rho) <= H
    got = np.asarray(_mask_static(H, np.ones((1, n), np.float32), top_quantile=rho))
    assert got.sum() == want.sum()
    np.testing.assert_array_equal(got, want)
    value = float(_quantile(H[0], np.ones(n, bool), 1.0 - rho))
    assert value == pytest.approx(np.quantile(H[0].astype(np.float64), 1.0 - rho), rel=1e-7)
