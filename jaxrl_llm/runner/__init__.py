"""The training run: `jaxrl-llm train CONFIG.yaml` as a library (docs/running.md).

- `config`: `RunConfig`, one frozen dataclass for a whole run (model, tokenizer, data, rewards,
  algorithm or sft, optim, sampling, train, warm_start, checkpoint, metrics, mesh, parallel,
  export, seed, run_dir), validated across sections on load.
- `overrides`: `key.sub=value` command-line overrides, `load_run_config`.
- `task`: the data tokenized once, fixed prompt / answer / completion lengths, batches.
- `models`: tokenizer, policy, critic, export.
- `programs`: the compiled programs, cached per process.
- `scoring`, `rollout`: rewards (in-graph or host, overlong punishment, GDPO combination) and
  the rollout batch of a step (with DAPO's dynamic-sampling refills).
- `completion_width`: the rollout batch cut to its longest completion (`train.trim_completions`).
- `packed_groups`: its groups packed without padding (`train.pack_groups`), `StepPacking`,
  `packed_forward` (the forwards of the packed rows, in the update's row groups).
- `evaluate`, `eval_run`: greedy and temperature-1 accuracy, pass@k; `jaxrl-llm eval`.
- `warm_start`: SFT before RL, cached in the run directory.
- `preference`: offline preference runs (DPO, RPO, SimPO, CPO, ORPO, KTO) in the same loop.
- `health`, `signals`: skipped non-finite steps and their diagnosis, degenerate batches,
  graceful SIGTERM / Ctrl-C.
- `compiled`, `in_graph`: the fully compiled RL iteration (`train.compiled_iterations`):
  sampling, in-graph reward, advantages and update, `K` iterations per host call.
- `compilation_cache`: JAX's persistent compilation cache (`train.compilation_cache`).
- `faults`: fault injection points for the crash tests (inert unless `JAXRL_LLM_FAULT` is set).
- `context`, `setup`, `loop`: `RunContext`, `iterated_examples`, `prepare_run`, `run_training`, `train`.
- `prefetch`: `BatchPrefetch`, a supervised run's next batch prepared while the update runs.
"""

from jaxrl_llm.runner.compilation_cache import enable_compilation_cache
from jaxrl_llm.runner.compiled import (
    chunk_ends,
    chunk_indices,
    compiled_steps,
    iterations_program,
    make_iteration,
)
from jaxrl_llm.runner.completion_width import (
    completion_width,
    trim_collected,
    trim_sequences,
    trim_to_longest,
)
from jaxrl_llm.runner.config import (
    ExportConfig,
    ModelSection,
    OverlongConfig,
    ReferenceSyncConfig,
    RunConfig,
    TokenizerSection,
    TrainConfig,
    WarmStartConfig,
    check_devices,
    config_hash,
    config_to_dict,
)
from jaxrl_llm.runner.context import RunContext, iterated_examples, reference_policy
from jaxrl_llm.runner.eval_run import evaluate_run, format_eval_table, parse_checkpoint
from jaxrl_llm.runner.evaluate import evaluate_policy, evaluate_sft, evaluate_state, pass_at_k
from jaxrl_llm.runner.faults import fault_point, parse_fault
from jaxrl_llm.runner.health import (
    SkipTracker,
    TrainingDivergedError,
    degenerate_batch_warnings,
    divergence_message,
    nonfinite_terms,
)
from jaxrl_llm.runner.in_graph import TaskArrays, in_graph_scores, rollout_metrics, task_arrays
from jaxrl_llm.runner.loop import run_training, train
from jaxrl_llm.runner.models import (
    build_critic,
    build_policy,
    check_context,
    check_vocabulary,
    compiled_init,
    export_policy,
    run_tokenizer,
)
from jaxrl_llm.runner.overrides import (
    apply_overrides,
    build_run_config,
    load_run_config,
    parse_override,
)
from jaxrl_llm.runner.packed_groups import (
    StepPacking,
    packed_forward,
    packed_groups,
    packed_slot_saving,
    packing_metrics,
    padding_share,
)
from jaxrl_llm.runner.preference import (
    evaluate_preference,
    load_preference_eval_examples,
    load_preference_examples,
    precompute_reference,
)
from jaxrl_llm.runner.prefetch import BatchPrefetch
from jaxrl_llm.runner.programs import (
    advantage_program,
    kept_rows_logprob_program,
    logprob_program,
    nll_program,
    preference_eval_program,
    preference_prepare_program,
    prompt_group_size,
    reference_sync_program,
    rollout_program,
    update_program,
    value_program,
)
from jaxrl_llm.runner.rollout import (
    Collected,
    collect,
    forward_in_row_groups,
    in_graph_stop_ids,
    run_rollout,
    sampler_old_logprobs,
)
from jaxrl_llm.runner.scoring import (
    Scores,
    combine_rewards,
    component_rewards,
    group_has_spread,
    process_groups,
    reward_metrics,
    run_stop_ids,
)
from jaxrl_llm.runner.setup import (
    PreparedRun,
    build_context,
    prepare_run,
    trainable_patterns,
    update_row_groups,
)
from jaxrl_llm.runner.signals import GracefulStop
from jaxrl_llm.runner.task import (
    TaskData,
    answer_fits,
    load_task,
    packed_sft_batch,
    packing_row_unit,
    pad_rows,
    prompt_batch,
    sft_batch,
)
from jaxrl_llm.runner.warm_start import warm_start_hash, warm_start_policy

__all__ = [
    "BatchPrefetch",
    "Collected",
    "ExportConfig",
    "GracefulStop",
    "ModelSection",
    "OverlongConfig",
    "PreparedRun",
    "ReferenceSyncConfig",
    "RunConfig",
    "RunContext",
    "Scores",
    "SkipTracker",
    "StepPacking",
    "TaskArrays",
    "TaskData",
    "TokenizerSection",
    "TrainConfig",
    "TrainingDivergedError",
    "WarmStartConfig",
    "advantage_program",
    "answer_fits",
    "apply_overrides",
    "build_context",
    "build_critic",
    "build_policy",
    "build_run_config",
    "check_context",
    "check_devices",
    "check_vocabulary",
    "chunk_ends",
    "chunk_indices",
    "collect",
    "combine_rewards",
    "compiled_init",
    "compiled_steps",
    "completion_width",
    "component_rewards",
    "config_hash",
    "config_to_dict",
    "degenerate_batch_warnings",
    "divergence_message",
    "enable_compilation_cache",
    "evaluate_policy",
    "evaluate_preference",
    "evaluate_run",
    "evaluate_sft",
    "evaluate_state",
    "export_policy",
    "fault_point",
    "format_eval_table",
    "forward_in_row_groups",
    "group_has_spread",
    "in_graph_scores",
    "in_graph_stop_ids",
    "iterated_examples",
    "iterations_program",
    "kept_rows_logprob_program",
    "load_preference_eval_examples",
    "load_preference_examples",
    "load_run_config",
    "load_task",
    "logprob_program",
    "make_iteration",
    "nll_program",
    "nonfinite_terms",
    "packed_forward",
    "packed_groups",
    "packed_sft_batch",
    "packed_slot_saving",
    "packing_metrics",
    "packing_row_unit",
    "pad_rows",
    "padding_share",
    "parse_checkpoint",
    "parse_fault",
    "parse_override",
    "pass_at_k",
    "precompute_reference",
    "preference_eval_program",
    "preference_prepare_program",
    "prepare_run",
    "process_groups",
    "prompt_batch",
    "prompt_group_size",
    "reference_policy",
    "reference_sync_program",
    "reward_metrics",
    "rollout_metrics",
    "rollout_program",
    "run_rollout",
    "run_stop_ids",
    "run_tokenizer",
    "run_training",
    "sampler_old_logprobs",
    "sft_batch",
    "task_arrays",
    "train",
    "trainable_patterns",
    "trim_collected",
    "trim_sequences",
    "trim_to_longest",
    "update_program",
    "update_row_groups",
    "value_program",
    "warm_start_hash",
    "warm_start_policy",
]
