"""BAPO adaptive clip bounds (ALGORITHMS.md §5.11) against a brute-force Python search."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.bapo import bapo_clip_bounds, bapo_loss, clip_bound_grid
from losses.ppo import ppo_clip_loss
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask

N, T = 8, 11  # N a multiple of 8 so the batch splits into 8 shards
DEFAULTS = {"c_low": 0.6, "c_low_max": 0.8, "c_high": 1.2, "c_high_max": 2.0, "step": 0.05}


def _inputs(seed: int, shift: float = 0.0):
    rng = np.random.default_rng(seed)
    old = -rng.uniform(0.1, 3.0, size=(N, T)).astype(np.float32)
    lp = (old + 0.35 * rng.normal(size=(N, T))).astype(np.float32)
    adv = (rng.normal(size=(N, T)) + shift).astype(np.float32)
    return rng, lp, old, adv, make_mask(rng, N, T)


def brute_force_bounds(lp, old, adv, m, *, c_low, c_low_max, c_high, c_high_max, step, target):
    """The search of §5.11 as a plain Python loop over the grid, in float64."""
    valid = m > 0
    r = np.exp(np.clip(lp.astype(np.float64) - old, -20, 20))[valid]
    a = adv.astype(np.float64)[valid]

    def pos(c_hi):
        return sum(ri * ai for ri, ai in zip(r, a, strict=True) if ai > 0 and ri <= c_hi)

    def neg(c_lo):
        return sum(ri * -ai for ri, ai in zip(r, a, strict=True) if ai < 0 and ri >= c_lo)

    def meets(p, n):
        return n == 0 or p / n >= target

    k = 0
    while True:
        c_lo = min(c_low + k * step, c_low_max)
        if meets(pos(c_high), neg(c_lo)):
            return c_lo, c_high, "low"
        if c_lo >= c_low_max:
            break
        k += 1
    k = 0
    while True:
        c_hi = min(c_high + k * step, c_high_max)
        if meets(pos(c_hi), neg(c_low_max)):
            return c_low_max, c_hi, "high"
        if c_hi >= c_high_max:
            break
        k += 1
    return c_low_max, c_high_max, "max"


@functools.partial(jax.jit, static_argnames=tuple(DEFAULTS))
def _bounds_batch(lp, old, adv, m, target, **kw):
    """`bapo_clip_bounds` over a stack of batches `[S,N,T]` (one compilation)."""
    return jax.vmap(lambda a, b, c, d: bapo_clip_bounds(a, b, c, d, target=target, **kw))(
        lp, old, adv, m
    )


def test_grid():
    assert clip_bound_grid(0.6, 0.8, 0.05) == pytest.approx((0.6, 0.65, 0.7, 0.75, 0.8))
    assert len(clip_bound_grid(1.2, 2.0, 0.05)) == 17
    assert clip_bound_grid(0.6, 0.6, 0.05) == (0.6,)
    assert clip_bound_grid(0.6, 0.73, 0.05) == pytest.approx((0.6, 0.65, 0.7, 0.73))


@pytest.mark.parametrize("target", [1.0, 0.8, 1.3])
def test_equals_brute_force_search(target):
    shifts = np.linspace(-0.9, 0.6, 24)
    batches = [_inputs(seed, shift) for seed, shift in enumerate(shifts)]
    lp, old, adv, m = (np.stack([b[i] for b in batches]) for i in range(1, 5))
    c_lo, c_hi, metrics = _bounds_batch(lp, old, adv, m, jnp.float32(target), **DEFAULTS)
    phases = set()
    for s in range(len(shifts)):
        lo, hi, phase = brute_force_bounds(lp[s], old[s], adv[s], m[s], target=target, **DEFAULTS)
        phases.add((phase, lo == DEFAULTS["c_low"]))
        assert_close(c_lo[s], lo)
        assert_close(c_hi[s], hi)
        assert_close(metrics["bapo/c_low"][s], lo)
        assert_close(metrics["bapo/c_high"][s], hi)
        valid = m[s] > 0
        r = np.exp(lp[s].astype(np.float64) - old[s])[valid]
        a = adv[s].astype(np.float64)[valid]
        pos = np.sum(r * a * ((a > 0) & (r <= hi)))
        neg = np.sum(r * -a * ((a < 0) & (r >= lo)))
        assert_close(metrics["bapo/pos"][s], pos, rtol=1e-5, atol=1e-5)
        assert_close(metrics["bapo/neg"][s], neg, rtol=1e-5, atol=1e-5)
        assert_close(metrics["bapo/pos_neg_ratio"][s], pos / neg if neg > 0 else 0.0, rtol=1e-5)
    # the batches exercise every branch: initial bounds, raised c_lo, raised c_hi, the maxima
    assert {("low", True), ("low", False), ("high", False), ("max", False)} <= phases


def test_initial_bounds_when_they_already_meet_the_target():
    _, lp, old, adv, m = _inputs(0, shift=1.5)  # positive advantages dominate
    c_lo, c_hi, metrics = jax.jit(bapo_clip_bounds)(lp, old, adv, m)
    assert float(metrics["bapo/neg"]) > 0
    assert float(metrics["bapo/pos_neg_ratio"]) >= 1.0
    assert_close([c_lo, c_hi], [0.6, 1.2])


def test_no_negative_contribution_meets_the_target():
    _, lp, old, adv, m = _inputs(1)
    bounds = jax.jit(bapo_clip_bounds, static_argnames=("c_low", "c_high"))
    for a in (np.abs(adv), np.zeros_like(adv)):  # neg = 0, also with pos = 0
        c_lo, c_hi, metrics = bounds(lp, old, a, m, c_low=0.7, c_high=1.3)
        assert_close([c_lo, c_hi, metrics["bapo/neg"]], [0.7, 1.3, 0.0])
        assert float(metrics["bapo/pos_neg_ratio"]) == 0.0


_bounds = jax.jit(bapo_clip_bounds)
_bounds_per_shard = jax.jit(jax.vmap(bapo_clip_bounds))
_bounds_psum = jax.jit(
    jax.vmap(lambda a, b, c, d: bapo_clip_bounds(a, b, c, d, axis_name="d"), axis_name="d")
)


def test_axis_name_sums_over_shards():
    """8 shards under `vmap(axis_name=...)` choose the bounds of the whole batch."""
    for seed, shift in ((2, -0.4), (3, -0.1), (4, 0.0)):
        _, lp, old, adv, m = _inputs(seed, shift)
        full = _bounds(lp, old, adv, m)
        shards = [x.reshape(8, N // 8, T) for x in (lp, old, adv, m)]
        sharded = _bounds_psum(*shards)
        for leaf_full, leaf_sharded in zip(
            jax.tree.leaves(full), jax.tree.leaves(sharded), strict=True
        ):
            assert_close(leaf_sharded, np.full(8, float(leaf_full)), rtol=1e-5, atol=1e-6)
        if seed == 2:  # without the psum the shards disagree
            local = _bounds_per_shard(*shards)
            assert np.unique(np.asarray(local[0])).size + np.unique(np.asarray(local[1])).size > 2


@jax.jit
def _bapo_and_ppo(lp, old, adv, m, clip_low, clip_high):
    """Value and gradient of `bapo_loss` and of `ppo_clip_loss` with given (traced) clip values."""
    agg = "seq_mean_token_mean"
    bapo = jax.value_and_grad(lambda x: bapo_loss(x, old, adv, m, agg=agg), has_aux=True)(lp)
    ppo = jax.value_and_grad(
        lambda x: ppo_clip_loss(
            x, old, adv, m, clip_low=clip_low, clip_high=clip_high, dual_clip=3.0, agg=agg
        ),
        has_aux=True,
    )(lp)
    return bapo, ppo


def test_bapo_loss_is_ppo_with_the_bounds():
    _, lp, old, adv, m = _inputs(5, shift=-0.3)
    c_lo, c_hi, _ = _bounds(lp, old, adv, m)
    assert float(c_lo) > 0.6 or float(c_hi) > 1.2  # the bounds moved
    ((loss, metrics), grad), ((ref_loss, ref_metrics), ref_grad) = _bapo_and_ppo(
        lp, old, adv, m, 1.0 - c_lo, c_hi - 1.0
    )
    assert_close(loss, float(ref_loss))
    assert_close(grad, np.asarray(ref_grad, np.float64))
    assert np.any(np.asarray(grad) != 0)
    for key, value in ref_metrics.items():
        assert_close(metrics[key], float(value))
    assert_close([metrics["bapo/c_low"], metrics["bapo/c_high"]], [float(c_lo), float(c_hi)])


def test_bapo_loss_nan_safe():
    rng, lp, old, adv, m = _inputs(6, shift=-0.3)
    assert_nan_safe(lambda a, b, c: bapo_loss(a, b, c, m), (lp, old, adv), m, rng)


def test_errors_name_the_problem():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="need 0 < c_low <= c_low_max <= 1"):
        bapo_clip_bounds(x, x, x, x, c_low=0.9, c_low_max=0.8)
    with pytest.raises(ValueError, match="need 0 < c_low <= c_low_max <= 1"):
        bapo_clip_bounds(x, x, x, x, c_low_max=1.1)
    with pytest.raises(ValueError, match="need 1 <= c_high <= c_high_max"):
        bapo_clip_bounds(x, x, x, x, c_high=0.9)
    with pytest.raises(ValueError, match="`step` must be > 0"):
        bapo_clip_bounds(x, x, x, x, step=0.0)
    with pytest.raises(ValueError, match="`c_low` must be a finite Python number"):
        bapo_clip_bounds(x, x, x, x, c_low=jnp.float32(0.6))
    with pytest.raises(ValueError, match="`target` must be > 0"):
        bapo_clip_bounds(x, x, x, x, target=0.0)
    with pytest.raises(ValueError, match="`clip_low` is set by the adaptive bounds"):
        bapo_loss(x, x, x, x, clip_low=0.2)
    with pytest.raises(ValueError, match="`advantages` must be per token"):
        bapo_clip_bounds(x, x, jnp.zeros(2), x)
