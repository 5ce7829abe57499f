"""Sharding cases for token-level returns and advantages (losses/returns.py)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from losses.returns import (
    discounted_returns,
    gae,
    min_form_returns,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
)
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(11)
B, G, T = 8, 2, 7
N = B * G
_mask = make_mask(_rng, N, T)
_r = _rng.normal(size=(N, T)).astype(np.float32)
_v = _rng.normal(size=(N, T)).astype(np.float32)
_gamma = _rng.uniform(0.5, 1.0, size=(N, T)).astype(np.float32)
_s = _rng.normal(size=(B, G)).astype(np.float32)
_valid = np.ones((B, G), bool)
_valid[1, 0] = False
_b = _rng.normal(size=(N,)).astype(np.float32)
_step_mask = (_rng.uniform(size=(N, T)) < 0.4).astype(np.float32)


def _gae_stacked(r, v, m, g=None, **kw):
    """`gae` as one array `[2,N,T]` (advantages, returns), so the runner can sum it."""
    if g is not None:
        kw["gamma"] = g
    return jnp.stack(gae(r, v, m, **kw))


def _discounted_token_gamma(r, m, g):
    return discounted_returns(r, m, gamma=g)


def _baseline_with_valid(s, m, valid):
    return reinforce_pp_baseline_advantages(s, m, valid=valid, singleton="raw")


def _min_form_with_completion(r, step_mask, completion):
    return min_form_returns(r, step_mask, completion_mask=completion)


CASES = [
    ShardCase("discounted_returns", discounted_returns, (_r, _mask), {"gamma": 0.9}),
    ShardCase("discounted_returns_token_gamma", _discounted_token_gamma, (_r, _mask, _gamma), {}),
    ShardCase("gae_skip", _gae_stacked, (_r, _v, _mask), {"gamma": 0.9, "lam": 0.95}),
    ShardCase(
        "gae_standard_token_gamma",
        _gae_stacked,
        (_r, _v, _mask, _gamma),
        {"lam": 0.95, "skip_masked": False},
    ),
    ShardCase("reinforce_pp", reinforce_pp_advantages, (_r, _mask), {"gamma": 0.99}),
    ShardCase(
        "reinforce_pp_openrlhf_reset",
        reinforce_pp_advantages,
        (_r, _mask),
        {"masked_carry": False, "whiten_ddof": 0, "whiten_eps_mode": "max"},
    ),
    ShardCase("reinforce_pp_baseline", reinforce_pp_baseline_advantages, (_s, _mask), {}),
    ShardCase("reinforce_pp_baseline_valid", _baseline_with_valid, (_s, _mask, _valid), {}),
    ShardCase("remax", remax_advantages, (_r, _b, _mask), {}),
    ShardCase("min_form_returns", min_form_returns, (_r, _step_mask), {}),
    ShardCase(
        "min_form_returns_completion", _min_form_with_completion, (_r, _step_mask, _mask), {}
    ),
]
