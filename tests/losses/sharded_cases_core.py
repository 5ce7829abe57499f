"""Sharding cases for masked statistics, aggregation, layout and the PPO/REINFORCE losses."""

from __future__ import annotations

import numpy as np

import losses
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(7)
N, T = 16, 5
_mask = make_mask(_rng, N, T)
_x = _rng.normal(size=(N, T)).astype(np.float32)
_lp = -_rng.uniform(0.1, 3.0, size=(N, T)).astype(np.float32)
_old = (_lp + 0.3 * _rng.normal(size=(N, T))).astype(np.float32)
_adv = _rng.normal(size=(N, T)).astype(np.float32)
_segments = np.sort(_rng.integers(0, 3, size=(N, T)), axis=1).astype(np.int32)  # packed rows


def _packed_aggregate(x, mask, segment_ids):
    return losses.aggregate(x, mask, mode="seq_mean_token_mean", segment_ids=segment_ids)


CASES = [
    ShardCase("masked_sum", losses.masked_sum, (_x, _mask), {}),
    ShardCase("masked_mean_axis1", losses.masked_mean, (_x, _mask), {"axis": 1}),
    ShardCase("masked_var", losses.masked_var, (_x, _mask), {"ddof": 1}),
    ShardCase("masked_whiten", losses.masked_whiten, (_x, _mask), {"eps_mode": "std"}),
    ShardCase("broadcast_to_tokens", losses.broadcast_to_tokens, (_x[:, 0], _mask), {}),
    *[
        ShardCase(f"aggregate_{mode}", losses.aggregate, (_x, _mask), {"mode": mode})
        for mode in losses.AGG_MODES
    ],
    ShardCase("aggregate_packed", _packed_aggregate, (_x, _mask, _segments), {}),
    ShardCase(
        "ppo_clip_loss_dual",
        losses.ppo_clip_loss,
        (_lp, _old, _adv, _mask),
        {"clip_high": 0.28, "dual_clip": 3.0, "agg": "seq_mean_token_mean"},
    ),
    ShardCase("reinforce_loss", losses.reinforce_loss, (_lp, _adv, _mask), {}),
]
