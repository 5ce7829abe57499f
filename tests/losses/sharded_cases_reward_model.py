"""Sharding cases for the reward-model, process-reward and self-reward functions (§9, §11)."""

from __future__ import annotations

import numpy as np

from losses.process_reward import (
    aggregate_step_scores,
    implicit_prm_loss,
    implicit_process_rewards,
    mc_step_labels,
    prm_bce_loss,
    prm_mse_loss,
    scatter_step_rewards,
)
from losses.reward_model import (
    bradley_terry_loss,
    debiased_preference,
    infonce_loss,
    log_exp_pairwise_loss,
    plackett_luce_logprob,
    rewards_as_labels_loss,
    soft_bradley_terry_loss,
    verdict_probability,
    win_rate_rewards,
)
from losses.self_reward import laser_loss, laser_self_rewards, last_valid_logits, pass_at_k
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(31)
N, T, M, K, C, V, G = 16, 7, 4, 3, 5, 11, 4
B = N // G * 2  # 8 prompts for the [B,G] / [B,G,G] cases

_mask = make_mask(_rng, N, T)
_step_mask = make_mask(_rng, N, M)
_valid = (_rng.uniform(size=N) > 0.2).astype(np.float32)
_c = _rng.normal(size=N).astype(np.float32)
_r = _rng.normal(size=N).astype(np.float32)
_p = _rng.uniform(size=N).astype(np.float32)
_score = _rng.normal(size=(B, G)).astype(np.float32)
_y = (_rng.uniform(size=(B, G)) > 0.5).astype(np.float32)
_anchor = _rng.normal(size=B).astype(np.float32)
_scores = _rng.normal(size=(N, C)).astype(np.float32)
_pos = (_rng.uniform(size=(N, C)) > 0.6).astype(np.float32)
_cand = (_rng.uniform(size=(N, C)) > 0.15).astype(np.float32)
_ranking = np.stack([_rng.permutation(C)[:3] for _ in range(N)]).astype(np.int32)
_ranking[3, 2] = -1  # a padded step
_logits = _rng.normal(size=(N, V)).astype(np.float32)
_pref = _rng.uniform(size=(B, G, G)).astype(np.float32)
_counts_n = _rng.integers(1, 9, size=N).astype(np.int32)
_counts_c = np.minimum(_rng.integers(0, 9, size=N), _counts_n).astype(np.int32)
_correct = (_rng.uniform(size=(N, M, K)) > 0.5).astype(np.float32)
_step_logits = _rng.normal(size=(N, M)).astype(np.float32)
_step_labels = _rng.uniform(size=(N, M)).astype(np.float32)
_ends = np.sort(_rng.integers(-1, T, size=(N, M)), axis=1).astype(np.int32)
_lp = -_rng.uniform(0.1, 3.0, size=(N, T)).astype(np.float32)
_ref = (_lp + 0.3 * _rng.normal(size=(N, T))).astype(np.float32)
_seg = np.minimum(np.cumsum(_rng.uniform(size=(N, T)) > 0.6, axis=1), M - 1).astype(np.int32)
_seg = np.where(_mask > 0, _seg, -1).astype(np.int32)
_labels = (_rng.uniform(size=N) > 0.5).astype(np.float32)
_seq_logits = _rng.normal(size=(N, T, V)).astype(np.float32)


def _bt_valid(c, r, valid):
    return bradley_terry_loss(c, r, valid=valid, margin=0.1)


def _real(score, y, anchor):
    return rewards_as_labels_loss(score, y, anchor=anchor)


def _infonce(s, pos, valid):
    return infonce_loss(s, pos, temperature=0.5, valid=valid)


def _verdict(logits):
    return verdict_probability(logits, 2, 7)


def _scatter(score, end):
    return scatter_step_rewards(score, end, T)


def _labels_float(x, **kw):
    return mc_step_labels(x, **kw)


def _plackett_luce(s, ranking, valid):
    return plackett_luce_logprob(s, ranking, valid=valid)


def _laser(seq_logits, mask, verifier):
    """Last valid logits → self-rewards → loss, as the actor composes them."""
    z = last_valid_logits(seq_logits, mask)
    r_s = laser_self_rewards(z, token_id=3, ref_constant=-2.0, beta_v=0.5, temperature=0.7)
    return laser_loss(r_s, verifier)


def _pass_at_k(n, c):
    return pass_at_k(c, n, 3)


CASES = [
    ShardCase("bradley_terry_loss", bradley_terry_loss, (_c, _r), {"margin": 0.3}),
    ShardCase("bradley_terry_loss_valid", _bt_valid, (_c, _r, _valid), {}),
    ShardCase("log_exp_pairwise_loss", log_exp_pairwise_loss, (_c, _r), {}),
    ShardCase("soft_bradley_terry_loss", soft_bradley_terry_loss, (_c, _r, _p), {}),
    ShardCase("debiased_preference", debiased_preference, (_p, _p[::-1].copy()), {}),
    ShardCase("rewards_as_labels_loss", _real, (_score, _y, _anchor), {}),
    ShardCase("infonce_loss", _infonce, (_scores, _pos, _cand), {}),
    ShardCase("plackett_luce_logprob", _plackett_luce, (_scores, _ranking, None), {}),
    ShardCase("plackett_luce_logprob_valid", _plackett_luce, (_scores, _ranking, _cand), {}),
    ShardCase("verdict_probability", _verdict, (_logits,), {}),
    ShardCase("win_rate_rewards", win_rate_rewards, (_pref,), {}),
    ShardCase("pass_at_k", _pass_at_k, (_counts_n, _counts_c), {}),
    ShardCase("mc_step_labels_hard", _labels_float, (_correct,), {}),
    ShardCase("mc_step_labels_soft", _labels_float, (_correct,), {"mode": "soft"}),
    ShardCase("prm_bce_loss", prm_bce_loss, (_step_logits, _step_labels, _step_mask), {}),
    ShardCase(
        "prm_mse_loss",
        prm_mse_loss,
        (_step_logits, _step_labels, _step_mask),
        {"agg": "seq_mean_token_mean"},
    ),
    *[
        ShardCase(
            f"aggregate_step_scores_{how}",
            aggregate_step_scores,
            (_p[:, None] * _step_labels, _step_mask),
            {"how": how},
        )
        for how in ("min", "last", "prod", "mean")
    ],
    ShardCase("scatter_step_rewards", _scatter, (_step_logits, _ends), {}),
    ShardCase(
        "implicit_process_rewards",
        implicit_process_rewards,
        (_lp, _ref, _seg, _mask),
        {"beta": 0.05, "num_segments": M},
    ),
    ShardCase("implicit_prm_loss", implicit_prm_loss, (_lp, _ref, _mask, _labels), {"beta": 0.1}),
    ShardCase("laser", _laser, (_seq_logits, _mask, _labels), {}),
]
