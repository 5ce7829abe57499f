"""Process-reward, potential and multi-turn shaping (ALGORITHMS.md §10.7, §11) vs NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.process_shaping import (
    clip_process_rewards,
    delta_process_rewards,
    potential_shaped_rewards,
    turn_decay_rewards,
)
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, plant_nonfinite

N, M, T = 8, 6, 10

_clip = jax.jit(clip_process_rewards, static_argnames=("eta",))
_delta = jax.jit(delta_process_rewards)
_potential = jax.jit(potential_shaped_rewards)
_turn = jax.jit(turn_decay_rewards, static_argnames=("gamma", "lam"))


def step_batch(seed):
    rng = np.random.default_rng(seed)
    step_mask = make_mask(rng, N, M)  # an empty row, a full row and a hole
    r = rng.normal(size=(N, M)).astype(np.float32)
    return rng, plant_nonfinite(r, step_mask, rng), r, step_mask


def np_delta(r, step_mask):
    out = np.zeros(r.shape)
    for n in range(r.shape[0]):
        steps = np.flatnonzero(step_mask[n] > 0)
        for i, k in enumerate(steps):
            nxt = float(r[n, steps[i + 1]]) if i + 1 < len(steps) else 0.0
            out[n, k] = float(r[n, k]) - nxt
    return out


# --------------------------------------------------------------------------------------------------
# clip / delta mechanisms
# --------------------------------------------------------------------------------------------------


def test_clip_process_rewards_match_reference_and_bound_the_sum():
    _, dirty, r, step_mask = step_batch(0)
    out = _clip(dirty, step_mask, eta=0.3)
    expected = np.where(step_mask > 0, np.minimum(r.astype(np.float64) - 0.3, 0.0), 0.0)
    assert_close(out, expected)
    assert np.all(np.asarray(out).sum(1) <= 0.0)
    assert np.all(np.asarray(out)[step_mask == 0] == 0.0)


def test_delta_process_rewards_match_reference_and_telescope():
    _, dirty, r, step_mask = step_batch(1)
    out = np.asarray(_delta(dirty, step_mask))
    assert np.all(np.isfinite(out))
    assert_close(out, np_delta(r, step_mask))
    first = np.array(
        [r[n, np.flatnonzero(step_mask[n])[0]] if step_mask[n].any() else 0.0 for n in range(N)]
    )
    assert_close(out.sum(1), first, atol=1e-5)
    # return-to-go from each valid step is its own PRM score
    to_go = np.cumsum(out[:, ::-1], axis=1)[:, ::-1]
    assert_close(to_go[step_mask > 0], r[step_mask > 0], atol=1e-5)


def test_process_shaping_nan_safety_and_no_gradient():
    rng, _, r, step_mask = step_batch(2)
    assert_nan_safe(lambda x: jnp.sum(delta_process_rewards(x, step_mask)), (r,), step_mask, rng)
    assert_nan_safe(
        lambda x: jnp.sum(clip_process_rewards(x, step_mask, eta=0.0)), (r,), step_mask, rng
    )
    g = jax.grad(lambda x: jnp.sum(delta_process_rewards(x, step_mask)))(r)
    assert np.all(np.asarray(g) == 0.0)


# --------------------------------------------------------------------------------------------------
# potential_shaped_rewards
# --------------------------------------------------------------------------------------------------


def test_potential_shaped_rewards_match_reference():
    rng = np.random.default_rng(3)
    mask = make_mask(rng, N, T)
    r = rng.normal(size=(N, T)).astype(np.float32)
    phi = rng.normal(size=(N, T + 1)).astype(np.float32)
    used = np.zeros((N, T + 1))
    used[:, :-1] += mask
    used[:, 1:] += mask
    out = _potential(
        plant_nonfinite(r, mask, rng), plant_nonfinite(phi, used > 0, rng), mask, gamma=0.9
    )
    expected = np.where(mask > 0, r + 0.9 * phi[:, 1:].astype(np.float64) - phi[:, :-1], 0.0)
    assert_close(out, expected)


def test_potential_shaping_telescopes_and_keeps_returns_up_to_the_start_potential():
    rng = np.random.default_rng(4)
    lengths = np.array([0, 1, 4, T, T, 7, 3, 9])
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    r = rng.normal(size=(N, T)).astype(np.float32)
    phi = rng.normal(size=(N, T + 1)).astype(np.float32)
    phi[np.arange(N), lengths] = 0.0  # terminal potential 0
    shaped = np.asarray(_potential(r, phi, mask), np.float64)
    raw = np.where(mask > 0, r, 0.0).sum(1)
    expected = np.where(lengths > 0, raw - phi[:, 0], 0.0)  # Σ shaped = Σ r − φ_0
    assert_close(shaped.sum(1), expected, atol=1e-5)
    # the shaping term is a pure function of the states: γ = 1, φ ≡ c gives r back
    assert_close(
        _potential(r, np.full((N, T + 1), 2.5, np.float32), mask), np.where(mask > 0, r, 0.0)
    )


def test_potential_shaping_nan_safety_and_errors():
    rng = np.random.default_rng(5)
    mask = make_mask(rng, N, T)
    r = rng.normal(size=(N, T)).astype(np.float32)
    phi = rng.normal(size=(N, T + 1)).astype(np.float32)
    assert_nan_safe(lambda x: jnp.sum(potential_shaped_rewards(x, phi, mask)), (r,), mask, rng)
    with pytest.raises(ValueError, match="phi"):
        potential_shaped_rewards(r, phi[:, :T], mask)
    with pytest.raises(ValueError, match="gamma"):
        potential_shaped_rewards(r, phi, mask, gamma=1.5)
    with pytest.raises(ValueError, match="mask"):
        potential_shaped_rewards(r, phi, mask[:3])


# --------------------------------------------------------------------------------------------------
# turn_decay_rewards (UFO)
# --------------------------------------------------------------------------------------------------


def test_turn_decay_rewards_match_reference():
    rng = np.random.default_rng(6)
    turn = rng.integers(0, 5, size=N)
    solved = rng.uniform(size=N) > 0.4
    n_rep = rng.integers(0, 3, size=N).astype(np.float32)
    out = _turn(turn, solved, n_rep, gamma=0.7, lam=0.2)
    assert_close(out, np.where(solved, 0.7 ** turn.astype(np.float64), 0.0) - 0.2 * n_rep)
    # solving earlier is always better; a first-turn solve without repetition earns 1
    r = np.asarray(_turn(np.arange(4), np.ones(4, bool), np.zeros(4), gamma=0.5, lam=0.1))
    assert r[0] == 1.0 and np.all(np.diff(r) < 0)
    with pytest.raises(ValueError, match="gamma"):
        turn_decay_rewards(turn, solved, n_rep, gamma=1.2, lam=0.1)
    with pytest.raises(ValueError, match="lam"):
        turn_decay_rewards(turn, solved, n_rep, gamma=0.5, lam=-0.1)
    with pytest.raises(ValueError, match="n_rep"):
        turn_decay_rewards(turn, solved, n_rep[:2], gamma=0.5, lam=0.1)
