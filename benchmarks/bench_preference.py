"""DPO's update step and reference forward, and a reward model's update step, with each
pair's prompt run once (`PreferenceConfig.shared_prompt`, `RewardModelConfig.shared_prompt`)
against the concatenated forward; and, on pairs of uneven lengths, packed pairs
(`PreferenceConfig.packing`) against the shared prompt.

Run with `python -m benchmarks.bench_preference [--out FILE.json] [--repeat 7] [--quick]`.
Never part of the test suite's pass/fail.

The workload is one offline DPO step on the benchmark models (`benchmarks.workloads`,
Qwen3-shaped, vocabulary 259, random weights): `N` pairs whose chosen and rejected completions
of `T` tokens follow the same prompt of `P` tokens (random tokens, every position real), β = 0.1,
AdamW 1e-3 with clipping at 1 (`train.make_update_step`), and the reference log-probs that
`prepare_preference_batch` computes before it. Each case is compiled and timed in two forms,
in one process, alternating call by call; the table reports the median of `--repeat` calls of
each. Fixed-length cases compare `shared_prompt` off (chosen and rejected rows concatenated:
`2·(P + T)` token slots per pair) and on (`P + 2·T`). The uneven case (`dpo_uneven`) draws each
pair's prompt from 8..P tokens and each completion from 4..T (a seeded draw; the first pair
full length, so the batch pads to `P` and `T`), as real preference data is, and compares the
shared prompt with packed pairs (`Σ p + c + r` real tokens in rows of `P + 2·T` slots). The
reward-model cases (`reward_model`, `reward_model_uneven`) train a `ValueModel` of the same
shape with Bradley-Terry (`train.reward_model_objective`) on the same pairs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.workloads import MODELS, load_average, write_results
from jaxrl_llm.data import PreferenceDataConfig, TokenizedPreference, make_preference_batch
from jaxrl_llm.models import Decoder, ValueModel
from jaxrl_llm.train import (
    OptimConfig,
    PreferenceBatch,
    PreferenceConfig,
    RewardModelConfig,
    SequenceBatch,
    init_train_state,
    make_logprob_fn,
    make_optimizer,
    make_update_step,
    pack_preference_batch,
    preference_objective,
    prepare_preference_batch,
    reward_model_objective,
    split_models,
)

CASES = [  # (model, pairs, prompt length P, completion length T, objective)
    ("small", 8, 64, 64, "dpo"),
    ("small", 8, 128, 32, "dpo"),
    ("small", 16, 32, 32, "dpo"),
    ("small", 16, 64, 64, "dpo_uneven"),
    ("small", 8, 64, 64, "reward_model"),
    ("small", 16, 64, 64, "reward_model_uneven"),
]
QUICK = [
    ("tiny", 8, 32, 16, "dpo"),
    ("tiny", 8, 32, 16, "dpo_uneven"),
    ("tiny", 8, 32, 16, "reward_model"),
    ("tiny", 8, 32, 16, "reward_model_uneven"),
]
FORMS = {  # objective → (baseline form, measured form)
    "dpo": ("concatenated", "shared_prompt"),
    "reward_model": ("concatenated", "shared_prompt"),
    "dpo_uneven": ("shared_prompt", "packed"),
    "reward_model_uneven": ("shared_prompt", "packed"),
}
OPTIM = OptimConfig(name="adamw", learning_rate=1e-3, max_grad_norm=1.0)


def pairs(vocab: int, N: int, P: int, T: int, uneven: bool = False) -> PreferenceBatch:
    """`N` random pairs: one prompt per pair, two different completions; `uneven`: real
    lengths drawn from 8..P (prompts) and 4..T (completions), the first pair full length."""
    if uneven:
        return _uneven_pairs(vocab, N, P, T)
    key = jax.random.key(0)
    prompts = jax.random.randint(key, (N, P), 1, vocab)

    def side(i: int) -> SequenceBatch:
        completions = jax.random.randint(jax.random.fold_in(key, i), (N, T), 1, vocab)
        tokens = jnp.concatenate([prompts, completions], axis=1)
        return SequenceBatch(tokens, jnp.ones_like(tokens), jnp.ones((N, T), jnp.float32))

    return PreferenceBatch(chosen=side(1), rejected=side(2))


def _uneven_pairs(vocab: int, N: int, P: int, T: int) -> PreferenceBatch:
    rng = np.random.default_rng(0)

    def draw(low: int, high: int, full: bool) -> tuple[int, ...]:
        n = high if full else int(rng.integers(min(low, high), high + 1))
        return tuple(int(t) for t in rng.integers(1, vocab - 3, n))

    examples = [
        TokenizedPreference(draw(8, P, n == 0), draw(4, T, n == 0), draw(4, T, n == 0), None)
        for n in range(N)
    ]
    data = PreferenceDataConfig(max_prompt_length=P, max_completion_length=T, bucket_minimum=4)
    return make_preference_batch(examples, pad_id=0, config=data)


def programs(size: str, objective: str, batch: PreferenceBatch, form: str) -> dict[str, Any]:
    """The compiled update step of one form (DPO: and the reference forward), with inputs."""
    cfg = MODELS[size].model_config()
    tx = make_optimizer(OPTIM)
    shared, packing = form == "shared_prompt", form == "packed"
    if objective == "reward_model":
        graphs, params, frozen = split_models(ValueModel(cfg, rngs=nnx.Rngs(0)))
        state = init_train_state(params, frozen, tx, key=jax.random.key(0))
        rm_config = RewardModelConfig(shared_prompt=shared, packing=packing)
        batch = jax.tree.map(jnp.asarray, pack_preference_batch(rm_config, batch))
        started = time.perf_counter()
        rm = reward_model_objective(rm_config, graphs)
        update = jax.jit(make_update_step(rm, tx)).lower(state, batch).compile()
        return {
            "update": (update, (state, batch)),
            "compile_s": time.perf_counter() - started,
            "token_slots": _token_slots(batch, form),
        }
    graphs, params, frozen = split_models(Decoder(cfg, rngs=nnx.Rngs(0)))
    config = PreferenceConfig(loss="dpo", beta=0.1, shared_prompt=shared, packing=packing)
    batch = jax.tree.map(jnp.asarray, pack_preference_batch(config, batch))
    logprob_fn = make_logprob_fn(graphs.policy, group_size=config.prompt_group_size)
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
        "token_slots": _token_slots(batch, form),
    }


def _token_slots(batch: PreferenceBatch, form: str) -> int:
    """Token slots one forward of the pairs runs in a form."""
    if form == "packed":
        return int(np.prod(batch.packed.tokens.shape))
    N, S = batch.chosen.tokens.shape
    T = batch.chosen.completion_mask.shape[1]
    return 2 * N * S if form == "concatenated" else N * (S + T)


def _time(fn: Any, args: tuple) -> float:
    started = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - started


def measure(size: str, N: int, P: int, T: int, repeat: int, objective: str = "dpo") -> dict:
    """Both forms of one case (`FORMS`), alternating call by call; medians after a warm-up
    round."""
    forms = FORMS[objective]
    uneven = objective.endswith("_uneven")
    batch = pairs(MODELS[size].vocab_size, N, P, T, uneven=uneven)
    model_objective = objective.removesuffix("_uneven")
    progs = {form: programs(size, model_objective, batch, form) for form in forms}
    parts = [p for p in ("reference", "update") if p in progs[forms[0]]]
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeat + 1):  # the first round warms up
        for form in forms:
            for part in parts:
                fn, args = progs[form][part]
                times.setdefault((form, part), []).append(_time(fn, args))
    median = {k: statistics.median(v[1:]) for k, v in times.items()}
    row = {
        "objective": objective,
        "model": size,
        "pairs": N,
        "prompt_len": P,
        "completion_len": T,
        "forms": list(forms),
        "token_rows": {
            form: progs[form]["token_slots"]
            if "token_slots" in progs[form]
            else _token_slots(batch, form)
            for form in forms
        },
        "load_avg_1min": round(load_average(), 2),
    }
    if uneven:
        real = (
            np.asarray(batch.chosen.attention_mask).sum()
            + np.asarray(batch.rejected.completion_mask).sum()
        )
        row["real_tokens"] = int(real)
    for form in forms:
        row[form] = {f"{part}_s": round(median[(form, part)], 4) for part in parts}
        row[form]["compile_s"] = round(progs[form]["compile_s"], 2)
    for part in parts:
        row[f"{part}_speedup"] = round(median[(forms[0], part)] / median[(forms[1], part)], 2)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the results to this JSON file")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="the tiny model, one case each")
    args = parser.parse_args(argv)
    results = []
    for case in QUICK if args.quick else CASES:
        *shape, objective = case
        row = measure(*shape, args.repeat, objective)
        print(json.dumps(row), flush=True)
        results.append(row)
    write_results(args.out, results)


if __name__ == "__main__":
    main()
