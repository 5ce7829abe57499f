"""Run test modules on simulated CPU devices in subprocesses (the suite keeps one device).

`XLA_FLAGS=--xla_force_host_platform_device_count=N` must be set before JAX starts, so every
multi-device check runs a `python -m tests....` runner in a fresh process and reads its stdout:
`run_on_devices` for one process, `run_two_processes` for a two-process `jax.distributed` job on
localhost (CPU collectives), and `parse_result` for the `RESULT {json}` line a runner prints.

The runners compile with most of XLA's optimisations off (`JAX_DISABLE_MOST_OPTIMIZATIONS=1`,
as the test process does; a caller's `env` may set it to 0): they compare sharded programs with
single-device ones compiled under the same setting, and compiling is most of their time
(measured 2026-11-27: the sharded sampler runner 15-17 → 10 s, the shardings runner 15.5 →
12-14 s). The SPMD partitioner, which decides the layouts, runs the same either way.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

from tests.compile_settings import with_fast_xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Messages with which a JAX build without cross-process CPU collectives refuses the job.
NO_CPU_COLLECTIVES = (
    "Multiprocess computations aren't implemented on the CPU backend",
    "CPU collectives are not supported",
)


def _environ(devices: int, xla_flags: str, env: dict[str, str] | None) -> dict[str, str]:
    environ = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS="1", **(env or {}))
    flags = f"--xla_force_host_platform_device_count={devices} {xla_flags}"
    environ["XLA_FLAGS"] = with_fast_xla_flags(f"{environ.get('XLA_FLAGS', '')} {flags}".strip())
    environ["JAX_PLATFORMS"] = "cpu"
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    return environ


def run_on_devices(
    module: str,
    *args: str,
    devices: int = 8,
    xla_flags: str = "",
    env: dict[str, str] | None = None,
    timeout: int = 600,
) -> str:
    """Run `python -m module *args` with `devices` simulated CPU devices; return its stdout.

    Fails the test (with the end of both streams) when the process exits non-zero.
    """
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=_environ(devices, xla_flags, env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TwoProcessRun(NamedTuple):
    """What `run_two_processes` saw: each process's `(stdout, stderr)`, the coordinator port,
    and the result of `while_running`."""

    outputs: list[tuple[str, str]]
    port: int
    during: Any


def run_two_processes(
    module: str,
    *args: str,
    devices: int = 4,
    env: dict[str, str] | None = None,
    timeout: int = 180,
    while_running: Callable[[], Any] | None = None,
) -> TwoProcessRun:
    """Run `python -m module *args` as processes 0 and 1 of one `jax.distributed` job.

    Each process gets `devices` simulated CPU devices and the coordinator settings that
    `sharding.initialize_distributed` reads (`JAXRL_COORDINATOR_ADDRESS`, `JAXRL_NUM_PROCESSES`,
    `JAXRL_PROCESS_ID`). `while_running()` is called while the job runs (e.g. to compute the
    single-process reference). Skips the test when this JAX build has no cross-process CPU
    collectives; fails it on a timeout or a non-zero exit, with both processes' output.
    """
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=_environ(
                devices,
                "",
                {
                    **(env or {}),
                    "JAXRL_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                    "JAXRL_NUM_PROCESSES": "2",
                    "JAXRL_PROCESS_ID": str(pid),
                },
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in range(2)
    ]
    try:
        during = while_running() if while_running is not None else None
        outputs = [proc.communicate(timeout=timeout) for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        tails = [p.communicate()[1][-2000:] for p in procs]
        pytest.fail(f"2-process job timed out after {timeout} s; stderr tails: {tails}")
    except BaseException:
        for proc in procs:
            proc.kill()
        raise
    logs = "\n".join(
        f"--- process {i} (rc {p.returncode})\n{o[0][-3000:]}\n{o[1][-3000:]}"
        for i, (p, o) in enumerate(zip(procs, outputs, strict=True))
    )
    if any(p.returncode for p in procs) and any(m in logs for m in NO_CPU_COLLECTIVES):
        pytest.skip(f"this JAX build has no cross-process CPU collectives:\n{logs}")
    assert all(p.returncode == 0 for p in procs), logs
    return TwoProcessRun(outputs, port, during)


def parse_result(stdout: str) -> dict[str, Any]:
    """The JSON of the one `RESULT {...}` line a runner prints."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, stdout[-4000:]
    return json.loads(lines[0][len("RESULT ") :])
