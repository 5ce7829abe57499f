"""Token selection (ALGORITHMS.md §5.16, §11): D³S token down-sampling, GTPO conflict tokens and
CAPO-style rejection, against float64 NumPy references written from the formulas."""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.token_selection import conflict_token_mask, token_downsample_mask, token_rejection_mask
from tests.losses.helpers import assert_close, make_mask, plant_nonfinite

N, T = 7, 11

_downsample = jax.jit(token_downsample_mask)  # keep_frac and threshold traced
_downsample_static = jax.jit(token_downsample_mask, static_argnames="keep_frac")
_conflict = jax.jit(conflict_token_mask)
_reject = jax.jit(token_rejection_mask)
_reject_static = jax.jit(token_rejection_mask, static_argnames="max_reject")


def _inputs(seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(N, T)).astype(np.float32)
    H = rng.gamma(2.0, 0.5, size=(N, T)).astype(np.float32)
    return rng, A, H, make_mask(rng, N, T)


# --------------------------------------------------------------------------------------------------
# token_downsample_mask (D³S)
# --------------------------------------------------------------------------------------------------


def np_token_downsample(A, H, m, keep_frac):
    valid = m > 0
    score = np.abs(A.astype(np.float64)) * H.astype(np.float64)
    q = np.quantile(score[valid], 1.0 - keep_frac)  # linear interpolation
    return valid & (score >= q)


@pytest.mark.parametrize("keep_frac", [0.1, 0.25, 0.5, 0.8, 1.0])
def test_token_downsample_matches_numpy(keep_frac):
    rng, A, H, m = _inputs(0)
    expected = np_token_downsample(A, H, m, keep_frac)
    dirty_A, dirty_H = plant_nonfinite(A, m, rng), plant_nonfinite(H, m, rng)
    got = np.asarray(_downsample_static(dirty_A, dirty_H, m, keep_frac=keep_frac))
    np.testing.assert_array_equal(got, expected)
    traced = _downsample(A, H, m, keep_frac=jnp.float32(keep_frac))
    np.testing.assert_array_equal(np.asarray(traced), expected)
    n = int(m.sum())
    assert got.sum() == math.floor(1 + keep_frac * (n - 1) + 1e-9)  # distinct scores


def test_token_downsample_invariances():
    _, A, H, m = _inputs(1)
    base = np.asarray(_downsample(A, H, m, keep_frac=0.3))
    # only |A| matters, and the selection is scale-free in both factors
    for A2, H2 in ((-A, H), (3.0 * A, H), (A, 0.2 * H), (-2.0 * A, 5.0 * H)):
        np.testing.assert_array_equal(np.asarray(_downsample(A2, H2, m, keep_frac=0.3)), base)
    # keep_frac = 1 keeps every valid token; an empty mask keeps nothing
    np.testing.assert_array_equal(np.asarray(_downsample(A, H, m, keep_frac=1.0)), m > 0)
    assert not np.asarray(_downsample(A, H, np.zeros_like(m), keep_frac=0.5)).any()


def test_token_downsample_prefers_large_advantage_and_entropy():
    A = np.array([[1.0, 1.0, 1.0, 1.0], [0.1, 0.1, 3.0, 3.0]], np.float32)
    H = np.array([[0.1, 2.0, 0.1, 2.0], [2.0, 0.1, 0.1, 2.0]], np.float32)
    keep = np.asarray(_downsample(A, H, np.ones((2, 4)), keep_frac=0.25))
    # scores [0.1 2 0.1 2 | 0.2 0.01 0.3 6]: the top quarter is {6, 2, 2}
    assert keep.tolist() == [[False, True, False, True], [False, False, False, True]]


def test_token_downsample_threshold_and_no_gradient():
    _, A, H, m = _inputs(2)
    out = np.asarray(_downsample(A, H, m, keep_frac=0.2, threshold=jnp.float32(0.5)))
    score = np.abs(A) * H
    np.testing.assert_array_equal(out, (m > 0) & (score >= 0.5))
    grad = jax.jit(
        jax.grad(
            lambda a: jnp.sum(a * token_downsample_mask(a, H, m, keep_frac=0.4).astype(jnp.float32))
        )
    )(A)
    expected = np.asarray(_downsample(A, H, m, keep_frac=0.4), np.float32)
    np.testing.assert_array_equal(np.asarray(grad), expected)


def test_token_downsample_errors_name_the_problem():
    x = jnp.ones((2, 3))
    for bad in (0.0, 1.5, -0.1, True):
        with pytest.raises(ValueError, match=r"`keep_frac` must be"):
            token_downsample_mask(x, x, x, keep_frac=bad)
    with pytest.raises(ValueError, match="`keep_frac` must be a scalar"):
        token_downsample_mask(x, x, x, keep_frac=jnp.ones(2))
    with pytest.raises(ValueError, match="`entropy` must have the shape of `advantages`"):
        token_downsample_mask(x, jnp.ones((3, 2)), x, keep_frac=0.5)
    with pytest.raises(ValueError, match="`advantages` must have rank 2"):
        token_downsample_mask(jnp.ones(3), jnp.ones(3), jnp.ones(3), keep_frac=0.5)
    with pytest.raises(ValueError, match="`advantages` must be a floating-point array"):
        token_downsample_mask(jnp.ones((2, 3), jnp.int32), x, x, keep_frac=0.5)
    with pytest.raises(ValueError, match="`mask` must have shape"):
        token_downsample_mask(x, x, jnp.ones((3, 2)), keep_frac=0.5)


def test_d3s_pipeline_trains_only_selected_rollouts_and_tokens():
    """Rollout down-sampling into the mask, token down-sampling through `token_weights`."""
    from losses.advantages import group_advantages
    from losses.layout import broadcast_to_tokens
    from losses.ppo import ppo_clip_loss
    from losses.rollout_selection import rollout_downsample_mask

    rng = np.random.default_rng(9)
    B, G = 3, 4
    mask = make_mask(rng, B * G, T)
    r = rng.normal(size=(B, G)).astype(np.float32)
    H = rng.gamma(2.0, 0.5, size=(B * G, T)).astype(np.float32)
    lp = -rng.uniform(0.1, 2.0, size=(B * G, T)).astype(np.float32)

    @jax.jit
    def step(lp, r, H, mask):
        keep = rollout_downsample_mask(group_advantages(r), k=2)
        m = mask * broadcast_to_tokens(keep, mask)
        A = broadcast_to_tokens(group_advantages(r), mask)
        tokens = token_downsample_mask(A, H, m, keep_frac=0.5)
        grad = jax.grad(lambda x: ppo_clip_loss(x, None, A, m, token_weights=tokens)[0])(lp)
        return grad, tokens, A, m

    grad, selected, A, m = (np.asarray(x) for x in step(lp, r, H, mask))
    assert selected.any() and np.all(grad[~selected] == 0)
    assert np.all(selected <= (m > 0)) and m.sum() < mask.sum()
    expected = -np.where(selected, A, 0.0) / m.sum()  # token_mean over the subset
    assert_close(grad, expected)


# --------------------------------------------------------------------------------------------------
# conflict_token_mask (GTPO)
# --------------------------------------------------------------------------------------------------


def np_conflict(tokens, mask, adv):
    B, G, T_ = tokens.shape
    out = np.zeros(tokens.shape, bool)
    for b, i, t in np.ndindex(B, G, T_):
        if not mask[b, i, t]:
            continue
        for j in range(G):
            opposite = adv[b, i] * adv[b, j] < 0
            if j != i and mask[b, j, t] and tokens[b, j, t] == tokens[b, i, t] and opposite:
                out[b, i, t] = True
    return out


def _conflict_inputs(seed, B=4, G=5):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 3, size=(B, G, T)).astype(np.int32)
    mask = make_mask(rng, B * G, T).reshape(B, G, T)
    adv = rng.normal(size=(B, G)).astype(np.float32)
    adv[0, :2] = 0.0  # zero advantages never conflict
    adv[1] = np.abs(adv[1])  # a group without negatives: no conflicts
    return rng, tokens, mask, adv


def test_conflict_matches_brute_force():
    for seed in range(3):
        rng, tokens, mask, adv = _conflict_inputs(seed)
        garbage = np.where(mask > 0, tokens, rng.integers(0, 3, size=tokens.shape)).astype(np.int32)
        got = np.asarray(_conflict(garbage, mask, adv))
        expected = np_conflict(tokens, mask > 0, adv)
        np.testing.assert_array_equal(got, expected)
        assert expected.any() and not expected.all()  # the case is informative
        assert not got[1].any()
        assert not got[0, :2].any()
        assert not got[mask == 0].any()


def test_conflict_invariances():
    _, tokens, mask, adv = _conflict_inputs(5)
    base = np.asarray(_conflict(tokens, mask, adv))
    # symmetric in the sign convention and in the magnitude of the advantages
    np.testing.assert_array_equal(np.asarray(_conflict(tokens, mask, -adv)), base)
    np.testing.assert_array_equal(np.asarray(_conflict(tokens, mask, 7.0 * np.sign(adv))), base)
    # relabelling the vocabulary changes nothing
    np.testing.assert_array_equal(np.asarray(_conflict((tokens + 1) * 3, mask, adv)), base)
    # all rollouts of a group with the same sign: nothing conflicts
    assert not np.asarray(_conflict(tokens, mask, np.abs(adv) + 0.1)).any()


def test_conflict_errors_name_the_problem():
    tok = jnp.zeros((2, 3, 4), jnp.int32)
    with pytest.raises(ValueError, match="`tokens` must have rank 3"):
        conflict_token_mask(jnp.zeros((6, 4), jnp.int32), jnp.ones((6, 4)), jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="`tokens` must be an integer array"):
        conflict_token_mask(jnp.zeros((2, 3, 4)), jnp.ones((2, 3, 4)), jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"`advantages` must have shape \[B,G\] = \(2, 3\)"):
        conflict_token_mask(tok, jnp.ones((2, 3, 4)), jnp.zeros((3, 2)))
    with pytest.raises(ValueError, match="`mask` must have shape"):
        conflict_token_mask(tok, jnp.ones((2, 3)), jnp.zeros((2, 3)))


# --------------------------------------------------------------------------------------------------
# token_rejection_mask (CAPO)
# --------------------------------------------------------------------------------------------------


def np_floor_fraction(rho, n):
    """`floor(ρ·n)`, with a product within rounding of an integer taken as that integer."""
    return math.floor(Fraction(rho).limit_denominator(10**6) * n)


def np_rejection(score, m, max_reject):
    valid = m > 0
    n = int(valid.sum())
    rejected = np_floor_fraction(max_reject, n)
    if rejected >= n:
        return np.zeros_like(valid)
    q = np.sort(score[valid].astype(np.float64))[n - 1 - rejected]
    return valid & (score <= q)


@pytest.mark.parametrize("max_reject", [0.0, 0.05, 0.08, 0.25, 0.5, 1.0])
def test_rejection_matches_numpy(max_reject):
    rng, _, H, m = _inputs(3)
    expected = np_rejection(H, m, max_reject)
    got = np.asarray(_reject_static(plant_nonfinite(H, m, rng), m, max_reject=max_reject))
    np.testing.assert_array_equal(got, expected)
    traced = np.asarray(_reject(H, m, max_reject=jnp.float32(max_reject)))
    np.testing.assert_array_equal(traced, expected)


def test_rejected_count_is_exactly_the_floor_and_never_above_the_budget():
    rng = np.random.default_rng(4)
    score = rng.permutation(N * T).reshape(N, T).astype(np.float32)
    for n in range(0, N * T + 1):
        m = (np.arange(N * T) < n).reshape(N, T).astype(np.float32)
        for rho in (0.08, 0.1, 0.2, 1 / 3):
            kept = int(np.asarray(_reject_static(score, m, max_reject=rho)).sum())
            assert n - kept == np_floor_fraction(rho, n), (n, rho)
            assert n - kept <= rho * n + 1e-9


def test_rejection_keeps_ties_and_rejects_the_largest():
    s = np.array([[1.0, 5.0, 5.0, 0.0], [2.0, 5.0, 3.0, 4.0]], np.float32)
    ones = np.ones((2, 4))
    # 8 tokens; the top score 5.0 occurs three times. A budget of 1 or 2 rejections would have to
    # split the tie, so nothing is rejected; a budget of 3 rejects the three, 4 also the 4.0.
    for rho in (0.125, 0.25):
        assert np.asarray(_reject_static(s, ones, max_reject=rho)).all()
    keep = np.asarray(_reject_static(s, ones, max_reject=0.375))
    assert keep.tolist() == [[True, False, False, True], [True, False, True, True]]
    keep = np.asarray(_reject_static(s, ones, max_reject=0.5))
    assert keep.tolist() == [[True, False, False, True], [True, False, True, False]]
    assert np.asarray(_reject_static(s, ones, max_reject=0.0)).all()
    assert not np.asarray(_reject_static(s, ones, max_reject=1.0)).any()


@pytest.mark.parametrize("max_reject", [0.0, 0.08, 0.5])
def test_nan_scores_are_rejected_and_the_rest_ranked_as_if_they_were_largest(max_reject):
    s = np.array([[0.1, np.nan, 0.3], [0.2, 0.5, 0.4]], np.float32)
    ones = np.ones((2, 3))
    # the NaN ranks as +inf: q = the (n − r)-th smallest of [0.1, 0.2, 0.3, 0.4, 0.5, +inf]
    ranked = np.where(np.isnan(s), np.inf, s)
    expected = np_rejection(ranked, ones, max_reject) & ~np.isnan(s)
    got = np.asarray(_reject_static(s, ones, max_reject=max_reject))
    np.testing.assert_array_equal(got, expected)
    assert got[~np.isnan(s)].sum() >= 5 - int(max_reject * 6)  # finite tokens not all dropped


def test_rejection_empty_mask_and_no_gradient():
    _, _, H, m = _inputs(6)
    assert not np.asarray(_reject(H, np.zeros_like(m), max_reject=0.5)).any()
    grad = jax.jit(jax.grad(lambda h: jnp.sum(h * token_rejection_mask(h, m).astype(jnp.float32))))(
        H
    )
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(_reject(H, m), np.float32))


def test_rejection_errors_name_the_problem():
    x = jnp.ones((2, 3))
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match=r"`max_reject` must be"):
            token_rejection_mask(x, x, max_reject=bad)
    with pytest.raises(ValueError, match="`score` must have rank 2"):
        token_rejection_mask(jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match="`score` must be a floating-point array"):
        token_rejection_mask(jnp.ones((2, 3), jnp.int32), x)
    with pytest.raises(ValueError, match="`mask` must have shape"):
        token_rejection_mask(x, jnp.ones((3, 2)))
