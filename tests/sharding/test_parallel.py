"""The update step across devices and processes equals the single-device step.

Both tests run JAX in subprocesses (the rest of the suite keeps its one device):

- 8 simulated devices (`parallel_runner.py`): the GRPO update step after 3 steps on the jit
  meshes (8,1,1), (1,8,1), (2,2,2), (1,4,2) (Auto axes) and (2,2,2) (Explicit axes) and on
  the data-parallel (`parallel: pmap`) path
  equals one device, large matrices are split over fsdp · tensor, the sampler draws the same
  tokens on every mesh, and the data-parallel step refuses what it cannot run;
- two processes with 4 simulated devices each (`parallel_two_process_runner.py`,
  `jax.distributed` with CPU collectives), each loading half of the batch: 2 steps of the jit
  and the data-parallel update equal a single-process run computed here.

Tolerance (`parallel_problem.TOLERANCE`, float32): 1e-5 absolute on parameters, Adam moments
and β, 1e-5 relative (to max(1, |value|)) on every metric of every step.

The subprocesses compile with `JAX_DISABLE_MOST_OPTIMIZATIONS=1` (XLA's backend optimisation
level 0): the same computations, compiled about twice as fast; the 8-device references run
under the same setting, the 2-process test's reference under the suite's own.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Messages with which a JAX build without cross-process CPU collectives refuses the job.
_NO_CPU_COLLECTIVES = (
    "Multiprocess computations aren't implemented on the CPU backend",
    "CPU collectives are not supported",
)


def _env(devices: int, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def test_update_step_and_sampler_on_8_simulated_devices():
    from tests.sharding.parallel_problem import TOLERANCE

    proc = subprocess.run(
        [sys.executable, "-m", "tests.sharding.parallel_runner"],
        cwd=ROOT,
        env=_env(8),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-4000:]
    results = json.loads(lines[0][len("RESULT ") :])
    runs = ["jit(8, 1, 1)", "jit(1, 8, 1)", "jit(2, 2, 2)", "jit(1, 4, 2)", "jit_explicit(2, 2, 2)"]
    runs += ["pmap(8, 1, 1)"]
    for run in runs:
        diffs = results[run]
        for key in ("params", "mu", "beta", "metrics"):
            assert diffs[key] <= TOLERANCE, (run, key, diffs)
        assert diffs["params_moved"] > 100 * TOLERANCE, (run, diffs)
    assert results["sampler_tokens"] > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_like_one_process(tmp_path):
    from tests.sharding import parallel_problem as problem

    port, out = _free_port(), tmp_path / "two_process.pkl"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.sharding.parallel_two_process_runner"],
            cwd=ROOT,
            env=_env(
                4,
                JAXRL_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                JAXRL_NUM_PROCESSES="2",
                JAXRL_PROCESS_ID=str(pid),
                JAXRL_TEST_OUT=str(out),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in range(2)
    ]
    try:
        # the single-process reference, computed while the job runs
        with jax.default_device(jax.devices("cpu")[0]):
            reference = problem.reference_run(problem.batch(), steps=2)
        outputs = [proc.communicate(timeout=600) for proc in procs]
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    logs = "\n".join(
        f"--- process {i} (rc {p.returncode})\n{o[0][-3000:]}\n{o[1][-3000:]}"
        for i, (p, o) in enumerate(zip(procs, outputs, strict=True))
    )
    if any(p.returncode for p in procs) and any(m in logs for m in _NO_CPU_COLLECTIVES):
        pytest.skip(f"this JAX build has no cross-process CPU collectives:\n{logs}")
    assert all(p.returncode == 0 for p in procs), logs
    with open(out, "rb") as f:
        results = pickle.load(f)
    for run in ("jit", "pmap"):
        diffs = problem.compare(results[run], reference)  # raises above the tolerance
        assert diffs["params_moved"] > 100 * problem.TOLERANCE, (run, diffs)
        assert np.isfinite(list(diffs.values())).all(), diffs
        print(f"two processes, {run}: {diffs}")
