"""Every CPU benchmark in one command, then the report (`make bench`).

    python -m benchmarks.run_all            the full run (about half an hour on 2 quiet cores)
    python -m benchmarks.run_all --quick    a smoke run: tiny workloads, few steps (minutes)

Options: `--peers-python PYTHON` (default `$PEERS_PYTHON`, else `/tmp/peers-venv/bin/python`
when it exists; without it the peers are skipped with a message), `--force` (re-measure
results that exist), `--skip losses sampler attention preference trim pack_forms grpo`.

Runs, in this order, each in its own processes:

    losses    benchmarks.bench_losses   -> RESULTS/losses_cpu.json
    sampler   benchmarks.bench_sampler  -> RESULTS/sampler_cpu.json (vs HF generate)
    attention benchmarks.bench_attention -> RESULTS/attention_cpu.json (whole vs query blocks)
    preference benchmarks.bench_preference -> RESULTS/preference_cpu.json (DPO, shared prompt)
    trim      benchmarks.bench_trim     -> RESULTS/trim_cpu.json (completions cut to the longest)
    pack_forms benchmarks.bench_pack_forms -> RESULTS/pack_forms_cpu.json (one batch, padded
                                           and packed)
    grpo      benchmarks.bench_grpo     -> RESULTS/grpo/*.json (matmul peak, ours, peers,
                                           scaling)
    report    benchmarks.report         -> RESULTS/README.md, RESULTS/scaling.png

RESULTS is `benchmarks/results` (`benchmarks/results/quick` with `--quick`, so a smoke run
never overwrites the real figures). The GPU benchmark (`benchmarks.bench_gpu`) runs separately
on a GPU machine and writes into `RESULTS/gpu/`, which the report picks up.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

from benchmarks import bench_grpo, report

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(command: list[str], env: dict | None = None) -> int:
    print("$ " + " ".join(command), flush=True)
    return subprocess.run(command, cwd=ROOT, env=dict(os.environ, **(env or {}))).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_grpo.add_arguments(parser)
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        choices=["losses", "sampler", "attention", "preference", "trim", "pack_forms", "grpo"],
        help="parts",
    )
    args = parser.parse_args(argv)
    results = ROOT / "benchmarks" / "results" / ("quick" if args.quick else "")
    results.mkdir(parents=True, exist_ok=True)
    started, failures = time.perf_counter(), []
    py = sys.executable
    losses = [py, "-m", "benchmarks.bench_losses", "--out", str(results / "losses_cpu.json")]
    if "losses" not in args.skip and not args.quick and _run(losses):
        failures.append("losses")
    if "sampler" not in args.skip:
        sampler = [py, "-m", "benchmarks.bench_sampler", "--out", str(results / "sampler_cpu.json")]
        if args.quick:
            sampler += ["--only", "tiny", "--repeat", "3"]
        if _run(sampler, bench_grpo.hugepage_env()):  # as `jaxrl-llm` runs itself
            failures.append("sampler")
    for part in ("attention", "preference", "trim", "pack_forms"):  # in-process, one each
        if part in args.skip:
            continue
        command = [py, "-m", f"benchmarks.bench_{part}", "--out", str(results / f"{part}_cpu.json")]
        if _run(command + (["--quick"] if args.quick else []), bench_grpo.hugepage_env()):
            failures.append(part)
    if "grpo" not in args.skip:
        args.out = str(results / "grpo") if args.out is None else args.out
        bench_grpo.run(args)
    command = "python -m benchmarks.run_all" + (" --quick" if args.quick else "")
    path = report.write_report(results, command)
    print(f"run_all: done in {time.perf_counter() - started:.0f} s; report: {path}", flush=True)
    if failures:
        print(f"run_all: failed parts: {', '.join(failures)}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
