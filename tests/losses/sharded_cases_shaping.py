"""Sharding cases for reward shaping and combination (ALGORITHMS.md §10, §11, §4.18).

Modules: `losses/length_rewards.py`, `losses/reward_combination.py`, `losses/robust_rewards.py`,
`losses/label_free.py`, `losses/likelihood_rewards.py`, `losses/process_shaping.py`,
`losses/dynamic_sampling.py`. `[N,...]` inputs are sharded along `N` (N = 16), `[B,G,...]` inputs
along `B` (B = 8), the ensemble `[E,N]` along `E` (E = 8) and HAPO's `[P]` table along `P`
(P = 8); bool and integer outputs are cast to float32 so the runner can compare them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from losses.dynamic_sampling import dynamic_sampling_mask, keep_groups_mask, select_kept_groups
from losses.label_free import majority_vote_rewards
from losses.length_rewards import (
    accuracy_gated_rewards,
    conciseness_gated_rewards,
    drpo_positive_weights,
    hapo_history_update,
    hapo_length_rewards,
    kimi_length_rewards,
    mask_truncated,
    overlong_penalty,
    truncation_penalty,
)
from losses.likelihood_rewards import (
    followup_likelihood_rewards,
    reference_probability_rewards,
    self_aligned_rewards,
)
from losses.process_shaping import (
    clip_process_rewards,
    delta_process_rewards,
    potential_shaped_rewards,
    turn_decay_rewards,
)
from losses.reward_combination import (
    constraint_gated_rewards,
    format_gated_rewards,
    gap_rewards,
    gated_accumulated_rewards,
    rubric_rewards,
    self_correction_bonus,
    weighted_rewards,
)
from losses.robust_rewards import ENSEMBLE_MODES, ensemble_rewards, par_rewards
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(11)
B, G, T, M, K, R, E, P = 8, 2, 9, 4, 3, 5, 8, 8
N = B * G
_mask = make_mask(_rng, N, T)
_x = _rng.normal(size=(N, T)).astype(np.float32)
_lp = np.log(_rng.uniform(0.05, 1.0, size=(N, T))).astype(np.float32)
_lp2 = np.log(_rng.uniform(0.05, 1.0, size=(N, T))).astype(np.float32)
_phi = _rng.normal(size=(N, T + 1)).astype(np.float32)
_r = _rng.normal(size=N).astype(np.float32)
_r2 = _rng.normal(size=N).astype(np.float32)
_lengths = _rng.integers(1, 120, size=N).astype(np.float32)
_lengths_bg = _rng.integers(1, 120, size=(B, G)).astype(np.float32)
_lengths_bg[1] = 50.0  # equal lengths
_correct = _rng.uniform(size=N) > 0.4
_correct_bg = (_rng.uniform(size=(B, G)) > 0.4).astype(np.float32)
_valid_bg = _rng.uniform(size=(B, G)) > 0.15
_history = np.where(_rng.uniform(size=N) > 0.3, _rng.integers(20, 100, size=N), np.inf)
_history = _history.astype(np.float32)
_table = np.where(_rng.uniform(size=P) > 0.5, 60.0, np.inf).astype(np.float32)
_prompt_ids = _rng.integers(0, P, size=N).astype(np.int32)
_components = _rng.normal(size=(N, K)).astype(np.float32)
_component_valid = _rng.uniform(size=(N, K)) > 0.3
_weights = np.array([0.5, 1.0, -0.25], np.float32)  # [K]: a constant of the traced function
_met = (_rng.uniform(size=(N, R)) > 0.5).astype(np.float32)
_rubric_w = _rng.normal(size=(N, R)).astype(np.float32)
_violated = _rng.uniform(size=(N, 3)) > 0.8
_steps = _rng.normal(size=(N, M)).astype(np.float32)
_step_mask = (np.arange(M)[None, :] < _rng.integers(0, M + 1, size=N)[:, None]).astype(np.float32)
_step_mask[3, 1] = 0.0  # a hole
_refs = _rng.normal(size=(N, R)).astype(np.float32)
_ensemble = _rng.normal(size=(E, N)).astype(np.float32)
_answers = _rng.integers(0, 3, size=(B, 6)).astype(np.int32)
_answer_valid = _rng.uniform(size=(B, 6)) > 0.2
_votes = _rng.integers(0, 3, size=(B, 4)).astype(np.int32)
_followups = _rng.normal(size=(N, 4)).astype(np.float32)
_polarity = np.array([1.0, -1.0, 1.0, 0.0], np.float32)
_turn = _rng.integers(0, 4, size=N).astype(np.float32)
_reps = _rng.integers(0, 3, size=N).astype(np.float32)
_group_r = _rng.integers(0, 2, size=(B, 4)).astype(np.float32)
_group_r[2] = 1.0  # a degenerate group
_keep = _rng.uniform(size=B) > 0.4


def _as_float(fn):
    def run(*args, **kwargs):
        return jnp.asarray(fn(*args, **kwargs)).astype(jnp.float32)

    return run


def _weighted(r, valid):
    out = weighted_rewards(r, _weights, valid=valid)
    return jnp.stack([out.rewards, out.valid.astype(jnp.float32)])


def _selection(keep):
    sel = select_kept_groups(keep, num_groups=5)
    return jnp.concatenate(
        [
            sel.indices.astype(jnp.float32),
            sel.selected.astype(jnp.float32),
            jnp.stack([sel.num_kept, sel.enough]).astype(jnp.float32),
        ]
    )


def _followup(lp_f):
    return followup_likelihood_rewards(lp_f, _polarity)


def _with_valid(fn):
    def run(x, y, valid, **kwargs):
        return fn(x, y, valid=valid, **kwargs)

    return run


def _majority_valid(a, valid):
    return majority_vote_rewards(a, valid=valid)


def _majority_votes(a, votes):
    return majority_vote_rewards(a, vote_ids=votes)


def _ensemble_case(mode):
    kw = {"uwo_coef": 0.5} if mode == "uwo" else {"robust_weight": 0.3} if mode == "robust" else {}
    return ShardCase(
        f"ensemble_rewards_{mode}", ensemble_rewards, (_ensemble,), {"mode": mode, **kw}
    )


CASES = [
    ShardCase(
        "overlong_penalty", overlong_penalty, (_lengths,), {"max_length": 100, "buffer_length": 30}
    ),
    ShardCase("truncation_penalty", truncation_penalty, (_r, _correct), {"coef": 0.5}),
    ShardCase("truncation_penalty_fixed", truncation_penalty, (_r, _correct), {"coef": -0.5}),
    ShardCase("mask_truncated", mask_truncated, (_mask, _correct), {}),
    ShardCase(
        "kimi_length_rewards",
        _with_valid(kimi_length_rewards),
        (_lengths_bg, _correct_bg, _valid_bg),
        {},
    ),
    ShardCase("hapo_length_rewards", hapo_length_rewards, (_lengths, _correct, _history), {}),
    ShardCase(
        "hapo_history_update", hapo_history_update, (_table, _prompt_ids, _lengths, _correct), {}
    ),
    ShardCase(
        "accuracy_gated_rewards",
        _with_valid(accuracy_gated_rewards),
        (_correct_bg, _lengths_bg / 100.0, _valid_bg),
        {"threshold": 0.5, "lam": 0.3},
    ),
    ShardCase("conciseness_gated_rewards", conciseness_gated_rewards, (_r, _r2), {"w": 0.5}),
    ShardCase(
        "drpo_positive_weights",
        drpo_positive_weights,
        (-_lengths_bg / 100.0, _correct_bg),
        {"lam": 0.2},
    ),
    ShardCase("weighted_rewards", _weighted, (_components, _component_valid), {}),
    ShardCase("rubric_rewards", rubric_rewards, (_met, _rubric_w), {}),
    ShardCase("format_gated_rewards", format_gated_rewards, (_r, _correct), {"fail_value": -2.0}),
    ShardCase(
        "constraint_gated_rewards", constraint_gated_rewards, (_r, _violated), {"floor": -1.0}
    ),
    ShardCase(
        "gated_accumulated_rewards",
        gated_accumulated_rewards,
        (_r, _steps, _step_mask),
        {"threshold": 0.0},
    ),
    ShardCase("gap_rewards", gap_rewards, (_r, _r2), {}),
    ShardCase("self_correction_bonus", self_correction_bonus, (_r, _r2), {"alpha": 2.0}),
    ShardCase("par_rewards", par_rewards, (_r, _refs), {}),
    *[_ensemble_case(mode) for mode in ENSEMBLE_MODES],
    ShardCase(
        "majority_vote_rewards",
        _majority_valid,
        (_answers, _answer_valid),
        {},
    ),
    ShardCase(
        "majority_vote_rewards_votes",
        _majority_votes,
        (_answers, _votes),
        {},
    ),
    ShardCase("self_aligned_rewards", self_aligned_rewards, (_lp, _lp2, _mask), {}),
    ShardCase("followup_likelihood_rewards", _followup, (_followups,), {}),
    ShardCase(
        "reference_probability_rewards", reference_probability_rewards, (_lp, _mask, _lp2), {}
    ),
    ShardCase("clip_process_rewards", clip_process_rewards, (_steps, _step_mask), {"eta": 0.2}),
    ShardCase("delta_process_rewards", delta_process_rewards, (_steps, _step_mask), {}),
    ShardCase(
        "potential_shaped_rewards", potential_shaped_rewards, (_x, _phi, _mask), {"gamma": 0.9}
    ),
    ShardCase(
        "turn_decay_rewards",
        turn_decay_rewards,
        (_turn, _correct, _reps),
        {"gamma": 0.8, "lam": 0.1},
    ),
    ShardCase(
        "dynamic_sampling_mask",
        _as_float(dynamic_sampling_mask),
        (_group_r,),
        {"reward_range": (0.0, 1.0), "min_std": 0.1, "ddof": 0},
    ),
    ShardCase("keep_groups_mask", keep_groups_mask, (_mask, _keep), {}),
    ShardCase("select_kept_groups", _selection, (_keep,), {}),
]
