"""Every `losses` function gives identical results on 8 simulated devices (subprocess)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_losses_match_on_8_simulated_devices():
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"  # compile time dominates: 257 small programs
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.losses.sharded_runner"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert " 0 failed" in proc.stdout
