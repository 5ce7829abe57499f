"""Sharding cases for SAPO, CISPO, Clip-Cov and KL-Cov (losses/sapo.py, cispo.py, covariance.py).

The covariance losses sort all tokens of the batch to select the top-k ones: on a mesh the sort
must see the whole (gathered) batch, and the selection must equal the single-device one.
"""

from __future__ import annotations

import jax
import numpy as np

from losses.cispo import cispo_loss
from losses.covariance import clip_cov_loss, kl_cov_loss
from losses.sapo import sapo_loss
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(23)
N, T = 16, 7
_mask = make_mask(_rng, N, T)
_lp = -_rng.uniform(0.05, 4.0, size=(N, T)).astype(np.float32)
_old = (_lp + 0.4 * _rng.normal(size=(N, T))).astype(np.float32)
_adv = (2.0 * _rng.normal(size=(N, T))).astype(np.float32)
_isw = _rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)


def _sapo_with_is_weights(logp, old_logp, advantages, mask, is_weights):
    """`is_weights` is keyword-only; this wrapper shards it like the other `[N,T]` inputs."""
    return sapo_loss(
        logp,
        old_logp,
        advantages,
        mask,
        is_weights=is_weights,
        tau_pos=0.7,
        tau_neg=2.0,
        agg="token_mean",
    )


CASES = [
    ShardCase("sapo_loss", sapo_loss, (_lp, _old, _adv, _mask), {}),
    ShardCase("sapo_loss_token_mean_is", _sapo_with_is_weights, (_lp, _old, _adv, _mask, _isw), {}),
    ShardCase("cispo_loss", cispo_loss, (_lp, _old, _adv, _mask), {}),
    ShardCase(
        "cispo_loss_absolute",
        cispo_loss,
        (_lp, _old, _adv, _mask),
        {"convention": "absolute", "clip_high": 1.3, "agg": "seq_mean_token_mean"},
    ),
    ShardCase("clip_cov_loss", clip_cov_loss, (_lp, _old, _adv, _mask), {"clip_cov_ratio": 0.05}),
    ShardCase(
        "clip_cov_loss_key",
        clip_cov_loss,
        (_lp, _old, _adv, _mask),
        {"clip_cov_ratio": 0.05, "key": jax.random.key(5), "agg": "seq_mean_token_sum"},
    ),
    ShardCase(
        "kl_cov_loss",
        kl_cov_loss,
        (_lp, _old, _adv, _mask),
        {"kl_cov_ratio": 0.05, "ppo_kl_coef": 0.5},
    ),
]
