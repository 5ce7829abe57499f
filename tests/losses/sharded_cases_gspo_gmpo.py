"""Sharding cases for `gspo_loss` (both levels) and `gmpo_loss` (see sharded_runner.py)."""

from __future__ import annotations

import numpy as np

from losses.gmpo import gmpo_loss
from losses.gspo import gspo_loss
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(11)
N, T = 16, 7
_mask = make_mask(_rng, N, T)
_lp = -_rng.uniform(0.1, 3.0, size=(N, T)).astype(np.float32)
_old = (_lp + 0.4 * _rng.normal(size=(N, T))).astype(np.float32)
_adv_tok = _rng.normal(size=(N, T)).astype(np.float32)
_adv_seq = np.repeat(_rng.normal(size=(N, 1)), T, axis=1).astype(np.float32)
_is_w = _rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)
_tok_w = (_rng.uniform(size=(N, T)) > 0.2).astype(np.float32)


def _gspo_weighted(lp, old, adv, mask, is_w, tok_w, **kw):
    """Weights as positional arguments, so that they are sharded too."""
    return gspo_loss(lp, old, adv, mask, is_weights=is_w, token_weights=tok_w, **kw)


def _gmpo_weighted(lp, old, adv, mask, is_w, tok_w, **kw):
    return gmpo_loss(lp, old, adv, mask, is_weights=is_w, token_weights=tok_w, **kw)


CASES = [
    ShardCase(
        "gspo_loss_sequence_token",
        _gspo_weighted,
        (_lp, _old, _adv_tok, _mask, _is_w, _tok_w),
        {},
    ),
    ShardCase(
        "gspo_loss_sequence",
        gspo_loss,
        (_lp, _old, _adv_seq, _mask),
        {"level": "sequence", "clip_low": 0.05, "clip_high": 0.08},
    ),
    ShardCase("gmpo_loss", _gmpo_weighted, (_lp, _old, _adv_seq, _mask, _is_w, _tok_w), {}),
    ShardCase(
        "gmpo_loss_clamped_num_seqs",
        gmpo_loss,
        (_lp, _old, _adv_tok, _mask),
        {"clip_low": 0.2, "clip_high": 0.2, "log_ratio_clamp": 0.5, "num_seqs": 20.0},
    ),
]
