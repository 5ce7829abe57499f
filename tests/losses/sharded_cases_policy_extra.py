"""Sharding cases for the extra policy losses (DPPO, DRO, DisCO, VESPO, NFT, DHPO, R²VPO and the
offline / off-policy losses of `losses/offline_pg.py`); see sharded_runner.py.

`[N,T]` inputs are sharded along `N = 16`, `[B,G]` labels and sequence values along `B = 8`
(`G = 2`), flat `[N]` sequence values along `N`; weights and masks travel as positional arrays.
"""

from __future__ import annotations

import numpy as np

from losses.disco import disco_loss
from losses.dppo import dppo_loss
from losses.dro import dro_loss
from losses.hybrid import hybrid_ratio_loss
from losses.nft import nft_loss
from losses.offline_pg import alol_loss, gated_sft_loss, mirror_descent_loss, shaped_offpolicy_loss
from losses.ratio_variance import dual_ascent_update, ratio_variance_loss
from losses.vespo import vespo_loss
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(23)
B, G, T = 8, 2, 7
N = B * G
_mask = make_mask(_rng, N, T)
_lp = np.log(_rng.uniform(0.03, 0.97, size=(N, T))).astype(np.float32)
_old = np.minimum(_lp + 0.5 * _rng.normal(size=(N, T)), -1e-3).astype(np.float32)
_adv_tok = _rng.normal(size=(N, T)).astype(np.float32)
_adv_seq = np.repeat(_rng.normal(size=(N, 1)), T, axis=1).astype(np.float32)
_is_w = _rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)
_tok_w = (_rng.uniform(size=(N, T)) > 0.2).astype(np.float32)
_mix = _rng.uniform(size=(N, T)).astype(np.float32)
_correct = _rng.integers(0, 2, size=(B, G)).astype(np.int32)
_correct[0] = [1, 0]
_seq_lp = -_rng.uniform(5.0, 20.0, size=(B, G)).astype(np.float32)
_seq_old = (_seq_lp + _rng.normal(size=(B, G))).astype(np.float32)
_seq_r = _rng.integers(0, 2, size=(B, G)).astype(np.float32)
_seq_valid = _rng.uniform(size=(B, G)) > 0.2
_flat = {
    k: v.astype(np.float32)
    for k, v in {
        "lp": -_rng.uniform(5.0, 20.0, size=N),
        "ref": 0.5 * _rng.normal(size=N),
        "r": _rng.normal(size=N),
        "v": _rng.normal(size=N),
    }.items()
}
_flat_valid = _rng.uniform(size=N) > 0.2
_n_correct = _rng.integers(0, 3, size=B).astype(np.int32)


def _dppo_weighted(lp, old, adv, mask, is_w, tok_w, **kw):
    return dppo_loss(lp, old, adv, mask, is_weights=is_w, token_weights=tok_w, **kw)


def _vespo_weighted(lp, old, adv, mask, is_w, tok_w, **kw):
    return vespo_loss(lp, old, adv, mask, is_weights=is_w, token_weights=tok_w, **kw)


def _disco_weighted(lp, old, correct, mask, tok_w, **kw):
    return disco_loss(lp, old, correct, mask, token_weights=tok_w, **kw)


def _nft_weighted(lp, old, correct, mask, is_w, **kw):
    return nft_loss(lp, old, correct, mask, is_weights=is_w, **kw)


def _hybrid_token_mix(lp, old, adv, mask, mix, tok_w, **kw):
    return hybrid_ratio_loss(lp, old, adv, mask, mix=mix, token_weights=tok_w, **kw)


def _ratio_variance_weighted(lp, old, adv, mask, is_w, **kw):
    return ratio_variance_loss(lp, old, adv, mask, is_weights=is_w, **kw)


def _shaped_weighted(lp, adv, mask, is_w, **kw):
    return shaped_offpolicy_loss(lp, adv, mask, is_weights=is_w, **kw)


def _mirror_valid(seq_lp, seq_old, r, valid, **kw):
    return mirror_descent_loss(seq_lp, seq_old, r, valid=valid, **kw)


def _alol_valid(lp, ref, r, v, valid, **kw):
    return alol_loss(lp, ref, r, v, valid=valid, **kw)


_P = (_lp, _old, _adv_tok, _mask)
CASES = [
    ShardCase("dppo_loss_tv", _dppo_weighted, (*_P, _is_w, _tok_w), {}),
    ShardCase(
        "dppo_loss_binary_kl",
        dppo_loss,
        _P,
        {"divergence": "binary_kl", "ratio_cap": None, "agg": "seq_mean_token_mean"},
    ),
    ShardCase("dro_loss", dro_loss, _P, {"beta": 0.5, "agg": "seq_mean_token_sum_norm"}),
    ShardCase("disco_loss_log_l", _disco_weighted, (_lp, _old, _correct, _mask, _tok_w), {}),
    ShardCase(
        "disco_loss_l_ratio_mean",
        disco_loss,
        (_lp, _old, _correct, _mask),
        {"score": "l_ratio", "objective": "mean", "penalty": 5.0, "num_groups": 12.0},
    ),
    ShardCase("vespo_loss", _vespo_weighted, (_lp, _old, _adv_seq, _mask, _is_w, _tok_w), {}),
    ShardCase(
        "nft_loss_token",
        _nft_weighted,
        (_lp, _old, _correct, _mask, _is_w),
        {"clamp_neg": 0.3, "clamp_pos": 0.6, "norm": "one_minus"},
    ),
    ShardCase(
        "nft_loss_sequence",
        nft_loss,
        (_lp, _old, _correct, _mask),
        {"clamp_neg": 0.3, "norm": "sqrt", "ratio_level": "sequence", "agg": "seq_mean_token_sum"},
    ),
    ShardCase(
        "hybrid_ratio_loss_scalar",
        hybrid_ratio_loss,
        _P,
        {"mix": 0.4, "seq_clip_low": 0.05, "seq_clip_high": 0.05},
    ),
    ShardCase(
        "hybrid_ratio_loss_token_mix", _hybrid_token_mix, (*_P, _mix, _tok_w), {"level": "sequence"}
    ),
    ShardCase(
        "ratio_variance_loss",
        _ratio_variance_weighted,
        (*_P, _is_w),
        {"lam": 0.7, "target": 0.05},
    ),
    ShardCase(
        "dual_ascent_update",
        dual_ascent_update,
        (np.float32(0.4), np.float32(0.3)),
        {"lr": 0.5, "target": 0.1},
    ),
    ShardCase(
        "mirror_descent_loss",
        _mirror_valid,
        (_seq_lp, _seq_old, _seq_r, _seq_valid),
        {"tau": 0.3},
    ),
    ShardCase(
        "alol_loss",
        _alol_valid,
        (_flat["lp"], _flat["lp"] + _flat["ref"], _flat["r"], _flat["v"], _flat_valid),
        {"clip": 0.2},
    ),
    ShardCase(
        "shaped_offpolicy_loss",
        _shaped_weighted,
        (_lp, _adv_tok, _mask, _is_w),
        {"gamma": 0.1, "agg": "seq_mean_token_mean"},
    ),
    ShardCase(
        "gated_sft_loss",
        gated_sft_loss,
        (_lp, _mask, _n_correct),
        {"threshold": 1, "coef": 0.5, "agg": "seq_mean_token_mean"},
    ),
]
