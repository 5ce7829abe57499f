"""The benchmarks that build on the library's internals still run, on tiny cases.

A smoke test of `benchmarks/grpo_worker.py` as `bench_grpo` starts it (a subprocess printing
one `RESULT` line; the step-by-step loop): it builds on the runner's internals (the update
step, the log-prob forward), so a change there must not leave `make bench` broken; and of
`benchmarks/bench_attention.py`'s measurement and its report table. Nothing here is timed or compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
