"""GRPO iteration benchmark: jaxrl_llm (step-by-step loop and compiled iteration) vs Tunix and
TRL, the update step alone against the measured float32 matmul peak, and a scaling sweep.

    python -m benchmarks.bench_grpo [--quick] [--out DIR] [--peers-python PYTHON]
                                    [--only matmul ours peers scaling] [--force]

Never part of the test suite's pass/fail. Every measurement runs in a fresh subprocess
(`benchmarks.grpo_worker` for jaxrl_llm, `benchmarks.peers.*` in the peers' environment) and
writes `DIR/<part>__<name>.json` (default `benchmarks/results/grpo`, with `--quick`
`benchmarks/results/quick/grpo`); an existing file is kept unless `--force`, so an interrupted
run resumes. `benchmarks.report` turns the files into the markdown table and the scaling plot.

Parts (`--only`):

- `matmul`: the float32 matmul peak (2048², median of 20), jax here and torch in the peers'
  environment; the FLOP/s fractions in the report divide by the jax figure of the same run.
- `ours`: every workload (`benchmarks.workloads.WORKLOADS`) with the step-by-step loop and
  with the compiled iteration (`--chunk` iterations per host call), each twice in fresh
  processes sharing one new persistent compilation cache: the first process compiles (cold
  time to first step), the second loads from the cache (warm time to first step and its
  remaining compile time). The loop's result also holds the update step alone.
- `peers`: the same workloads with Tunix (`benchmarks.peers.tunix_grpo`) and TRL
  (`benchmarks.peers.trl_grpo`, with torch on all cores and on one thread: on a shared machine
  torch's spinning threads can lose more than they gain) run by `--peers-python` (default
  `$PEERS_PYTHON`, else `/tmp/peers-venv/bin/python` when it exists); skipped with a message
  when a peer does not import there. Install lines: docs/performance.md.
- `scaling`: the step-by-step loop around tiny 8 × 8 × 64 while the width, the completion
  length and G double (four points each): seconds per step, the update step alone, the
  update's memory from XLA's analysis (arguments + outputs + temporaries), and the process's
  peak RSS (which includes the compiler's own memory).

Our workers run with glibc's huge-page tunable, as `jaxrl-llm` runs itself
(jaxrl_llm.hugepages); Tunix runs both as installed and with the same tunable
(`peer_tunix_hugepages__*`), and the report compares with the faster of the two.

The 1-minute load average is recorded with every result: the machine may be shared, so compare
ratios taken in one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from benchmarks.workloads import WORKLOADS, Workload, iteration_flops, machine
from jaxrl_llm.hugepages import (
    environment_with_hugepages,
    glibc_version,
    thp_mode,
    tunables_without_hugepages,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_PEERS_PYTHON = "/tmp/peers-venv/bin/python"
SCALING_BASE = Workload("tiny", 8, 8, 64)
QUICK_WORKLOADS = [Workload("tiny", 2, 4, 16), Workload("tiny", 8, 8, 64)]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one invocation measures."""

    out: pathlib.Path
    workloads: list[Workload]
    steps: int  # steady-state steps per measurement (the small 8×8×64 workload: half)
    chunk: int
    scaling: list[tuple[str, Workload]]
    peers_python: str | None
    force: bool


def scaling_points(quick: bool) -> list[tuple[str, Workload]]:
    """Three sweeps around `SCALING_BASE`: width, completion length and G doubled."""
    b = SCALING_BASE
    factors = (1, 2) if quick else (1, 2, 4, 8)
    lengths = (32, 64) if quick else (32, 64, 128, 256)
    groups = (4, 8) if quick else (4, 8, 16, 32)
    points = [("width", dataclasses.replace(b, model=f"tiny_w{64 * f}")) for f in factors]
    points += [("length", dataclasses.replace(b, new_tokens=t)) for t in lengths]
    points += [("group", dataclasses.replace(b, samples=g)) for g in groups]
    return points


def _steps(plan: Plan, w: Workload) -> int:
    heavy = w.shape.hidden_size >= 256 and w.prompts * w.samples * w.new_tokens > 1000
    return max(3, plan.steps // 2) if heavy else plan.steps


def _last_result(stdout: str) -> dict | None:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT ") :]) if lines else None


def _tunables_without_hugepages() -> str:
    """This process's `GLIBC_TUNABLES` less any `glibc.malloc.hugetlb` setting."""
    return tunables_without_hugepages(os.environ.get("GLIBC_TUNABLES", ""))


def hugepage_env() -> dict | None:
    """The environment change `jaxrl-llm` makes for itself (glibc's huge-page tunable,
    jaxrl_llm.hugepages), so that our workers run as the command line runs; None where it
    does not apply (no THP in madvise mode, old glibc, `JAXRL_LLM_HUGEPAGES=0`)."""
    base = dict(os.environ, GLIBC_TUNABLES=_tunables_without_hugepages())
    env = environment_with_hugepages(base, thp_mode(), glibc_version())
    return None if env is None else {"GLIBC_TUNABLES": env["GLIBC_TUNABLES"]}


def peer_env_variants() -> dict[str, dict | None]:
    """The JAX peer run as installed (suffix "") and, where it applies, with the same
    huge-page tunable as ours (suffix "_hugepages"): the report takes the faster of the two,
    so our ratios never count the tunable as our own gain."""
    tuned = hugepage_env()
    if tuned is None:
        return {"": None}
    return {"": {"GLIBC_TUNABLES": _tunables_without_hugepages()}, "_hugepages": tuned}


def _subprocess(command: list[str], env: dict | None = None, timeout: int = 1800) -> dict:
    """Run one measurement; its `RESULT` line, or an error record with the output's tail."""
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", **(env or {}))
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "command": command}
    result = _last_result(done.stdout)
    if done.returncode or result is None:
        tail = (done.stderr or done.stdout)[-3000:]
        return {"error": f"exit {done.returncode}", "stderr_tail": tail, "command": command}
    return result


def _measure(plan: Plan, name: str, make: Callable[[], dict]) -> dict | None:
    path = plan.out / f"{name}.json"
    if path.exists() and not plan.force:
        print(f"{path.relative_to(ROOT)}: kept (--force re-measures)", flush=True)
        return json.loads(path.read_text())
    started = time.perf_counter()
    result = make()
    result["bench_wall_s"] = round(time.perf_counter() - started, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    status = "ERROR " + result["error"] if "error" in result else "ok"
    print(f"{path.relative_to(ROOT)}: {status} ({result['bench_wall_s']} s)", flush=True)
    return result


def _ours(w: Workload, mode: str, steps: int, chunk: int, cache: str) -> dict:
    args = ["ours", json.dumps(dataclasses.asdict(w)), mode, str(steps), str(chunk), cache]
    return _subprocess([sys.executable, "-m", "benchmarks.grpo_worker", *args], hugepage_env())


def run_ours(plan: Plan) -> None:
    for w in plan.workloads:
        for mode in ("loop", "compiled"):

            def make(w: Workload = w, mode: str = mode) -> dict:
                cache = tempfile.mkdtemp(prefix="jaxrl_llm_bench_cache_")
                try:
                    cold = _ours(w, mode, _steps(plan, w), plan.chunk, cache)
                    if "error" in cold:
                        return cold
                    warm = _ours(w, mode, 3, plan.chunk, cache)
                    cold["second_run"] = {
                        k: warm.get(k)
                        for k in ("time_to_first_step_s", "compile_to_first_step", "error")
                        if k in warm
                    }
                    return cold
                finally:
                    shutil.rmtree(cache, ignore_errors=True)

            _measure(plan, f"ours_{mode}__{w.name}", make)


def _peer_installed(python: str, peer: str) -> str | None:
    """None when `peer` imports in `python`, else the reason."""
    return peer_module_missing(python, f"{peer}_grpo")


def peer_module_missing(python: str, module: str) -> str | None:
    """None when `benchmarks.peers.<module>.check_installed()` passes in `python`, else why not
    (the last line of its error)."""
    probe = subprocess.run(
        [python, "-c", f"import benchmarks.peers.{module} as m; m.check_installed()"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    if probe.returncode == 0:
        return None
    return (probe.stderr.strip().splitlines() or ["?"])[-1]


def _peer(python: str, peer: str, w: Workload, steps: int, env: dict | None = None) -> dict:
    command = [python, "-m", f"benchmarks.peers.{peer}_grpo", json.dumps(dataclasses.asdict(w))]
    result = _subprocess([*command, str(steps)], env=env)
    if "error" not in result:
        flops = iteration_flops(w)["iteration"]
        result["gflop_per_iteration"] = round(flops / 1e9, 4)
        result["gflops"] = round(flops / result["seconds_per_step"] / 1e9, 2)
    return result


def run_peers(plan: Plan) -> None:
    python = plan.peers_python
    if python is None:
        print(
            "peers: skipped (no --peers-python, $PEERS_PYTHON or /tmp/peers-venv; "
            "see docs/performance.md for the install lines)",
            flush=True,
        )
        return
    for peer in ("tunix", "trl"):
        missing = _peer_installed(python, peer)
        if missing is not None:
            print(f"peers: {peer} skipped, it does not import in {python}: {missing}", flush=True)
            continue
        variants = peer_env_variants()
        if peer == "trl":  # torch on all cores, and on one thread
            variants = {"": None, "_1thread": {"OMP_NUM_THREADS": "1"}}
        for w in plan.workloads:
            for suffix, env in variants.items():

                def make(peer: str = peer, w: Workload = w, env: dict | None = env) -> dict:
                    return _peer(python, peer, w, _steps(plan, w) + 1, env)

                _measure(plan, f"peer_{peer}{suffix}__{w.name}", make)


def run_matmul(plan: Plan) -> None:
    _measure(
        plan,
        "matmul__jax",
        lambda: _subprocess(
            [sys.executable, "-m", "benchmarks.grpo_worker", "matmul"], hugepage_env()
        ),
    )
    if plan.peers_python and _peer_installed(plan.peers_python, "trl") is None:
        _measure(
            plan,
            "matmul__torch",
            lambda: _subprocess([plan.peers_python, "-m", "benchmarks.peers.torch_matmul"]),
        )


def run_scaling(plan: Plan) -> None:
    for axis, w in plan.scaling:

        def make(axis: str = axis, w: Workload = w) -> dict:
            return {**_ours(w, "scaling", max(3, plan.steps // 2), 1, "none"), "axis": axis}

        _measure(plan, f"scaling_{axis}__{w.name}", make)


def _peers_python(flag: str | None) -> str | None:
    if flag:
        return flag
    if os.environ.get("PEERS_PYTHON"):
        return os.environ["PEERS_PYTHON"]
    return DEFAULT_PEERS_PYTHON if pathlib.Path(DEFAULT_PEERS_PYTHON).exists() else None


PARTS = {"matmul": run_matmul, "ours": run_ours, "peers": run_peers, "scaling": run_scaling}


def make_plan(args: argparse.Namespace) -> Plan:
    """The `Plan` of the command line (`--quick`: tiny workloads, few steps, short sweeps)."""
    default_out = RESULTS / ("quick" if args.quick else "") / "grpo"
    return Plan(
        out=pathlib.Path(args.out) if args.out else default_out,
        workloads=QUICK_WORKLOADS[:1] if args.quick else WORKLOADS,
        steps=3 if args.quick else 10,
        chunk=2 if args.quick else args.chunk,
        scaling=scaling_points(args.quick),
        peers_python=_peers_python(args.peers_python),
        force=args.force,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="smoke run (tiny, few steps)")
    parser.add_argument("--out", default=None, help="results directory")
    parser.add_argument("--only", nargs="*", choices=sorted(PARTS), default=list(PARTS))
    parser.add_argument("--peers-python", default=None, help="python of the peers' venv")
    parser.add_argument("--chunk", type=int, default=4, help="compiled iterations per call")
    parser.add_argument("--force", action="store_true", help="re-measure existing results")


def run(args: argparse.Namespace) -> pathlib.Path:
    """Measure the parts of `args.only`; returns the results directory."""
    plan = make_plan(args)
    plan.out.mkdir(parents=True, exist_ok=True)
    (plan.out / "machine.json").write_text(json.dumps(machine(), indent=2) + "\n")
    started = time.perf_counter()
    for part in [p for p in PARTS if p in args.only]:  # matmul first: the same run's peak
        PARTS[part](plan)
    print(f"bench_grpo: done in {time.perf_counter() - started:.0f} s -> {plan.out}", flush=True)
    return plan.out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
