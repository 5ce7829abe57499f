"""Sharding cases for credit assignment beyond the sequence.

Modules: `losses/segments.py`, `losses/step_credit.py`, `losses/tree_credit.py`,
`losses/token_baseline.py`, `losses/step_losses.py`. `[N,...]` inputs are sharded along `N`
(N = 16), `[B,G,...]` inputs along `B` (B = 8); integer outputs are cast to float32 so the runner
can compare (and differentiate) them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from losses.segments import (
    SEGMENT_OPS,
    divergence_suffix_mask,
    multi_turn_loss_mask,
    run_length_segments,
    segment_broadcast,
    segment_ids_from_boundaries,
    segment_reduce,
    segment_standardize,
    turn_ids_from_roles,
)
from losses.step_credit import (
    anchor_state_advantages,
    budget_weighted_returns,
    critique_token_rewards,
    dual_level_advantages,
    information_gain_rewards,
    sibling_advantages,
    step_advantages,
    step_min_form_returns,
)
from losses.step_losses import (
    awr_loss,
    direct_advantage_step_loss,
    progress_attribution_loss,
    soft_bellman_losses,
)
from losses.token_baseline import optimal_token_baseline_advantages
from losses.tree_credit import prefix_tree_values, tempo_advantages
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(5)
B, G, T, M, K = 8, 2, 9, 4, 3
N = B * G
_mask = make_mask(_rng, N, T)
_x = _rng.normal(size=(N, T)).astype(np.float32)
_is_end = (_rng.uniform(size=(N, T)) < 0.3).astype(np.int32)
_seg = np.where(_mask > 0, np.minimum(np.cumsum(_is_end, 1) - _is_end, M), -1).astype(np.int32)
_y = _rng.normal(size=(N, M)).astype(np.float32)
_step_mask = (np.arange(M)[None, :] < _rng.integers(0, M + 1, size=N)[:, None]).astype(np.float32)
_V = _rng.normal(size=(N, M + 1)).astype(np.float32)
_ids = _rng.integers(0, 3, size=(N, M)).astype(np.int32)
_roles = _rng.integers(0, 4, size=(N, T)).astype(np.int32)
_tok_a = _rng.integers(0, 3, size=(N, T)).astype(np.int32)
_tok_b = np.where(np.arange(T)[None, :] < 4, _tok_a, _rng.integers(0, 3, size=(N, T)))
_tok_b = _tok_b.astype(np.int32)
_tokens = _rng.integers(0, 2, size=(B, G, T)).astype(np.int32)
_s = _rng.integers(0, 2, size=(B, G)).astype(np.float32)
_old = np.log(_rng.uniform(0.05, 1.0, size=(N, T))).astype(np.float32)
_lsp = np.log(_rng.uniform(0.05, 1.0, size=(N, T))).astype(np.float32)
_is = _rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)
_flat = _rng.normal(size=40).astype(np.float32)
_task = _rng.integers(0, 4, size=40).astype(np.int32)
_votes = _rng.integers(0, 2, size=(N, M + 1, K)).astype(np.float32)
_children = _rng.normal(size=(N, 5)).astype(np.float32)
_child_valid = _rng.uniform(size=(N, 5)) > 0.2
_budget_r = _rng.integers(0, 2, size=(N, 8)).astype(np.float32)
_prior = (np.arange(1, 9) / 36.0).astype(np.float32)  # [J=8]: sharded too, against the rows


def _reduce(op):
    def run(x, seg, m):
        y, present = segment_reduce(x, seg, m, num_segments=M, op=op)
        return jnp.stack([y, present])

    return run


def _as_float(fn):
    def run(*args, **kwargs):
        return fn(*args, **kwargs).astype(jnp.float32)

    return run


def _otb(r, m, old, lsp, rho, **kw):
    return jnp.stack(optimal_token_baseline_advantages(r, m, old, lsp, G=G, is_weights=rho, **kw))


def _tree_then_tempo(tokens, m, s):
    values = prefix_tree_values(tokens, m, s, chunk_size=4)
    return jnp.stack([values.reshape(N, T), tempo_advantages(values, s, m, td_weight=0.5)])


def _soft_bellman(lp, ref, v, R, m):
    return soft_bellman_losses(lp, ref, v, R, m, beta=0.1, value_coef=0.5)


def _sibling(v, valid):
    return sibling_advantages(v, valid, scale="group")


CASES = [
    ShardCase(
        "segment_ids_from_boundaries",
        _as_float(segment_ids_from_boundaries),
        (_is_end, _mask),
        {},
    ),
    *[ShardCase(f"segment_reduce_{op}", _reduce(op), (_x, _seg, _mask), {}) for op in SEGMENT_OPS],
    ShardCase("segment_broadcast", segment_broadcast, (_y, _seg, _mask), {}),
    ShardCase(
        "segment_standardize", segment_standardize, (_flat, _task), {"num_tasks": 4, "ddof": 0}
    ),
    ShardCase(
        "run_length_segments",
        _as_float(run_length_segments),
        (_ids % 2, _step_mask),
        {},
    ),
    ShardCase(
        "multi_turn_loss_mask", multi_turn_loss_mask, (_mask, _roles), {"trainable_roles": (2, 3)}
    ),
    ShardCase(
        "turn_ids_from_roles",
        _as_float(turn_ids_from_roles),
        (_roles, _mask),
        {"trainable_roles": 2},
    ),
    ShardCase("divergence_suffix_mask", divergence_suffix_mask, (_tok_a, _tok_b, _mask), {}),
    ShardCase("step_advantages", step_advantages, (_V, _step_mask), {}),
    ShardCase("information_gain_rewards", information_gain_rewards, (_V, _step_mask), {}),
    ShardCase("sibling_advantages", _sibling, (_children, _child_valid), {}),
    ShardCase("anchor_state_advantages", anchor_state_advantages, (_y, _ids, _step_mask), {"G": G}),
    ShardCase(
        "anchor_state_advantages_none",
        anchor_state_advantages,
        (_y, _ids, _step_mask),
        {"G": G, "scale": "none"},
    ),
    ShardCase(
        "dual_level_advantages",
        dual_level_advantages,
        (_V[:, 0], _y, _step_mask),
        {"step_weight": 0.7},
    ),
    ShardCase(
        "step_min_form_returns", step_min_form_returns, (_x, _seg, _mask), {"num_segments": M}
    ),
    ShardCase(
        "critique_token_rewards",
        critique_token_rewards,
        (_V[:, 0], _votes, _seg, _mask),
        {"threshold": 2, "penalty": 0.5},
    ),
    ShardCase("budget_weighted_returns", budget_weighted_returns, (_budget_r, _prior), {}),
    ShardCase("prefix_tree_values_then_tempo", _tree_then_tempo, (_tokens, _mask, _s), {}),
    ShardCase("optimal_token_baseline", _otb, (_x, _mask, _old, _lsp, _is), {}),
    ShardCase(
        "optimal_token_baseline_ordinal",
        _otb,
        (_x, _mask, _old, _lsp, _is),
        {"positions": "valid_ordinal", "handle_zero_tail": True},
    ),
    ShardCase(
        "progress_attribution_loss", progress_attribution_loss, (_y, _step_mask, _V[:, 0]), {}
    ),
    ShardCase("soft_bellman_losses", _soft_bellman, (_old, _lsp, _x, _V[:, 0], _mask), {}),
    ShardCase(
        "direct_advantage_step_loss",
        direct_advantage_step_loss,
        (_y, _V[:, :M], _step_mask),
        {"beta": 0.5},
    ),
    ShardCase(
        "awr_loss",
        awr_loss,
        (_y, _V[:, :M], _step_mask),
        {"beta": 2.0, "max_weight": 3.0, "agg": "seq_mean_token_mean"},
    ),
]
