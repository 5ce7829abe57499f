"""Memory and time of the training forward + backward with whole and query-chunked attention.

Run with `python -m benchmarks.bench_attention [--out FILE.json] [--repeat 5] [--quick]`.
Never part of the test suite's pass/fail.

The workload is the heart of a GRPO update on the benchmark models (`benchmarks.workloads`,
Qwen3-shaped, vocabulary 259): 8 prompts of 16 tokens × G = 8 completions of `T` tokens, each
prompt once per group (`Decoder.shared_prompt_hidden_states`), the completion tokens'
log-probs (`train.logprobs.chunked_logprobs`) and the gradient of their mean with respect to
every parameter, as one jitted program. For each completion length it is compiled with
`attention_chunk = None` (every query at once) and with blocks of `C` queries
(`layers.chunked_attend`), and records XLA's memory analysis of the compiled program
(temporaries: activations kept for the backward pass, attention's float32 logits and
probabilities, gradients) and the median wall time of `--repeat` calls.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks.workloads import PROMPT_LEN, Workload
from jaxrl_llm.models import Decoder
from jaxrl_llm.train.logprobs import chunked_logprobs

PROMPTS, GROUP = 8, 8
CASES = {  # model -> (completion lengths, query blocks)
    "tiny": ((128, 256, 512, 1024), (64, 128)),
    "small": ((256, 512), (64,)),
}
QUICK = {"tiny": ((128, 256), (64,))}


def measure(size: str, length: int, chunk: int | None, repeat: int) -> dict:
    """Compile and time one (model, completion length, attention_chunk) case."""
    cfg = Workload(size, PROMPTS, GROUP, length).shape.model_config()
    graphdef, params = nnx.split(Decoder(cfg, attention_chunk=chunk, rngs=nnx.Rngs(0)))
    rows, width = PROMPTS * GROUP, PROMPT_LEN + length
    key = jax.random.key(1)
    prompts = jax.random.randint(key, (PROMPTS, PROMPT_LEN), 0, cfg.vocab_size)
    completions = jax.random.randint(jax.random.fold_in(key, 1), (rows, length), 0, cfg.vocab_size)
    tokens = jnp.concatenate([jnp.repeat(prompts, GROUP, axis=0), completions], axis=1)
    positions = jnp.broadcast_to(jnp.arange(width), (rows, width))
    mask = jnp.ones((rows, length), jnp.float32)

    def loss(params: nnx.State) -> jax.Array:
        model = nnx.merge(graphdef, params)
        hidden = model.shared_prompt_hidden_states(
            tokens, positions, prompt_length=PROMPT_LEN, group_size=GROUP
        )
        logp, _ = chunked_logprobs(
            model, hidden[:, PROMPT_LEN - 1 : -1], tokens[:, PROMPT_LEN:], mask, chunk_size=64
        )
        return jnp.mean(logp)

    started = time.perf_counter()
    compiled = jax.jit(jax.grad(loss)).lower(params).compile()
    compile_s = time.perf_counter() - started
    analysis = compiled.memory_analysis()
    jax.block_until_ready(compiled(params))
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        jax.block_until_ready(compiled(params))
        times.append(time.perf_counter() - started)
    return {
        "model": size,
        "rows": rows,
        "prompt_len": PROMPT_LEN,
        "completion_len": length,
        "attention_chunk": chunk,
        "temp_mb": round(analysis.temp_size_in_bytes / 2**20, 1),
        "median_s": round(statistics.median(times), 4),
        "compile_s": round(compile_s, 2),
        "load_avg_1min": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the results to this JSON file")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny model, two lengths")
    args = parser.parse_args(argv)
    results = []
    for size, (lengths, chunks) in (QUICK if args.quick else CASES).items():
        for length in lengths:
            for chunk in (None, *chunks):
                row = measure(size, length, chunk, args.repeat)
                print(json.dumps(row), flush=True)
                results.append(row)
    if args.out:
        out = {"machine": platform.processor() or platform.machine(), "results": results}
        pathlib.Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
