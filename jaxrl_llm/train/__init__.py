"""The compiled update step: optimizer, train state, algorithms and objectives.

* `optim` — `OptimConfig` → one optax transformation (clipping, optimizer, schedule, decay mask,
  `MultiSteps` accumulation).
* `params` — split models once into graphs, trainable and frozen parameters.
* `state` — the `TrainState` pytree.
* `batch` — `RLBatch`, `SequenceBatch`, global `Normalizers`.
* `packing` — several SFT sequences per row: `pack_batch`, `best_fit_decreasing`.
* `pair_packing` — several preference pairs per row, each prompt once: `pack_pairs`,
  `PackedPairs`, `packed_pair_logprobs`, `packed_pair_scores`.
* `group_packing` — padding-free rollout batches, each prompt once with its `G` completions:
  `pack_groups`, `PackedGroups`, `PackedSequences`, `packed_completion_logprobs`,
  `packed_completion_hidden`, `group_packing_fill`, `completion_row_count`; a packing's parts (`packing_part`,
  `group_rows_part`, `join_group_parts`, `check_packing_parts`).
* `logprobs` — chunked completion log-probs / entropies / values and their jitted forwards.
* `algorithms` — `AlgorithmConfig`, named `PRESETS`, and the composed RL loss.
* `advantages` — rewards → advantages, returns and the kept-groups mask; `build_rl_batch`.
* `objectives` — what the step differentiates: `rl_objective`, `sft_objective`.
* `preference` — offline preference training (DPO, RPO, SimPO, CPO, ORPO, KTO, BCO):
  `PreferenceConfig`, `PreferenceBatch`, `preference_objective`, `train_preference`.
* `reward_model` — reward-model training (Bradley-Terry on pairs): `RewardModelConfig`,
  `reward_model_objective`, `train_reward_model`.
* `update` — the pure `update_step` (epochs × minibatches × accumulation in `lax.scan`),
  `loss_and_grads`, `make_update_step`, `update_unit_orders` (a shuffled update's orders).
* `row_groups` — one update's gradient in row groups from host threads (XLA:CPU),
  `make_row_group_update_step`.
* `shardings` — state and batch shardings for a mesh.
* `metrics` — sums-and-counts reduction of metrics over micro-batches.
"""

from jaxrl_llm.train.advantages import Advantages, build_rl_batch, compute_advantages
from jaxrl_llm.train.algorithms import (
    PRESETS,
    AdvantageConfig,
    AlgorithmConfig,
    CriticConfig,
    KLConfig,
    PolicyLossConfig,
    RolloutCorrectionConfig,
    keeps_row_subset,
    kl_controller,
    online_dpo_normalizers,
    online_dpo_pairs,
    online_dpo_select,
    preset,
    rl_loss,
)
from jaxrl_llm.train.batch import (
    Normalizers,
    RLBatch,
    SequenceBatch,
    check_rl_batch,
    check_sequence_batch,
    count_normalizers,
    prompt_length,
)
from jaxrl_llm.train.group_packing import (
    PackedGroups,
    PackedSequences,
    check_packed_groups,
    check_packing_parts,
    completion_row_count,
    group_packing_fill,
    group_rows_part,
    join_group_parts,
    pack_groups,
    packed_completion_hidden,
    packed_completion_logprobs,
    packing_part,
)
from jaxrl_llm.train.logprobs import (
    chunked_logprobs,
    completion_hidden,
    completion_logprobs,
    critic_values,
    make_logprob_fn,
    make_value_fn,
)
from jaxrl_llm.train.metrics import (
    MicroStats,
    micro_batch_stats,
    reduce_stats,
    with_derived_margin,
)
from jaxrl_llm.train.objectives import Objective, SFTConfig, rl_objective, sft_objective
from jaxrl_llm.train.optim import (
    OPTIMIZERS,
    OptimConfig,
    clip_each_subtree,
    has_learning_rate,
    learning_rate,
    make_optimizer,
    make_schedule,
    weight_decay_mask,
)
from jaxrl_llm.train.packing import best_fit_decreasing, pack_batch
from jaxrl_llm.train.pair_packing import (
    PackedPairs,
    pack_pairs,
    packed_pair_logprobs,
    packed_pair_scores,
    packing_fill,
)
from jaxrl_llm.train.parallel import check_data_parallel, make_data_parallel_update_step
from jaxrl_llm.train.params import ModelGraphs, param_path, reference_params, split_models
from jaxrl_llm.train.preference import (
    PreferenceBatch,
    PreferenceConfig,
    call_on_pairs,
    check_preference_batch,
    check_shared_prompts,
    concat_sequences,
    interleave_pairs,
    joint_token_logprobs,
    kto_kl_sequences,
    pack_preference_batch,
    pair_valid,
    precompute_reference_logprobs,
    preference_loss,
    preference_normalizers,
    preference_objective,
    prepare_preference_batch,
    reference_logprobs,
    sequence_logprobs,
    train_preference,
)
from jaxrl_llm.train.reward_model import (
    RewardModelConfig,
    reward_model_loss,
    reward_model_objective,
    sequence_scores,
    train_reward_model,
)
from jaxrl_llm.train.row_groups import (
    apply_group_gradients,
    group_gradients,
    make_row_group_update_step,
)
from jaxrl_llm.train.shardings import (
    batch_devices,
    batch_sharding,
    param_shardings,
    place_batch,
    train_state_shardings,
)
from jaxrl_llm.train.state import TrainState, init_train_state, sync_reference
from jaxrl_llm.train.update import (
    finish_update,
    jit_state_step,
    loss_and_grads,
    make_update_step,
    update_step,
    update_unit_orders,
)

__all__ = [
    "OPTIMIZERS",
    "PRESETS",
    "AdvantageConfig",
    "Advantages",
    "AlgorithmConfig",
    "CriticConfig",
    "KLConfig",
    "MicroStats",
    "ModelGraphs",
    "Normalizers",
    "Objective",
    "OptimConfig",
    "PackedGroups",
    "PackedPairs",
    "PackedSequences",
    "PolicyLossConfig",
    "PreferenceBatch",
    "PreferenceConfig",
    "RLBatch",
    "RewardModelConfig",
    "RolloutCorrectionConfig",
    "SFTConfig",
    "SequenceBatch",
    "TrainState",
    "apply_group_gradients",
    "batch_devices",
    "batch_sharding",
    "best_fit_decreasing",
    "build_rl_batch",
    "call_on_pairs",
    "check_data_parallel",
    "check_packed_groups",
    "check_packing_parts",
    "check_preference_batch",
    "check_rl_batch",
    "check_sequence_batch",
    "check_shared_prompts",
    "chunked_logprobs",
    "clip_each_subtree",
    "completion_hidden",
    "completion_logprobs",
    "completion_row_count",
    "compute_advantages",
    "concat_sequences",
    "count_normalizers",
    "critic_values",
    "finish_update",
    "group_gradients",
    "group_packing_fill",
    "group_rows_part",
    "has_learning_rate",
    "init_train_state",
    "interleave_pairs",
    "jit_state_step",
    "join_group_parts",
    "joint_token_logprobs",
    "keeps_row_subset",
    "kl_controller",
    "kto_kl_sequences",
    "learning_rate",
    "loss_and_grads",
    "make_data_parallel_update_step",
    "make_logprob_fn",
    "make_optimizer",
    "make_row_group_update_step",
    "make_schedule",
    "make_update_step",
    "make_value_fn",
    "micro_batch_stats",
    "online_dpo_normalizers",
    "online_dpo_pairs",
    "online_dpo_select",
    "pack_batch",
    "pack_groups",
    "pack_pairs",
    "pack_preference_batch",
    "packed_completion_hidden",
    "packed_completion_logprobs",
    "packed_pair_logprobs",
    "packed_pair_scores",
    "packing_fill",
    "packing_part",
    "pair_valid",
    "param_path",
    "param_shardings",
    "place_batch",
    "precompute_reference_logprobs",
    "preference_loss",
    "preference_normalizers",
    "preference_objective",
    "prepare_preference_batch",
    "preset",
    "prompt_length",
    "reduce_stats",
    "reference_logprobs",
    "reference_params",
    "reward_model_loss",
    "reward_model_objective",
    "rl_loss",
    "rl_objective",
    "sequence_logprobs",
    "sequence_scores",
    "sft_objective",
    "split_models",
    "sync_reference",
    "train_preference",
    "train_reward_model",
    "train_state_shardings",
    "update_step",
    "update_unit_orders",
    "weight_decay_mask",
    "with_derived_margin",
]
