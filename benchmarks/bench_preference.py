"""DPO's update step and reference forward with each pair's prompt run once, against the
concatenated forward (`PreferenceConfig.shared_prompt`).

Run with `python -m benchmarks.bench_preference [--out FILE.json] [--repeat 7] [--quick]`.
Never part of the test suite's pass/fail.

The workload is one offline DPO step on the benchmark models (`benchmarks.workloads`,
Qwen3-shaped, vocabulary 259, random weights): `N` pairs whose chosen and rejected completions
of `T` tokens follow the same prompt of `P` tokens (random tokens, every position real), β = 0.1,
AdamW 1e-3 with clipping at 1 (`train.make_update_step`), and the reference log-probs that
`prepare_preference_batch` computes before it. Each case is compiled and timed with
`shared_prompt` off (chosen and rejected rows concatenated: `2·(P + T)` token rows per pair)
and on (`P + 2·T`), in one process, the two forms alternating call by call; the table reports
the median of `--repeat` calls of each.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks.workloads import MODELS, load_average, machine
from jaxrl_llm.models import Decoder
from jaxrl_llm.train import (
    OptimConfig,
    PreferenceBatch,
    PreferenceConfig,
    SequenceBatch,
    init_train_state,
    make_logprob_fn,
    make_optimizer,
    make_update_step,
    preference_objective,
    prepare_preference_batch,
    split_models,
)

CASES = [  # (model, pairs, prompt length P, completion length T)
    ("small", 8, 64, 64),
    ("small", 8, 128, 32),
    ("small", 16, 32, 32),
]
QUICK = [("tiny", 8, 32, 16)]
OPTIM = OptimConfig(name="adamw", learning_rate=1e-3, max_grad_norm=1.0)


def pairs(vocab: int, N: int, P: int, T: int) -> PreferenceBatch:
    """`N` random pairs: one prompt per pair, two different completions."""
    key = jax.random.key(0)
    prompts = jax.random.randint(key, (N, P), 1, vocab)

    def side(i: int) -> SequenceBatch:
        completions = jax.random.randint(jax.random.fold_in(key, i), (N, T), 1, vocab)
        tokens = jnp.concatenate([prompts, completions], axis=1)
        return SequenceBatch(tokens, jnp.ones_like(tokens), jnp.ones((N, T), jnp.float32))

    return PreferenceBatch(chosen=side(1), rejected=side(2))


def programs(size: str, batch: PreferenceBatch, shared: bool) -> dict[str, Any]:
    """The compiled reference forward and update step of one form, with their inputs."""
    cfg = MODELS[size].model_config()
    graphs, params, frozen = split_models(Decoder(cfg, rngs=nnx.Rngs(0)))
    config = PreferenceConfig(loss="dpo", beta=0.1, shared_prompt=shared)
    logprob_fn = make_logprob_fn(graphs.policy, group_size=config.prompt_group_size)
    tx = make_optimizer(OPTIM)
    state = init_train_state(params, frozen, tx, key=jax.random.key(0))

    def prepare(policy: Any, frozen_policy: Any, batch: PreferenceBatch) -> PreferenceBatch:
        out, _ = prepare_preference_batch(
            config,
            batch,
            logprob_fn=logprob_fn,
            policy_params=policy,
            ref_params=policy,
            frozen=frozen_policy,
        )
        return out

    args = (state.params["policy"], state.frozen["policy"], batch)
    started = time.perf_counter()
    reference = jax.jit(prepare).lower(*args).compile()
    prepared = reference(*args)
    step = make_update_step(preference_objective(config, graphs), tx)
    update = jax.jit(step).lower(state, prepared).compile()
    compile_s = time.perf_counter() - started
    return {
        "reference": (reference, args),
        "update": (update, (state, prepared)),
        "compile_s": compile_s,
    }


def _time(fn: Any, args: tuple) -> float:
    started = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - started


def measure(size: str, N: int, P: int, T: int, repeat: int) -> dict:
    batch = pairs(MODELS[size].vocab_size, N, P, T)
    forms = {shared: programs(size, batch, shared) for shared in (False, True)}
    times: dict[tuple[bool, str], list[float]] = {}
    for _ in range(repeat + 1):  # the first round warms up
        for shared, progs in forms.items():
            for part in ("reference", "update"):
                fn, args = progs[part]
                times.setdefault((shared, part), []).append(_time(fn, args))
    median = {k: statistics.median(v[1:]) for k, v in times.items()}
    row = {
        "model": size,
        "pairs": N,
        "prompt_len": P,
        "completion_len": T,
        "token_rows": {"concatenated": 2 * N * (P + T), "shared_prompt": N * (P + 2 * T)},
        "load_avg_1min": round(load_average(), 2),
    }
    for shared, name in ((False, "concatenated"), (True, "shared_prompt")):
        row[name] = {
            "update_s": round(median[(shared, "update")], 4),
            "reference_s": round(median[(shared, "reference")], 4),
            "compile_s": round(forms[shared]["compile_s"], 2),
        }
    for part in ("update", "reference"):
        row[f"{part}_speedup"] = round(median[(False, part)] / median[(True, part)], 2)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the results to this JSON file")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="the tiny model, one case")
    args = parser.parse_args(argv)
    results = []
    for case in QUICK if args.quick else CASES:
        row = measure(*case, args.repeat)
        print(json.dumps(row), flush=True)
        results.append(row)
    if args.out:
        out = {"machine": machine(), "results": results}
        pathlib.Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
