"""GPU benchmark: decode throughput against the HBM roofline and the update step's bf16 MFU for
a ~0.5B Qwen-shaped model with random weights.

    python -m benchmarks.bench_gpu --out DIR [--bandwidth 3.35e12] [--peak-flops 989e12]
    python -m benchmarks.bench_gpu --out DIR --tiny        smoke run on any backend (CPU)

Writes `DIR/bench_gpu.json` (the report, `benchmarks.report`, reads `benchmarks/results/gpu/`).
Stands alone (no run config, no data): about 3-5 minutes on one H100, most of it compiling.

Model (`--tiny`: 2 layers, width 64, vocab 259): Qwen2-shaped (the Qwen2.5-0.5B layout) with
24 layers, width D = 896, MLP F = 4864, 14 query heads × 64, 2 KV heads, vocabulary V = 151936,
tied embeddings, random normal weights.

Decode (`jaxrl_llm.sampler.jit_sample_tokens`, bf16 weights and activations, temperature 1, no
early stop): `B = 64` prompts of `P = 128` tokens, two programs generating `T1 = 32` and
`T2 = 160` tokens; each timed as the median of `--repeat` runs after a warm-up. Decode
throughput is taken from the difference, so the prefill cancels:

    tokens/s  = B · (T2 − T1) / (t(T2) − t(T1))

The HBM roofline is the time to read, once per decode step, every weight a step needs and the
KV cache of the context so far, at `--bandwidth` bytes/s (default 3.35e12, H100 SXM):

    W   = 2 · (L · M_l + V · D)                  bf16 layer matmuls + norms, and the (tied)
                                                 output projection; the input embedding is a
                                                 gather of B rows (ignored)
    KV  = 2 · 2 · L · K · hd · B · c             K and V, bf16, c tokens of context
    roofline tokens/s = B · (T2 − T1) / Σ_{c = P+T1}^{P+T2−1} (W + KV(c)) / bandwidth

Update step (`jaxrl_llm.train.make_update_step` with the `grpo` preset, AdamW, float32 master
parameters, bf16 compute): `N = 16` sequences of `S = 512` tokens (`P = 16`, `T = 496`), the
GRPO loss with the k3 KL term, timed as the median of `--repeat` steps after a warm-up. MFU
uses the 6·N_params·tokens model (N_params = the matmul parameters: layers and the output
projection; tokens = N·S) against `--peak-flops` (default 989e12, H100 SXM dense bf16):

    MFU = 6 · N_params · N · S / t_step / peak

Targets (issue 9): decode ≥ 70% of the roofline at batch 64; update ≥ 40% bf16 MFU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models import Decoder, ModelConfig
from jaxrl_llm.sampler import SamplingConfig, jit_sample_tokens
from jaxrl_llm.train import (
    OptimConfig,
    init_train_state,
    kl_controller,
    make_optimizer,
    make_update_step,
    preset,
    rl_objective,
    split_models,
)
from jaxrl_llm.train.advantages import build_rl_batch


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The model and workload shapes of one run."""

    model: ModelConfig
    batch: int  # decode prompts B
    prompt: int  # decode prompt length P
    short: int  # T1
    long: int  # T2
    rows: int  # update sequences N
    seq: int  # update sequence length S
    completion: int  # update completion length T


def sizes(tiny: bool) -> Sizes:
    """The ~0.5B model and workloads (module docstring), or a tiny smoke version."""
    if tiny:
        model = ModelConfig(
            family="qwen2",
            vocab_size=259,
            hidden_size=64,
            intermediate_size=128,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            tie_embeddings=True,
        )
        return Sizes(model, batch=4, prompt=8, short=4, long=64, rows=4, seq=32, completion=24)
    model = ModelConfig(
        family="qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        tie_embeddings=True,
        max_position_embeddings=4096,
    )
    return Sizes(model, batch=64, prompt=128, short=32, long=160, rows=16, seq=512, completion=496)


def layer_params(c: ModelConfig) -> int:
    """Parameters of one layer: attention (with Qwen2's q/k/v biases), MLP, two norms."""
    D, hd, H, K, F = c.hidden_size, c.head_dim, c.num_heads, c.num_kv_heads, c.intermediate_size
    attention = D * hd * (2 * H + 2 * K) + hd * (H + 2 * K)
    return attention + 3 * D * F + 2 * D


def matmul_params(c: ModelConfig) -> int:
    """N_params of the MFU model: every layer, the final norm and the output projection."""
    return c.num_layers * layer_params(c) + c.hidden_size + c.vocab_size * c.hidden_size


def decode_roofline(s: Sizes, bandwidth: float, bytes_per_value: int = 2) -> dict[str, float]:
    """Bytes per decode step and the roofline tokens/s of the steps `T1 … T2 − 1`."""
    c = s.model
    weights = bytes_per_value * matmul_params(c)
    kv_per_token = 2 * bytes_per_value * c.num_layers * c.num_kv_heads * c.head_dim * s.batch
    contexts = range(s.prompt + s.short, s.prompt + s.long)
    total = sum(weights + kv_per_token * ctx for ctx in contexts)
    return {
        "weight_bytes_per_step": weights,
        "kv_bytes_per_step_mean": kv_per_token * statistics.mean(contexts),
        "roofline_s": total / bandwidth,
        "roofline_tokens_per_s": s.batch * len(contexts) / (total / bandwidth),
    }


def _median_time(fn: Any, repeat: int) -> float:
    jax.block_until_ready(fn(0))  # warm-up
    times = []
    for i in range(repeat):
        started = time.perf_counter()
        jax.block_until_ready(fn(i + 1))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench_decode(s: Sizes, bandwidth: float, repeat: int) -> dict[str, Any]:
    """Decode tokens/s from two generation lengths (module docstring)."""
    model = Decoder(s.model, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, min(s.model.vocab_size, 32000), (s.batch, s.prompt)))
    mask = jnp.ones((s.batch, s.prompt), bool)
    out: dict[str, Any] = {"batch": s.batch, "prompt": s.prompt}
    for name, T in (("short", s.short), ("long", s.long)):
        config = SamplingConfig(max_new_tokens=T, stop_tokens=())
        started = time.perf_counter()
        compiled = jit_sample_tokens.lower(
            graphdef, state, tokens, mask, jax.random.key(0), config=config
        ).compile()
        out[f"compile_{name}_s"] = round(time.perf_counter() - started, 2)

        def run(i: int, compiled: Any = compiled) -> Any:
            return compiled(state, tokens, mask, jax.random.key(i)).tokens

        out[f"median_{name}_s"] = _median_time(run, repeat)
        out[f"new_tokens_{name}"] = T
    decode_s = out["median_long_s"] - out["median_short_s"]
    roof = decode_roofline(s, bandwidth)
    out.update(roof)
    out["decode_s"] = decode_s
    out["end_to_end_tokens_per_s"] = s.batch * s.long / out["median_long_s"]
    if decode_s <= 0:  # timing noise larger than the extra decode steps (tiny runs)
        out["tokens_per_s"] = out["fraction_of_roofline"] = None
        return out
    out["tokens_per_s"] = s.batch * (s.long - s.short) / decode_s
    out["fraction_of_roofline"] = out["tokens_per_s"] / roof["roofline_tokens_per_s"]
    return out


def _rl_batch(s: Sizes, G: int = 4) -> Any:
    rng = np.random.default_rng(1)
    N, S, T = s.rows, s.seq, s.completion
    tokens = jnp.asarray(rng.integers(0, min(s.model.vocab_size, 32000), (N, S)), jnp.int32)
    batch, _ = build_rl_batch(
        preset("grpo"),
        tokens=tokens,
        attention_mask=jnp.ones((N, S), jnp.int32),
        completion_mask=jnp.ones((N, T), jnp.float32),
        rewards=jnp.asarray(rng.normal(size=N), jnp.float32),
        group_size=G,
        ref_logp=jnp.asarray(-rng.uniform(0, 10, (N, T)), jnp.float32),
        kl_coef=0.04,
    )
    return batch


def bench_update(s: Sizes, peak_flops: float, repeat: int) -> dict[str, Any]:
    """Seconds of one GRPO update step and its bf16 MFU (module docstring)."""
    model = Decoder(s.model, dtype=jnp.bfloat16, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    graphs, params, frozen = split_models(model)
    algorithm = preset("grpo")
    optim = OptimConfig(name="adamw", learning_rate=1e-6, max_grad_norm=1.0)
    optimizer = make_optimizer(optim)
    state = init_train_state(
        params, frozen, optimizer, key=jax.random.key(0), kl=kl_controller(algorithm.kl).init()
    )
    step = make_update_step(
        rl_objective(algorithm, graphs), optimizer, kl_controller=kl_controller(algorithm.kl)
    )
    batch = _rl_batch(s)
    started = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - started
    holder = {"state": state}

    def run(i: int) -> Any:
        holder["state"], metrics = compiled(holder["state"], batch)
        return metrics

    seconds = _median_time(run, repeat)
    tokens = s.rows * s.seq
    flops = 6 * matmul_params(s.model) * tokens
    return {
        "rows": s.rows,
        "seq": s.seq,
        "tokens": tokens,
        "compile_s": round(compile_s, 2),
        "median_s": seconds,
        "model_flops": flops,
        "achieved_flops": flops / seconds,
        "peak_flops": peak_flops,
        "mfu": flops / seconds / peak_flops,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for bench_gpu.json")
    parser.add_argument("--bandwidth", type=float, default=3.35e12, help="HBM bytes/s")
    parser.add_argument("--peak-flops", type=float, default=989e12, help="dense bf16 FLOP/s")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes: a smoke run on CPU")
    parser.add_argument("--skip", nargs="*", default=[], choices=["decode", "update"])
    args = parser.parse_args(argv)
    s = sizes(args.tiny)
    device = jax.devices()[0]
    result: dict[str, Any] = {
        "device": f"{device.platform}: {device.device_kind}",
        "jax": jax.__version__,
        "tiny": args.tiny,
        "model": {
            "layers": s.model.num_layers,
            "width": s.model.hidden_size,
            "mlp": s.model.intermediate_size,
            "heads": s.model.num_heads,
            "kv_heads": s.model.num_kv_heads,
            "head_dim": s.model.head_dim,
            "vocab": s.model.vocab_size,
            "matmul_params": matmul_params(s.model),
        },
        "bandwidth": args.bandwidth,
    }
    started = time.perf_counter()
    if "decode" not in args.skip:
        result["decode"] = bench_decode(s, args.bandwidth, args.repeat)
        print(json.dumps({"decode": result["decode"]}), flush=True)
    if "update" not in args.skip:
        result["update"] = bench_update(s, args.peak_flops, args.repeat)
        print(json.dumps({"update": result["update"]}), flush=True)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"bench_gpu: {out / 'bench_gpu.json'} ({result['wall_s']} s)", flush=True)
    return result


if __name__ == "__main__":
    main()
