"""Sharding cases for rollout/token selection, advantage transforms and the Beta tracker.

Modules: `losses/rollout_selection.py`, `losses/token_selection.py`,
`losses/advantage_transforms.py`, `losses/tracker.py`. `[N,...]` inputs are sharded along `N`
(N = 16), `[B,G,...]` inputs along `B` (B = 8), the tracker's `[P]` state along `P` (P = 24).
Boolean selections are cast to float32 so the runner can compare (and differentiate) them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from losses.advantage_transforms import (
    anchored_group_advantages,
    planning_token_advantages,
    risk_weights,
    shaped_advantages,
    sign_weighted_advantages,
    token_advantage_reweight,
)
from losses.rollout_selection import best_worst_mask, rollout_downsample_mask
from losses.token_selection import conflict_token_mask, token_downsample_mask, token_rejection_mask
from losses.tracker import (
    BetaTrackerState,
    beta_tracker_update,
    tracker_advantages,
    tracker_baseline,
)
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(31)
B, G, T, P = 8, 4, 9, 24
N = B * G
_mask = make_mask(_rng, N, T)
_adv_tok = _rng.normal(size=(N, T)).astype(np.float32)
_H = _rng.gamma(2.0, 0.5, size=(N, T)).astype(np.float32)
_plan = _rng.uniform(size=(N, T)) < 0.3
_thr = _rng.normal(size=(N, T)).astype(np.float32)
_adv_grp = _rng.normal(size=(B, G)).astype(np.float32)
_binary = _rng.integers(0, 2, size=(B, G)).astype(np.float32)
_valid = _rng.uniform(size=(B, G)) > 0.2
_bonus = _rng.normal(size=(B, G)).astype(np.float32)
_tokens = _rng.integers(0, 3, size=(B, G, T)).astype(np.int32)
_tok_mask = _mask.reshape(B, G, T)
_ids = _rng.integers(0, P, size=N).astype(np.int32)
_ids[3] = P + 5  # out of range: ignored
_r = _rng.integers(0, 2, size=N).astype(np.float32)
_alpha = _rng.uniform(0.5, 4.0, size=P).astype(np.float32)
_beta = _rng.uniform(0.5, 4.0, size=P).astype(np.float32)
_rho = _rng.uniform(0.5, 1.0, size=P).astype(np.float32)


def _as_float(fn):
    def run(*args, **kwargs):
        return fn(*args, **kwargs).astype(jnp.float32)

    return run


def _conflict(adv, tokens, m):
    return conflict_token_mask(tokens, m, adv).astype(jnp.float32)


def _sign_weighted(adv, select, m):
    return sign_weighted_advantages(adv, pos_weight=0.1, neg_weight=1.5, select=select, mask=m)


def _planning(adv, plan, m):
    return planning_token_advantages(adv, plan, alpha=0.2, mask=m)


def _thr_reweight(adv, thr, m):
    return token_advantage_reweight(adv, thr, p=-0.4, mask=m)


def _anchored(r, valid):
    return anchored_group_advantages(r, anchor=0.5, coef=0.3, valid=valid)


def _risk(r, valid):
    return risk_weights(r, alphas=(0.25, 0.75), weights=(0.6, 0.4), valid=valid)


def _tracker_update(r, ids, alpha, beta, rho):
    state = beta_tracker_update(BetaTrackerState(alpha, beta), ids, r, discount=rho)
    return jnp.stack(state)


def _tracker_update_scalar_discount(r, ids, alpha, beta):
    state = beta_tracker_update(BetaTrackerState(alpha, beta), ids, r, discount=0.9)
    return jnp.stack(state)


def _tracker_advantages(r, ids, alpha, beta):
    return tracker_advantages(BetaTrackerState(alpha, beta), ids, r)


def _tracker_baseline(alpha, beta, ids):
    return tracker_baseline(BetaTrackerState(alpha, beta), ids)


CASES = [
    *[
        ShardCase(
            f"rollout_downsample_mask_k{k}", _as_float(rollout_downsample_mask), (a,), {"k": k}
        )
        for k, a in ((1, _adv_grp), (2, _adv_grp), (3, _binary), (4, _adv_grp))
    ],
    ShardCase("best_worst_mask", _as_float(best_worst_mask), (_adv_grp,), {"valid": None}),
    ShardCase(
        "token_downsample_mask",
        _as_float(token_downsample_mask),
        (_adv_tok, _H, _mask),
        {"keep_frac": 0.3},
    ),
    ShardCase(
        "token_downsample_mask_threshold",
        _as_float(token_downsample_mask),
        (_adv_tok, _H, _mask),
        {"keep_frac": 0.3, "threshold": 0.8},
    ),
    ShardCase(
        "token_rejection_mask",
        _as_float(token_rejection_mask),
        (_H, _mask),
        {"max_reject": 0.08},
    ),
    ShardCase("conflict_token_mask", _conflict, (_adv_grp, _tokens, _tok_mask), {}),
    ShardCase("sign_weighted_advantages", _sign_weighted, (_adv_tok, _plan, _mask), {}),
    ShardCase("planning_token_advantages", _planning, (_adv_tok, _plan, _mask), {}),
    ShardCase("token_advantage_reweight", _thr_reweight, (_adv_tok, _thr, _mask), {}),
    ShardCase(
        "shaped_advantages",
        shaped_advantages,
        (_adv_grp, _bonus, _binary),
        {"c": 0.5},
    ),
    ShardCase("anchored_group_advantages", _anchored, (_binary, _valid), {}),
    ShardCase("risk_weights", _risk, (_adv_grp, _valid), {}),
    ShardCase("beta_tracker_update", _tracker_update, (_r, _ids, _alpha, _beta, _rho), {}),
    ShardCase(
        "beta_tracker_update_scalar_discount",
        _tracker_update_scalar_discount,
        (_r, _ids, _alpha, _beta),
        {},
    ),
    ShardCase("tracker_advantages", _tracker_advantages, (_r, _ids, _alpha, _beta), {}),
    ShardCase("tracker_baseline", _tracker_baseline, (_alpha, _beta, _ids), {}),
]
