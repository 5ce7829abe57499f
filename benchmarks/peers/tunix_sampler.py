"""Tunix's sampler (`tunix.generate.sampler.Sampler`) on the sampler benchmark's workloads.

    python -m benchmarks.peers.tunix_sampler '{"model": "tiny", "prompts": 32, "samples": 1,
                                               "new_tokens": 64}' REPEAT

Run in the peers' environment (`benchmarks.bench_sampler --peers-python`). The setup a Tunix
user writes: a randomly initialised `tunix.models.qwen3.Qwen3` of the `benchmarks.bench_sampler`
shape (float32, untied embeddings, every weight redrawn from N(0, 0.1²) like the Hugging Face
reference there), a `Sampler` with `CacheConfig(cache_size=P + T)` (the smallest cache Tunix
accepts), and one call per measurement:

    sampler(prompts, max_generation_steps=T, max_prompt_length=16, temperature=1.0,
            top_p=1.0, top_k=None, eos_tokens=[259], seed=i)

`top_p=1.0` selects Tunix's sampling mode (with `top_p=None` it decodes greedily) and, with no
top-k, its shortcut that draws from the full softmax without sorting. Tunix stops a row at an
EOS id and its decode loop at the first step where every row is done; the EOS id here is 259,
one past the vocabulary (259 ids), which the categorical draw can never produce, so every row
generates exactly `T` tokens (checked on the returned tokens).

Tunix takes text and prepends BOS: each prompt is 15 random characters U+0000-U+00FF, one id
each (the latin-1 byte tokenizer below, ids 0-255, PAD 256, BOS 257, EOS 258), so every
prompt is 16 tokens, as in the benchmark. Tunix has no "G samples per prompt" option: a user
(and Tunix's own GRPO rollout) repeats each prompt `G` times, so the `B·G` rows each prefill
their prompt.

Between repeats the weights are replaced with a rescaled copy through `Sampler.
transformer_state` (what Tunix's RL loop does after each update), and the number of programs
the sampler's two jitted functions (prefill, decode loop) compiled is recorded: 2 when nothing
recompiles. Each call is timed as the user sees it (tokenization, prefill, decode loop, copy
to host, detokenization); the first call (tracing and compilation included) is reported
separately, then one warm-up call, then the median of `REPEAT` calls.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import statistics
import sys
import time

from benchmarks.peers.tunix_grpo import ByteTokenizer, _version, tunix_qwen3
from benchmarks.workloads import MODELS, PROMPT_LEN, VOCAB, Workload, emit, load_average

NO_EOS = VOCAB  # one past the vocabulary: never sampled
INIT_STD = 0.1  # `benchmarks.bench_sampler.hf_model`'s weights


def check_installed() -> None:
    """Raise ImportError when Tunix's sampler is not importable here."""
    from tunix.generate import sampler  # noqa: F401
    from tunix.models.qwen3 import model  # noqa: F401


class LatinTokenizer(ByteTokenizer):
    """One id per character U+0000-U+00FF (latin-1), PAD 256, BOS 257, EOS 258."""

    def encode(self, text: str, **kwargs) -> list[int]:
        return list(str(text).encode("latin-1"))

    def decode(self, ids, **kwargs) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("latin-1")


def qwen3_model(size: str, seed: int = 0):
    """Tunix's Qwen3 with `benchmarks.bench_sampler`'s shape of `size` and N(0, 0.1²) weights."""
    import jax
    from flax import nnx

    model = tunix_qwen3(dataclasses.replace(MODELS[size], tie_embeddings=False), seed)
    params = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    redrawn = [
        INIT_STD * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)
    ]
    nnx.update(model, jax.tree.unflatten(treedef, redrawn))
    return model


def prompts(count: int, seed: int = 0) -> list[str]:
    """`count` strings of `PROMPT_LEN - 1` random latin-1 characters (BOS makes them 16 ids)."""
    rng = random.Random(seed)
    return ["".join(chr(rng.randrange(256)) for _ in range(PROMPT_LEN - 1)) for _ in range(count)]


def run(w: Workload, repeat: int) -> dict:
    import jax
    from tunix.generate import sampler as sampler_lib

    B, G, T = w.prompts, w.samples, w.new_tokens
    model = qwen3_model(w.model)
    config = model.config
    cache_size = PROMPT_LEN + T
    sampler = sampler_lib.Sampler(
        transformer=model,
        tokenizer=LatinTokenizer(),
        cache_config=sampler_lib.CacheConfig(
            cache_size=cache_size,
            num_layers=config.num_layers,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
        ),
    )
    rows = [p for p in prompts(B) for _ in range(G)]  # each prompt G times, as Tunix's GRPO

    def call(seed: int):
        return sampler(
            rows,
            max_generation_steps=T,
            max_prompt_length=PROMPT_LEN,
            temperature=1.0,
            top_p=1.0,
            top_k=None,
            eos_tokens=[NO_EOS],
            seed=seed,
        )

    start = time.perf_counter()
    out = call(0)
    first_call_s = time.perf_counter() - start
    prompt_lengths = {len(p) for p in out.padded_prompt_tokens}
    if prompt_lengths != {PROMPT_LEN}:
        raise RuntimeError(f"tunix padded the prompts to {prompt_lengths}, expected {PROMPT_LEN}")
    call(1)  # warm-up
    state = sampler.transformer_state
    times, loads = [], []
    for i in range(repeat):
        scale = 1.0 + 1e-3 * ((i + 1) % 2)
        sampler.transformer_state = jax.tree.map(lambda x, s=scale: x * s, state)  # new weights
        loads.append(load_average())
        start = time.perf_counter()
        out = call(i + 2)
        times.append(time.perf_counter() - start)
    lengths = {len(t) for t in out.tokens}
    if len(out.tokens) != B * G or lengths != {T}:
        raise RuntimeError(f"tunix returned {len(out.tokens)} rows of lengths {lengths}")
    programs = (
        sampler._compiled_prefill_fn._cache_size() + sampler._compiled_decode_fn._cache_size()
    )
    median = statistics.median(times)
    return {
        "impl": "tunix",
        "workload": dataclasses.asdict(w),
        "first_call_s": round(first_call_s, 2),
        "median_s": round(median, 5),
        "min_s": round(min(times), 5),
        "tokens_per_s": round(B * G * T / median),
        "repeat": repeat,
        "programs_compiled": programs,
        "cache_size": cache_size,
        "load_avg_1min": round(statistics.median(loads), 2),
        "jax": jax.__version__,
        "tunix": _version("google-tunix"),
    }


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    workload = Workload(**json.loads(sys.argv[1]))
    emit(run(workload, int(sys.argv[2])))
