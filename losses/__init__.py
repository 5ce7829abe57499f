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
* `dppo`, `dro`, `disco`, `vespo`, `nft`, `hybrid`, `ratio_variance`, `offline_pg` — policy losses
  of the seed papers (trust regions, discriminative, negative-aware, offline and off-policy).
* `segments`, `step_credit`, `tree_credit`, `token_baseline`, `step_losses` — credit assignment
  below the sequence: steps, turns, prefix trees, per-position baselines, step-level losses.
* `reward_model`, `process_reward`, `self_reward` — reward-model, PRM and self-reward losses.
* `length_rewards`, `reward_combination`, `robust_rewards`, `label_free`, `likelihood_rewards`,
  `process_shaping`, `dynamic_sampling` — reward shaping and combination, zero-variance groups.
* `dpo`, `ref_free_preference`, `kto`, `dpo_variants`, `token_dpo`, `pairwise_pg`, `pair_utils` —
  preference losses (DPO and its loss types, SimPO/CPO/ORPO, KTO/BCO, RPO/XPO, TGDPO, pairwise PG).
* `rollout_selection`, `token_selection`, `advantage_transforms`, `tracker` — down-sampling and
  token masks, advantage reweighting (sign, planning tokens, risk), the single-stream Beta tracker.
"""

from losses.advantage_transforms import (
    anchored_group_advantages,
    planning_token_advantages,
    risk_weights,
    shaped_advantages,
    sign_weighted_advantages,
    token_advantage_reweight,
)
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
from losses.aggregation import AGG_MODES, aggregate, sequence_sums
from losses.bapo import bapo_clip_bounds, bapo_loss, clip_bound_grid
from losses.cispo import cispo_loss
from losses.covariance import clip_cov_loss, kl_cov_loss
from losses.disco import (
    disco_loss,
)
from losses.dpo import (
    DPO_LOSS_TYPES,
    F_DIVERGENCES,
    dpo_loss,
)
from losses.dpo_variants import (
    nll_loss,
    rpo_loss,
    step_apo_loss,
    xpo_loss,
)
from losses.dppo import (
    dppo_loss,
)
from losses.dro import (
    dro_loss,
)
from losses.dynamic_sampling import (
    GroupSelection,
    dynamic_sampling_mask,
    keep_groups_mask,
    select_kept_groups,
)
from losses.entropy_mask import high_entropy_mask, masked_quantile
from losses.gmpo import gmpo_loss
from losses.gspo import gspo_loss
from losses.hybrid import (
    hybrid_ratio_loss,
)
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
from losses.kto import (
    KTO_LOSS_TYPES,
    bco_loss,
    kto_loss,
    kto_reference_point,
)
from losses.label_free import (
    majority_vote_rewards,
)
from losses.layout import broadcast_to_tokens, from_groups, to_groups
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
from losses.logprobs import (
    completion_logits,
    entropy_from_logits,
    log_sum_pi_squared,
    self_certainty,
    sequence_logprob,
    token_logprobs,
)
from losses.masked import masked_count, masked_mean, masked_sum, masked_var, masked_whiten
from losses.nft import (
    nft_loss,
)
from losses.offline_pg import (
    alol_loss,
    gated_sft_loss,
    mirror_descent_loss,
    shaped_offpolicy_loss,
)
from losses.pair_utils import (
    best_worst_pairs,
    ld_sequence_logprob,
    rank_consistency,
    wpo_weights,
)
from losses.pairwise_pg import (
    contrastive_pg_loss,
    pairwise_ppo_loss,
    relative_regression_loss,
)
from losses.ppo import ppo_clip_loss, reinforce_loss
from losses.process_reward import (
    aggregate_step_scores,
    implicit_prm_loss,
    implicit_process_rewards,
    mc_step_labels,
    prm_bce_loss,
    prm_mse_loss,
    scatter_step_rewards,
)
from losses.process_shaping import (
    clip_process_rewards,
    delta_process_rewards,
    potential_shaped_rewards,
    turn_decay_rewards,
)
from losses.ratio_variance import (
    dual_ascent_update,
    ratio_variance_loss,
)
from losses.ref_free_preference import (
    CPO_LOSS_TYPES,
    cpo_loss,
    orpo_loss,
    simpo_loss,
)
from losses.returns import (
    discounted_returns,
    gae,
    min_form_returns,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
)
from losses.reward_combination import (
    WeightedRewards,
    constraint_gated_rewards,
    format_gated_rewards,
    gap_rewards,
    gated_accumulated_rewards,
    rubric_rewards,
    self_correction_bonus,
    weighted_rewards,
)
from losses.reward_model import (
    bradley_terry_loss,
    debiased_preference,
    infonce_loss,
    log_exp_pairwise_loss,
    plackett_luce_logprob,
    rewards_as_labels_loss,
    soft_bradley_terry_loss,
    verdict_probability,
    win_rate_rewards,
)
from losses.robust_rewards import (
    ENSEMBLE_MODES,
    ensemble_rewards,
    par_rewards,
)
from losses.rollout_correction import (
    off_policy_sequence_mask,
    rollout_correction_weights,
    rollout_mismatch_metrics,
    rollout_rejection_mask,
)
from losses.rollout_selection import (
    best_worst_mask,
    rollout_downsample_mask,
)
from losses.sapo import sapo_loss
from losses.segments import (
    divergence_suffix_mask,
    multi_turn_loss_mask,
    run_length_segments,
    segment_broadcast,
    segment_ids_from_boundaries,
    segment_reduce,
    segment_standardize,
    turn_ids_from_roles,
)
from losses.self_reward import (
    laser_loss,
    laser_self_rewards,
    last_valid_logits,
    pass_at_k,
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
from losses.token_baseline import (
    optimal_token_baseline_advantages,
)
from losses.token_dpo import (
    dpo_token_rewards,
    tgdpo_loss,
)
from losses.token_selection import (
    conflict_token_mask,
    token_downsample_mask,
    token_rejection_mask,
)
from losses.tracker import (
    BetaTrackerState,
    beta_tracker_update,
    init_beta_tracker,
    tracker_advantages,
    tracker_baseline,
)
from losses.tree_credit import (
    prefix_tree_values,
    tempo_advantages,
)
from losses.value import (
    RunningMoments,
    init_running_moments,
    normalize_rewards,
    running_moments_update,
    value_loss,
)
from losses.vespo import (
    vespo_loss,
)

__all__ = [
    "AGG_MODES",
    "CPO_LOSS_TYPES",
    "DPO_LOSS_TYPES",
    "ENSEMBLE_MODES",
    "F_DIVERGENCES",
    "KTO_LOSS_TYPES",
    "BetaTrackerState",
    "GroupSelection",
    "KLController",
    "KLControllerState",
    "RunningMoments",
    "WeightedRewards",
    "accuracy_gated_rewards",
    "adaptive_kl_controller",
    "adaptive_kl_update",
    "aggregate",
    "aggregate_step_scores",
    "alol_loss",
    "anchor_state_advantages",
    "anchored_group_advantages",
    "awr_loss",
    "bapo_clip_bounds",
    "bapo_loss",
    "bco_loss",
    "best_worst_mask",
    "best_worst_pairs",
    "beta_tracker_update",
    "bnpo_advantages",
    "bradley_terry_loss",
    "broadcast_to_tokens",
    "budget_weighted_returns",
    "cispo_loss",
    "clip_bound_grid",
    "clip_cov_loss",
    "clip_process_rewards",
    "completion_logits",
    "conciseness_gated_rewards",
    "conflict_token_mask",
    "constraint_gated_rewards",
    "contrastive_pg_loss",
    "cpo_loss",
    "critique_token_rewards",
    "debiased_preference",
    "delta_process_rewards",
    "direct_advantage_step_loss",
    "disco_loss",
    "discounted_returns",
    "divergence_suffix_mask",
    "dpo_loss",
    "dpo_token_rewards",
    "dppo_loss",
    "dro_loss",
    "drpo_positive_weights",
    "dual_ascent_update",
    "dual_level_advantages",
    "dynamic_sampling_mask",
    "ensemble_rewards",
    "entropy_from_logits",
    "fixed_kl_controller",
    "followup_likelihood_rewards",
    "format_gated_rewards",
    "from_groups",
    "full_kl",
    "gae",
    "gap_rewards",
    "gated_accumulated_rewards",
    "gated_sft_loss",
    "gdpo_advantages",
    "gmpo_loss",
    "gpg_advantages",
    "group_advantage_metrics",
    "group_advantages",
    "group_advantages_flat",
    "gspo_loss",
    "hapo_history_update",
    "hapo_length_rewards",
    "high_entropy_mask",
    "hybrid_ratio_loss",
    "implicit_prm_loss",
    "implicit_process_rewards",
    "infonce_loss",
    "information_gain_rewards",
    "init_beta_tracker",
    "init_running_moments",
    "keep_groups_mask",
    "kimi_length_rewards",
    "kl_cov_loss",
    "kl_estimate",
    "kl_loss",
    "kl_penalized_rewards",
    "kl_penalized_scores",
    "kto_loss",
    "kto_reference_point",
    "laser_loss",
    "laser_self_rewards",
    "last_valid_logits",
    "ld_sequence_logprob",
    "log_exp_pairwise_loss",
    "log_sum_pi_squared",
    "majority_vote_rewards",
    "mask_truncated",
    "masked_count",
    "masked_mean",
    "masked_quantile",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "mc_step_labels",
    "min_form_returns",
    "mirror_descent_loss",
    "multi_turn_loss_mask",
    "nft_loss",
    "nll_loss",
    "normalize_rewards",
    "off_policy_sequence_mask",
    "opo_advantages",
    "optimal_token_baseline_advantages",
    "orpo_loss",
    "overlong_penalty",
    "pairwise_ppo_loss",
    "par_rewards",
    "pass_at_k",
    "passk_advantages",
    "plackett_luce_logprob",
    "planning_token_advantages",
    "potential_shaped_rewards",
    "ppo_clip_loss",
    "prefix_tree_values",
    "prm_bce_loss",
    "prm_mse_loss",
    "progress_attribution_loss",
    "rank_consistency",
    "ratio_variance_loss",
    "reference_probability_rewards",
    "reinforce_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "relative_regression_loss",
    "remax_advantages",
    "rewards_as_labels_loss",
    "risk_weights",
    "rloo_advantages",
    "rloo_advantages_flat",
    "rollout_correction_weights",
    "rollout_downsample_mask",
    "rollout_mismatch_metrics",
    "rollout_rejection_mask",
    "rpo_loss",
    "rubric_rewards",
    "run_length_segments",
    "running_moments_update",
    "sapo_loss",
    "scatter_step_rewards",
    "segment_broadcast",
    "segment_ids_from_boundaries",
    "segment_reduce",
    "segment_standardize",
    "select_kept_groups",
    "self_aligned_rewards",
    "self_certainty",
    "self_correction_bonus",
    "sequence_logprob",
    "sequence_sums",
    "shaped_advantages",
    "shaped_offpolicy_loss",
    "sibling_advantages",
    "sign_weighted_advantages",
    "simpo_loss",
    "soft_bellman_losses",
    "soft_bradley_terry_loss",
    "step_advantages",
    "step_apo_loss",
    "step_min_form_returns",
    "tempo_advantages",
    "tgdpo_loss",
    "to_groups",
    "token_advantage_reweight",
    "token_downsample_mask",
    "token_logprobs",
    "token_rejection_mask",
    "tracker_advantages",
    "tracker_baseline",
    "truncation_penalty",
    "turn_decay_rewards",
    "turn_ids_from_roles",
    "value_loss",
    "verdict_probability",
    "vespo_loss",
    "weighted_rewards",
    "win_rate_rewards",
    "wpo_weights",
    "xpo_loss",
    "zero_variance_mask",
]
