"""Atomicity: SIGKILL a process in the middle of an asynchronous save (subprocess)."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import pytest

from jaxrl_llm.checkpoint import Checkpointer, IncompleteCheckpointWarning
from tests.checkpoint import kill_runner
from tests.compile_settings import fast_compile_env

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run_until_started(directory: pathlib.Path) -> dict[int, str]:
    env = fast_compile_env(JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.checkpoint.kill_runner", str(directory)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    digests = {}
    watchdog = threading.Timer(120, proc.kill)  # a hung runner fails the test, never blocks it
    watchdog.start()
    try:
        for line in proc.stdout:
            if line.startswith("DIGEST "):
                _, step, value = line.split()
                digests[int(step)] = value
            if line.startswith("STARTED 2"):
                proc.send_signal(signal.SIGKILL)  # mid-write of step 2
                break
        proc.wait(timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read()
    assert proc.returncode == -signal.SIGKILL, f"runner exited with {proc.returncode}:\n{stderr}"
    assert set(digests) == {1, 2}, stderr[-4000:]
    return digests


def test_sigkill_during_async_save_keeps_the_previous_checkpoint(tmp_path):
    digests = _run_until_started(tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "1" in names and "2" not in names, names  # step 2 never reached its final name
    assert any(n.startswith("2.orbax-checkpoint-tmp") for n in names), names

    target = {
        "w": jnp.zeros((kill_runner.ROWS, kill_runner.COLS), jnp.float32),
        "step": jnp.int32(0),
        "key": jax.random.key(0),
    }
    with pytest.warns(IncompleteCheckpointWarning, match="save of step 2 .* did not finish"):
        ckpt = Checkpointer(tmp_path, save_every=1)
    with ckpt:
        assert ckpt.latest_step() == 1
        with pytest.warns(IncompleteCheckpointWarning, match=r"skipping step\(s\) \[2\]"):
            state, meta = ckpt.restore(target_state=target)
        assert meta == {"step": 1}
        assert kill_runner.digest(state) == digests[1]
        # the run goes on: step 2 can be saved again and is then the latest
        # (its digest is this process's: XLA settings may round the draw differently here)
        saved = kill_runner.state_at(2)
        ckpt.save(2, saved, {"step": 2})
        ckpt.wait()
        state, meta = ckpt.restore(target_state=target)
        assert meta == {"step": 2} and kill_runner.digest(state) == kill_runner.digest(saved)
