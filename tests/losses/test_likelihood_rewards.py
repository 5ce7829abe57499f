"""Likelihood-based rewards: SAR, FLR, RLPR (ALGORITHMS.md §11) against float64 NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.likelihood_rewards import (
    followup_likelihood_rewards,
    reference_probability_rewards,
    self_aligned_rewards,
)
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, plant_nonfinite

N, T, F = 7, 11, 5

_sar = jax.jit(self_aligned_rewards)
_flr = jax.jit(followup_likelihood_rewards)
_rlpr = jax.jit(reference_probability_rewards)


def logprob_batch(seed):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, N, T)
    a = np.log(rng.uniform(0.05, 1.0, size=(N, T))).astype(np.float32)
    b = np.log(rng.uniform(0.05, 1.0, size=(N, T))).astype(np.float32)
    return rng, mask, a, b


def np_row_mean(x, mask):
    m = mask > 0
    return np.array(
        [x[n][m[n]].astype(np.float64).mean() if m[n].any() else 0.0 for n in range(x.shape[0])]
    )


# --------------------------------------------------------------------------------------------------
# self_aligned_rewards (SAR)
# --------------------------------------------------------------------------------------------------


def test_self_aligned_rewards_match_perplexity_formula():
    rng, mask, lp_c, lp_u = logprob_batch(0)
    ppl_c = np.exp(-np_row_mean(lp_c, mask))
    ppl_u = np.exp(-np_row_mean(lp_u, mask))
    expected = (ppl_u - ppl_c) / ppl_u
    out = _sar(plant_nonfinite(lp_c, mask, rng), plant_nonfinite(lp_u, mask, rng), mask)
    assert out.shape == (N,) and out.dtype == jnp.float32
    assert_close(out, expected)
    assert out[0] == 0.0  # the empty row


def test_self_aligned_rewards_sign_bound_and_nan_safety():
    rng, mask, lp_c, _ = logprob_batch(1)
    assert_close(_sar(lp_c, lp_c, mask), np.zeros(N))  # the question changes nothing → 0
    out = np.asarray(_sar(lp_c, lp_c - 1.0, mask))  # the question helps → positive, below 1
    assert np.all(out[1:] > 0) and np.all(out < 1)
    assert np.all(np.asarray(_sar(lp_c - 1.0, lp_c, mask))[1:] < 0)
    assert_nan_safe(lambda a, b: jnp.sum(self_aligned_rewards(a, b, mask)), (lp_c, lp_c), mask, rng)
    g = jax.grad(lambda a: jnp.sum(self_aligned_rewards(a, lp_c, mask)))(lp_c)
    assert np.all(np.asarray(g) == 0.0)  # never leaks a gradient into the policy
    with pytest.raises(ValueError, match="lp_uncond"):
        self_aligned_rewards(lp_c, lp_c[:, :3], mask)


# --------------------------------------------------------------------------------------------------
# followup_likelihood_rewards (FLR)
# --------------------------------------------------------------------------------------------------


def test_followup_likelihood_rewards_match_reference():
    rng = np.random.default_rng(2)
    lp = rng.normal(size=(N, F)).astype(np.float32)
    polarity = np.array([1.0, -1.0, 1.0, 0.0, -1.0], np.float32)
    lp[:, 3] = np.nan  # unused follow-up
    expected = lp[:, [0, 2]].astype(np.float64).mean(1) - lp[:, [1, 4]].astype(np.float64).mean(1)
    out = _flr(lp, polarity)
    assert_close(out, expected)
    # integer polarity and an empty negative side
    only_pos = _flr(lp, np.array([1, 0, 1, 0, 0]))
    assert_close(only_pos, lp[:, [0, 2]].astype(np.float64).mean(1))
    g = jax.grad(lambda x: jnp.sum(followup_likelihood_rewards(x, polarity)))(np.nan_to_num(lp))
    assert np.all(np.asarray(g) == 0.0)


def test_followup_likelihood_rewards_errors():
    with pytest.raises(ValueError, match="polarity"):
        followup_likelihood_rewards(jnp.ones((N, F)), jnp.ones(F + 1))
    with pytest.raises(ValueError, match="polarity"):
        followup_likelihood_rewards(jnp.ones((N, F)), jnp.ones(F, bool))
    with pytest.raises(ValueError, match="lp_f"):
        followup_likelihood_rewards(jnp.ones(F), jnp.ones(F))


# --------------------------------------------------------------------------------------------------
# reference_probability_rewards (RLPR)
# --------------------------------------------------------------------------------------------------


def test_reference_probability_rewards_match_reference():
    rng, mask, lp, base = logprob_batch(3)
    p = np_row_mean(np.exp(lp.astype(np.float64)), mask)
    b = np_row_mean(np.exp(base.astype(np.float64)), mask)
    out = _rlpr(plant_nonfinite(lp, mask, rng), mask, plant_nonfinite(base, mask, rng))
    assert_close(out, np.clip(p - b, 0.0, 1.0))
    assert_close(_rlpr(lp, mask), p)  # no debiasing: the mean probability
    assert np.all(np.asarray(out) >= 0) and np.all(np.asarray(out) <= 1)
    assert out[0] == 0.0


def test_reference_probability_rewards_nan_safety_and_errors():
    rng, mask, lp, base = logprob_batch(4)
    assert_nan_safe(
        lambda a, b: jnp.sum(reference_probability_rewards(a, mask, b)), (lp, base), mask, rng
    )
    with pytest.raises(ValueError, match="base_lp"):
        reference_probability_rewards(lp, mask, base[:, :2])
    with pytest.raises(ValueError, match="mask"):
        reference_probability_rewards(lp, mask[:, :2])
    ints = np.zeros(lp.shape, np.int32)  # integer "log-probs" were taken as numbers
    with pytest.raises(ValueError, match="`ref_lp` must be a floating-point array"):
        reference_probability_rewards(ints, mask)
    with pytest.raises(ValueError, match="`lp_uncond` must be a floating-point array"):
        self_aligned_rewards(lp, ints, mask)
