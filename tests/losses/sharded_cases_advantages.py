"""Sharding cases for the group advantage estimators (`losses/advantages.py`).

`[B,G]` inputs are sharded along `B` (B = 8 or 16), flat `[N]` inputs along `N` (N = 40); `valid`
masks and lengths travel as positional arrays, options as static keywords.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from losses.advantages import (
    bnpo_advantages,
    gdpo_advantages,
    gpg_advantages,
    group_advantage_metrics,
    group_advantages,
    group_advantages_flat,
    opo_advantages,
    passk_advantages,
    rloo_advantages,
    rloo_advantages_flat,
    zero_variance_mask,
)
from tests.losses.helpers import ShardCase

_rng = np.random.default_rng(11)
B, G, K = 16, 5, 3
_s = _rng.normal(size=(B, G)).astype(np.float32)
_s[3] = 0.25  # zero variance
_s[5] = _rng.integers(0, 2, size=G)
_valid = _rng.uniform(size=(B, G)) > 0.2
_valid[0] = [True, False, False, False, False]  # a single valid sample
_valid[9] = False
_binary = _rng.integers(0, 2, size=(B, G)).astype(np.float32)
_lengths = _rng.integers(1, 30, size=(B, G)).astype(np.int32)
_multi = _rng.normal(size=(B, G, K)).astype(np.float32)
_N = 40
_flat = _rng.normal(size=_N).astype(np.float32)
_ids = _rng.integers(-1, 9, size=_N).astype(np.int32)  # ragged, unordered, some out of range
_flat_valid = _rng.uniform(size=_N) > 0.1


def _group_valid(r, v, **kw):
    return group_advantages(r, valid=v, **kw)


def _rloo_valid(r, v, **kw):
    return rloo_advantages(r, valid=v, **kw)


def _opo_valid(r, lengths, v, **kw):
    return opo_advantages(r, lengths, valid=v, **kw)


def _gdpo_valid(r, v, **kw):
    return gdpo_advantages(r, valid=v, weights=jnp.array([1.0, 0.5, -2.0]), **kw)


def _zvm_float(r, v, **kw):
    return zero_variance_mask(r, valid=v, **kw).astype(jnp.float32)


def _metrics_stacked(r, v):
    metrics = group_advantage_metrics(r, valid=v)
    return jnp.stack([metrics[k] for k in sorted(metrics)])


def _group_flat_valid(r, ids, v, **kw):
    return group_advantages_flat(r, ids, valid=v, **kw)


def _rloo_flat_valid(r, ids, v, **kw):
    return rloo_advantages_flat(r, ids, valid=v, **kw)


CASES = [
    *[
        ShardCase(f"group_advantages_{scale}", _group_valid, (_s, _valid), {"scale": scale})
        for scale in ("group", "batch", "none")
    ],
    ShardCase(
        "group_advantages_raw_ddof0",
        _group_valid,
        (_s, _valid),
        {"singleton": "raw", "ddof": 0, "eps": 1e-4},
    ),
    ShardCase("rloo_advantages", _rloo_valid, (_s, _valid), {}),
    ShardCase("rloo_advantages_batch_norm", _rloo_valid, (_s, _valid), {"normalize": "batch"}),
    ShardCase("gpg_advantages", gpg_advantages, (_s,), {}),
    ShardCase("gpg_advantages_nonzero_adv", gpg_advantages, (_s,), {"count": "nonzero_advantage"}),
    ShardCase("passk_advantages", passk_advantages, (_s,), {}),
    ShardCase("opo_advantages", _opo_valid, (_s, _lengths, _valid), {"singleton": "raw"}),
    ShardCase("bnpo_advantages_matched", bnpo_advantages, (_binary,), {}),
    ShardCase("bnpo_advantages_fixed", bnpo_advantages, (_binary,), {"alpha": 1.5, "beta": 2.0}),
    ShardCase("gdpo_advantages", _gdpo_valid, (_multi, _valid), {}),
    ShardCase("zero_variance_mask", _zvm_float, (_s, _valid), {}),
    ShardCase("zero_variance_mask_min_std", _zvm_float, (_s, _valid), {"min_std": 0.5}),
    ShardCase("group_advantage_metrics", _metrics_stacked, (_s, _valid), {}),
    ShardCase(
        "group_advantages_flat",
        _group_flat_valid,
        (_flat, _ids, _flat_valid),
        {"num_groups": 8},
    ),
    ShardCase(
        "group_advantages_flat_batch",
        _group_flat_valid,
        (_flat, _ids, _flat_valid),
        {"num_groups": 8, "scale": "batch", "singleton": "raw"},
    ),
    ShardCase(
        "rloo_advantages_flat",
        _rloo_flat_valid,
        (_flat, _ids, _flat_valid),
        {"num_groups": 8, "normalize": "batch"},
    ),
]
