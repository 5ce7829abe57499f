"""Bad hyperparameters and out-of-range inputs are refused by name across the losses.

Each case was accepted before (2026-12-07 audit) and gave a silent NaN, ±inf, a sign flip or a
loss that ignored the setting: a negative or NaN `log_ratio_clamp` forced every ratio to e^c
or made the loss NaN (VESPO's silently 0), `disco_loss(num_groups=-1)` flipped the objective,
a NaN threshold closed every gate or kept no token, labels outside [0, 1] made the BCE
unbounded below, a negative turn gave a reward above 1. The float64 references of each loss are
in its own test file; these cases pin only the refusals and the two overflow repairs.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from losses import (
    anchored_group_advantages,
    awr_loss,
    cispo_loss,
    clip_cov_loss,
    disco_loss,
    gae,
    gated_sft_loss,
    high_entropy_mask,
    hybrid_ratio_loss,
    implicit_prm_loss,
    init_running_moments,
    kl_penalized_rewards,
    kl_penalized_scores,
    laser_self_rewards,
    mc_step_labels,
    normalize_rewards,
    pairwise_ppo_loss,
    pass_at_k,
    prm_bce_loss,
    running_moments_update,
    sapo_loss,
    tempo_advantages,
    tgdpo_loss,
    turn_decay_rewards,
    vespo_loss,
)

NAN = float("nan")
LP = jnp.array([[-1.0, -0.5, -2.0]])
OLD = jnp.array([[-1.2, -0.4, -2.0]])
ADV = jnp.array([[1.0, -1.0, 0.5]])
MASK = jnp.ones((1, 3))
R = np.array([[0.1, 0.5, 0.2], [0.3, 0.4, 1.0]])
ONES = np.ones((2, 3))
ENTROPY = jnp.array([[0.1, 2.0, 0.5], [1.0, 3.0, 0.2]])
PAIRS = jnp.array([[-1.0, -2.0]])

CASES = {
    "cispo negative clamp": (
        lambda: cispo_loss(LP, OLD, ADV, MASK, log_ratio_clamp=-1.0),
        r"cispo_loss: `log_ratio_clamp` must be > 0",
    ),
    "sapo NaN clamp": (
        lambda: sapo_loss(LP, OLD, ADV, MASK, log_ratio_clamp=NAN),
        r"sapo_loss: `log_ratio_clamp` must be > 0",
    ),
    "vespo NaN clamp": (
        lambda: vespo_loss(LP, OLD, ADV, MASK, log_ratio_clamp=NAN),
        r"vespo_loss: `log_ratio_clamp` must be > 0",
    ),
    "pairwise ppo negative clamp": (
        lambda: pairwise_ppo_loss(
            PAIRS, PAIRS, jnp.array([[1.0, 0.0]]), clip=0.2, log_ratio_clamp=-2.0
        ),
        r"pairwise_ppo_loss: `log_ratio_clamp` must be > 0",
    ),
    "disco negative group count": (
        lambda: disco_loss(PAIRS.T, PAIRS.T, jnp.array([[1, 0]]), jnp.ones((2, 1)), num_groups=-1),
        r"`num_groups` must be a finite number >= 0",
    ),
    "hybrid mix array above 1": (
        lambda: hybrid_ratio_loss(LP, OLD, ADV, MASK, mix=jnp.array(1.5)),
        r"`mix` must lie in \[0.0, 1.0\]",
    ),
    "hybrid NaN mix": (
        lambda: hybrid_ratio_loss(LP, OLD, ADV, MASK, mix=jnp.array(NAN)),
        r"`mix` must not be NaN",
    ),
    "entropy quantile array above 1": (
        lambda: high_entropy_mask(ENTROPY, jnp.ones((2, 3)), top_quantile=jnp.array(1.5)),
        r"`top_quantile` must lie in",
    ),
    "entropy quantile array 0": (
        lambda: high_entropy_mask(ENTROPY, jnp.ones((2, 3)), top_quantile=jnp.array(0.0)),
        r"`top_quantile` must be > 0",
    ),
    "entropy NaN threshold": (
        lambda: high_entropy_mask(ENTROPY, jnp.ones((2, 3)), threshold=NAN),
        r"`threshold` must be finite",
    ),
    "clip-cov NaN bound": (
        lambda: clip_cov_loss(LP, LP, ADV, MASK, clip_cov_lb=NAN),
        r"`clip_cov_lb` must be < `clip_cov_ub` \(neither NaN\)",
    ),
    "gated SFT NaN threshold": (
        lambda: gated_sft_loss(PAIRS, jnp.ones((1, 2)), jnp.array([0]), threshold=NAN),
        r"`threshold` must be finite",
    ),
    "TGDPO NaN alpha": (
        lambda: tgdpo_loss(R, ONES, R, ONES, R, R, alpha=NAN),
        r"`alpha` must be finite",
    ),
    "TEMPO NaN weight": (
        lambda: tempo_advantages(ONES, np.array([[1.0, 0.0]]), ONES, td_weight=NAN),
        r"`td_weight` must be finite",
    ),
    "LaSeR NaN scale": (
        lambda: laser_self_rewards(R, token_id=0, ref_constant=0.0, beta_v=NAN),
        r"`beta_v` must be finite",
    ),
    "anchored NaN anchor": (
        lambda: anchored_group_advantages(R, anchor=NAN, coef=0.1),
        r"`anchor` must be finite",
    ),
    "pass@k negative c": (lambda: pass_at_k(-1, 5, 2), r"`c` must lie in \[0"),
    "pass@k c above n": (lambda: pass_at_k(6, 5, 2), r"`c` \(correct samples\) must be <= `n`"),
    "pass@k no samples": (lambda: pass_at_k(0, 0, 1), r"`n` must lie in \[1"),
    "PRM label 2": (
        lambda: prm_bce_loss(jnp.zeros((1, 1)), 2 * jnp.ones((1, 1)), jnp.ones((1, 1))),
        r"prm_bce_loss: `labels` must lie in \[0.0, 1.0\]",
    ),
    "implicit PRM label -1": (
        lambda: implicit_prm_loss(LP, OLD, MASK, jnp.array([-1.0]), beta=0.1),
        r"implicit_prm_loss: `labels` must lie in",
    ),
    "MC labels from counts": (
        lambda: mc_step_labels(jnp.full((1, 1, 2), 3.0), mode="soft"),
        r"`rollout_correct` must lie in \[0.0, 1.0\]",
    ),
    "GAE NaN lambda array": (
        lambda: gae(R, R, ONES, lam=np.array(NAN)),
        r"`lam` must not be NaN",
    ),
    "turn decay negative turn": (
        lambda: turn_decay_rewards(
            np.array([-1.0]), np.array([1]), np.array([0.0]), gamma=0.5, lam=0.1
        ),
        r"`turn` must lie in \[0",
    ),
    "per-token gamma outside [0, 1] on a valid token": (
        lambda: gae(R, np.zeros_like(R), ONES, gamma=np.full(R.shape, -1.0), lam=0.9),
        r"gae: `gamma` must lie in \[0.0, 1.0\], got values from -1",
    ),
    "kl-penalised rewards with a negative beta": (
        lambda: kl_penalized_rewards(jnp.array([1.0]), LP, OLD, MASK, beta=-0.1),
        r"kl_penalized_rewards: `beta` must be >= 0",
    ),
    "kl-penalised scores with a NaN beta": (
        lambda: kl_penalized_scores(jnp.array([1.0]), LP, OLD, MASK, beta=NAN),
        r"kl_penalized_scores: `beta` must be >= 0",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_values_are_refused_by_name(case):
    call, message = CASES[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_padding_may_still_hold_anything():
    """The range checks read valid entries only: an unsolved row's turn of −1 (padding) and a
    masked label of 2 pass, and leave the results those of the valid entries."""
    rewards = turn_decay_rewards(
        np.array([-1.0, 1.0]), np.array([0, 1]), np.zeros(2), gamma=0.5, lam=0.1
    )
    np.testing.assert_allclose(rewards, [0.0, 0.5])
    z, mask = jnp.zeros((1, 2)), jnp.array([[1.0, 0.0]])
    padded, _ = prm_bce_loss(z, jnp.array([[1.0, 2.0]]), mask)
    np.testing.assert_allclose(padded, np.log(2.0), rtol=1e-6)


def test_awr_weights_stay_finite_and_a_constant_stream_normalises_by_one():
    """`exp(A/β)` at A/β = 100 overflowed float32 (inf, or NaN times a log-prob of 0): the
    weights stop at e^60. `normalize_rewards(eps=0)` on equal rewards divided by 0."""
    loss, _ = awr_loss(np.array([[0.0, -2.0]]), np.array([[5.0, 0.0]]), np.ones((1, 2)), beta=0.05)
    np.testing.assert_allclose(loss, 1.0)  # (e^60 · 0 + 1 · 2) / 2
    state = running_moments_update(init_running_moments(), jnp.array([1.0, 1.0, 1.0]))
    np.testing.assert_array_equal(
        normalize_rewards(jnp.array([1.0, 2.0]), state, eps=0.0), [0.0, 1.0]
    )


def test_a_per_token_gamma_is_checked_on_valid_tokens_only():
    gamma = np.array([[0.9, 0.5, 7.0], [1.0, 0.0, -3.0]])  # the padding holds anything
    mask = np.array([[1, 1, 0], [1, 1, 0]])
    out = gae(R, np.zeros_like(R), mask, gamma=gamma, lam=1.0)[0]
    assert np.all(np.isfinite(np.asarray(out)))
