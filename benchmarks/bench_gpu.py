"""GPU benchmark: decode throughput against the HBM roofline and the update step's bf16 MFU for
a ~0.5B Qwen-shaped model with random weights.

    python -m benchmarks.bench_gpu --out DIR [--bandwidth B/s] [--peak-flops FLOP/s]
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
KV cache of the context so far, at `--bandwidth` bytes/s (default: the card's datasheet rate,
`datasheet_rates`, e.g. 3.35e12 for an H100 SXM and 4.8e12 for an H200):

    W   = 2 · (L · M_l + V · D)                  bf16 layer matmuls + norms, and the (tied)
                                                 output projection; the input embedding is a
                                                 gather of B rows (ignored)
    KV  = 2 · 2 · L · K · hd · B · c             K and V, bf16, c tokens of context
    roofline tokens/s = B · (T2 − T1) / Σ_{c = P+T1}^{P+T2−1} (W + KV(c)) / bandwidth

Update step (`jaxrl_llm.train.make_update_step` with the `grpo` preset, AdamW, float32 master
parameters, bf16 compute): `N = 16` sequences of `S = 512` tokens (`P = 16`, `T = 496`), the
GRPO loss with the k3 KL term, timed as the median of `--repeat` steps after a warm-up. MFU
uses the 6·N_params·tokens model (N_params = the matmul parameters: layers and the output
projection; tokens = N·S) against `--peak-flops` (default: the card's dense bf16 datasheet rate,
e.g. 989e12 for an H100 SXM or an H200):

    MFU = 6 · N_params · N · S / t_step / peak

Targets (issue 9): decode ≥ 70% of the roofline at batch 64; update ≥ 40% bf16 MFU.

The run also measures the card's own ceilings in JAX (`ceilings`): the bandwidth of a large
elementwise pass (`y = 2·x + 1` over bf16 `x`, bytes read plus bytes written) and the rate of a
large bf16 matrix product (8192³; random data), and reports both fractions against them too
(`fraction_of_measured_roofline`, `mfu_of_measured_peak`), since datasheet rates are not
what a given card sustains. `--variants` then times the decode with other loop shapes
(`SamplingConfig.layer_unroll`, `steps_per_loop`) and the update with other `remat` policies,
while `--budget-s` seconds have not yet passed; the JSON is rewritten after every part, so a
run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import statistics
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import profile_summary
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
            num_layers=16,  # > the default layer_unroll (8): the smoke run takes the layer scan
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


class Rates(NamedTuple):
    """Datasheet rates of one accelerator: HBM bytes/s and dense bf16 FLOP/s."""

    bandwidth: float
    peak_flops: float
    card: str


# (substrings that must all be in `device_kind`, lower-cased; rates), most specific first:
# NVIDIA's datasheets (dense bf16 tensor-core rate, without sparsity).
DATASHEETS: tuple[tuple[tuple[str, ...], Rates], ...] = (
    (("gh200",), Rates(4.0e12, 989e12, "GH200 (96 GB HBM3)")),
    (("h200", "nvl"), Rates(4.8e12, 835e12, "H200 NVL")),
    (("h200",), Rates(4.8e12, 989e12, "H200 SXM")),
    (("h100", "nvl"), Rates(3.9e12, 835e12, "H100 NVL")),
    (("h100", "pcie"), Rates(2.0e12, 756e12, "H100 PCIe")),
    (("h100",), Rates(3.35e12, 989e12, "H100 SXM")),
    (("a100", "40gb"), Rates(1.555e12, 312e12, "A100 40GB")),
    (("a100", "pcie"), Rates(1.935e12, 312e12, "A100 80GB PCIe")),
    (("a100",), Rates(2.039e12, 312e12, "A100 80GB SXM")),
    (("b200",), Rates(8.0e12, 2250e12, "B200")),
    (("l40s",), Rates(0.864e12, 362e12, "L40S")),
    (("l40",), Rates(0.864e12, 181e12, "L40")),
    (("l4",), Rates(0.3e12, 121e12, "L4")),
)
# the rates a run on a CPU (`--tiny`, a smoke run) reports against
NOMINAL = next(rates for _, rates in DATASHEETS if rates.card == "H100 SXM")


def datasheet_rates(device_kind: str) -> Rates | None:
    """The datasheet rates of the card whose `jax.Device.device_kind` is `device_kind`, or None
    for a card not in `DATASHEETS` (the caller then needs `--bandwidth` and `--peak-flops`).

    Examples:
      >>> datasheet_rates("NVIDIA H200").card, datasheet_rates("NVIDIA H100 80GB HBM3").card
      ('H200 SXM', 'H100 SXM')
      >>> datasheet_rates("NVIDIA H100 PCIe").bandwidth, datasheet_rates("Tesla T4") is None
      (2000000000000.0, True)
    """
    kind = device_kind.lower()
    for needles, rates in DATASHEETS:
        if all(n in kind for n in needles):
            return rates
    return None


def resolve_rates(device: Any, bandwidth: float | None, peak_flops: float | None) -> Rates:
    """The rates a run reports against: the flags where given, else the card's datasheet
    (`datasheet_rates`); on a CPU (a smoke run) the nominal H100 SXM rates. Raises
    `ValueError` naming the card when a GPU is not in the table and a flag is missing."""
    sheet = datasheet_rates(device.device_kind)
    if sheet is None and device.platform != "gpu":
        sheet = NOMINAL._replace(card=f"{NOMINAL.card}, nominal (the run is on {device.platform})")
    if sheet is None and (bandwidth is None or peak_flops is None):
        raise ValueError(
            f"bench_gpu: no datasheet rates for {device.device_kind!r}; pass --bandwidth "
            "(HBM bytes/s) and --peak-flops (dense bf16 FLOP/s)"
        )
    if bandwidth is not None and peak_flops is not None:
        label = "given on the command line"
    elif bandwidth is not None:
        label = f"{sheet.card}; HBM bandwidth given on the command line"
    elif peak_flops is not None:
        label = f"{sheet.card}; bf16 peak given on the command line"
    else:
        label = sheet.card
    return Rates(
        bandwidth if bandwidth is not None else sheet.bandwidth,
        peak_flops if peak_flops is not None else sheet.peak_flops,
        label,
    )


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


def ceilings(tiny: bool, repeat: int) -> dict[str, float]:
    """The card's measured bandwidth (bytes/s, read + written) and bf16 matmul rate (FLOP/s)."""
    size, n = (1 << 22, 256) if tiny else (1 << 29, 8192)  # 1 GiB of bf16; 8192³ matmul
    key_x, key_a, key_b = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(key_x, (size,), jnp.bfloat16)
    elementwise = jax.jit(lambda x: 2 * x + 1)
    copy_s = _median_time(lambda _: elementwise(x), repeat)
    a = jax.random.normal(key_a, (n, n), jnp.bfloat16)
    b = jax.random.normal(key_b, (n, n), jnp.bfloat16)
    matmul = jax.jit(jnp.matmul)
    matmul_s = _median_time(lambda _: matmul(a, b), repeat)
    return {
        "bandwidth": 2 * 2 * size / copy_s,
        "bf16_matmul_flops": 2 * n**3 / matmul_s,
        "elementwise_bytes": 2 * 2 * size,
        "matmul_n": n,
    }


def _guarded_profile(run: Any) -> dict[str, Any]:
    """`{"profile": ...}` of one `run()`, or `{"profile_error": ...}`: a profiler that fails on
    the card (CUPTI) must not lose the measurement it was to explain."""
    try:
        profile = profile_summary.profile(run)
    except Exception as err:  # any profiler failure is reported, not raised
        print(f"bench_gpu: profile failed: {type(err).__name__}: {err}", flush=True)
        return {"profile_error": f"{type(err).__name__}: {err}"[:500]}
    print(profile_summary.brief(profile), flush=True)
    return {"profile": profile}


def bench_decode(
    s: Sizes, bandwidth: float, repeat: int, trace: bool = False, **overrides: Any
) -> dict[str, Any]:
    """Decode tokens/s from two generation lengths (module docstring); `overrides` go to
    `SamplingConfig` (loop shape); `trace` adds a profile of one long run."""
    model = Decoder(s.model, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, min(s.model.vocab_size, 32000), (s.batch, s.prompt)))
    mask = jnp.ones((s.batch, s.prompt), bool)
    out: dict[str, Any] = {"batch": s.batch, "prompt": s.prompt, **overrides}
    for name, T in (("short", s.short), ("long", s.long)):
        config = SamplingConfig(max_new_tokens=T, stop_tokens=(), **overrides)
        started = time.perf_counter()
        compiled = jit_sample_tokens.lower(
            graphdef, state, tokens, mask, jax.random.key(0), config=config
        ).compile()
        out[f"compile_{name}_s"] = round(time.perf_counter() - started, 2)

        def run(i: int, compiled: Any = compiled) -> Any:
            return compiled(state, tokens, mask, jax.random.key(i)).tokens

        out[f"median_{name}_s"] = _median_time(run, repeat)
        out[f"new_tokens_{name}"] = T
        if trace and name == "long":
            out.update(_guarded_profile(lambda run=run: run(repeat + 1)))
    decode_s = out["median_long_s"] - out["median_short_s"]
    roof = decode_roofline(s, bandwidth)
    out.update(roof)
    out["decode_s"] = decode_s
    out["end_to_end_tokens_per_s"] = s.batch * s.long / out["median_long_s"]
    if decode_s <= 0:  # timing noise larger than the extra decode steps (tiny runs)
        out["tokens_per_s"] = out["fraction_of_roofline"] = None
        return out
    out["tokens_per_s"] = s.batch * (s.long - s.short) / decode_s
    out["ms_per_decode_step"] = 1e3 * decode_s / (s.long - s.short)
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


def bench_update(
    s: Sizes,
    peak_flops: float,
    repeat: int,
    trace: bool = False,
    remat: str = "dots",
    rows: int | None = None,
    fused_attention: bool = False,
    chunk_size: int | None = None,
) -> dict[str, Any]:
    """Seconds of one GRPO update step and its bf16 MFU (module docstring); `rows` overrides
    the sequence count N, `fused_attention` the model's attention (cuDNN's flash attention,
    `Decoder(fused_attention=True)`), `chunk_size` the log-probs' positions per vocabulary
    chunk (`AlgorithmConfig.chunk_size`; None: the whole `[N·T, V]` logits at once); `trace`
    adds a profile of one step."""
    s = dataclasses.replace(s, rows=rows or s.rows)
    model = Decoder(
        s.model,
        dtype=jnp.bfloat16,
        param_dtype=jnp.float32,
        remat=remat,
        fused_attention=fused_attention,
        rngs=nnx.Rngs(0),
    )
    graphs, params, frozen = split_models(model)
    algorithm = dataclasses.replace(preset("grpo"), chunk_size=chunk_size)
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
    profiled = _guarded_profile(lambda: run(repeat + 1)) if trace else {}
    tokens = s.rows * s.seq
    flops = 6 * matmul_params(s.model) * tokens
    return {
        "remat": remat,
        "fused_attention": fused_attention,
        "chunk_size": chunk_size,
        "rows": s.rows,
        "seq": s.seq,
        "tokens": tokens,
        "compile_s": round(compile_s, 2),
        "median_s": seconds,
        "model_flops": flops,
        "achieved_flops": flops / seconds,
        "peak_flops": peak_flops,
        "mfu": flops / seconds / peak_flops,
        **profiled,
    }


DECODE_VARIANTS = '[{"layer_unroll": 24}, {"layer_unroll": 4}, {"steps_per_loop": 4}]'
UPDATE_VARIANTS = '[{"remat": "none"}, {"remat": "full"}, {"rows": 32}]'


def _fractions(result: dict[str, Any]) -> None:
    """Add the fractions of the measured ceilings to the decode and update parts."""
    measured = result.get("ceilings")
    if not measured:
        return
    scale = result["bandwidth"] / measured["bandwidth"]
    for d in [result.get("decode", {}), *result.get("decode_variants", [])]:
        if d.get("fraction_of_roofline") is not None:
            d["fraction_of_measured_roofline"] = d["fraction_of_roofline"] * scale
    for u in [result.get("update", {}), *result.get("update_variants", [])]:
        if "achieved_flops" in u:
            u["mfu_of_measured_peak"] = u["achieved_flops"] / measured["bf16_matmul_flops"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for bench_gpu.json")
    parser.add_argument("--bandwidth", type=float, help="HBM bytes/s (default: datasheet)")
    parser.add_argument("--peak-flops", type=float, help="dense bf16 FLOP/s (default: datasheet)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes: a smoke run on CPU")
    parser.add_argument("--skip", nargs="*", default=[], choices=["ceilings", "decode", "update"])
    parser.add_argument("--variants", action="store_true", help="also time the variants below")
    parser.add_argument("--decode-variants", default=DECODE_VARIANTS, help="JSON list")
    parser.add_argument("--update-variants", default=UPDATE_VARIANTS, help="JSON list")
    parser.add_argument("--profile", action="store_true", help="trace the main decode, update")
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="no variant after")
    args = parser.parse_args(argv)
    s = sizes(args.tiny)
    device = jax.devices()[0]
    try:
        rates = resolve_rates(device, args.bandwidth, args.peak_flops)
    except ValueError as error:
        parser.error(str(error))
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
        "bandwidth": rates.bandwidth,
        "peak_flops": rates.peak_flops,
        "rates": rates.card,
        "xla_flags": os.environ.get("XLA_FLAGS"),  # e.g. the session's command-buffer parts
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    def record(name: str, value: Any) -> None:
        result[name] = value
        _fractions(result)
        result["wall_s"] = round(time.perf_counter() - started, 1)
        (out / "bench_gpu.json").write_text(json.dumps(result, indent=2) + "\n")
        shown = value[-1] if isinstance(value, list) else value
        print(json.dumps({name: shown}), flush=True)

    if "ceilings" not in args.skip:
        record("ceilings", ceilings(args.tiny, args.repeat))
    if "decode" not in args.skip:
        record("decode", bench_decode(s, rates.bandwidth, args.repeat, args.profile))
    if "update" not in args.skip:
        record("update", bench_update(s, rates.peak_flops, args.repeat, args.profile))
    if args.variants:
        variants = [
            ("update", bench_update, rates.peak_flops, v) for v in json.loads(args.update_variants)
        ]
        variants += [
            ("decode", bench_decode, rates.bandwidth, v) for v in json.loads(args.decode_variants)
        ]
        for part, bench, rate, overrides in variants:
            if time.perf_counter() - started > args.budget_s:
                continue
            done = result.setdefault(f"{part}_variants", [])
            try:
                timed = bench(s, rate, args.repeat, **overrides)
            except Exception as err:  # e.g. out of memory: the next variant still runs
                timed = {**overrides, "error": f"{type(err).__name__}: {err}"[:500]}
            record(f"{part}_variants", [*done, timed])
    print(
        f"bench_gpu: {out / 'bench_gpu.json'} ({time.perf_counter() - started:.1f} s)", flush=True
    )
    return result


if __name__ == "__main__":
    main()
