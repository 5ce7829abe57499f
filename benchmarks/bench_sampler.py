"""Throughput and compile time of the compiled sampler, and the ratio to Hugging Face `generate`.

Run with `python -m benchmarks.bench_sampler [--out FILE.json] [--repeat 7] [--no-hf]
[--decode-phases 4] [--peers-python PYTHON] [--no-tunix]`. Never part of the test suite's pass/fail.

Workloads (issue 5): Qwen3-shaped models with the byte vocabulary (259 tokens), prompts of 16
tokens, temperature 1, no early stop (`stop_tokens=()`), so every row generates exactly `T`
tokens:

- `tiny`: 2 layers, width 64, MLP 128, 4 heads × 16, 2 KV heads;
- `small`: 4 layers, width 256, MLP 768, 8 heads × 32, 4 KV heads.

Each case is compiled once (`lower` + `compile`, the reported compile time), run once to warm
up, then timed as the median of `--repeat` runs with fresh keys (blocking on the result).
Ours runs as `generate` runs it: the prompts split into `SamplingConfig.row_groups` groups (auto:
2 on a 2-core CPU), each group's call from its own host thread (`jaxrl_llm.sampler.row_groups`);
the compile time is that of the group-shaped program (`--row-groups 1`: one call).
Generated tokens/s = rows × T / median. The group cases sample G completions of each of B
prompts (prompt prefilled once, KV cache broadcast to the G rows). The weights are redrawn
between repeats of one case and the number of compiled programs is recorded: it must stay 1.

The Hugging Face reference loads the same weights (written with `transformers`, read back with
`from_pretrained`) into `Qwen3ForCausalLM` on the CPU build of torch and runs `generate` with
`do_sample=True, top_k=0, top_p=1.0, min_new_tokens=T, max_new_tokens=T` on the same
left-padded prompts, with torch using all cores and with one thread (the second is steadier
on a shared machine, where torch's spinning threads suffer most from other processes). The machine is shared: `uptime`'s 1-minute load average is recorded with
each measurement.

Tunix's sampler (`benchmarks.peers.tunix_sampler`: `tunix.generate.sampler.Sampler` on the same
shapes with random weights, the same prompt length, T and temperature, no early stop, a KV cache
of P + T) runs in the peers' environment given by `--peers-python` (default `$PEERS_PYTHON`,
else `/tmp/peers-venv/bin/python` when it exists), one subprocess per case; it is skipped with
a message when Tunix does not import there. Its compile time is its first call's wall time
(tracing, compilation and one run). Tunix runs as installed and, where it applies, with glibc's
huge-page tunable (jaxrl_llm/hugepages.py); the faster run counts. `make bench` starts this
benchmark with the tunable, as `jaxrl-llm` starts itself, so ours and HF run with it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import tempfile
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from benchmarks.bench_grpo import (
    _peers_python,
    _subprocess,
    peer_env_variants,
    peer_module_missing,
)
from jaxrl_llm.models import from_pretrained
from jaxrl_llm.sampler import SamplingConfig, jit_sample_tokens, left_pad
from jaxrl_llm.sampler.row_groups import call_in_row_groups, resolve_row_groups, split_row_keys

SIZES = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    ),
    "small": dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
    ),
}
# (model, prompts B, samples per prompt G, new tokens T); rows N = B·G
CASES = [
    ("tiny", 32, 1, 64),
    ("tiny", 64, 1, 128),
    ("tiny", 8, 4, 64),
    ("small", 32, 1, 64),
    ("small", 64, 1, 128),
    ("small", 8, 4, 64),
]
PROMPT_LEN = 16
VOCAB = 259


def load_average() -> float:
    return os.getloadavg()[0]


def hf_model(size: str, seed: int = 0) -> Any:
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, tie_word_embeddings=False, **SIZES[size], max_position_embeddings=4096
    )
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # weights large enough for non-uniform next-token distributions
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    return model


def prompts(B: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return left_pad(rng.integers(0, 256, (B, PROMPT_LEN)).tolist(), length=PROMPT_LEN, pad_id=0)


def bench_ours(
    model: Any,
    B: int,
    G: int,
    T: int,
    repeat: int,
    steps_per_loop: int,
    decode_phases: int | None = None,
    row_groups: int | None = None,
) -> dict:
    graphdef, state = nnx.split(model)
    config = SamplingConfig(
        max_new_tokens=T,
        num_samples=G,
        stop_tokens=(),
        steps_per_loop=steps_per_loop,
        decode_phases=decode_phases,
        row_groups=row_groups,
    )
    tokens, mask = prompts(B)
    groups = resolve_row_groups(config.row_groups, B)
    b = B // groups

    def sample(state: Any, key: jax.Array) -> Any:  # as `generate` runs it
        keys = split_row_keys(key, B * G, groups)
        return call_in_row_groups(
            lambda j: jit_sample_tokens(
                graphdef,
                state,
                tokens[j * b : (j + 1) * b],
                mask[j * b : (j + 1) * b],
                keys[j],
                config=config,
            ),
            groups,
        )

    before = jit_sample_tokens.jitted._cache_size()
    start = time.perf_counter()
    jit_sample_tokens.lower(
        graphdef,
        state,
        tokens[:b],
        mask[:b],
        jax.random.split(jax.random.key(0), b * G),
        config=config,
    ).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(sample(state, jax.random.key(0)))
    times, loads = [], []
    for i in range(repeat):
        scale = 1.0 + 1e-3 * (i % 2)
        state = jax.tree.map(lambda x, scale=scale: x * scale, state)  # "new weights"
        loads.append(load_average())
        start = time.perf_counter()
        out = sample(state, jax.random.key(i + 1))
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
    assert int(np.asarray(out.lengths).min()) == T  # no early stop: every row made T tokens
    median = statistics.median(times)
    return {
        "compile_s": round(compile_s, 2),
        "median_s": round(median, 5),
        "min_s": round(min(times), 5),
        "tokens_per_s": round(B * G * T / median),
        "row_groups": groups,
        "programs_compiled": jit_sample_tokens.jitted._cache_size() - before,
        "load_avg_1min": round(statistics.median(loads), 2),
    }


def bench_hf(model: Any, B: int, G: int, T: int, repeat: int, threads: int) -> dict:
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _time_hf(model, B, G, T, repeat)
    finally:
        torch.set_num_threads(previous)


def _time_hf(model: Any, B: int, G: int, T: int, repeat: int) -> dict:
    import torch

    tokens, mask = prompts(B)
    ids = torch.tensor(np.repeat(tokens, G, axis=0), dtype=torch.long)
    attn = torch.tensor(np.repeat(mask, G, axis=0), dtype=torch.long)
    kw = dict(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=T,
        min_new_tokens=T,
        pad_token_id=0,
    )
    times, loads = [], []
    with torch.no_grad():
        model.generate(ids, attention_mask=attn, **kw)  # warm-up
        for _ in range(repeat):
            loads.append(load_average())
            start = time.perf_counter()
            out = model.generate(ids, attention_mask=attn, **kw)
            times.append(time.perf_counter() - start)
    assert out.shape[1] == PROMPT_LEN + T
    median = statistics.median(times)
    return {
        "median_s": round(median, 4),
        "min_s": round(min(times), 4),
        "tokens_per_s": round(B * G * T / median),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1min": round(statistics.median(loads), 2),
    }


def tunix_missing(python: str | None) -> str | None:
    """None when Tunix's sampler imports in `python`, else why it cannot run."""
    if python is None:
        return "no --peers-python, $PEERS_PYTHON or /tmp/peers-venv"
    reason = peer_module_missing(python, "tunix_sampler")
    return None if reason is None else f"it does not import in {python}: {reason}"


def bench_tunix(python: str, size: str, B: int, G: int, T: int, repeat: int) -> dict:
    """Tunix's sampler as installed and, where it applies, with glibc's huge-page tunable
    (`bench_grpo.peer_env_variants`): the faster run, with `variant` naming it and every
    run's tokens/s under `variants`."""
    workload = {"model": size, "prompts": B, "samples": G, "new_tokens": T}
    command = [python, "-m", "benchmarks.peers.tunix_sampler", json.dumps(workload), str(repeat)]
    runs = {
        name or "default": _subprocess(command, env) for name, env in peer_env_variants().items()
    }
    ok = {name: r for name, r in runs.items() if "error" not in r}
    if not ok:
        return runs["default"]
    name = max(ok, key=lambda n: ok[n]["tokens_per_s"])
    variants = {n: r.get("tokens_per_s", r.get("error")) for n, r in runs.items()}
    return {**ok[name], "variant": name.lstrip("_"), "variants": variants}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--steps-per-loop", type=int, default=1)
    parser.add_argument(
        "--decode-phases",
        type=int,
        default=None,
        help="SamplingConfig.decode_phases of ours (default: its length-dependent default)",
    )
    parser.add_argument(
        "--row-groups", type=int, default=None, help="SamplingConfig.row_groups (default: auto)"
    )
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face reference")
    parser.add_argument("--only", default=None, help="run only this model size (tiny / small)")
    parser.add_argument("--peers-python", default=None, help="python of the peers' venv (Tunix)")
    parser.add_argument("--no-tunix", action="store_true", help="skip Tunix's sampler")
    args = parser.parse_args()
    peers_python = _peers_python(args.peers_python)
    tunix_skipped = "--no-tunix" if args.no_tunix else tunix_missing(peers_python)
    if tunix_skipped:
        print(f"tunix: skipped ({tunix_skipped})", flush=True)

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in SIZES:
            if args.only and size != args.only:
                continue
            reference = hf_model(size)
            path = pathlib.Path(tmp) / size
            reference.save_pretrained(path)
            ours = from_pretrained(path)
            for case_size, B, G, T in CASES:
                if case_size != size:
                    continue
                row = {"model": size, "prompts": B, "samples": G, "rows": B * G, "new_tokens": T}
                row["jaxrl_llm"] = bench_ours(
                    ours,
                    B,
                    G,
                    T,
                    args.repeat,
                    args.steps_per_loop,
                    args.decode_phases,
                    args.row_groups,
                )
                if not args.no_hf:
                    ours_tps = row["jaxrl_llm"]["tokens_per_s"]
                    for threads in (os.cpu_count() or 1, 1):
                        hf = bench_hf(reference, B, G, T, args.repeat, threads)
                        row[f"hf_generate_{threads}_threads"] = hf
                        row[f"speedup_vs_hf_{threads}_threads"] = round(
                            ours_tps / hf["tokens_per_s"], 1
                        )
                if not tunix_skipped:
                    tunix = bench_tunix(peers_python, size, B, G, T, args.repeat)
                    row["tunix"] = tunix
                    if "error" not in tunix:
                        row["speedup_vs_tunix"] = round(
                            row["jaxrl_llm"]["tokens_per_s"] / tunix["tokens_per_s"], 2
                        )
                results.append(row)
                print(json.dumps(row))
    report = {
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "jax": jax.__version__,
            "backend": jax.default_backend(),
        },
        "prompt_len": PROMPT_LEN,
        "steps_per_loop": args.steps_per_loop,
        "decode_phases": args.decode_phases,
        "results": results,
    }
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
