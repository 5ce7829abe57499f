"""Sharding cases for log-probs, entropies, KL estimators, KL rewards/control and full_kl."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from losses.kl import (
    KLControllerState,
    adaptive_kl_controller,
    adaptive_kl_update,
    fixed_kl_controller,
    full_kl,
    kl_estimate,
    kl_loss,
    kl_penalized_rewards,
    kl_penalized_scores,
)
from losses.logprobs import (
    completion_logits,
    entropy_from_logits,
    log_sum_pi_squared,
    self_certainty,
    sequence_logprob,
    token_logprobs,
)
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(11)
N, T, V, P = 16, 7, 11, 3
_mask = make_mask(_rng, N, T)
_logits = (2.0 * _rng.normal(size=(N, T, V))).astype(np.float32)
_logits_q = (2.0 * _rng.normal(size=(N, T, V))).astype(np.float32)
_seq_logits = _rng.normal(size=(N, P + T, V)).astype(np.float32)
_targets = _rng.integers(0, V, size=(N, T)).astype(np.int32)
_lp = -_rng.uniform(0.1, 3.0, size=(N, T)).astype(np.float32)
_ref = (_lp + 0.5 * _rng.normal(size=(N, T))).astype(np.float32)
_old = (_lp + 0.2 * _rng.normal(size=(N, T))).astype(np.float32)
_scores = _rng.normal(size=(N,)).astype(np.float32)


def _adaptive_controller_step(beta, current_kl):
    ctrl = adaptive_kl_controller(0.001)
    return ctrl.update(KLControllerState(jnp.asarray(beta)), current_kl, 256).beta


def _fixed_controller_step(beta, current_kl):
    ctrl = fixed_kl_controller(0.05)
    return ctrl.update(KLControllerState(jnp.asarray(beta)), current_kl, 256).beta


CASES = [
    ShardCase("token_logprobs", token_logprobs, (_logits, _targets), {"temperature": 0.8}),
    ShardCase(
        "token_logprobs_chunked_masked",
        token_logprobs,
        (_logits, _targets),
        {"chunk_size": 3, "mask": _mask},
    ),
    ShardCase("entropy_from_logits_chunked", entropy_from_logits, (_logits,), {"chunk_size": 2}),
    ShardCase("log_sum_pi_squared", log_sum_pi_squared, (_logits,), {"temperature": 1.3}),
    ShardCase("self_certainty_chunked", self_certainty, (_logits, _mask), {"chunk_size": 4}),
    ShardCase("sequence_logprob_sum", sequence_logprob, (_lp, _mask), {}),
    ShardCase("sequence_logprob_mean", sequence_logprob, (_lp, _mask), {"reduce": "mean"}),
    ShardCase("completion_logits", completion_logits, (_seq_logits,), {"P": P, "T": T}),
    *[
        ShardCase(f"kl_estimate_{est}", kl_estimate, (_lp, _ref), {"estimator": est, "mask": _mask})
        for est in ("k1", "k2", "k3", "abs")
    ],
    ShardCase(
        "kl_estimate_k3_straight_through",
        kl_estimate,
        (_lp, _ref),
        {"estimator": "k3", "straight_through": True, "clamp": 10.0},
    ),
    ShardCase("kl_loss", kl_loss, (_lp, _ref, _mask), {}),
    ShardCase(
        "kl_loss_is_correction_seq_mean",
        kl_loss,
        (_lp, _ref, _mask),
        {"is_correction": True, "old_logp": _old, "agg": "seq_mean_token_mean"},
    ),
    ShardCase(
        "kl_penalized_rewards_last",
        kl_penalized_rewards,
        (_scores, _old, _ref, _mask),
        {"beta": 0.05},
    ),
    ShardCase(
        "kl_penalized_rewards_after_last_k3",
        kl_penalized_rewards,
        (_scores, _old, _ref, _mask),
        {"beta": 0.05, "estimator": "k3", "score_position": "after_last"},
    ),
    ShardCase(
        "kl_penalized_scores", kl_penalized_scores, (_scores, _old, _ref, _mask), {"beta": 0.1}
    ),
    ShardCase("adaptive_kl_update", adaptive_kl_update, (0.001, 0.15, 256), {}),
    ShardCase("adaptive_kl_controller", _adaptive_controller_step, (0.001, 0.15), {}),
    ShardCase("fixed_kl_controller", _fixed_controller_step, (0.05, 0.3), {}),
    ShardCase("full_kl_chunked", full_kl, (_logits, _logits_q, _mask), {"chunk_size": 3}),
]
