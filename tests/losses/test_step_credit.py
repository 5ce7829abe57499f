"""Step-level credit (ALGORITHMS.md §4.15, §4.17, §11) against float64 NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.advantages import group_advantages
from losses.returns import discounted_returns
from losses.step_credit import (
    anchor_state_advantages,
    budget_weighted_returns,
    critique_token_rewards,
    dual_level_advantages,
    information_gain_rewards,
    sibling_advantages,
    step_advantages,
    step_min_form_returns,
)
from tests.losses.helpers import assert_close, make_mask, plant_nonfinite

N, M, T = 6, 5, 12
B, G = 3, 2

_step_adv = jax.jit(step_advantages)
_info_gain = jax.jit(information_gain_rewards)
_sibling = jax.jit(sibling_advantages, static_argnames=("scale", "ddof"))
_anchor = jax.jit(anchor_state_advantages, static_argnames=("G", "scale", "ddof"))
_dual = jax.jit(dual_level_advantages)
_min_form = jax.jit(step_min_form_returns, static_argnames=("num_segments", "reduce"))
_critique = jax.jit(critique_token_rewards)


def boundary_batch(seed):
    """V[N,M+1] with NaN/inf on boundaries no valid step touches; prefix step masks + one hole."""
    rng = np.random.default_rng(seed)
    step_mask = make_mask(rng, N, M)
    V = rng.normal(size=(N, M + 1)).astype(np.float32)
    used = np.zeros((N, M + 1))
    used[:, :-1] += step_mask
    used[:, 1:] += step_mask
    return rng, plant_nonfinite(V, used > 0, rng), step_mask


def np_differences(V, step_mask):
    out = np.zeros(step_mask.shape)
    for n, k in np.ndindex(*step_mask.shape):
        if step_mask[n, k] > 0:
            out[n, k] = float(V[n, k + 1]) - float(V[n, k])
    return out


# --------------------------------------------------------------------------------------------------
# step_advantages / information_gain_rewards
# --------------------------------------------------------------------------------------------------


def test_step_advantages_match_reference_and_ignore_unused_boundaries():
    _, V, step_mask = boundary_batch(0)
    out = _step_adv(V, step_mask)
    assert out.dtype == jnp.float32 and out.shape == (N, M)
    assert_close(out, np_differences(V, step_mask))


def test_step_advantages_telescope_to_final_minus_prompt_value():
    rng = np.random.default_rng(1)
    lengths = np.array([0, 1, 3, 5, 5, 2])
    step_mask = (np.arange(M)[None, :] < lengths[:, None]).astype(np.float32)
    V = rng.normal(size=(N, M + 1)).astype(np.float32)
    total = np.asarray(_step_adv(V, step_mask)).sum(1)
    expected = np.where(lengths > 0, V[np.arange(N), lengths] - V[:, 0], 0.0)
    assert_close(total, expected, atol=1e-5)


def test_information_gain_rewards_match_reference_and_rlp_form():
    _, p, mask = boundary_batch(2)
    assert_close(_info_gain(p, mask), np_differences(p, mask))
    # RLP: information gain of a thought = lp(next | ctx, cot) − lp(next | ctx)
    lp = np.array([[-2.0, -0.5], [-1.0, -1.5]], np.float32)
    assert_close(_info_gain(lp, np.ones((2, 1))), [[1.5], [-0.5]])


# --------------------------------------------------------------------------------------------------
# sibling_advantages (§4.15)
# --------------------------------------------------------------------------------------------------


def np_sibling(v, valid, scale, eps=1e-6, ddof=1):
    out = np.zeros(v.shape)
    for idx in np.ndindex(*v.shape[:-1]):
        x = v[idx][valid[idx]].astype(np.float64)
        if len(x) < 2 or x.max() == x.min():
            continue
        a = v[idx].astype(np.float64) - x.mean()
        if scale == "group":
            a = a / (x.std(ddof=ddof) + eps)
        out[idx] = np.where(valid[idx], a, 0.0)
    return out


@pytest.mark.parametrize("scale", ["none", "group"])
def test_sibling_advantages_match_reference(scale):
    rng = np.random.default_rng(3)
    v = rng.normal(size=(4, 3, 5)).astype(np.float32)  # [nodes..., C]
    valid = rng.uniform(size=v.shape) > 0.2
    valid[0, 0] = [True, False, False, False, False]  # a single valid child
    v[1, 1] = 0.25  # equal siblings
    v = plant_nonfinite(v, valid, rng)
    out = _sibling(v, valid, scale=scale)
    assert out.shape == v.shape
    assert_close(out, np_sibling(v, valid, scale))
    sums = np.asarray(out).sum(-1)
    if scale == "none":
        assert_close(sums, np.zeros(sums.shape), atol=1e-5)


# --------------------------------------------------------------------------------------------------
# anchor_state_advantages / dual_level_advantages (§4.17)
# --------------------------------------------------------------------------------------------------


def np_anchor(R, ids, step_mask, G, scale, eps=1e-6, ddof=1):
    out = np.zeros(R.shape)
    for n, k in np.ndindex(*R.shape):
        if step_mask[n, k] == 0:
            continue
        b = n // G
        members = [
            float(R[j, l])
            for j in range(b * G, b * G + G)
            for l in range(R.shape[1])
            if step_mask[j, l] > 0 and ids[j, l] == ids[n, k]
        ]
        x = np.array(members)
        if len(x) < 2 or x.max() == x.min():
            continue
        a = float(R[n, k]) - x.mean()
        out[n, k] = a if scale == "none" else a / (x.std(ddof=ddof) + eps)
    return out


def anchor_batch(seed):
    rng = np.random.default_rng(seed)
    step_mask = make_mask(rng, N, M)
    R = plant_nonfinite(rng.normal(size=(N, M)), step_mask, rng)
    ids = rng.integers(0, 4, size=(N, M)).astype(np.int32)
    return rng, R, ids, step_mask


@pytest.mark.parametrize(("scale", "ddof"), [("group", 1), ("none", 1), ("group", 0)])
def test_anchor_state_advantages_match_reference(scale, ddof):
    _, R, ids, step_mask = anchor_batch(4)
    R[4, :2] = R[5, :2] = 0.5  # a zero-variance key across trajectories
    ids[4, :2] = ids[5, :2] = 99
    out = _anchor(R, ids, step_mask, G=G, scale=scale, ddof=ddof)
    assert_close(out, np_anchor(R, ids, step_mask, G, scale, ddof=ddof))
    assert np.all(np.asarray(out)[4:, :2][step_mask[4:, :2] > 0] == 0.0)


def test_anchor_states_of_different_prompts_never_share_a_key():
    _, R, _, step_mask = anchor_batch(5)
    ids = np.zeros((N, M), np.int32)  # the same id everywhere: keys are still per prompt
    out = np.asarray(_anchor(R, ids, step_mask, G=G, scale="none"))
    for b in range(B):
        rows = slice(b * G, b * G + G)
        assert_close(out[rows].sum(), 0.0, atol=1e-5)


def test_distinct_anchor_states_give_the_episode_advantage():
    rng, R, _, step_mask = anchor_batch(6)
    ids = np.arange(N * M, dtype=np.int32).reshape(N, M)
    step = _anchor(R, ids, step_mask, G=G)
    assert np.all(np.asarray(step) == 0.0)
    episode = group_advantages(rng.normal(size=(B, G)).astype(np.float32))
    dual = _dual(episode, step, step_mask, step_weight=1.0)
    assert_close(dual, np.asarray(episode).reshape(N, 1) * step_mask)


def test_dual_level_advantages_match_reference_and_zero_weight_is_episode_only():
    rng = np.random.default_rng(7)
    step_mask = make_mask(rng, N, M)
    episode = rng.normal(size=N).astype(np.float32)
    episode[0] = np.nan  # row 0 has no valid step
    step = plant_nonfinite(rng.normal(size=(N, M)), step_mask, rng)
    out = _dual(episode, step, step_mask, step_weight=0.3)
    expected = np.where(step_mask > 0, episode[:, None] + 0.3 * np.where(step_mask > 0, step, 0), 0)
    assert_close(out, expected)
    only_episode = _dual(episode, step, step_mask, step_weight=0.0)
    assert_close(only_episode, np.where(step_mask > 0, episode[:, None], 0.0))


def test_gigpo_pipeline_from_step_rewards():
    """Step rewards → discounted step returns → anchor-state advantages → tokens."""
    rng, _, ids, step_mask = anchor_batch(8)
    step_rewards = rng.normal(size=(N, M)).astype(np.float32)
    returns = discounted_returns(step_rewards, step_mask, gamma=0.9)
    out = _anchor(returns, ids, step_mask, G=G)
    assert_close(out, np_anchor(np.asarray(returns), ids, step_mask, G, "group"))


# --------------------------------------------------------------------------------------------------
# step_min_form_returns (§4.13 on segments), critique_token_rewards, budget_weighted_returns (§11)
# --------------------------------------------------------------------------------------------------


def token_steps(seed):
    rng = np.random.default_rng(seed)
    m = make_mask(rng, N, T)
    is_end = rng.uniform(size=(N, T)) < 0.3
    seg = np.full((N, T), -1, np.int32)
    for n in range(N):
        k = 0
        for t in range(T):
            if m[n, t] > 0:
                seg[n, t] = min(k, M - 1)
                k += int(is_end[n, t])
    return rng, m, seg


def test_step_min_form_returns_match_reference():
    rng, m, seg = token_steps(9)
    r = plant_nonfinite(rng.normal(size=(N, T)), m, rng)
    out = _min_form(r, seg, m, num_segments=M)
    expected = np.zeros((N, T))
    for n in range(N):
        last = {}
        for t in range(T):
            if m[n, t] > 0:
                last[seg[n, t]] = float(r[n, t])  # the step's reward: its last valid token
        for t in range(T):
            if m[n, t] > 0:
                expected[n, t] = min(v for k, v in last.items() if k >= seg[n, t])
    assert_close(out, expected)


def test_step_min_form_bounds_and_constant_reward():
    rng, m, seg = token_steps(10)
    r = rng.normal(size=(N, T)).astype(np.float32)
    out = np.asarray(_min_form(r, seg, m, num_segments=M))
    valid = m > 0
    assert out[valid].min() >= r[valid].min() - 1e-6 and out[valid].max() <= r[valid].max() + 1e-6
    const = _min_form(np.full((N, T), 0.7, np.float32), seg, m, num_segments=M)
    assert_close(const, 0.7 * m)


def test_critique_token_rewards_match_reference():
    rng, m, seg = token_steps(11)
    outcome = rng.integers(0, 2, size=N).astype(np.float32)
    votes = rng.integers(0, 2, size=(N, M, 3))
    out = _critique(outcome, votes, seg, m, threshold=2, penalty=0.4)
    expected = np.zeros((N, T))
    for n, t in np.ndindex(N, T):
        if m[n, t] > 0:
            flagged = votes[n, seg[n, t]].sum() >= 2
            expected[n, t] = outcome[n] - 0.4 * flagged
    assert_close(out, expected)
    unflagged = _critique(outcome, votes, seg, m, threshold=4, penalty=0.4)
    assert_close(unflagged, outcome[:, None] * m)


def test_budget_weighted_returns_match_reference():
    rng = np.random.default_rng(12)
    r = rng.integers(0, 2, size=(N, 4)).astype(np.float32)
    prior = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    out = jax.jit(budget_weighted_returns)(r, prior)
    assert_close(out, r.astype(np.float64) @ prior)
    uniform_last = budget_weighted_returns(r, np.array([0.0, 0.0, 0.0, 1.0]))
    assert_close(uniform_last, r[:, -1])


# --------------------------------------------------------------------------------------------------
# bad inputs
# --------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    V = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match=r"step_advantages: `step_mask` must have shape \(2, 3\)"):
        step_advantages(V, np.ones((2, 4)))
    with pytest.raises(ValueError, match="information_gain_rewards: `p` must have M \\+ 1 >= 2"):
        information_gain_rewards(np.zeros((2, 1)), np.ones((2, 0)))
    with pytest.raises(ValueError, match="sibling_advantages: nodes need C >= 2 children"):
        sibling_advantages(np.zeros((3, 1)))
    with pytest.raises(ValueError, match="sibling_advantages: `scale` must be one of 'none'"):
        sibling_advantages(np.zeros((3, 2)), scale="batch")
    with pytest.raises(
        ValueError,
        match="anchor_state_advantages: `G` must be a positive Python int dividing N = 2",
    ):
        anchor_state_advantages(V, np.zeros((2, 4), np.int32), np.ones((2, 4)), G=3)
    with pytest.raises(ValueError, match="`state_ids` must be an integer array"):
        anchor_state_advantages(V, V, np.ones((2, 4)), G=2)
    with pytest.raises(ValueError, match="dual_level_advantages: `episode_adv` must hold one"):
        dual_level_advantages(np.zeros(3), V, np.ones((2, 4)))
    with pytest.raises(ValueError, match="`step_weight` must be >= 0"):
        dual_level_advantages(np.zeros(2), V, np.ones((2, 4)), step_weight=-1.0)
    with pytest.raises(ValueError, match="step_min_form_returns: `reduce` must be one of"):
        step_min_form_returns(
            V, np.zeros((2, 4), np.int32), np.ones((2, 4)), num_segments=2, reduce="x"
        )
    with pytest.raises(
        ValueError, match="step_min_form_returns: `segment_ids` must have the shape"
    ):
        step_min_form_returns(V, np.zeros((2, 3), np.int32), np.ones((2, 4)), num_segments=2)
    with pytest.raises(ValueError, match="critique_token_rewards: `votes` must have rank 3"):
        critique_token_rewards(
            np.zeros(2), V, np.zeros((2, 4), np.int32), np.ones((2, 4)), threshold=1, penalty=1.0
        )
    with pytest.raises(ValueError, match="`threshold` must be > 0"):
        critique_token_rewards(
            np.zeros(2),
            np.zeros((2, 2, 3)),
            np.zeros((2, 4), np.int32),
            np.ones((2, 4)),
            threshold=0,
            penalty=1.0,
        )
    with pytest.raises(
        ValueError, match=r"budget_weighted_returns: `prior` must have shape \(J,\)"
    ):
        budget_weighted_returns(V, np.ones(3))
