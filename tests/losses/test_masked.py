"""Masked statistics and layout helpers against float64 NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import losses
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask


def _data(seed=0, N=7, T=11):
    rng = np.random.default_rng(seed)
    return rng, rng.normal(size=(N, T)).astype(np.float32), make_mask(rng, N, T)


def test_sum_mean_match_reference_all_axes():
    _, x, m = _data()
    x64 = np.where(m > 0, x.astype(np.float64), 0.0)
    assert_close(jax.jit(losses.masked_sum)(x, m), x64.sum())
    assert_close(losses.masked_mean(x, m), x64.sum() / m.sum())
    assert_close(losses.masked_mean(x, m, axis=1), x64.sum(1) / np.maximum(m.sum(1), 1))
    assert_close(losses.masked_sum(x, m, axis=0), x64.sum(0))
    assert float(losses.masked_mean(x, np.zeros_like(m))) == 0.0
    assert_close(losses.masked_count(m), m.sum())


@pytest.mark.parametrize("ddof", [0, 1])
def test_var_matches_numpy(ddof):
    _, x, m = _data(1)
    assert_close(losses.masked_var(x, m, ddof=ddof), np.var(x[m > 0].astype(np.float64), ddof=ddof))
    rows = losses.masked_var(x, m, ddof=ddof, axis=1)
    for n in range(x.shape[0]):
        valid = x[n][m[n] > 0].astype(np.float64)
        expected = np.var(valid, ddof=ddof) if len(valid) > ddof else 0.0
        assert_close(rows[n], expected)


def test_var_of_fewer_than_two_values_is_zero():
    assert float(losses.masked_var(jnp.array([3.0, jnp.nan]), jnp.array([1, 0]))) == 0.0
    assert float(losses.masked_var(jnp.array([3.0]), jnp.array([0]))) == 0.0


@pytest.mark.parametrize(
    ("eps_mode", "ddof", "shift_mean"),
    [("add", 1, True), ("max", 0, True), ("std", 1, True), ("add", 1, False)],
)
def test_whiten_matches_reference(eps_mode, ddof, shift_mean):
    _, x, m = _data(2)
    eps = 1e-3  # large enough that its placement matters
    v = x[m > 0].astype(np.float64)
    mu, var = v.mean(), v.var(ddof=ddof)
    scale = {
        "add": 1 / np.sqrt(var + eps),
        "max": 1 / np.sqrt(max(var, eps)),
        "std": 1 / (np.sqrt(var) + eps),
    }[eps_mode]
    expected = (x - mu) * scale + (0.0 if shift_mean else mu)
    expected = np.where(m > 0, expected, 0.0)
    out = losses.masked_whiten(x, m, eps=eps, eps_mode=eps_mode, ddof=ddof, shift_mean=shift_mean)
    assert_close(out, expected)


def test_whiten_properties():
    _, x, m = _data(3)
    y = losses.masked_whiten(x, m)
    assert_close(losses.masked_mean(y, m), 0.0, atol=1e-6)
    assert_close(losses.masked_var(y, m), 1.0, rtol=1e-5)
    assert_close(losses.masked_whiten(3.0 * x + 2.0, m), y, atol=1e-5)  # affine invariance
    kept = losses.masked_whiten(x, m, shift_mean=False)
    assert_close(losses.masked_mean(kept, m), losses.masked_mean(x, m), atol=1e-6)
    per_row = losses.masked_whiten(x, m, axis=1)
    for n in range(x.shape[0]):
        if m[n].sum() > 1:
            assert_close(losses.masked_mean(per_row[n], m[n]), 0.0, atol=1e-6)


def test_whiten_refuses_a_negative_eps():
    """eps < 0 made `sqrt(var + eps)` NaN, which the zero guard then read as 1: no scaling."""
    _, x, m = _data(3)
    with pytest.raises(ValueError, match="masked_whiten: `eps` must be >= 0"):
        losses.masked_whiten(x, m, eps=-1.0)


@pytest.mark.parametrize("eps_mode", ["add", "max", "std"])
def test_whiten_of_equal_entries_is_zero_whatever_eps(eps_mode):
    """Equal valid entries (every answer right) and an all-invalid slice: exactly 0 (the mean
    with shift_mean=False), also at eps = 0, which gave 0/0 = NaN, and never float residue
    scaled up by a small eps."""
    x = np.array([[0.1, 0.1, 0.1, 5.0], [1.0, 2.0, 3.0, 4.0]], np.float32)
    m = np.array([[1, 1, 1, 0], [0, 0, 0, 0]], np.float32)
    for eps in (0.0, 1e-12):
        y = losses.masked_whiten(x, m, eps=eps, eps_mode=eps_mode, axis=1)
        np.testing.assert_array_equal(np.asarray(y), 0.0)
        kept = losses.masked_whiten(x, m, eps=eps, eps_mode=eps_mode, axis=1, shift_mean=False)
        assert_close(kept[0, :3], 0.1)
    rloo = losses.rloo_advantages(np.ones((2, 4), np.float32), normalize="batch", norm_eps=0.0)
    np.testing.assert_array_equal(np.asarray(rloo), 0.0)


@pytest.mark.parametrize(
    "fn",
    [
        losses.masked_sum,
        losses.masked_mean,
        losses.masked_var,
        lambda x, m: jnp.sum(losses.masked_whiten(x, m) ** 3),
    ],
)
def test_nan_outside_mask_does_not_leak(fn):
    rng, x, m = _data(4)
    assert_nan_safe(fn, (x, m), m, rng, planted=(0,))


def test_layout_helpers():
    x = jnp.arange(12.0).reshape(6, 2)
    g = losses.to_groups(x, 3)
    assert g.shape == (2, 3, 2)
    assert np.array_equal(losses.from_groups(g), x)
    m = np.array([[1, 1, 0], [0, 0, 0]], np.float32)
    out = losses.broadcast_to_tokens(jnp.array([[2.0, jnp.nan]]), m)
    assert out.tolist() == [[2.0, 2.0, 0.0], [0.0, 0.0, 0.0]]


def test_bad_input_errors_name_the_problem():
    with pytest.raises(ValueError, match="`ddof` must be one of"):
        losses.masked_var(jnp.ones(3), jnp.ones(3), ddof=2)
    with pytest.raises(ValueError, match="`eps_mode` must be one of"):
        losses.masked_whiten(jnp.ones(3), jnp.ones(3), eps_mode="sqrt")
    with pytest.raises(ValueError, match="does not broadcast"):
        losses.masked_mean(jnp.ones((2, 3)), jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="multiple of G=4"):
        losses.to_groups(jnp.ones(6), 4)
    with pytest.raises(ValueError, match="one value per row"):
        losses.broadcast_to_tokens(jnp.ones(3), jnp.ones((2, 4)))
