"""The fully compiled RL iteration: sample → reward → advantages → log-probs → update, `K` at a
time in one program (`train.compiled_iterations: K`).

With an in-graph reward (`rewards.jax_native`, the built-in tasks) nothing in an RL iteration
needs the host, so `K` iterations run as one `lax.scan` per host call (the end-to-end compiled
pattern of PureJaxRL, from "Discovered Policy Optimisation", Lu et al. 2022, arXiv 2210.05639,
applied to a language model):

    host, once per run      the train split tokenized into device arrays   TaskArrays [M, P], [M, A]
    host, once per chunk    the prompt indices of the K iterations          next_batch × K → [K, B]
    device, one program     scan over k = 1 … K:
        key_k      = fold_in(fold_in(fold_in(key(seed), 1), step_k), 0)     (the loop's key)
        prompts    = TaskArrays[indices_k]                                  (a gather)
        rollout, r = sample_tokens + exact_answer_reward                    (`rollout_program`)
        signal     = w·r (+ overlong punishment) (GDPO-normalised with combine: decoupled)
        old, ref   = policy / reference log-probs when the algorithm reads them
        batch      = build_rl_batch(...)                                    (`advantage_program`)
        state      = update(state, batch)                                   (the run's update step)
        metrics_k  = the step-by-step loop's reward, response, advantage and update metrics
    host, once per chunk    one transfer of the stacked [K] metrics; log, checkpoint, evaluate

The programs called inside are the very jitted programs the step-by-step loop calls
(`runner.programs`), so one iteration computes what `loop._rl_step` computes from the same
state, prompts and key: the test compares the parameters after a few iterations and every
logged metric (`tests/runner/test_compiled.py`). Only wall-clock metrics differ: a chunk is
timed as a whole, and each of its steps reports `time/step_s` = chunk time / K (the per-phase
`time/sample_s`, `time/reward_s`, `time/forward_s`, `time/update_s` do not exist in one
program and are not reported). With XLA's default optimisation level the parameters after a
chunk of `K > 1` iterations are also bit for bit those of the loop; with most optimisations off
(`jax_disable_most_optimizations`, the runner tests) the loop body of the scan can round the
last bit differently (parameters within 1e-7; the per-step metrics of the test run are equal).

Chunks end at multiples of `K` (and at `train.steps`), counted in absolute steps, so a resumed
run cuts its chunks where an uninterrupted one does. Evaluation, checkpoints, SIGTERM and the
divergence stop act at chunk ends: the config requires `train.eval_every` and
`checkpoint.every` to be multiples of `K`; a signal stops the run after the current chunk; a
divergence found inside a chunk stops the run at the chunk's end (with its checkpoint).

What needs the host between sampling and the update is rejected when the config loads
(`runner.config`): reward functions on decoded text, and DAPO's refills (re-sampling until
`B` groups have a reward spread; `train.max_refills: 0` keeps the in-graph zero-variance
filter).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_llm.data import IteratorState, next_batch
from jaxrl_llm.runner.context import RunContext
from jaxrl_llm.runner.in_graph import TaskArrays, in_graph_scores, rollout_metrics, task_arrays
from jaxrl_llm.runner.programs import (
    advantage_program,
    kept_rows_logprob_program,
    logprob_program,
    prompt_group_size,
    rollout_program,
    value_program,
)
from jaxrl_llm.runner.rollout import in_graph_stop_ids, sampler_old_logprobs
from jaxrl_llm.train import (
    AlgorithmConfig,
    ModelGraphs,
    OptimConfig,
    SequenceBatch,
    keeps_row_subset,
    kl_controller,
    make_optimizer,
    make_update_step,
    rl_objective,
    sync_reference,
)
from jaxrl_llm.train.shardings import train_state_shardings

_CACHE_SIZE = 16


def chunk_indices(
    data: IteratorState, *, num_examples: int, batch_size: int, shuffle: bool, length: int
) -> tuple[np.ndarray, IteratorState]:
    """The prompt indices of `length` consecutive steps (`next_batch` `length` times).

    Returns:
      `(indices[length, batch_size] int32, the iterator state after them)`.

    Examples:
      >>> idx, after = chunk_indices(IteratorState(seed=0, epoch=0, position=0), num_examples=5,
      ...                            batch_size=3, shuffle=True, length=2)
      >>> idx.tolist(), after
      ([[2, 4, 3], [0, 1, 1]], IteratorState(seed=0, epoch=1, position=1))
    """
    rows = []
    for _ in range(length):
        indices, data = next_batch(
            data, num_examples=num_examples, batch_size=batch_size, shuffle=shuffle
        )
        rows.append(indices)
    return np.asarray(rows, np.int32).reshape(length, batch_size), data


def chunk_ends(start: int, steps: int, every: int) -> list[int]:
    """The last steps of the chunks between `start` (done) and `steps`: multiples of `every`,
    and `steps`.

    Examples:
      >>> chunk_ends(0, 10, 4), chunk_ends(5, 10, 4), chunk_ends(0, 3, 1)
      ([4, 8, 10], [8, 10], [1, 2, 3])
    """
    ends, step = [], start
    while step < steps:
        step = min((step // every + 1) * every, steps)
        ends.append(step)
    return ends


class _Spec(NamedTuple):
    """The static settings one compiled iteration depends on (hashable: the program cache key)."""

    graphs: ModelGraphs
    sampling: Any
    stop_ids: tuple[int, ...]
    algorithm: AlgorithmConfig
    optim: OptimConfig
    reward_weight: float
    combine: str
    overlong: Any
    overlong_max_length: int | None
    truncation_penalty: float | None
    prompts_per_step: int
    mesh: Any
    forward_group: int  # rows per shared prompt of the log-prob forwards
    update_group: int  # ... and of the update (`programs.prompt_group_size`)
    reference_sync: Any  # `train.reference_sync` (None: off)


def _spec(ctx: RunContext) -> _Spec:
    config = ctx.config
    stop_ids = in_graph_stop_ids(config, ctx.tokenizer)
    if config.kind != "rl" or stop_ids is None:
        raise ValueError(
            "compiled_steps: the compiled iteration needs an RL run with the in-graph reward "
            f"(rewards.jax_native: true), got a {config.kind!r} run with jax_native="
            f"{config.rewards.jax_native}."
        )
    return _Spec(
        graphs=ctx.graphs,
        sampling=ctx.sampling,
        stop_ids=stop_ids,
        algorithm=config.algorithm,
        optim=config.optim,
        reward_weight=float(config.rewards.weights()[0]),
        combine=config.rewards.combine,
        overlong=config.train.overlong,
        overlong_max_length=config.overlong_max_length,
        truncation_penalty=config.train.truncation_penalty,
        prompts_per_step=config.train.prompts_per_step,
        mesh=ctx.mesh,
        forward_group=prompt_group_size(config, ctx.mesh, update=False),
        update_group=prompt_group_size(config, ctx.mesh, update=True),
        reference_sync=config.train.reference_sync,
    )


def _update_step(
    alg: AlgorithmConfig,
    graphs: ModelGraphs,
    optim: OptimConfig,
    group_size: int,
    samples_per_prompt: int,
) -> Any:
    """The run's update step (`programs.update_program`) without its mesh wrapper, which
    cannot be entered inside `jit`: the enclosing program runs under the mesh instead."""
    return make_update_step(
        rl_objective(alg, graphs, group_size=group_size, samples_per_prompt=samples_per_prompt),
        make_optimizer(optim),
        epochs=alg.epochs,
        minibatches=alg.minibatches,
        accumulation_steps=optim.accumulation_steps,
        shuffle=alg.shuffle,
        kl_controller=kl_controller(alg.kl),
        skip_nonfinite=True,
    )


def _scored_rollout(spec: _Spec) -> Callable[..., Any]:
    """`(policy, frozen, TaskArrays of B prompts, key) -> (Rollout, correct, total, signal)`:
    what `runner.rollout.collect` computes for an in-graph reward (one pass, no refills)."""
    rollout = rollout_program(spec.graphs.policy, spec.sampling, spec.stop_ids)

    def scored(policy: Any, frozen: Any, prompts: TaskArrays, key: jax.Array) -> Any:
        out, correct = rollout(policy, frozen, *prompts, key)
        total, signal = in_graph_scores(
            correct,
            out.lengths,
            weight=spec.reward_weight,
            group_size=spec.sampling.num_samples,
            combine=spec.combine,
            overlong=spec.overlong,
            overlong_max_length=spec.overlong_max_length,
            truncated=out.truncated,
            truncation_penalty=spec.truncation_penalty,
        )
        return out, correct, total, signal

    return scored


def _update_batch(spec: _Spec) -> Callable[..., Any]:
    """`(state, reference, Rollout, signal) -> (batch, advantage metrics)`: the forwards and
    `build_rl_batch` of `runner.loop._rl_step`."""
    alg = spec.algorithm
    logprob = logprob_program(
        spec.graphs.policy, alg.temperature, alg.chunk_size, spec.forward_group
    )
    batch_alg = alg
    if spec.combine == "decoupled":  # the signal is already group-normalised (as in the loop)
        batch_alg = dataclasses.replace(
            alg, advantage=dataclasses.replace(alg.advantage, scale="none")
        )
    advantages = advantage_program(batch_alg, spec.sampling.num_samples)
    ref_after = keeps_row_subset(alg, spec.sampling.num_samples)
    pairs = kept_rows_logprob_program(spec.graphs.policy, alg, spec.forward_group)
    values_of = value_program(spec.graphs, spec.forward_group) if alg.critic is not None else None

    def build(state: Any, reference: Any, out: Any, signal: jax.Array) -> Any:
        policy, frozen = state.params["policy"], state.frozen["policy"]
        seqs = SequenceBatch(
            tokens=out.tokens,
            attention_mask=out.attention_mask.astype(jnp.int32),
            completion_mask=out.completion_mask.astype(jnp.float32),
        )
        old = None
        if alg.needs_old_logprobs and alg.old_logprobs == "sampler":
            old = sampler_old_logprobs(seqs, out.logprobs)
        elif alg.needs_old_logprobs:
            old = logprob(policy, frozen, seqs)
        ref = logprob(reference, frozen, seqs) if alg.needs_reference and not ref_after else None
        values = values_of(state.params, state.frozen, seqs) if values_of is not None else None
        batch, metrics = advantages(
            tokens=seqs.tokens,
            attention_mask=seqs.attention_mask,
            completion_mask=seqs.completion_mask,
            rewards=signal,
            old_logp=old,
            ref_logp=ref,
            old_values=values,
            rollout_logp=out.sampling_logprobs if alg.rollout_correction else None,
            kl_coef=state.kl.beta,
        )
        if ref_after:  # online DPO's reference forward on the kept pairs (as in the loop)
            kept = SequenceBatch(batch.tokens, batch.attention_mask, batch.completion_mask)
            batch = batch._replace(ref_logp=pairs(reference, frozen, kept))
        return batch, metrics

    return build


def _dapo_metrics(signal: jax.Array, group_size: int, B: int) -> dict[str, jax.Array]:
    """The dynamic-sampling metrics of one sampled batch (DAPO without refills)."""
    groups = signal.reshape(-1, group_size)
    kept = jnp.sum((groups.max(axis=1) > groups.min(axis=1)).astype(jnp.float32))
    return {
        "dapo/sampled_batches": jnp.ones((), jnp.float32),
        "dapo/kept_groups": jnp.minimum(kept, float(B)),
        "dapo/kept_groups_frac": kept / B,
    }


def _build_iteration(spec: _Spec) -> Callable[..., Any]:
    scored = _scored_rollout(spec)
    build_batch = _update_batch(spec)
    update = _update_step(
        spec.algorithm, spec.graphs, spec.optim, spec.update_group, spec.sampling.num_samples
    )
    G = spec.sampling.num_samples

    def iteration(
        state: Any, reference: Any, task: TaskArrays, indices: jax.Array, step: jax.Array, key: Any
    ) -> tuple[Any, dict[str, jax.Array]]:
        step_key = jax.random.fold_in(jax.random.fold_in(key, step), 0)  # refill 0 of `step`
        prompts = jax.tree.map(lambda x: x[indices], task)
        out, correct, total, signal = scored(
            state.params["policy"], state.frozen["policy"], prompts, step_key
        )
        if state.reference is not None:  # `train.reference_sync`: the state holds it
            reference = state.reference
        batch, adv_metrics = build_batch(state, reference, out, signal)
        state, metrics = update(state, batch)
        metrics = {**metrics, **adv_metrics}
        sync = spec.reference_sync
        if sync is not None:  # after every `every`-th update, as the loop does
            due = step % sync.every == 0
            optimizer = make_optimizer(spec.optim) if sync.reset_optimizer else None
            synced = functools.partial(sync_reference, alpha=sync.alpha, optimizer=optimizer)
            state = jax.lax.cond(due, synced, lambda s: s, state)
            metrics["ref/synced"] = due.astype(jnp.float32)
        metrics.update(rollout_metrics(total, correct, out.lengths, out.truncated))
        if spec.algorithm.advantage.drop_zero_variance:
            metrics.update(_dapo_metrics(signal, G, spec.prompts_per_step))
        return state, metrics

    return iteration


def make_iteration(ctx: RunContext) -> Callable[..., Any]:
    """One RL iteration as a pure function of arrays (module docstring).

    Args:
      ctx: the run context (in-graph rewards).

    Returns:
      `iteration(state, reference, task, indices[B], step, sample_key) -> (state, metrics)`;
      `reference` is the frozen reference policy's parameters (None without KL), `task` the
      `TaskArrays`, `sample_key` the loop's sampling stream key.

    Raises:
      ValueError: the run is not an RL run with the in-graph reward.

    Examples:
      `iterations_program` runs it under `lax.scan`; `tests/runner/test_compiled.py` checks
      it against the step-by-step loop. Without the in-graph reward there is none:

      >>> from jaxrl_llm.runner.config import ModelSection, RunConfig
      >>> from jaxrl_llm.train import SFTConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig())
      >>> make_iteration(RunContext(cfg, *([None] * 9)))
      Traceback (most recent call last):
      ...
      ValueError: compiled_steps: the compiled iteration needs an RL run with the in-graph reward (rewards.jax_native: true), got a 'sft' run with jax_native=False.
    """
    return _build_iteration(_spec(ctx))


_PROGRAMS: dict[Any, Callable[..., Any]] = {}


def iterations_program(ctx: RunContext, state: Any, length: int) -> Callable[..., Any]:
    """`length` iterations as one jitted `lax.scan`, the state donated; cached per process.

    Returns:
      `run(state, reference, task, indices[length, B], steps[length], sample_key) ->
      (state, metrics)` with every metric stacked to `[length]`.

    Raises:
      ValueError: `length < 1`, or the run has no compiled iteration (`make_iteration`).

    Examples:
      `compiled_steps` calls it once per chunk length (`K`, and a shorter last or first
      chunk); `tests/runner/test_compiled.py` compares it with the step-by-step loop.

      >>> iterations_program(None, None, 0)
      Traceback (most recent call last):
      ...
      ValueError: iterations_program: `length` must be >= 1, got 0.
    """
    if length < 1:
        raise ValueError(f"iterations_program: `length` must be >= 1, got {length}.")
    spec = _spec(ctx)
    key = (spec, length, jax.tree.structure(state))
    if key in _PROGRAMS:
        return _PROGRAMS[key]
    iteration = _build_iteration(spec)

    def run(
        state: Any,
        reference: Any,
        task: TaskArrays,
        indices: jax.Array,
        steps: jax.Array,
        sample_key: Any,
    ) -> tuple[Any, dict[str, jax.Array]]:
        def body(carry: Any, xs: tuple[jax.Array, jax.Array]) -> Any:
            return iteration(carry, reference, task, xs[0], xs[1], sample_key)

        return jax.lax.scan(body, state, (indices, steps))

    shardings = train_state_shardings(state, spec.mesh, make_optimizer(spec.optim))
    replicated = NamedSharding(spec.mesh, PartitionSpec())
    jitted = jax.jit(run, out_shardings=(shardings, replicated), donate_argnums=0)

    def program(state: Any, *args: Any) -> tuple[Any, dict[str, jax.Array]]:
        with jax.set_mesh(spec.mesh):
            return jitted(state, *args)

    if len(_PROGRAMS) >= _CACHE_SIZE:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[key] = program
    return program


def _host_metrics(stacked: dict[str, Any], length: int, seconds: float) -> list[dict[str, float]]:
    """Per-step host metrics from the `[length]`-stacked ones; the chunk's time split evenly."""
    per_step = seconds / length
    out = []
    for i in range(length):
        metrics = {k: float(v[i]) for k, v in stacked.items()}
        metrics["time/step_s"] = per_step
        tokens = metrics["rollout/completion_tokens"]
        metrics["perf/tokens_per_sec"] = tokens / max(per_step, 1e-9)
        out.append(metrics)
    return out


def compiled_steps(
    ctx: RunContext,
    state: Any,
    data: IteratorState,
    start: int,
    steps: int,
    sample_key: Any,
) -> Iterator[tuple[int, Any, IteratorState, dict[str, float], int]]:
    """Run steps `start + 1 … steps` in compiled chunks of `train.compiled_iterations`.

    Args:
      ctx: the run context.
      state: the `TrainState` after step `start` (donated to the first chunk).
      data: the train iterator position after step `start`.
      start: steps already done.
      steps: the last step.
      sample_key: the loop's sampling stream key (`fold_in(key(seed), 1)`).

    Yields:
      `(step, state, data, metrics, chunk_end)` for every step in order: the state and data
      position are those after the chunk that holds `step` (its last step is `chunk_end`), the
      metrics are the step's own (host floats).

    Raises:
      ValueError: the run has no compiled iteration (`make_iteration`).

    Examples:
      The loop (`runner.loop.run_training`) consumes it when `train.compiled_iterations` is set;
      `tests/runner/test_compiled.py` checks it against the step-by-step loop. Nothing to do
      when `start == steps`:

      >>> list(compiled_steps(None, None, None, 5, 5, None))
      []
    """
    if start >= steps:
        return
    config = ctx.config
    ends = chunk_ends(start, steps, config.train.compiled_iterations or 1)
    task = task_arrays(ctx)
    step = start
    for end in ends:
        length = end - step
        indices, data = chunk_indices(
            data,
            num_examples=len(ctx.task.train),
            batch_size=config.train.prompts_per_step,
            shuffle=config.data.shuffle,
            length=length,
        )
        program = iterations_program(ctx, state, length)
        started = time.perf_counter()
        state, stacked = program(
            state,
            ctx.reference,
            task,
            jnp.asarray(indices),
            jnp.arange(step + 1, end + 1, dtype=jnp.int32),
            sample_key,
        )
        stacked = jax.device_get(stacked)
        for i, metrics in enumerate(_host_metrics(stacked, length, time.perf_counter() - started)):
            yield step + 1 + i, state, data, metrics, end
        step = end
