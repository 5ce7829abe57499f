"""The benchmarks that build on the library's internals still run, on tiny cases.

A smoke test of `benchmarks/grpo_worker.py` as `bench_grpo` starts it (a subprocess printing
one `RESULT` line; the step-by-step loop): it builds on the runner's internals (the update
step, the log-prob forward), so a change there must not leave `make bench` broken; and of
`benchmarks/bench_attention.py`'s, `benchmarks/bench_preference.py`'s,
`benchmarks/bench_trim.py`'s and `benchmarks/bench_pack_forms.py`'s measurements and their
report tables; and of the GPU benchmark's roofline and MFU arithmetic and its report table
(the benchmark itself needs a GPU to mean anything). The FLOP model every table divides by is
checked against a hand derivation, the parameter counts against the real models, and the
speed-up columns for their direction. Nothing here is timed or compared. The
preference and pack-forms benchmarks' smoke tests are extended cases (`make test-all`:
tests/extended.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.extended import EXTENDED

WORKLOAD = {"model": "tiny", "prompts": 2, "samples": 4, "new_tokens": 16}


def test_the_grpo_worker_reports_a_result():
    # the loop with the update alone and XLA's memory analysis (the compiled form's wrapper
    # is a call of `runner.compiled.compiled_steps`, tested in tests/runner/test_compiled.py)
    mode = "scaling"
    command = [sys.executable, "-m", "benchmarks.grpo_worker", "ours", json.dumps(WORKLOAD)]
    command += [mode, "2", "2", "none"]  # 2 steps, chunks of 2, no persistent cache
    env = {**os.environ, "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}  # compiles in 60 % of the CPU
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, done.stdout[-3000:]
    result = json.loads(lines[0].removeprefix("RESULT "))
    assert result["workload"] == WORKLOAD
    assert result["seconds_per_step"] > 0 and result["time_to_first_step_s"] > 0
    assert result["update"]["median_s"] > 0
    assert result["update"]["xla_temp_mb"] > 0
    assert set(result["phases_median_s"]) >= {"sample_s", "forward_s", "update_s"}


def test_the_attention_benchmark_measures_both_forms(tmp_path):
    from benchmarks import bench_attention, report

    row = bench_attention.measure("tiny", 24, 16, repeat=1)
    assert row["attention_chunk"] == 16 and row["temp_mb"] > 0 and row["median_s"] > 0
    rows = [{**row, "attention_chunk": None}, row]  # the whole form differs by a keyword only
    (tmp_path / "attention_cpu.json").write_text(json.dumps({"results": rows}))
    table = report.attention_table(tmp_path)
    assert table[0].startswith("### Attention in query blocks") and len(table) == 8


@EXTENDED  # the forms it times are tested in tests/train (test_preference_shared_prompt.py)
def test_the_preference_benchmark_measures_both_forms(tmp_path):
    from benchmarks import bench_preference, report

    row = bench_preference.measure("tiny", 2, 6, 3, repeat=1)
    assert row["token_rows"] == {"concatenated": 36, "shared_prompt": 24}
    for form in ("concatenated", "shared_prompt"):
        assert row[form]["update_s"] > 0 and row[form]["reference_s"] > 0
    rm = bench_preference.measure("tiny", 2, 6, 3, repeat=1, objective="reward_model")
    assert rm["shared_prompt"]["update_s"] > 0 and "reference_s" not in rm["shared_prompt"]
    uneven = bench_preference.measure("tiny", 4, 12, 8, repeat=1, objective="dpo_uneven")
    assert uneven["forms"] == ["shared_prompt", "packed"] and uneven["packed"]["update_s"] > 0
    slots = uneven["token_rows"]
    assert slots["shared_prompt"] == 4 * (12 + 2 * 8)
    assert uneven["real_tokens"] <= slots["packed"] <= slots["shared_prompt"]
    (tmp_path / "preference_cpu.json").write_text(json.dumps({"results": [row, rm, uneven]}))
    table = report.preference_table(tmp_path)
    assert table[0].startswith("### Each pair's prompt once, and packed") and len(table) == 9
    assert table[-2].startswith("| reward_model | tiny | 2 × 6 + 3 |") and "| — |" in table[-2]
    assert "| shared_prompt → packed | 112 → " in table[-1]


def test_the_trim_benchmark_cuts_and_packs_the_completions(tmp_path):
    from benchmarks import bench_trim, report
    from benchmarks.workloads import Workload

    row = bench_trim.measure(Workload("tiny", 2, 2, 64), steps=1, warmup=0)
    assert row["full"]["widths"] == [64] and row["trimmed"]["widths"][0] < 64
    assert row["packed"]["widths"] == row["trimmed"]["widths"] and row["packed"]["rows"][0] >= 1
    assert row["speedup_packed_update"] > 0 and row["trimmed"]["time/update_s"] > 0
    (tmp_path / "trim_cpu.json").write_text(json.dumps({"results": [row]}))
    table = report.trim_table(tmp_path)
    assert table[0].startswith("### Completions cut") and len(table) == 9
    assert table[-1].startswith("| tiny__2x2x64 | packed |")


@EXTENDED  # the forms it times are tested in tests/train/test_group_packing.py and tests/runner
def test_the_pack_forms_benchmark_times_three_forms_on_one_batch(tmp_path):
    from benchmarks import bench_pack_forms, report
    from benchmarks.workloads import Workload

    row = bench_pack_forms.measure(
        10, 64, repeat=1, workload=Workload("tiny", 2, 2, 64), row_groups=2
    )
    assert row["row_groups"] == 2 and row["width"] < 64 and 0 < row["padding_share"] < 1
    assert 0 <= row["slot_saving"] < 1
    assert row["completion_rows"]["parts"] >= row["completion_rows"]["one_call"] >= 1
    for form in ("padded", "packed_one_call", "packed"):
        assert row[form]["update"] > 0 and row[form]["forward"] > 0
    pairs = bench_pack_forms.measure(
        10, 64, repeat=1, workload=Workload("tiny", 2, 4, 64), algorithm="online_dpo"
    )
    assert pairs["completion_rows"]["one_call"] <= 4  # the 2 prompts' kept pairs: 4 rows
    assert pairs["packed"]["update"] > 0 and pairs["packed"]["forward"] > 0
    (tmp_path / "pack_forms_cpu.json").write_text(json.dumps({"results": [row]}))
    table = report.pack_forms_table(tmp_path)
    assert table[0].startswith("### One batch padded and packed") and len(table) == 7
    assert table[-1].startswith("| tiny__2x2x64, stop every 10 |")


def test_the_gpu_benchmark_arithmetic_and_its_report(tmp_path):
    from benchmarks import bench_gpu, report

    s = bench_gpu.sizes(tiny=True)  # 16 layers, width 64, MLP 128, 4 × 16 heads, 2 KV, vocab 259
    # per layer: q,k,v,o weights 64·16·(2·4 + 2·2), q/k/v biases 16·(4 + 2·2), MLP 3·64·128,
    # two norms 2·64; then the final norm and the tied output projection 259·64
    per_layer = 64 * 16 * 12 + 16 * 8 + 3 * 64 * 128 + 2 * 64
    assert bench_gpu.matmul_params(s.model) == 16 * per_layer + 64 + 259 * 64
    roof = bench_gpu.decode_roofline(s, bandwidth=1e9)
    weights = 2 * bench_gpu.matmul_params(s.model)
    kv = 2 * 2 * 16 * 2 * 16 * s.batch  # K and V, bf16, layers, KV heads, head dim, rows
    contexts = range(s.prompt + s.short, s.prompt + s.long)
    assert roof["roofline_s"] == sum(weights + kv * c for c in contexts) / 1e9
    assert roof["roofline_tokens_per_s"] == s.batch * len(contexts) / roof["roofline_s"]

    decode = {
        "batch": 64,
        "tokens_per_s": 2e4,
        "ms_per_decode_step": 3.2,
        "fraction_of_roofline": 0.1,
        "compile_short_s": 1.0,
        "compile_long_s": 2.0,
    }
    update = {
        "rows": 16,
        "seq": 512,
        "median_s": 0.1,
        "achieved_flops": 2e14,
        "mfu": 0.2,
        "compile_s": 3.0,
        "peak_flops": 1e15,
    }
    result = {
        "device": "gpu: X",
        "bandwidth": 3e12,
        "peak_flops": 1e15,
        "rates": "X",
        "decode": decode,
        "update": update,
        "decode_variants": [{**decode, "layer_unroll": 24, "fraction_of_roofline": 0.2}],
        "update_variants": [
            {**update, "fused_attention": True, "median_s": 0.05},
            {**update, "chunk_size": 64},
            {"rows": 32, "error": "XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory"},
        ],
        "ceilings": {"bandwidth": 2e12, "bf16_matmul_flops": 5e14, "matmul_n": 8192},
        "xla_flags": "--xla_gpu_enable_command_buffer=+WHILE",
    }
    bench_gpu._fractions(result)
    assert abs(decode["fraction_of_measured_roofline"] - 0.15) < 1e-12  # 0.1 · 3e12 / 2e12
    assert abs(update["mfu_of_measured_peak"] - 0.4) < 1e-12  # 2e14 / 5e14
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "card.json").write_text(json.dumps(result))
    table = report.gpu_table(tmp_path)
    assert "datasheet (X) 3 TB/s HBM and 1000 TFLOP/s dense bf16" in table[2]
    assert table[2].endswith("`XLA_FLAGS=--xla_gpu_enable_command_buffer=+WHILE`.")
    rows = [line for line in table if line.startswith("| ")]
    assert rows[1:] == [
        "| decode, batch 64 (default loop) | 20000 tok/s (3.2 ms/step) | 10.0% | 15.0% "
        "| 1.0 + 2.0 s |",
        "| decode, batch 64, layer_unroll 24 | 20000 tok/s (3.2 ms/step) | 20.0% | 30.0% "
        "| 1.0 + 2.0 s |",
        "| update, 16 × 512 tokens, remat dots | 0.1 s (200 TFLOP/s) | 20.0% | 40.0% | 3.0 s |",
        "| update, 16 × 512 tokens, remat dots, fused attention | 0.05 s (200 TFLOP/s) | 20.0% "
        "| 40.0% | 3.0 s |",
        "| update, 16 × 512 tokens, remat dots, log-probs in chunks of 64 positions per row "
        "| 0.1 s (200 TFLOP/s) | 20.0% | 40.0% | 3.0 s |",
        "| update, rows 32 | failed: XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory | — | — "
        "| — |",
    ]


def test_the_gpu_benchmark_reports_against_the_cards_datasheet():
    from benchmarks.bench_gpu import datasheet_rates, resolve_rates

    class Device:  # what `resolve_rates` reads of a `jax.Device`
        def __init__(self, platform, device_kind):
            self.platform, self.device_kind = platform, device_kind

    h200 = resolve_rates(Device("gpu", "NVIDIA H200"), None, None)
    assert (h200.bandwidth, h200.peak_flops, h200.card) == (4.8e12, 989e12, "H200 SXM")
    assert datasheet_rates("NVIDIA GH200 480GB").card.startswith("GH200")  # not the H200
    assert datasheet_rates("NVIDIA H100 80GB HBM3").bandwidth == 3.35e12
    assert datasheet_rates("NVIDIA A100-SXM4-40GB").bandwidth == 1.555e12
    assert (
        datasheet_rates("NVIDIA L40S").card == "L40S" and datasheet_rates("NVIDIA L4").card == "L4"
    )
    one_flag = resolve_rates(Device("gpu", "NVIDIA H200"), 4e12, None)  # the other from the sheet
    assert (one_flag.bandwidth, one_flag.peak_flops) == (4e12, 989e12)
    given = resolve_rates(Device("gpu", "Tesla T4"), 3.2e11, 65e12)
    assert (given.bandwidth, given.peak_flops, given.card) == (
        3.2e11,
        65e12,
        "given on the command line",
    )
    with pytest.raises(ValueError, match=r"no datasheet rates for 'Tesla T4'.*--bandwidth"):
        resolve_rates(Device("gpu", "Tesla T4"), None, None)
    cpu = resolve_rates(Device("cpu", "cpu"), None, None)  # a smoke run: nominal H100 SXM rates
    assert cpu.bandwidth == 3.35e12 and "nominal" in cpu.card


def test_the_workloads_flop_model_equals_a_hand_derivation():
    """The FLOPs every benchmark table divides by, against arithmetic written out here."""
    from benchmarks.workloads import MODELS, Workload, iteration_flops

    # tiny: per layer q,k,v,o 64·16·(2·4 + 2·2) + MLP 3·64·128 = 36,864; 2 layers
    M, attn, DV = 2 * 36_864, 4 * 2 * 4 * 16, 2 * 64 * 259
    # 2 prompts × G = 4, P = 16, T = 16: N = 8 rows of S = 32, logits on the 16 completions
    forward = 8 * (2 * M * 32 + attn * 32 * 32) + DV * 8 * 16
    prefill = 2 * (2 * M * 16 + attn * 16 * 16) + DV * 2  # the prompts once, one logit row each
    # T − 1 = 15 decode steps (the prefill's logits give token 1), each over the P + T cache
    decode = 8 * 15 * (2 * M + attn * 32 + DV)
    tiny = iteration_flops(Workload("tiny", 2, 4, 16))
    assert tiny == {
        "sample": prefill + decode,
        "reference": forward,
        "update": 3 * forward,
        "iteration": prefill + decode + 4 * forward,
    }
    assert tiny["iteration"] == 213_432_064
    assert iteration_flops(Workload("small", 8, 8, 64))["iteration"] == 165_770_342_400
    # parameters: matmuls, the tied embedding once, q/k norms and the two norms of each layer
    assert MODELS["tiny"].num_params == M + 64 * 259 + 2 * (2 * 64 + 2 * 16) + 64 == 90_688
    import jax
    from flax import nnx

    from jaxrl_llm.models import Decoder

    for shape in MODELS.values():
        model = Decoder(shape.model_config(), rngs=nnx.Rngs(0))
        real = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        assert real == shape.num_params, shape.name


def test_the_grpo_table_divides_the_faster_peer_by_ours():
    from benchmarks import report

    name = "tiny__2x4x16"
    grpo = {
        f"ours_loop__{name}": {"seconds_per_step": 0.01},
        f"ours_compiled__{name}": {"seconds_per_step": 0.004, "iterations_per_call": 4},
        f"peer_tunix__{name}": {"seconds_per_step": 0.03},
        f"peer_trl__{name}": {"seconds_per_step": 0.02, "torch_threads": 2},
        f"peer_trl_1thread__{name}": {"seconds_per_step": 0.05, "torch_threads": 1},
    }
    row = next(line for line in report.grpo_table(grpo) if line.startswith("| tiny 2×4×16"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[-2:] == ["2.00×", "5.00×"]  # TRL's 0.02 s (the faster peer) / ours
    assert cells[4] == "0.02 (2 thr)"


def test_the_gpu_report_keeps_partial_runs_and_names_given_rates(tmp_path):
    """`gpu_session.sh` writes runs with one part, or variants alone: each gets its rows."""
    from benchmarks import bench_gpu, report

    decode = {
        "batch": 64, "tokens_per_s": 2e4, "ms_per_decode_step": 3.2, "fraction_of_roofline": 0.1,
        "compile_short_s": 1.0, "compile_long_s": 2.0,
    }  # fmt: skip
    update = {
        "rows": 16, "seq": 512, "median_s": 0.1, "achieved_flops": 2e14, "mfu": 0.2,
        "compile_s": 3.0, "peak_flops": 1e15,
    }  # fmt: skip
    head = {"device": "gpu: X", "bandwidth": 3e12, "peak_flops": 1e15, "rates": "X"}
    runs = {
        "a_decode": {**head, "decode": decode},
        "b_update": {**head, "update": update},
        "c_variants": {**head, "decode_variants": [{**decode, "layer_unroll": 24}]},
        "d_ceilings": {**head, "ceilings": {"bandwidth": 2e12, "bf16_matmul_flops": 5e14}},
    }
    (tmp_path / "gpu").mkdir()
    for name, run in runs.items():
        (tmp_path / "gpu" / f"{name}.json").write_text(json.dumps(run))
    table = report.gpu_table(tmp_path)
    titles = [line for line in table if line.startswith("### ")]
    assert [t.rsplit(" ", 1)[-1] for t in titles] == ["a_decode", "b_update", "c_variants"]
    rows = [line for line in table if line.startswith("| ") and not line.startswith("| part")]
    assert [r.split("|")[1].strip() for r in rows] == [
        "decode, batch 64 (default loop)",
        "update, 16 × 512 tokens, remat dots",
        "decode, batch 64, layer_unroll 24",
    ]

    class Device:
        platform, device_kind = "gpu", "NVIDIA H200"

    label = bench_gpu.resolve_rates(Device(), 4e12, None).card
    assert label == "H200 SXM; HBM bandwidth given on the command line"
    assert "peak given" in bench_gpu.resolve_rates(Device(), None, 1e15).card
