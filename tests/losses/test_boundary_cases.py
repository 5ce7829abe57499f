"""Boundary cases the per-module tests did not pin (found by mutation testing, 2026-12-07).

Each case makes a plausible one-token change to the formula observable: an exact tie at a clip
or gate bound (on-policy ratio 1, a bound of exactly 1), an asymmetric clip, a constant input
whose float32 mean is inexact, a log-ratio below the sequence cap's lower side, a zero
advantage. The values are computed by hand in the comments.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import losses
from tests.losses.helpers import assert_close

ONES, ZEROS = jnp.ones((1, 2)), jnp.zeros((1, 2))


def test_passk_std_gets_eps_added_outside_the_square_root():
    # rewards [1, 0, 0, 0]: the std (ddof 1) of the pass@k scores is 0.5; eps = 1 → 1 / 1.5
    adv = losses.passk_advantages(jnp.array([[1.0, 0.0, 0.0, 0.0]]), eps=1.0)
    assert_close(adv[0, 0], 1.0 / 1.5)


def test_whiten_of_a_constant_whose_float32_mean_is_inexact_is_zero():
    # mean(0.1 × 7) in float32 is 0.10000001 ≠ 0.1: without the constant guard the output is
    # −7.5e-5 each (eps 1e-8) or −0.93 each (eps 0 in "std" mode)
    x = jnp.full(7, 0.1)
    np.testing.assert_array_equal(losses.masked_whiten(x, jnp.ones(7)), np.zeros(7))
    whitened = losses.masked_whiten(x, jnp.ones(7), eps=0.0, eps_mode="std")
    np.testing.assert_array_equal(whitened, np.zeros(7))


def test_gspo_caps_the_sequence_log_ratio_from_above_only():
    # log s = −1 with seq_log_ratio_max = 0.5: s = e^−1 (a two-sided clip would give e^−0.5)
    loss, metrics = losses.gspo_loss(
        jnp.array([[-1.0, -1.0]]), ZEROS, ONES, ONES, seq_log_ratio_max=0.5
    )
    assert_close(loss, -np.exp(-1.0))
    assert_close(metrics["policy/ratio_mean"], np.exp(-1.0))


def test_an_on_policy_ratio_of_one_is_not_clipped_at_a_zero_clip():
    # r = 1 exactly with ε_low = 0: 1 − ε_low = 1 is the bound, not beyond it
    _, metrics = losses.cispo_loss(jnp.array([[-1.0, -2.0]]), None, ONES, ONES, clip_low=0.0)
    assert float(metrics["policy/clip_frac_low"]) == 0.0
    assert float(metrics["policy/clip_frac"]) == 0.0


def test_rollout_masks_keep_a_ratio_equal_to_their_bounds():
    # old == rollout: ρ = 1 exactly, inside [low, high] for low = 1 and for high = 1
    for bounds in ({"low": 1.0}, {"high": 1.0}):
        w = losses.rollout_correction_weights(ZEROS, ZEROS, ONES, mode="mask", **bounds)
        np.testing.assert_array_equal(w, [[1.0, 1.0]])


def test_gmpo_low_clip_fraction_uses_the_low_bound():
    # logr = −0.3, A < 0: below −ε_low = −0.2 (clipped low) but not below −ε_high = −0.4;
    # the pessimistic log-ratio is max(−0.3, −0.2) = −0.2, loss = e^−0.2 · 1
    loss, metrics = losses.gmpo_loss(
        jnp.array([[-0.3]]),
        jnp.zeros((1, 1)),
        -jnp.ones((1, 1)),
        jnp.ones((1, 1)),
        clip_low=0.2,
        clip_high=0.4,
    )
    assert_close(loss, np.exp(-0.2))
    assert float(metrics["policy/clip_frac_low"]) == 1.0
    assert float(metrics["policy/clip_frac"]) == 1.0


def test_shaped_advantages_never_shift_a_zero_advantage():
    # the shift is bounded by c·|A|: A = 0 stays 0; A = 1 gets +0.3 (≤ 0.5)
    shaped = losses.shaped_advantages(
        jnp.array([0.0, 1.0]), jnp.array([0.3, 0.3]), jnp.array([1, 1]), c=0.5
    )
    assert_close(shaped, [0.0, 1.3])


def test_batch_normalisation_of_sequence_weights_under_a_token_gate():
    # geometric level, gated per token at high = 2: row 0 has d = old − rollout = [1, −1] →
    # ρ_0 = e^0 = 1, but its first token's ratio e > 2 is rejected; row 1 has ρ_1 = 1. The
    # sequence weights in the mean are ρ_n of rows with a kept token: mean(1, 1) = 1, so the
    # weights stay [[1, 0], [1, 1]] (a token mean would give 3/4 and weights of 4/3)
    w = losses.rollout_correction_weights(
        jnp.zeros((2, 2)),
        jnp.array([[-1.0, 1.0], [0.0, 0.0]]),
        jnp.ones((2, 2)),
        level="geometric",
        mode="mask",
        mask_level="token",
        high=2.0,
        batch_normalize=True,
    )
    assert_close(w, [[0.0, 1.0], [1.0, 1.0]])
