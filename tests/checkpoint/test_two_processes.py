"""Multi-host checkpoints: two JAX processes save their own shards and restore on a new mesh."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checkpoint import Checkpointer
from tests.checkpoint.two_process_runner import global_values

ROOT = pathlib.Path(__file__).resolve().parents[2]
_NO_CPU_COLLECTIVES = (
    "Multiprocess computations aren't implemented on the CPU backend",
    "CPU collectives are not supported",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_write_their_shards_and_restore_anywhere(tmp_path):
    port = _free_port()
    procs = []
    for pid in range(2):
        env = dict(os.environ)
        env.update(
            XLA_FLAGS="--xla_force_host_platform_device_count=4",
            JAX_PLATFORMS="cpu",
            PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
            JAXRL_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
            JAXRL_NUM_PROCESSES="2",
            JAXRL_PROCESS_ID=str(pid),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.checkpoint.two_process_runner", str(tmp_path)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=180))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        logs = [p.communicate()[1][-2000:] for p in procs]
        pytest.fail(f"2-process job timed out after 180 s; stderr tails: {logs}")
    logs = "\n".join(
        f"--- process {i} (rc {p.returncode})\n{o[0][-3000:]}\n{o[1][-3000:]}"
        for i, (p, o) in enumerate(zip(procs, outputs, strict=True))
    )
    if any(p.returncode for p in procs) and any(m in logs for m in _NO_CPU_COLLECTIVES):
        pytest.skip(f"this JAX build has no cross-process CPU collectives:\n{logs}")
    assert all(p.returncode == 0 for p in procs), logs

    results = []
    for stdout, _ in outputs:
        lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
        assert len(lines) == 1, logs
        results.append(json.loads(lines[0][len("RESULT ") :]))
    expected_key = np.asarray(jax.random.key_data(jax.random.key(11))).tolist()
    for pid, r in enumerate(results):
        assert r["process"] == pid and r["info"][:2] == [pid, 2]
        assert r["shards_checked"] == 8  # 4 local devices x 2 arrays, each compared
        assert r["key_data"] == expected_key and r["meta"] == {"n": 1}
    # the two processes held disjoint rows of `w` ...
    assert not set(results[0]["rows_written"]) & set(results[1]["rows_written"])
    # ... and each wrote its own shard files (orbax's per-process OCDBT layout)
    written = sorted(p.name for p in (tmp_path / "1" / "state").glob("ocdbt.process_*"))
    assert written == ["ocdbt.process_0", "ocdbt.process_1"], written

    # this single process (one device) reads the whole multi-host checkpoint
    values = global_values()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {
        "w": jax.ShapeDtypeStruct(values["w"].shape, jnp.float32, sharding=device),
        "b": jax.ShapeDtypeStruct(values["b"].shape, jnp.int32, sharding=device),
        "key": jax.random.key(0),
    }
    with Checkpointer(tmp_path, save_every=1) as ckpt:
        state, meta = ckpt.restore(target_state=target)
    assert meta == {"n": 1}
    np.testing.assert_array_equal(np.asarray(state["w"]), values["w"])
    np.testing.assert_array_equal(np.asarray(state["b"]), values["b"])
    assert np.asarray(jax.random.key_data(state["key"])).tolist() == expected_key
