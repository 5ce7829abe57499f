"""The measurements of `benchmarks.bench_grpo` that run jaxrl_llm, one per fresh process.

    python -m benchmarks.grpo_worker ours WORKLOAD_JSON MODE STEPS CHUNK CACHE_DIR|none
    python -m benchmarks.grpo_worker matmul [N]

Each prints one `RESULT {json}` line (`benchmarks.workloads.emit`). A fresh process per
measurement makes time to first step include everything a user's run pays after its imports
(model initialisation, tracing, compilation or loading from the persistent cache, the step),
and makes peak memory that run's own.

`ours` runs a GRPO workload (`benchmarks.workloads`) built as a `RunConfig` (the arithmetic
task, the in-graph exact-answer reward, the `grpo` preset: β = 0.04, ε = 0.2, one update per
batch; AdamW 1e-3 with clipping at 1) through the runner:

- MODE `loop`: `runner.loop._rl_step`, the step-by-step loop of `jaxrl-llm train`; its
  per-phase wall times (sample + reward, reference forward + advantages, update) are
  recorded, then the update step alone (the loop's compiled program) is timed on one batch
  (median), with XLA's `cost_analysis` FLOP count of it.
- MODE `scaling`: as `loop`, and XLA's memory analysis of the update step (one more compile).
- MODE `compiled`: `runner.compiled.compiled_steps` with `train.compiled_iterations = CHUNK`;
  seconds per step is chunk time / CHUNK over the chunks after the first, time to first step
  the time to the end of the first chunk (its results reach the host together).

Compilation is accounted with JAX's monitoring events up to the end of the first step: tracing
(`trace_s`), lowering to StableHLO (`lower_s`), XLA compilation or, on a persistent-cache hit,
fetching the executable (`compile_or_cache_load_s`; `cache_load_s` of it is the reading of the
cache files), and the counts of cache hits and misses.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import resource
import statistics
import sys
import tempfile
import time

from benchmarks.workloads import (
    BETA,
    EPSILON,
    LEARNING_RATE,
    MAX_GRAD_NORM,
    PROMPT_LEN,
    Workload,
    emit,
    iteration_flops,
    load_average,
)

_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "compile_or_cache_load_s",
    "/jax/compilation_cache/cache_retrieval_time_sec": "cache_load_s",
}


class CompileTally:
    """Sums JAX's compilation durations (and counts cache hits / misses) while installed."""

    def __init__(self) -> None:
        import jax

        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.counts: dict[str, int] = collections.defaultdict(int)
        self.active = True

        def on_duration(event: str, duration: float, **kwargs) -> None:
            if self.active and event in _EVENTS:
                self.seconds[_EVENTS[event]] += duration

        def on_event(event: str, **kwargs) -> None:
            if self.active and event.startswith("/jax/compilation_cache/cache_"):
                self.counts[event.rsplit("/", 1)[-1]] += 1

        jax.monitoring.register_event_duration_secs_listener(on_duration)
        jax.monitoring.register_event_listener(on_event)

    def snapshot(self) -> dict:
        """The sums so far (seconds rounded), then stop counting."""
        self.active = False
        out = {k: round(v, 3) for k, v in sorted(self.seconds.items())}
        out.update(dict(self.counts))
        return out


def _peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run_config(w: Workload, run_dir: str, cache_dir: str | None, chunk: int | None):
    """The workload as a `RunConfig` (module docstring)."""
    from jaxrl_llm.data import ArithmeticConfig, DataConfig
    from jaxrl_llm.metrics_log import MetricsConfig
    from jaxrl_llm.rewards import RewardConfig
    from jaxrl_llm.runner.config import ExportConfig, ModelSection, RunConfig, TrainConfig
    from jaxrl_llm.sampler import SamplingConfig
    from jaxrl_llm.train import OptimConfig, preset

    model = w.shape.model_config()
    grpo = preset("grpo")
    if grpo.kl.coef != BETA or grpo.policy_loss.clip_low != EPSILON:
        raise RuntimeError(f"the grpo preset changed: β={grpo.kl.coef}, ε={grpo.policy_loss}")
    return RunConfig(
        model=ModelSection(init=model),
        data=DataConfig(arithmetic=ArithmeticConfig(max_digits=2, train_size=2000, eval_size=8)),
        rewards=RewardConfig(jax_native=True),
        algorithm=grpo,
        optim=OptimConfig(name="adamw", learning_rate=LEARNING_RATE, max_grad_norm=MAX_GRAD_NORM),
        sampling=SamplingConfig(max_new_tokens=w.new_tokens, num_samples=w.samples),
        train=TrainConfig(
            steps=10**6,
            prompts_per_step=w.prompts,
            eval_prompts=0,
            compiled_iterations=chunk,
            compilation_cache=cache_dir,
        ),
        metrics=MetricsConfig(console=False, tensorboard=False),
        export=ExportConfig(enabled=False),
        run_dir=run_dir,
    )


def _update_batch(ctx, state, data, step):
    """The update batch of one step, built as `runner.loop._rl_step` builds it."""
    import jax

    from jaxrl_llm.runner.keys import SAMPLE_STREAM, fold_in, stream_key
    from jaxrl_llm.runner.programs import advantage_program, logprob_program
    from jaxrl_llm.runner.rollout import collect

    alg = ctx.config.algorithm
    key = fold_in(stream_key(ctx.config.seed, SAMPLE_STREAM), step)
    collected, data = collect(ctx, state, data, key)
    seqs = collected.sequences
    logprob = logprob_program(ctx.graphs.policy, alg.temperature, alg.chunk_size)
    with jax.set_mesh(ctx.mesh):
        ref = logprob(ctx.reference, state.frozen["policy"], seqs)
        batch, _ = advantage_program(alg, ctx.sampling.num_samples)(
            tokens=seqs.tokens,
            attention_mask=seqs.attention_mask,
            completion_mask=seqs.completion_mask,
            rewards=collected.signal,
            old_logp=None,
            ref_logp=ref,
            kl_coef=state.kl.beta,
        )
    return batch


def update_alone(ctx, state, data, step: int, repeat: int, memory: bool) -> tuple[dict, object]:
    """Median seconds of the run's own compiled update step (`ctx.update`, compiled by the loop
    already) on one batch, and XLA's FLOP count of it (from the lowered program). With
    `memory`, the program is compiled once more for XLA's memory analysis: the bytes of its
    arguments (state and batch), outputs and temporaries (activations kept for the backward
    pass, gradients)."""
    import jax

    from jaxrl_llm.runner.compiled import _update_step
    from jaxrl_llm.runner.programs import prompt_group_size

    batch = _update_batch(ctx, state, data, step)
    group_size = prompt_group_size(ctx.config, ctx.mesh, update=True)
    config = ctx.config
    update = _update_step(config.algorithm, ctx.graphs, config.optim, group_size, config.group_size)
    lowered = update.lower(state, batch)
    cost = lowered.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    sizes = {}
    if memory:
        analysis = lowered.compile().memory_analysis()
        for key in ("argument", "output", "temp"):
            sizes[f"xla_{key}_mb"] = round(getattr(analysis, f"{key}_size_in_bytes") / 2**20, 2)
    times = []
    for _ in range(repeat + 1):
        started = time.perf_counter()
        with jax.set_mesh(ctx.mesh):
            state, metrics = ctx.update(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - started)
    out = {
        "median_s": round(statistics.median(times[1:]), 5),
        "xla_flops": float(cost.get("flops", 0.0)) if cost else None,
        **sizes,
    }
    return out, state


def _loop_steps(ctx, state, data, steps: int, imported: float, tally: CompileTally) -> dict:
    from jaxrl_llm.runner import loop

    times, tokens, phases = [], [], collections.defaultdict(list)
    for step in range(1, steps + 2):
        started = time.perf_counter()
        state, data, metrics = loop._rl_step(ctx, state, data, step)
        times.append(time.perf_counter() - started)
        tokens.append(metrics["rollout/completion_tokens"])
        if step == 1:
            first, compile_ = time.perf_counter() - imported, tally.snapshot()
            continue
        for key in ("time/sample_s", "time/reward_s", "time/forward_s", "time/update_s"):
            phases[key.split("/")[1]].append(metrics[key])
    return {
        "state": state,
        "data": data,
        "step_times": times[1:],
        "first": first,
        "compile": compile_,
        "tokens": tokens,
        "phases_median_s": {k: round(statistics.median(v), 5) for k, v in phases.items()},
    }


def _compiled_steps(ctx, state, data, steps: int, chunk: int, imported: float, tally) -> dict:
    from jaxrl_llm.runner.compiled import compiled_steps
    from jaxrl_llm.runner.keys import SAMPLE_STREAM, stream_key

    key = stream_key(ctx.config.seed, SAMPLE_STREAM)
    total = chunk * (1 + max(3, -(-steps // chunk)))  # the first chunk compiles
    first, compile_, times, tokens = None, None, [], []
    for step, _, _, metrics, end in compiled_steps(ctx, state, data, 0, total, key):
        if first is None:
            first, compile_ = time.perf_counter() - imported, tally.snapshot()
        if step == end and step > chunk:  # the chunks after the first (compiling) one
            times.append(metrics["time/step_s"])
        tokens.append(metrics["rollout/completion_tokens"])
    return {
        "state": state,
        "step_times": times,
        "first": first,
        "compile": compile_,
        "tokens": tokens,
    }


def worker_ours(w: Workload, mode: str, steps: int, chunk: int, cache_dir: str | None) -> dict:
    """One workload in this process (module docstring)."""
    import jax

    from jaxrl_llm.runner.setup import prepare_run

    tally = CompileTally()
    imported = time.perf_counter()
    loads = [load_average()]
    with tempfile.TemporaryDirectory() as run_dir:
        config = run_config(w, run_dir, cache_dir, chunk if mode == "compiled" else None)
        prepared = prepare_run(config)
        prepared.checkpointer.close()
        ctx = prepared.context
        if ctx.task.prompt_length != PROMPT_LEN:
            raise RuntimeError(f"prompt length {ctx.task.prompt_length}, expected {PROMPT_LEN}")
        if mode in ("loop", "scaling"):
            run = _loop_steps(ctx, prepared.state, prepared.data, steps, imported, tally)
            memory = mode == "scaling"
            update, _ = update_alone(ctx, run["state"], run["data"], steps + 2, steps, memory)
        else:
            run = _compiled_steps(ctx, prepared.state, prepared.data, steps, chunk, imported, tally)
            update = None
    loads.append(load_average())
    step_s = statistics.median(run["step_times"])
    flops = iteration_flops(w)
    result = {
        "impl": f"jaxrl_llm_{mode}",
        "workload": dataclasses.asdict(w),
        "seconds_per_step": round(step_s, 5),
        "step_times": [round(t, 5) for t in run["step_times"]],
        "time_to_first_step_s": round(run["first"], 3),
        "compile_to_first_step": run["compile"],
        "mean_completion_tokens": statistics.mean(run["tokens"]),
        "gflop_per_iteration": round(flops["iteration"] / 1e9, 4),
        "gflops": round(flops["iteration"] / step_s / 1e9, 2),
        "peak_rss_mb": _peak_rss_mb(),
        "load_avg_1min": loads,
        "jax": jax.__version__,
        "devices": str(jax.devices()),
    }
    if mode in ("loop", "scaling"):
        result["phases_median_s"] = run["phases_median_s"]
        result["update"] = {
            **update,
            "model_flops": flops["update"],
            "gflops": round(flops["update"] / update["median_s"] / 1e9, 2),
        }
    else:
        result["iterations_per_call"] = chunk
    return result


def worker_matmul(n: int = 2048, repeat: int = 20) -> dict:
    """The float32 matmul peak: the median time of an `n × n` product, in GFLOP/s."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(jnp.matmul)
    jax.block_until_ready(f(a, b))
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        jax.block_until_ready(f(a, b))
        times.append(time.perf_counter() - started)
    best, median = min(times), statistics.median(times)
    return {
        "impl": "jax",
        "n": n,
        "median_s": round(median, 5),
        "gflops_median": round(2 * n**3 / median / 1e9, 1),
        "gflops_best": round(2 * n**3 / best / 1e9, 1),
        "load_avg_1min": load_average(),
        "jax": jax.__version__,
    }


def main(argv: list[str]) -> None:
    if argv[0] == "matmul":
        emit(worker_matmul(*(int(a) for a in argv[1:2])))
        return
    _, workload, mode, steps, chunk, cache = argv
    w = Workload(**json.loads(workload))
    emit(worker_ours(w, mode, int(steps), int(chunk), None if cache == "none" else cache))


if __name__ == "__main__":
    main(sys.argv[1:])
