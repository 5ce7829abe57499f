"""Multi-reward advantages: weighted sum vs decoupled (GDPO), against float64 NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.rewards import combined_advantages, total_reward

B, G, K = 3, 5, 2
EPS = 1e-6
advantages = jax.jit(combined_advantages, static_argnames=("group_size", "mode"))


def np_group_norm(s: np.ndarray, valid: np.ndarray, eps: float = EPS) -> np.ndarray:
    """GRPO per group over valid samples: (s − mean) / (std(ddof=1) + eps); 0 if invalid or < 2."""
    out = np.zeros_like(s, np.float64)
    for b in range(s.shape[0]):
        v = valid[b]
        x = s[b, v].astype(np.float64)
        if len(x) < 2:
            continue
        if np.all(x == x[0]):
            continue
        out[b, v] = (x - x.mean()) / (x.std(ddof=1) + eps)
    return out


@pytest.fixture
def rewards():
    rng = np.random.default_rng(0)
    r = rng.normal(size=(B * G, K)).astype(np.float32)
    r[:, 1] = rng.integers(0, 2, size=B * G)  # a binary component with a different spread
    r[G : 2 * G, 1] = 1.0  # a group where component 1 is constant
    return r


def test_sum_mode_matches_reference(rewards):
    w = np.array([0.3, 2.0], np.float32)
    total = (rewards.astype(np.float64) * w).sum(1)
    expected = np_group_norm(total.reshape(B, G), np.ones((B, G), bool)).reshape(-1)
    got = advantages(rewards, w, group_size=G)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(total_reward(rewards, w), total, rtol=1e-6, atol=1e-6)


def test_decoupled_mode_matches_reference(rewards):
    w = np.array([0.3, 2.0], np.float32)
    ones = np.ones((B, G), bool)
    expected = sum(
        w[k] * np_group_norm(rewards[:, k].reshape(B, G), ones) for k in range(K)
    ).reshape(-1)
    got = advantages(rewards, w, group_size=G, mode="decoupled")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, advantages(rewards, w, group_size=G))


def test_valid_rows_leave_the_statistics(rewards):
    valid = np.ones(B * G, bool)
    valid[:G] = False  # a dropped group (drop_group policy)
    valid[G + 1] = False
    w = np.array([1.0, 1.0], np.float32)
    total = rewards.astype(np.float64).sum(1).reshape(B, G)
    expected = np_group_norm(total, valid.reshape(B, G)).reshape(-1)
    got = advantages(rewards, w, group_size=G, valid=valid)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got)[~valid] == 0)


def test_single_component_decoupled_equals_sum(rewards):
    r = rewards[:, :1]
    w = jnp.ones(1)
    np.testing.assert_allclose(
        advantages(r, w, group_size=G, mode="decoupled"),
        advantages(r, w, group_size=G),
        rtol=1e-6,  # two programs: the same value up to float32 rounding
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group_size": 4}, "`group_size` must be an integer >= 2 dividing N = 15"),
        ({"group_size": 1}, "`group_size` must be an integer >= 2"),
        ({"group_size": G, "mode": "max"}, "`mode` must be 'sum' or 'decoupled'"),
        ({"group_size": G, "mode": "decoupled", "scale": "batch"}, "`scale` must be 'group'"),
        ({"group_size": G, "valid": np.ones(B, bool)}, "`valid` must have shape \\(15,\\)"),
    ],
)
def test_bad_arguments(rewards, kwargs, message):
    with pytest.raises(ValueError, match=message):
        combined_advantages(rewards, np.ones(K, np.float32), **kwargs)


def test_rewards_must_be_two_dimensional():
    with pytest.raises(ValueError, match="`rewards` must be \\[N, K\\]"):
        combined_advantages(np.zeros(6, np.float32), np.ones(1), group_size=2)


def test_a_numpy_integer_group_size_is_accepted(rewards):
    w = np.ones(K, np.float32)
    np.testing.assert_array_equal(
        combined_advantages(rewards, w, group_size=np.int64(G)),
        combined_advantages(rewards, w, group_size=G),
    )
    with pytest.raises(ValueError, match="`group_size` must be an integer"):
        combined_advantages(rewards, w, group_size=True)
