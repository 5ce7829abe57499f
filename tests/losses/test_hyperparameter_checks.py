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
    clip_bound_grid,
    clip_cov_loss,
    disco_loss,
    gae,
    gated_sft_loss,
    hapo_history_update,
    high_entropy_mask,
    hybrid_ratio_loss,
    implicit_prm_loss,
    init_running_moments,
    kl_penalized_rewards,
    kl_penalized_scores,
    laser_self_rewards,
    ld_sequence_logprob,
    masked_quantile,
    mc_step_labels,
    normalize_rewards,
    pairwise_ppo_loss,
    pass_at_k,
    prm_bce_loss,
    running_moments_update,
    sapo_loss,
    segment_broadcast,
    soft_bradley_terry_loss,
    tempo_advantages,
    tgdpo_loss,
    token_logprobs,
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
    # 2026-12-07 input fuzz: silently NaN / inf / dropped before
    "quantile level above 1": (
        lambda: masked_quantile(ENTROPY, ENTROPY > 0, 1.5),
        r"masked_quantile: `q` must lie in \[0.0, 1.0\]",
    ),
    "NaN quantile level": (
        lambda: masked_quantile(ENTROPY, ENTROPY > 0, NAN),
        r"masked_quantile: `q` must not be NaN",
    ),
    "HAPO prompt id beyond the table": (
        lambda: hapo_history_update(
            jnp.full((2,), jnp.inf), jnp.array([0, 2]), jnp.array([4, 3]), jnp.array([1, 1])
        ),
        r"hapo_history_update: `prompt_ids` must lie in \[-inf, 1\], got values from 0 to 2",
    ),
    "segment id beyond y on a valid token": (
        lambda: segment_broadcast(jnp.ones((1, 1)), jnp.array([[0, 1]]), jnp.ones((1, 2))),
        r"segment_broadcast: `segment_ids` must lie in \[-inf, 0\]",
    ),
    "clip grid of step 0": (lambda: clip_bound_grid(0.6, 0.8, 0.0), r"`step` must be > 0"),
    "clip grid of negative step": (lambda: clip_bound_grid(0.6, 0.8, -0.05), r"`step` must be > 0"),
    "clip grid with a NaN end": (
        lambda: clip_bound_grid(0.6, NAN, 0.05),
        r"clip_bound_grid: `stop` must be a finite Python number",
    ),
    "per-row temperature": (
        lambda: token_logprobs(
            jnp.zeros((2, 3, 5)), jnp.zeros((2, 3), int), temperature=ONES[:, 0]
        ),
        r"token_logprobs: `temperature` must be a scalar .*got shape \(2,\)",
    ),
    "soft Bradley-Terry probability above 1": (
        lambda: soft_bradley_terry_loss(jnp.array([1.0]), jnp.array([0.0]), 1.5),
        r"soft_bradley_terry_loss: `prob` must lie in \[0.0, 1.0\]",
    ),
    "LD-DPO NaN alpha": (
        lambda: ld_sequence_logprob(ONES, ONES, ONES, ONES, alpha=NAN),
        r"ld_sequence_logprob: `alpha` must not be NaN",
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


def test_a_quantiles_mask_of_any_dtype_counts_like_the_bool_mask():
    """`where(valid, ...)` read any non-zero as valid while the count summed the raw values: a
    {0, 1} float or int mask times 0.5 or 2 gave inf or NaN."""
    x = jnp.array([0.1, 2.0, 0.5, 1.0, 3.0, 0.2, 9.0])
    valid = x < 5.0
    expected = np.quantile(np.asarray(x)[np.asarray(valid)], 0.5)
    for mask in (valid, valid.astype(jnp.float32), 0.5 * valid, 2 * valid.astype(jnp.int32)):
        np.testing.assert_allclose(masked_quantile(x, mask, 0.5), expected, rtol=1e-6)


def test_negative_ids_are_still_padding():
    """HAPO's −1 prompt id and a segment id of −1 mean "none": ignored, not an error."""
    table = hapo_history_update(
        jnp.full((3,), jnp.inf), jnp.array([0, -1, 2]), jnp.array([40, 30, 90]), jnp.ones(3)
    )
    np.testing.assert_array_equal(table, [40.0, np.inf, 90.0])
    out = segment_broadcast(jnp.array([[0.5]]), jnp.array([[0, -1, 3]]), jnp.array([[1, 1, 0]]))
    np.testing.assert_array_equal(out, [[0.5, 0.0, 0.0]])  # 3 is on a masked token
