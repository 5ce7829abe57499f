"""`losses`: pure, jittable, shardable loss functions for RL on language models.

Every function takes arrays plus keyword-only hyperparameters, works under `jax.jit`, `jax.grad`
and on sharded inputs, and imports nothing heavier than jax (no flax, optax, orbax, transformers).
Formulas, defaults and the peer libraries' conventions are documented per function and in
ALGORITHMS.md. Shape letters: `B` prompts, `G` samples per prompt, `N = B·G` sequences, `T`
completion length, `V` vocabulary, `K` reward components.

Modules, one concept each:

* `masked`, `aggregation`, `layout` — masked statistics, the five loss-aggregation modes, groups.
* `logprobs` — token log-probs and entropies from logits (chunked over rows).
* `kl` — KL estimators, the KL loss, KL-penalised rewards, KL coefficient controllers.
* `advantages` — outcome-level (group) estimators; `returns` — token-level returns, GAE.
* `ppo`, `gspo`, `sapo`, `cispo`, `gmpo`, `covariance`, `bapo` — policy losses.
* `value`, `rollout_correction`, `entropy_mask` — critic loss, train/rollout mismatch, token masks.
"""

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
from losses.aggregation import AGG_MODES, aggregate
from losses.bapo import bapo_clip_bounds, bapo_loss, clip_bound_grid
from losses.cispo import cispo_loss
from losses.covariance import clip_cov_loss, kl_cov_loss
from losses.entropy_mask import high_entropy_mask, masked_quantile
from losses.gmpo import gmpo_loss
from losses.gspo import gspo_loss
from losses.kl import (
    KLController,
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
from losses.layout import broadcast_to_tokens, from_groups, to_groups
from losses.logprobs import (
    completion_logits,
    entropy_from_logits,
    log_sum_pi_squared,
    self_certainty,
    sequence_logprob,
    token_logprobs,
)
from losses.masked import masked_count, masked_mean, masked_sum, masked_var, masked_whiten
from losses.ppo import ppo_clip_loss, reinforce_loss
from losses.returns import (
    discounted_returns,
    gae,
    min_form_returns,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
)
from losses.rollout_correction import (
    rollout_correction_weights,
    rollout_mismatch_metrics,
    rollout_rejection_mask,
)
from losses.sapo import sapo_loss
from losses.value import (
    RunningMoments,
    init_running_moments,
    normalize_rewards,
    running_moments_update,
    value_loss,
)

__all__ = [
    "AGG_MODES",
    "KLController",
    "KLControllerState",
    "RunningMoments",
    "adaptive_kl_controller",
    "adaptive_kl_update",
    "aggregate",
    "bapo_clip_bounds",
    "bapo_loss",
    "bnpo_advantages",
    "broadcast_to_tokens",
    "cispo_loss",
    "clip_bound_grid",
    "clip_cov_loss",
    "completion_logits",
    "discounted_returns",
    "entropy_from_logits",
    "fixed_kl_controller",
    "from_groups",
    "full_kl",
    "gae",
    "gdpo_advantages",
    "gmpo_loss",
    "gpg_advantages",
    "group_advantage_metrics",
    "group_advantages",
    "group_advantages_flat",
    "gspo_loss",
    "high_entropy_mask",
    "init_running_moments",
    "kl_cov_loss",
    "kl_estimate",
    "kl_loss",
    "kl_penalized_rewards",
    "kl_penalized_scores",
    "log_sum_pi_squared",
    "masked_count",
    "masked_mean",
    "masked_quantile",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "min_form_returns",
    "normalize_rewards",
    "opo_advantages",
    "passk_advantages",
    "ppo_clip_loss",
    "reinforce_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "remax_advantages",
    "rloo_advantages",
    "rloo_advantages_flat",
    "rollout_correction_weights",
    "rollout_mismatch_metrics",
    "rollout_rejection_mask",
    "running_moments_update",
    "sapo_loss",
    "self_certainty",
    "sequence_logprob",
    "to_groups",
    "token_logprobs",
    "value_loss",
    "zero_variance_mask",
]
