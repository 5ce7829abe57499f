"""Single-stream Beta value tracker (ALGORITHMS.md §11, SPO) against float64 NumPy loops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.tracker import (
    BetaTrackerState,
    beta_tracker_update,
    init_beta_tracker,
    tracker_advantages,
    tracker_baseline,
)
from tests.losses.helpers import assert_close

P, N = 6, 13

_update = jax.jit(beta_tracker_update)
_advantages = jax.jit(tracker_advantages, static_argnames=("normalize", "ddof"))
_baseline = jax.jit(tracker_baseline)


def _batch(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, P - 1, size=N).astype(np.int32)  # prompt P−1 is never sampled
    ids[:3] = 2  # a prompt sampled three times
    ids[4] = -1  # out of range: ignored
    ids[5] = P + 3
    r = rng.integers(0, 2, size=N).astype(np.float32)
    r[6] = 0.25  # a fractional reward
    valid = rng.uniform(size=N) > 0.2
    valid[:3] = True
    state = BetaTrackerState(
        rng.uniform(0.5, 3.0, size=P).astype(np.float32),
        rng.uniform(0.5, 3.0, size=P).astype(np.float32),
    )
    return rng, ids, r, valid, state


def np_update(state, ids, r, valid, discount):
    alpha = np.asarray(state.alpha, np.float64).copy()
    beta = np.asarray(state.beta, np.float64).copy()
    rho = np.broadcast_to(np.asarray(discount, np.float64), (len(alpha),))
    for p in range(len(alpha)):
        rows = [n for n in range(len(ids)) if ids[n] == p and valid[n]]
        if rows:
            alpha[p] = rho[p] * alpha[p] + sum(float(r[n]) for n in rows)
            beta[p] = rho[p] * beta[p] + sum(1.0 - float(r[n]) for n in rows)
    return alpha, beta


def np_advantages(state, ids, r, valid, normalize=True):
    alpha = np.asarray(state.alpha, np.float64)
    beta = np.asarray(state.beta, np.float64)
    ok = valid & (ids >= 0) & (ids < len(alpha))
    a = np.zeros(len(ids))
    for n in np.flatnonzero(ok):
        a[n] = r[n] - alpha[ids[n]] / (alpha[ids[n]] + beta[ids[n]])
    if normalize:
        x = a[ok]
        a[ok] = (x - x.mean()) / np.sqrt(x.var(ddof=1) + 1e-8)
    return a


def test_init():
    state = init_beta_tracker(4)
    assert state.alpha.tolist() == [1.0] * 4 and state.beta.tolist() == [1.0] * 4
    state = init_beta_tracker(3, alpha=jnp.array([1.0, 2.0, 3.0]), beta=0.5)
    assert state.alpha.tolist() == [1.0, 2.0, 3.0] and state.beta.tolist() == [0.5] * 3
    assert isinstance(state, BetaTrackerState) and state.alpha.dtype == jnp.float32


@pytest.mark.parametrize("discount", [1.0, 0.7, 0.0, "per_prompt"])
def test_update_matches_numpy(discount):
    rng, ids, r, valid, state = _batch(0)
    if discount == "per_prompt":
        discount = rng.uniform(0.3, 1.0, size=P).astype(np.float32)
    dirty = np.where(valid, r, np.nan).astype(np.float32)
    new = _update(state, ids, dirty, discount=discount, valid=valid)
    alpha, beta = np_update(state, ids, r, valid, discount)
    assert_close(new.alpha, alpha)
    assert_close(new.beta, beta)
    # prompts that were not sampled keep their state exactly
    np.testing.assert_array_equal(np.asarray(new.alpha)[P - 1], state.alpha[P - 1])


def test_update_without_discount_accumulates_counts():
    _, ids, r, _, _ = _batch(1)
    prior = init_beta_tracker(P)
    one = _update(prior, ids, r, discount=1.0)
    two = _update(_update(prior, ids[:7], r[:7], discount=1.0), ids[7:], r[7:], discount=1.0)
    assert_close(two.alpha, np.asarray(one.alpha))
    assert_close(two.beta, np.asarray(one.beta))
    ok = (ids >= 0) & (ids < P)
    counts = np.bincount(ids[ok], minlength=P)
    assert_close(np.asarray(one.alpha) + np.asarray(one.beta), 2.0 + counts)


def test_advantages_match_numpy_and_use_the_state_before_the_update():
    _, ids, r, valid, state = _batch(2)
    dirty = np.where(valid, r, np.inf).astype(np.float32)
    for normalize in (True, False):
        got = _advantages(state, ids, dirty, valid=valid, normalize=normalize)
        assert_close(got, np_advantages(state, ids, r, valid, normalize), rtol=1e-5, atol=1e-5)
    ok = valid & (ids >= 0) & (ids < P)
    got = np.asarray(_advantages(state, ids, dirty, valid=valid))
    assert np.all(got[~ok] == 0)
    assert_close(got[ok].mean(), 0.0, atol=1e-6)
    # the baseline is the tracked success probability
    base = np.asarray(_baseline(state, ids))
    expected = np.zeros(N)
    in_range = (ids >= 0) & (ids < P)
    expected[in_range] = (state.alpha / (state.alpha + state.beta))[ids[in_range]]
    assert_close(base, expected)
    # after the update the same rewards sit closer to the baseline
    after = _update(state, ids, r, discount=1.0, valid=valid)
    raw_before = np.abs(np.asarray(_advantages(state, ids, r, valid=valid, normalize=False)))
    raw_after = np.abs(np.asarray(_advantages(after, ids, r, valid=valid, normalize=False)))
    assert raw_after[ok].sum() < raw_before[ok].sum()


def test_tracker_learns_the_success_rate():
    """A stream of Bernoulli(p) rewards: the discounted tracker's baseline converges to p."""
    p_true = jnp.array([0.1, 0.5, 0.85])
    ids = jnp.repeat(jnp.arange(3), 4)  # four samples of each prompt per step

    def step(state, key):
        r = (jax.random.uniform(key, (12,)) < p_true[ids]).astype(jnp.float32)
        return beta_tracker_update(state, ids, r, discount=0.97), None

    keys = jax.random.split(jax.random.key(0), 300)
    state, _ = jax.jit(lambda s, k: jax.lax.scan(step, s, k))(init_beta_tracker(3), keys)
    baseline = np.asarray(tracker_baseline(state, jnp.arange(3)))
    np.testing.assert_allclose(baseline, np.asarray(p_true), atol=0.1)


def test_errors_name_the_problem():
    state = init_beta_tracker(3)
    ids = jnp.array([0, 1])
    r = jnp.array([1.0, 0.0])
    with pytest.raises(ValueError, match="`num_prompts` must be a positive Python int"):
        init_beta_tracker(0)
    with pytest.raises(ValueError, match="`alpha` must be > 0"):
        init_beta_tracker(3, alpha=0.0)
    with pytest.raises(ValueError, match=r"`beta` must be a scalar or have shape \[P\] = \(3,\)"):
        init_beta_tracker(3, beta=jnp.ones(4))
    with pytest.raises(ValueError, match="`state` must be a BetaTrackerState"):
        beta_tracker_update((jnp.ones(3), jnp.ones(3)), ids, r, discount=0.9)
    with pytest.raises(ValueError, match=r"`state\.beta` must have the shape of `state\.alpha`"):
        tracker_advantages(BetaTrackerState(jnp.ones(3), jnp.ones(2)), ids, r)
    for bad in (1.5, -0.1, True):
        with pytest.raises(ValueError, match=r"`discount` must be in \[0, 1\]"):
            beta_tracker_update(state, ids, r, discount=bad)
    with pytest.raises(ValueError, match=r"`discount` must be a scalar or have shape \[P\]"):
        beta_tracker_update(state, ids, r, discount=jnp.ones(2))
    with pytest.raises(ValueError, match="`prompt_ids` must be an integer array"):
        beta_tracker_update(state, jnp.array([0.0, 1.0]), r, discount=0.9)
    with pytest.raises(ValueError, match="`rewards` must have the shape of `prompt_ids`"):
        tracker_advantages(state, ids, jnp.ones(3))
    with pytest.raises(ValueError, match="`normalize` must be a bool"):
        tracker_advantages(state, ids, r, normalize=1)
    with pytest.raises(ValueError, match="`valid` must have shape"):
        tracker_advantages(state, ids, r, valid=jnp.ones(3))
