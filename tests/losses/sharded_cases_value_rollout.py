"""Sharding cases for the value loss, running moments, rollout correction, entropy masks and BAPO."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from losses.bapo import bapo_clip_bounds, bapo_loss
from losses.entropy_mask import high_entropy_mask
from losses.rollout_correction import (
    off_policy_sequence_mask,
    rollout_correction_weights,
    rollout_mismatch_metrics,
    rollout_rejection_mask,
)
from losses.value import (
    RunningMoments,
    init_running_moments,
    normalize_rewards,
    running_moments_update,
    value_loss,
)
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(23)
N, T = 16, 7
_mask = make_mask(_rng, N, T)
_v = _rng.normal(size=(N, T)).astype(np.float32)
_old_v = (_v + 0.4 * _rng.normal(size=(N, T))).astype(np.float32)
_ret = _rng.normal(size=(N, T)).astype(np.float32)
_roll = -_rng.uniform(0.1, 3.0, size=(N, T)).astype(np.float32)
_old = (_roll + 0.5 * _rng.normal(size=(N, T))).astype(np.float32)
_lp = (_old + 0.35 * _rng.normal(size=(N, T))).astype(np.float32)
_adv = _rng.normal(size=(N, T)).astype(np.float32)  # BAPO raises c_hi to 1.35 here
_H = _rng.gamma(2.0, 0.5, size=(N, T)).astype(np.float32)


def _moments(x, m):
    """`running_moments_update` from the empty state, as one array `[3]`."""
    return jnp.stack(running_moments_update(init_running_moments(), x, m))


def _normalized(x, m, count, mean, m2):
    return normalize_rewards(x, RunningMoments(count, mean, m2), clip=2.0, mask=m)


def _mismatch(old, roll, m):
    """`rollout_mismatch_metrics` as `(scalar, metrics)` so the runner can differentiate it."""
    w = rollout_correction_weights(old, roll, m, mode="mask", low=0.5, high=2.0)
    metrics = rollout_mismatch_metrics(old, roll, m, weights=w)
    return metrics["rollout/k1"], metrics


def _off_policy(lp, roll, adv, m):
    """`off_policy_sequence_mask` with per-token and per-sequence advantages, stacked."""
    per_token = off_policy_sequence_mask(lp, roll, adv, m, threshold=0.05)
    per_seq = off_policy_sequence_mask(lp, roll, adv[:, 0], m, threshold=0.05)
    return jnp.concatenate([per_token, per_seq], axis=1)


def _entropy_mask(H, m, **kw):
    return high_entropy_mask(H, m, **kw).astype(jnp.float32)


CASES = [
    ShardCase("value_loss", value_loss, (_v, _old_v, _ret, _mask), {"clip": 0.2}),
    ShardCase(
        "value_loss_unclipped",
        value_loss,
        (_v, None, _ret, _mask),
        {"clip": None, "agg": "seq_mean_token_mean"},
    ),
    ShardCase("running_moments_update", _moments, (_ret, _mask), {}),
    ShardCase(
        "normalize_rewards",
        _normalized,
        (_ret, _mask, np.float32(20.0), np.float32(0.3), np.float32(31.0)),
        {},
    ),
    *[
        ShardCase(f"rollout_weights_{name}", rollout_correction_weights, (_old, _roll, _mask), kw)
        for name, kw in {
            "token": {},
            "sequence_mask": {"level": "sequence", "mode": "mask", "high": 3.0},
            "geometric_gate": {"mode": "mask", "mask_level": "geometric", "low": 0.5, "high": 5.0},
            "token_norm": {"batch_normalize": True},
            "sequence_norm": {"level": "sequence", "batch_normalize": True},
        }.items()
    ],
    ShardCase(
        "rollout_rejection_mask",
        rollout_rejection_mask,
        (_old, _roll, _mask),
        {"criteria": (("token_k1", -1.0, 1.0), ("seq_mean_k3", None, 0.2))},
    ),
    ShardCase("rollout_mismatch_metrics", _mismatch, (_old, _roll, _mask), {}),
    ShardCase("off_policy_sequence_mask", _off_policy, (_lp, _roll, _adv, _mask), {}),
    ShardCase("high_entropy_mask", _entropy_mask, (_H, _mask), {"top_quantile": 0.2}),
    ShardCase("high_entropy_mask_threshold", _entropy_mask, (_H, _mask), {"threshold": 1.0}),
    ShardCase("bapo_clip_bounds", bapo_clip_bounds, (_lp, _old, _adv, _mask), {}),
    ShardCase(  # here BAPO raises c_lo to 0.75
        "bapo_clip_bounds_low", bapo_clip_bounds, (_lp, _old, _adv + 0.2, _mask), {}
    ),
    ShardCase("bapo_loss", bapo_loss, (_lp, _old, _adv, _mask), {"agg": "seq_mean_token_mean"}),
]
