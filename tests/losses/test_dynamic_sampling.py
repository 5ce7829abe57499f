"""Zero-variance group handling: filter masks, in-graph dropping, static selection (§4.18)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.advantages import group_advantages, zero_variance_mask
from losses.dynamic_sampling import (
    GroupSelection,
    dynamic_sampling_mask,
    keep_groups_mask,
    select_kept_groups,
)
from losses.layout import broadcast_to_tokens
from losses.ppo import ppo_clip_loss
from tests.losses.helpers import assert_close, make_mask

B, G, T = 6, 4, 7
N = B * G

_dyn = jax.jit(dynamic_sampling_mask, static_argnames=("min_std", "ddof", "reward_range"))
_keep = jax.jit(keep_groups_mask)
_select = jax.jit(select_kept_groups, static_argnames=("num_groups",))


def np_openrlhf_keep(rewards, low, high, threshold):
    """OpenRLHF `should_keep_group`: low < mean < high and population std > threshold."""
    r = np.asarray(rewards, np.float64)
    mean = r.mean(1)
    return (low < mean) & (mean < high) & (r.std(1) > threshold)


# --------------------------------------------------------------------------------------------------
# dynamic_sampling_mask
# --------------------------------------------------------------------------------------------------


def test_dynamic_sampling_mask_defaults_equal_zero_variance_mask():
    rng = np.random.default_rng(0)
    r = rng.integers(0, 2, size=(B, G)).astype(np.float32)
    r[0] = 1.0
    r[1] = 0.0
    np.testing.assert_array_equal(np.asarray(_dyn(r)), np.asarray(zero_variance_mask(r)))
    assert not bool(_dyn(r)[0]) and not bool(_dyn(r)[1])


def test_dynamic_sampling_mask_reproduces_openrlhf_filter():
    rng = np.random.default_rng(1)
    r = rng.uniform(size=(B, G)).astype(np.float32)
    r[0] = 0.5  # inside the range but zero variance
    r[1] = [0.9, 0.95, 1.0, 0.97]  # mean above the range
    r[2] = [0.0, 0.1, 0.0, 0.1]  # small std
    out = _dyn(r, reward_range=(0.05, 0.9), min_std=0.06, ddof=0)
    np.testing.assert_array_equal(np.asarray(out), np_openrlhf_keep(r, 0.05, 0.9, 0.06))
    binary = rng.integers(0, 2, size=(B, G)).astype(np.float32)
    binary[3] = 1.0
    np.testing.assert_array_equal(
        np.asarray(_dyn(binary, reward_range=(0.0, 1.0))), np_openrlhf_keep(binary, 0.0, 1.0, 0.0)
    )


def test_dynamic_sampling_mask_uses_valid_samples_only():
    r = np.array([[1.0, 0.0, np.nan, 1.0], [1.0, 1.0, 0.0, 1.0]], np.float32)
    valid = np.array([[True, True, False, True], [True, True, False, True]])
    out = _dyn(r, valid=valid, reward_range=(0.0, 1.0))
    assert np.asarray(out).tolist() == [True, False]


def test_dynamic_sampling_mask_errors():
    r = jnp.ones((B, G))
    with pytest.raises(ValueError, match="reward_range"):
        dynamic_sampling_mask(r, reward_range=(1.0, 0.0))
    with pytest.raises(ValueError, match="reward_range"):
        dynamic_sampling_mask(r, reward_range=(0.0,))
    with pytest.raises(ValueError, match="min_std"):
        dynamic_sampling_mask(r, min_std=-0.1)
    with pytest.raises(ValueError, match="ddof"):
        dynamic_sampling_mask(r, ddof=2)


# --------------------------------------------------------------------------------------------------
# keep_groups_mask: dropping groups in-graph equals removing them from the batch
# --------------------------------------------------------------------------------------------------


def test_keep_groups_mask_matches_repeat_and_other_ranks():
    rng = np.random.default_rng(2)
    mask = make_mask(rng, N, T)
    keep = rng.uniform(size=B) > 0.5
    expected = mask * np.repeat(keep, G)[:, None]
    np.testing.assert_array_equal(np.asarray(_keep(mask, keep)), expected)
    rows = np.ones(N, np.float32)
    np.testing.assert_array_equal(
        np.asarray(_keep(rows, keep)), np.repeat(keep, G).astype(np.float32)
    )


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_dropping_groups_in_graph_equals_the_loss_without_them(agg):
    rng = np.random.default_rng(3)
    rewards = rng.integers(0, 2, size=(B, G)).astype(np.float32)
    rewards[1] = 1.0
    rewards[4] = 0.0
    mask = make_mask(rng, N, T, empty_row=False)
    logp = np.log(rng.uniform(0.1, 1.0, size=(N, T))).astype(np.float32)
    old = (logp + 0.1 * rng.normal(size=(N, T))).astype(np.float32)
    keep = np.asarray(dynamic_sampling_mask(rewards))
    adv = broadcast_to_tokens(group_advantages(rewards), mask)

    def loss(lp, old_lp, a, m):
        return ppo_clip_loss(lp, old_lp, a, m, agg=agg)[0]

    full_value, full_grad = jax.value_and_grad(loss)(logp, old, adv, _keep(mask, keep))
    rows = np.repeat(keep, G)
    sub_value, sub_grad = jax.value_and_grad(loss)(
        logp[rows], old[rows], np.asarray(adv)[rows], mask[rows]
    )
    assert_close(full_value, float(sub_value))
    assert_close(np.asarray(full_grad)[rows], np.asarray(sub_grad))
    assert np.all(np.asarray(full_grad)[~rows] == 0.0)


def test_keep_groups_mask_errors():
    with pytest.raises(ValueError, match="keep"):
        keep_groups_mask(jnp.ones((N, T)), jnp.ones(5, bool))  # 5 does not divide 24
    with pytest.raises(ValueError, match="keep"):
        keep_groups_mask(jnp.ones((N, T)), jnp.ones((B, 1), bool))
    with pytest.raises(ValueError, match="mask"):
        keep_groups_mask(jnp.ones(()), jnp.ones(1, bool))


# --------------------------------------------------------------------------------------------------
# select_kept_groups
# --------------------------------------------------------------------------------------------------


def np_select(keep, num_groups):
    order = [b for b in range(len(keep)) if keep[b]] + [b for b in range(len(keep)) if not keep[b]]
    idx = np.array(order[:num_groups])
    return idx, keep[idx], int(keep.sum()), int(keep.sum()) >= num_groups


@pytest.mark.parametrize("num_groups", [1, 3, 6])
def test_select_kept_groups_matches_reference(num_groups):
    rng = np.random.default_rng(4)
    for _ in range(4):
        keep = rng.uniform(size=B) > 0.5
        sel = _select(keep, num_groups=num_groups)
        assert isinstance(sel, GroupSelection)
        idx, selected, num_kept, enough = np_select(keep, num_groups)
        np.testing.assert_array_equal(np.asarray(sel.indices), idx)
        np.testing.assert_array_equal(np.asarray(sel.selected), selected)
        assert int(sel.num_kept) == num_kept and bool(sel.enough) == enough


def test_select_kept_groups_host_loop_collects_enough_groups():
    # the DAPO loop: keep sampling batches until `enough`, then train on the selection
    rng = np.random.default_rng(5)
    pool = np.zeros((0, G), np.float32)
    for _ in range(20):
        batch = rng.integers(0, 2, size=(B, G)).astype(np.float32)
        pool = np.concatenate([pool, batch])
        sel = select_kept_groups(dynamic_sampling_mask(pool), num_groups=B)
        if bool(sel.enough):
            break
    assert bool(sel.enough)
    chosen = pool[np.asarray(sel.indices)]
    assert np.all(chosen.max(1) > chosen.min(1))  # every selected group carries a signal


def test_select_kept_groups_errors():
    with pytest.raises(ValueError, match="num_groups"):
        select_kept_groups(jnp.ones(B, bool), num_groups=B + 1)
    with pytest.raises(ValueError, match="num_groups"):
        select_kept_groups(jnp.ones(B, bool), num_groups=0)
    with pytest.raises(ValueError, match="keep"):
        select_kept_groups(jnp.ones((B, 2), bool), num_groups=1)
