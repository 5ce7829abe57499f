"""The training loop: `train(config) -> summary`, one skeleton for RL and SFT runs.

Per step (RL):

    rollout   collect(): prompts → sampler (G samples per prompt) → rewards → overlong
              punishment → DAPO refills                                   `runner.rollout`
    trim      completions cut to the batch's longest, bucketed      `runner.completion_width`
    forwards  old-policy log-probs (when the step reuses the batch or puts KL in the reward),
              reference log-probs (KL), old critic values (PPO)
    batch     build_rl_batch: advantages, returns, kept groups
    update    the compiled update step; a non-finite loss or gradient skips it in-graph
    metrics   rewards, accuracy, response lengths, truncation, KL, entropy, clip fractions,
              gradient norm, learning rate, tokens/s, seconds per phase → MetricsLogger
    eval      every train.eval_every steps                                `runner.evaluate`
    save      Checkpointer.maybe_save(step, state, meta with the data position)

An SFT run (`sft:`) replaces the first three lines by one batch of (prompt, answer) pairs, a
preference run (`preference:`) by one batch of preference examples with their reference
log-probs, a reward-model run (`reward_model:`) by one batch of pairs (`runner.preference`).
Before the first step (fresh runs) the policy is evaluated: `accuracy_before_rl`; after the
last, evaluated again, checkpointed, exported (`save_pretrained`), its curves plotted, and
`summary.json` written:

    accuracy_before_rl / accuracy_after_rl            eval accuracy at temperature 1
    greedy_accuracy_before_rl / greedy_accuracy_after_rl
    pass_at_k_before_rl / pass_at_k_after_rl          {k: pass@k}
    steps, wall_seconds, skipped_steps, final_metrics, run_dir,
    kind ("rl" / "sft" / "preference" / "reward_model")

Resuming restores the newest checkpoint (parameters, optimizer state, step, shuffling key, KL
controller, data position, skip counters); sampling and evaluation keys are functions of the
seed and the step, so a resumed run continues bit for bit. SIGTERM / Ctrl-C finish the current
step, write a checkpoint, and return a summary with `interrupted` set.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxrl_llm.data import IteratorState, next_batch
from jaxrl_llm.metrics_log import (
    _RESERVED,
    DEFAULT_PLOT_KEYS,
    DEFAULT_PROGRESS_KEYS,
    METRICS_FILE,
    MetricsConfig,
    MetricsLogger,
    plot_curves,
    read_metrics,
)
from jaxrl_llm.runner.compiled import compiled_steps
from jaxrl_llm.runner.completion_width import completion_width, trim_collected, trim_to_longest
from jaxrl_llm.runner.config import RunConfig, config_to_dict
from jaxrl_llm.runner.context import RunContext, iterated_examples, reference_policy
from jaxrl_llm.runner.evaluate import evaluate_state
from jaxrl_llm.runner.faults import fault_point
from jaxrl_llm.runner.health import (
    SkipTracker,
    TrainingDivergedError,
    degenerate_batch_warnings,
    divergence_message,
    nonfinite_terms,
)
from jaxrl_llm.runner.keys import EVAL_STREAM, SAMPLE_STREAM, fold_in, stream_key
from jaxrl_llm.runner.models import export_policy
from jaxrl_llm.runner.packed_groups import packed_forward, packed_groups, packing_metrics
from jaxrl_llm.runner.preference import _preference_step
from jaxrl_llm.runner.prefetch import BatchPrefetch
from jaxrl_llm.runner.programs import (
    advantage_program,
    kept_rows_logprob_program,
    logprob_program,
    prompt_group_size,
    reference_sync_program,
    value_program,
)
from jaxrl_llm.runner.rollout import collect, forward_in_row_groups, sampler_old_logprobs
from jaxrl_llm.runner.setup import PreparedRun, prepare_run
from jaxrl_llm.runner.signals import GracefulStop
from jaxrl_llm.runner.task import packed_sft_batch, packing_row_unit, sft_batch
from jaxrl_llm.train import PackedSequences, SequenceBatch, TrainState, keeps_row_subset
from jaxrl_llm.train.shardings import batch_devices, place_batch
from sharding import any_process, fetch_global, is_main_process

log = logging.getLogger(__name__)
SUMMARY_FILE = "summary.json"
CURVES_FILE = "curves.png"


def _host(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in fetch_global(dict(metrics)).items()}


def _rl_step(
    ctx: RunContext, state: TrainState, data: IteratorState, step: int
) -> tuple[TrainState, IteratorState, dict[str, float]]:
    """One RL step (module docstring); returns the new state, data position and metrics."""
    config, alg = ctx.config, ctx.config.algorithm
    started = time.perf_counter()
    key = fold_in(stream_key(config.seed, SAMPLE_STREAM), step)
    collected, data = collect(ctx, state, data, key)
    forward_start = time.perf_counter()
    width = collected.sequences.completion_mask.shape[1]
    if config.trims_completions:
        width = completion_width(
            collected.lengths, max_width=width, minimum=config.train.trim_minimum
        )
        collected = trim_collected(collected, width)
    G = ctx.sampling.num_samples
    ref_after = keeps_row_subset(alg, G)  # online DPO's reference: the kept rows only
    # (online DPO with G > 2 packs the pairs it keeps, below; its other forwards stay padded)
    packing = None if ref_after else packed_groups(ctx, collected.sequences, state.key)
    seqs = collected.sequences
    policy_params, policy_frozen = state.params["policy"], state.frozen["policy"]
    forward_group = prompt_group_size(config, ctx.mesh, update=False)
    logprob = logprob_program(ctx.graphs.policy, alg.temperature, alg.chunk_size, forward_group)
    batch_alg = alg
    if config.rewards.combine == "decoupled":  # the signal is already group-normalised
        batch_alg = dataclasses.replace(
            alg, advantage=dataclasses.replace(alg.advantage, scale="none")
        )
    with jax.set_mesh(ctx.mesh):

        def run(fn: Any, params: Any, rows: SequenceBatch, rows_packing: Any) -> Any:
            """A log-prob forward: the packed rows, or the padded ones, in row groups."""
            if rows_packing is not None:
                return packed_forward(fn, params, policy_frozen, rows, rows_packing)
            return forward_in_row_groups(ctx, fn, params, policy_frozen, rows)

        def forward(params: Any) -> Any:
            return run(logprob, params, seqs, packing)

        old = None
        if alg.needs_old_logprobs and alg.old_logprobs == "sampler":
            old = sampler_old_logprobs(seqs, collected.logprobs)
        elif alg.needs_old_logprobs:
            old = forward(policy_params)
        ref = (
            forward(reference_policy(ctx, state)) if alg.needs_reference and not ref_after else None
        )
        values = (
            value_program(ctx.graphs, forward_group)(
                state.params,
                state.frozen,
                seqs if packing is None else PackedSequences(seqs, packing.forward),
            )
            if alg.critic
            else None
        )
        batch, adv_metrics = advantage_program(batch_alg, G)(
            tokens=seqs.tokens,
            attention_mask=seqs.attention_mask,
            completion_mask=seqs.completion_mask,
            rewards=collected.signal,
            old_logp=old,
            ref_logp=ref,
            old_values=values,
            rollout_logp=collected.sampling_logprobs if alg.rollout_correction else None,
            kl_coef=state.kl.beta,
        )
        if ref_after:
            pairs = kept_rows_logprob_program(ctx.graphs.policy, alg, forward_group)
            kept = SequenceBatch(batch.tokens, batch.attention_mask, batch.completion_mask)
            packing = packed_groups(ctx, kept, state.key, group_size=2)  # the kept pairs
            ref = run(pairs, reference_policy(ctx, state), kept, packing)
            batch = batch._replace(ref_logp=ref)
        adv_metrics = _host(adv_metrics)
        update_start = time.perf_counter()
        state, metrics = ctx.update(
            state, batch._replace(packed=None if packing is None else packing.update)
        )
        metrics = _host(metrics)
    done = time.perf_counter()
    tokens = collected.metrics["rollout/completion_tokens"]
    metrics.update(adv_metrics)
    metrics.update(collected.metrics)
    metrics.update(
        {
            "time/forward_s": update_start - forward_start,
            "time/update_s": done - update_start,
            "time/step_s": done - started,
            "perf/completion_width": float(width),
            **(
                {}
                if packing is None
                else packing_metrics(packing.forward, max(1, len(packing.forward_parts)))
            ),
            "perf/tokens_per_sec": tokens / max(done - started, 1e-9),
        }
    )
    return state, data, metrics


class _SFTBatch(NamedTuple):
    """A supervised step's host batch and what it reports."""

    batch: Any  # SequenceBatch or PackedSFTBatch of NumPy arrays
    data: IteratorState  # the data position after it
    packing: dict[str, float]
    tokens: float  # answer tokens in the batch


def _sft_batch(ctx: RunContext, data: IteratorState) -> _SFTBatch:
    """The host side of a supervised step from data position `data` (NumPy only, so that it can
    run on the prefetch thread): the next `train.prompts_per_step` (prompt, answer) pairs,
    cut to the longest answer with `train.trim_completions`, packed several to a row with
    `sft.packing` (`sft/packed_rows` and `sft/packing_fill`, the share of the packed slots that
    hold a token)."""
    task = ctx.task
    indices, data = next_batch(
        data,
        num_examples=len(task.sft_train),
        batch_size=ctx.config.train.prompts_per_step,
        shuffle=ctx.config.data.shuffle,
    )
    examples = [task.train[task.sft_train[i]] for i in indices]
    batch = sft_batch(task, examples, ctx.config, ctx.tokenizer)
    packing: dict[str, float] = {}
    if ctx.config.trims_completions:
        batch = trim_to_longest(batch, minimum=ctx.config.train.trim_minimum)
        packing["perf/completion_width"] = float(batch.completion_mask.shape[1])
    tokens = float(batch.completion_mask.sum())
    sft = ctx.config.sft
    if sft.packing:
        parts = sft.minibatches * ctx.config.optim.accumulation_steps
        unit = packing_row_unit(parts, batch_devices(ctx.mesh), ctx.config.parallel)
        batch = packed_sft_batch(
            task, batch, length=sft.packing_length, unit=unit, pad_id=ctx.tokenizer.pad_id
        )
        packing = {
            "sft/packed_rows": float(batch.tokens.shape[0]),
            "sft/packing_fill": float(np.mean(batch.segment_ids > 0)),
        }
    return _SFTBatch(batch, data, packing, tokens)


def _sft_step(
    ctx: RunContext,
    state: TrainState,
    data: IteratorState,
    step: int,
    prefetch: BatchPrefetch | None = None,
) -> tuple[TrainState, IteratorState, dict[str, float]]:
    """One supervised step on `train.prompts_per_step` (prompt, answer) pairs (`_sft_batch`).
    With `prefetch`, the batch comes from it, and the next step's batch is prepared on its
    thread while this step's update runs (`runner.prefetch`; not after the last step)."""
    started = time.perf_counter()
    batch, data, packing, tokens = (
        _sft_batch(ctx, data) if prefetch is None else prefetch.take(data)
    )
    batch = place_batch(batch, ctx.mesh)
    with jax.set_mesh(ctx.mesh):
        state, metrics = ctx.update(state, batch)
        if prefetch is not None and step < ctx.config.train.steps:
            prefetch.start(data)
        metrics = _host(metrics)
    metrics.update(packing)
    done = time.perf_counter()
    metrics.update(
        {
            "time/update_s": done - started,
            "time/step_s": done - started,
            "perf/tokens_per_sec": tokens / max(done - started, 1e-9),
        }
    )
    return state, data, metrics


def _step_results(
    ctx: RunContext,
    step_fn: Any,
    state: TrainState,
    data: IteratorState,
    start: int,
    steps: int,
) -> Iterator[tuple[int, TrainState, IteratorState, dict[str, float], int]]:
    """`(step, state, data, metrics, chunk_end)` per step: one step at a time (`chunk_end` =
    `step`), or in compiled chunks of `train.compiled_iterations` (`runner.compiled`)."""
    if ctx.config.kind == "rl" and ctx.config.train.compiled_iterations is not None:
        sample_key = stream_key(ctx.config.seed, SAMPLE_STREAM)
        yield from compiled_steps(ctx, state, data, start, steps, sample_key)
        return
    prefetch = None
    if ctx.config.kind == "sft":  # the next batch prepared while the update runs
        prefetch = BatchPrefetch(functools.partial(_sft_batch, ctx))
        step_fn = functools.partial(step_fn, prefetch=prefetch)
    try:
        for step in range(start + 1, steps + 1):
            state, data, metrics = step_fn(ctx, state, data, step)
            state = _sync_reference(ctx, state, step, metrics)
            yield step, state, data, metrics, step
    finally:
        if prefetch is not None:
            prefetch.close()


def _sync_reference(
    ctx: RunContext, state: TrainState, step: int, metrics: dict[str, float]
) -> TrainState:
    """`train.reference_sync`: after every `every`-th step's update, move the reference toward
    the policy (`ref/synced` is 1 on those steps)."""
    sync = ctx.config.train.reference_sync
    if sync is None:
        return state
    due = step % sync.every == 0
    if due:
        with jax.set_mesh(ctx.mesh):
            optim = ctx.config.optim if sync.reset_optimizer else None
            state = reference_sync_program(sync.alpha, optim)(state)
    metrics["ref/synced"] = float(due)
    return state


# the progress line of runs whose metrics have no `reward/mean`, `kl/mean` or `entropy/mean`
PROGRESS_KEYS_BY_KIND = {
    "sft": ("sft/nll", "perf/tokens_per_sec"),
    "preference": ("loss/total", "pref/accuracy", "pref/margin", "perf/tokens_per_sec"),
    "reward_model": ("loss/total", "rm/accuracy", "rm/margin", "perf/tokens_per_sec"),
}


def _warn_unknown_progress_keys(keys: tuple[str, ...], metrics: dict[str, Any]) -> None:
    """Warn once, after the first step, about the `metrics.progress_keys` a user set that the
    step did not log (a typo showed nothing, silently); `eval/` keys appear at evaluations only
    and are not named."""
    unknown = [k for k in keys if k not in metrics and not k.startswith("eval/")]
    if unknown:
        log.warning(
            "metrics.progress_keys: %s not among this run's step metrics (it logs e.g. %s); "
            "they are not shown",
            ", ".join(unknown),
            ", ".join(sorted(metrics)[:6]),
        )


def _metrics_config(config: RunConfig) -> MetricsConfig:
    """`config.metrics`, with the progress line of an SFT, preference or reward-model run
    showing its own metrics when `metrics.progress_keys` is left at the (RL) default.

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig())
      >>> _metrics_config(cfg).progress_keys
      ('sft/nll', 'perf/tokens_per_sec')
    """
    keys = PROGRESS_KEYS_BY_KIND.get(config.kind)
    if keys is None or config.metrics.progress_keys != DEFAULT_PROGRESS_KEYS:
        return config.metrics
    return dataclasses.replace(config.metrics, progress_keys=keys)


def _meta(
    config: dict[str, Any],
    step: int,
    data: IteratorState,
    examples: int,
    skips: SkipTracker,
    before: Mapping[str, float],
    wall: float,
) -> dict[str, Any]:
    """The checkpoint's JSON meta; `config` is the run's `config_to_dict`, built once;
    `examples` is the size of the data `data` walks (`iterated_examples`), checked on resume."""
    return {
        "step": step,
        "data": {k: int(v) for k, v in data._asdict().items()},
        "data_examples": examples,
        "skips_consecutive": skips.consecutive,
        "skips_total": skips.total,
        "before": dict(before),
        "wall_seconds": wall,
        "config": config,
    }


def _evaluation(ctx: RunContext, state: TrainState, step: int) -> dict[str, float]:
    return evaluate_state(ctx, state, fold_in(stream_key(ctx.config.seed, EVAL_STREAM), step))


def _logged_at(run_dir: Any, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The training metrics and the evaluation that `metrics.jsonl` holds for `step` (a
    finished run that is resumed: its loop runs no step); `({}, {})` on other processes."""
    train: dict[str, Any] = {}
    evaluation: dict[str, Any] = {}
    path = run_dir / METRICS_FILE
    if not (is_main_process() and path.exists()):
        return train, evaluation
    for record in read_metrics(path):
        if record["step"] == step:
            values = {k: v for k, v in record.items() if k not in _RESERVED}
            (evaluation if any(k.startswith("eval/") for k in values) else train).update(values)
    return train, evaluation


def _plot(run_dir: Any) -> None:
    path = run_dir / METRICS_FILE
    if not path.exists():
        return
    present = {k for record in read_metrics(path) for k in record}
    plotted = (*DEFAULT_PLOT_KEYS, "sft/nll", "eval/sft/nll", "pref/accuracy", "eval/pref/accuracy")
    plotted += ("rm/accuracy", "eval/rm/accuracy")
    keys = [k for k in plotted if k in present]
    if keys:
        plot_curves(path, run_dir / CURVES_FILE, keys)


def _summary(
    ctx: RunContext,
    before: Mapping[str, float],
    after: Mapping[str, float],
    step: int,
    wall: float,
    skips: SkipTracker,
    final: Mapping[str, float],
    info: Mapping[str, Any],
    interrupted: str | None,
) -> dict[str, Any]:
    def pass_k(metrics: Mapping[str, float]) -> dict[str, float]:
        return {k.split("@")[1]: v for k, v in metrics.items() if k.startswith("eval/pass@")}

    return {
        "kind": ctx.config.kind,
        "accuracy_before_rl": before.get("eval/accuracy"),
        "accuracy_after_rl": after.get("eval/accuracy"),
        "greedy_accuracy_before_rl": before.get("eval/accuracy_greedy"),
        "greedy_accuracy_after_rl": after.get("eval/accuracy_greedy"),
        "pass_at_k_before_rl": pass_k(before),
        "pass_at_k_after_rl": pass_k(after),
        "steps": step,
        "wall_seconds": wall,
        "skipped_steps": skips.total,
        "interrupted": interrupted,
        "final_metrics": dict(final),
        "setup": dict(info),
        "run_dir": str(ctx.run_dir),
    }


def run_training(prepared: PreparedRun, *, resume_command: str | None = None) -> dict[str, Any]:
    """Run the steps of a prepared run to the end (or to a stop signal).

    Args:
      prepared: from `prepare_run`.
      resume_command: the command that resumes this run, shown when a signal stops it.

    Returns:
      The summary (module docstring); also written to `run_dir/summary.json` at the end.

    Raises:
      TrainingDivergedError: after `train.max_consecutive_skips` consecutive skipped steps (a
        checkpoint of the last finite state is written first).

    Examples:
      A two-step supervised run of a tiny random model on one-digit sums:

      >>> import json, pathlib, tempfile
      >>> from jaxrl_llm.data import ArithmeticConfig, DataConfig
      >>> from jaxrl_llm.metrics_log import MetricsConfig
      >>> from jaxrl_llm.models import ModelConfig
      >>> from jaxrl_llm.runner.config import ExportConfig, ModelSection, TrainConfig
      >>> from jaxrl_llm.sampler import SamplingConfig
      >>> from jaxrl_llm.train import SFTConfig
      >>> tiny = ModelConfig(family="qwen3", vocab_size=259, hidden_size=8, intermediate_size=16,
      ...                    num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> config = RunConfig(
      ...     model=ModelSection(init=tiny), sft=SFTConfig(),
      ...     data=DataConfig(arithmetic=ArithmeticConfig(max_digits=1, train_size=8, eval_size=2)),
      ...     sampling=SamplingConfig(max_new_tokens=4),
      ...     train=TrainConfig(steps=2, prompts_per_step=2, eval_prompts=0),
      ...     metrics=MetricsConfig(console=False, tensorboard=False),
      ...     export=ExportConfig(enabled=False), run_dir=tempfile.mkdtemp())
      >>> summary = run_training(prepare_run(config))
      >>> summary["kind"], summary["steps"], summary["final_metrics"]["sft/nll"] > 0
      ('sft', 2, True)
      >>> sorted(p.name for p in pathlib.Path(config.run_dir).iterdir())
      ['checkpoints', 'curves.png', 'metrics.jsonl', 'summary.json']
    """
    ctx, state, data, start, checkpointer, meta, skips, info = prepared
    config = ctx.config
    steps = config.train.steps
    step_fn = {
        "rl": _rl_step,
        "sft": _sft_step,
        "preference": _preference_step,
        "reward_model": _preference_step,
    }[config.kind]
    wall_offset = float(meta.get("wall_seconds", 0.0))
    began = time.perf_counter()
    before: dict[str, float] = dict(meta.get("before", {}))
    after: dict[str, float] = {}
    final: dict[str, float] = {}
    step = start
    active_warnings: set[str] = set()
    diverged = ""  # the message of the step that reached train.max_consecutive_skips
    config_dict = config_to_dict(config)  # every checkpoint's meta holds it
    examples = iterated_examples(ctx)

    def wall() -> float:
        return wall_offset + time.perf_counter() - began

    def save(at: int) -> None:
        checkpointer.save(at, state, _meta(config_dict, at, data, examples, skips, before, wall()))

    try:
        # a finished run resumed (e.g. after a crash in its export): no step runs, its last
        # records stand, and its final evaluation runs only if it was not logged yet
        finished = bool(meta) and start == steps
        final, logged_after = _logged_at(ctx.run_dir, start) if finished else ({}, {})
        evaluated = finished and any_process(bool(logged_after))  # process 0 read the file
        logger = MetricsLogger.from_config(
            ctx.run_dir,
            _metrics_config(config),
            total_steps=steps,
            resume_step=start if meta else None,
            run_config=config_dict,
        )
        with GracefulStop() as stop, logger:
            if not meta:
                before = _evaluation(ctx, state, 0)
                numeric = {k: v for k, v in info.items() if isinstance(v, int | float)}
                logger.log(0, {**before, **numeric})
            results = _step_results(ctx, step_fn, state, data, start, steps)
            for step, state, data, metrics, chunk_end in results:
                fault_point("step", step)  # crash tests only (inert unless JAXRL_LLM_FAULT)
                skipped = metrics.get("optim/skipped", 0.0) > 0
                skips = skips.update(skipped)
                final = metrics
                if (
                    step == start + 1
                    or step == steps
                    or step % config.train.log_every == 0
                    or skipped
                ):
                    logger.log(step, metrics)
                if step == start + 1 and config.metrics.progress_keys != DEFAULT_PROGRESS_KEYS:
                    _warn_unknown_progress_keys(logger.progress_keys, metrics)  # the user's
                warnings = degenerate_batch_warnings(metrics)
                for warning in warnings:
                    if warning not in active_warnings:  # once per streak
                        log.warning("step %d: %s (not repeated while it lasts)", step, warning)
                active_warnings = set(warnings)
                if skipped:
                    log.warning(
                        "step %d skipped: non-finite %s", step, ", ".join(nonfinite_terms(metrics))
                    )
                    if skips.consecutive >= config.train.max_consecutive_skips and not diverged:
                        diverged = divergence_message(
                            step,
                            skips.consecutive,
                            metrics,
                            f"step {chunk_end} in {checkpointer.directory}",
                        )
                if step < chunk_end:  # compiled chunks: eval, save and stop at their end
                    continue
                if diverged:  # a compiled chunk's later steps are counted and logged first
                    save(chunk_end)
                    checkpointer.wait()
                    raise TrainingDivergedError(diverged)
                due = config.train.eval_every and step % config.train.eval_every == 0
                if due and step < steps and (evaluation := _evaluation(ctx, state, step)):
                    logger.log(step, evaluation)  # (an empty evaluation: nothing to score)
                if checkpointer.maybe_save(
                    step, state, _meta(config_dict, step, data, examples, skips, before, wall())
                ):
                    fault_point("save", step)
                if any_process(stop.requested):  # every process stops at the same step
                    save(step)
                    checkpointer.wait()
                    hint = f"; resume with: {resume_command}" if resume_command else ""
                    signal_name = stop.signal_name or "SIGTERM"  # another process's signal
                    if is_main_process():
                        print(
                            f"jaxrl-llm train: received {signal_name}; stopped after step "
                            f"{step} and saved a checkpoint in {checkpointer.directory}{hint}",
                            flush=True,
                        )
                    return _summary(
                        ctx, before, after, step, wall(), skips, final, info, signal_name
                    )
            if evaluated:
                after = logged_after
            else:
                after = _evaluation(ctx, state, step)
                if after:
                    logger.log(step, after)
            save(step)
            checkpointer.wait()
    finally:
        checkpointer.close()
    with GracefulStop() as finishing:  # the run is complete: a signal waits for its outputs
        if config.export.enabled:
            export_policy(
                ctx.graphs,
                state.params["policy"],
                state.frozen["policy"],
                ctx.run_dir / config.export.directory,
                config.export.dtype,
                ctx.tokenizer,
                base_model=config.model.checkpoint,
            )
        summary = _summary(ctx, before, after, step, wall(), skips, final, info, None)
        if is_main_process():  # one writer per job
            _plot(ctx.run_dir)
            (ctx.run_dir / SUMMARY_FILE).write_text(
                json.dumps(summary, indent=2, sort_keys=True) + "\n"
            )
    if finishing.requested and is_main_process():
        print(
            f"jaxrl-llm train: received {finishing.signal_name} after the last step; finished "
            "writing the export and the summary first",
            flush=True,
        )
    return summary


def train(config: RunConfig, *, resume: bool = False) -> dict[str, Any]:
    """Run a whole training run: `run_training(prepare_run(config, resume=resume))`.

    Args:
      config: the validated `RunConfig` (`run_dir` set).
      resume: continue from the newest checkpoint in `run_dir/checkpoints`.

    Returns:
      The summary written to `run_dir/summary.json` (module docstring).

    Examples:
      A config that cannot run fails before anything is compiled:

      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> train(RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig()))
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: run_dir: not set; pass --run-dir or set run_dir in the config.
    """
    return run_training(prepare_run(config, resume=resume))
