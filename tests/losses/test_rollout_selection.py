"""Rollout selection (ALGORITHMS.md §5.16, §11): max-variance down-sampling against a brute force over
every k-subset, and PF-PPO's best/worst pair against NumPy."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.rollout_selection import best_worst_mask, rollout_downsample_mask

_downsample = jax.jit(rollout_downsample_mask, static_argnames="k")
_best_worst = jax.jit(best_worst_mask)


def brute_force_max_variance(a: np.ndarray, k: int) -> float:
    """Largest population variance over all k-subsets of one group (float64)."""
    a = np.asarray(a, np.float64)
    return max(np.var(a[list(s)]) for s in itertools.combinations(range(len(a)), k))


def np_structured_choice(a: np.ndarray, k: int) -> np.ndarray:
    """The documented rule in float64: j largest + k − j smallest, max variance, smallest j."""
    a = np.asarray(a, np.float64)
    order = np.argsort(a, kind="stable")
    G = len(a)
    variances = [np.var(a[np.r_[order[: k - j], order[G - j :]]]) for j in range(k + 1)]
    best = max(variances)
    j = next(j for j, v in enumerate(variances) if v >= best - 1e-9 * abs(best))
    keep = np.zeros(G, bool)
    keep[np.r_[order[: k - j], order[G - j :]]] = True
    return keep


@pytest.mark.parametrize("G", [2, 3, 5, 8])
def test_downsample_is_optimal_over_all_subsets(G):
    rng = np.random.default_rng(G)
    groups = [
        rng.normal(size=(6, G)),  # distinct values
        rng.integers(0, 2, size=(6, G)),  # binary rewards: many ties
        rng.integers(-2, 3, size=(6, G)),  # few levels
    ]
    for a in groups:
        a = a.astype(np.float32)
        for k in range(1, G + 1):
            keep = np.asarray(_downsample(a, k=k))
            assert keep.dtype == np.bool_
            np.testing.assert_array_equal(keep.sum(1), k)
            for b in range(a.shape[0]):
                got = np.var(a[b][keep[b]].astype(np.float64))
                np.testing.assert_allclose(got, brute_force_max_variance(a[b], k), rtol=1e-6)
                np.testing.assert_array_equal(keep[b], np_structured_choice(a[b], k))


def test_downsample_anchor_and_tie_rule():
    a = np.array([[0.9, -0.2, 0.1, -1.0, 0.3], [1.0, 0.0, 1.0, 0.0, 1.0]], np.float32)
    keep = np.asarray(_downsample(a, k=2))
    assert keep[0].tolist() == [True, False, False, True, False]  # max and min
    # binary group, k = 3: every candidate j = 0, 1, 2 holds two of one value and one of the other
    # (variance 2/9); the smallest j wins (the 3 smallest), and among equal values the stable
    # ascending order takes the first index
    keep = np.asarray(_downsample(a, k=3))
    assert keep[1].tolist() == [True, True, False, True, False]


def test_downsample_keeping_everything_and_invariances():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(4, 6)).astype(np.float32)
    assert np.asarray(_downsample(a, k=6)).all()
    base = np.asarray(_downsample(a, k=3))
    # the variance criterion is invariant to a positive affine map and to negation
    for transformed in (2.5 * a + 1.0, -a):
        np.testing.assert_array_equal(np.asarray(_downsample(transformed, k=3)), base)
    # permutation-equivariant (distinct values)
    perm = rng.permutation(6)
    np.testing.assert_array_equal(np.asarray(_downsample(a[:, perm], k=3)), base[:, perm])


def test_downsample_carries_no_gradient():
    a = jnp.array([[0.3, -1.0, 2.0, 0.5]])
    grad = jax.grad(lambda x: jnp.sum(x * _downsample(x, k=2)))(a)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(_downsample(a, k=2), np.float32))


def test_downsample_errors_name_the_problem():
    a = jnp.zeros((2, 4))
    for bad in (0, 5, 2.0, True):
        with pytest.raises(ValueError, match=r"`k` must be a static Python int with 1 <= k <= G=4"):
            rollout_downsample_mask(a, k=bad)
    with pytest.raises(ValueError, match="`advantages` must have rank 2"):
        rollout_downsample_mask(jnp.zeros(4), k=2)
    with pytest.raises(ValueError, match="`advantages` must be a real numeric array"):
        rollout_downsample_mask(jnp.zeros((2, 4), jnp.complex64), k=2)


def np_best_worst(s, valid):
    keep = np.zeros(s.shape, bool)
    for b in range(s.shape[0]):
        idx = np.flatnonzero(valid[b])
        if idx.size == 0:
            continue
        vals = s[b, idx].astype(np.float64)
        keep[b, idx[np.argmax(vals)]] = True  # NumPy argmax/argmin return the first index
        keep[b, idx[np.argmin(vals)]] = True
    return keep


def test_best_worst_matches_numpy_with_invalid_samples():
    rng = np.random.default_rng(3)
    s = rng.integers(0, 4, size=(9, 6)).astype(np.float32)
    valid = rng.uniform(size=s.shape) > 0.3
    valid[0] = False  # no valid sample
    valid[1] = [False, False, True, False, False, False]  # a single one
    s[2] = 0.5  # all equal: one rollout kept
    valid[2] = True
    dirty = np.where(valid, s, np.nan).astype(np.float32)
    keep = np.asarray(_best_worst(dirty, valid=valid))
    np.testing.assert_array_equal(keep, np_best_worst(s, valid))
    assert keep[0].sum() == 0 and keep[1].tolist() == [False, False, True, False, False, False]
    assert keep[2].tolist() == [True, False, False, False, False, False]
    assert (keep.sum(1) <= 2).all()
    np.testing.assert_array_equal(
        np.asarray(_best_worst(s)), np_best_worst(s, np.ones(s.shape, bool))
    )


def test_best_worst_errors_name_the_problem():
    with pytest.raises(ValueError, match="`rewards` must have rank 2"):
        best_worst_mask(jnp.zeros(3))
    with pytest.raises(ValueError, match="`valid` must have shape"):
        best_worst_mask(jnp.zeros((2, 3)), valid=jnp.ones((3, 2)))
