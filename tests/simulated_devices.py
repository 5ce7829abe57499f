"""Run a test module on simulated CPU devices in a subprocess (the suite keeps one device).

`XLA_FLAGS=--xla_force_host_platform_device_count=N` must be set before JAX starts, so every
multi-device check runs a `python -m tests....` runner in a fresh process and reads its stdout.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
    environ = dict(os.environ, **(env or {}))
    flags = f"--xla_force_host_platform_device_count={devices} {xla_flags}"
    environ["XLA_FLAGS"] = (environ.get("XLA_FLAGS", "") + " " + flags).strip()
    environ["JAX_PLATFORMS"] = "cpu"
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout
