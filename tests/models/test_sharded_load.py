"""`from_pretrained(mesh=...)` places every parameter by its logical axes (8 simulated devices)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_sharded_load_on_8_simulated_devices(hf_checkpoints):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    path = str(hf_checkpoints["gemma2"][1])
    proc = subprocess.run(
        [sys.executable, "-m", "tests.models.sharded_load_runner", path],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "sharded load: ok" in proc.stdout
