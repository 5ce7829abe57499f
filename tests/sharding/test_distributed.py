"""Multi-host start-up: settings resolution, host batch slices, and a real 2-process job on CPU."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

import sharding.distributed as dist
from sharding import (
    MeshConfig,
    host_batch_slice,
    initialize_distributed,
    make_global_batch,
    make_mesh,
)
from tests.simulated_devices import parse_result, run_two_processes

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def no_cluster(monkeypatch):
    """Pretend no cluster launcher is present, whatever machine runs the tests."""
    monkeypatch.setattr(dist, "_cluster_environment", lambda: None)
    monkeypatch.setattr(dist, "_STARTED", None)


def test_single_process_runs_start_nothing(no_cluster, monkeypatch):
    calls = []
    monkeypatch.setattr(dist.jax.distributed, "initialize", lambda *a, **k: calls.append(k))
    single = dist.ProcessInfo(0, 1, None, "single")
    assert initialize_distributed(environ={}) == single
    assert initialize_distributed(environ={dist.ENV_NUM_PROCESSES: ""}) == single  # empty = unset
    assert initialize_distributed("localhost:1234", 1, 0, environ={}) == single
    env = {dist.ENV_COORDINATOR: "h:1", dist.ENV_NUM_PROCESSES: "1", dist.ENV_PROCESS_ID: "0"}
    assert initialize_distributed(environ=env) == single
    with pytest.warns(UserWarning, match=r"local_device_ids=\[1\] has no effect"):
        assert initialize_distributed(local_device_ids=[1], environ={}) == single
    assert calls == []


def test_settings_come_from_arguments_before_the_environment(no_cluster, monkeypatch):
    calls = []
    monkeypatch.setattr(dist.jax.distributed, "initialize", lambda **k: calls.append(k))
    env = {dist.ENV_COORDINATOR: "env:9", dist.ENV_NUM_PROCESSES: "4", dist.ENV_PROCESS_ID: "3"}
    info = initialize_distributed(environ=env, initialization_timeout=7)
    assert info == dist.ProcessInfo(3, 4, "env:9", "environment")
    assert calls[-1]["coordinator_address"] == "env:9"
    assert (calls[-1]["num_processes"], calls[-1]["process_id"]) == (4, 3)
    assert calls[-1]["cluster_detection_method"] == "deactivate"
    assert calls[-1]["initialization_timeout"] == 7
    info = initialize_distributed("arg:1", 2, 1, environ=env)
    assert info == dist.ProcessInfo(1, 2, "arg:1", "arguments")
    # once started, the same settings return it; another coordinator is refused by name
    monkeypatch.setattr(dist.jax.distributed, "is_initialized", lambda: True)
    assert initialize_distributed("arg:1", 2, 1, environ={}) == info
    with pytest.raises(ValueError, match="already initialized with coordinator arg:1, asked"):
        initialize_distributed("other:2", 2, 1, environ={})


def test_cluster_launchers_are_left_to_jax(monkeypatch):
    monkeypatch.setattr(dist, "_STARTED", None)
    calls = []
    monkeypatch.setattr(dist, "_cluster_environment", lambda: "SlurmCluster")
    monkeypatch.setattr(dist, "_cluster_process_count", lambda cluster: 4)
    monkeypatch.setattr(dist.jax.distributed, "initialize", lambda **k: calls.append(k))
    info = initialize_distributed(environ={})
    assert info.source == "cluster" and "coordinator_address" not in calls[0]
    # a JAX that moved its launcher registry: its own auto-detection decides
    monkeypatch.setattr(dist, "_cluster_environment", lambda: "unknown")

    def no_launcher(**kwargs):
        raise ValueError("coordinator_address should be defined.")

    monkeypatch.setattr(dist.jax.distributed, "initialize", no_launcher)
    assert initialize_distributed(environ={}).source == "single"


def test_a_launcher_of_one_process_starts_nothing(monkeypatch):
    """`srun -n 1` (or a one-task batch job): JAX's auto-detection would bind the process to
    the device of its local rank; a single process keeps all of its devices instead."""
    monkeypatch.setattr(dist, "_STARTED", None)
    slurm = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node001", "SLURM_NTASKS": "1"}
    slurm.update({"SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    assert dist._cluster_environment() == "SlurmCluster"
    assert dist._cluster_process_count("SlurmCluster") == 1
    calls = []
    monkeypatch.setattr(dist.jax.distributed, "initialize", lambda **k: calls.append(k))
    assert initialize_distributed(environ={}) == dist.ProcessInfo(0, 1, None, "single")
    assert calls == []
    monkeypatch.setenv("SLURM_NTASKS", "2")  # two tasks: JAX's auto-detection starts the job
    assert initialize_distributed(environ={}).source == "cluster" and len(calls) == 1


def test_partial_or_malformed_settings_are_errors(no_cluster):
    with pytest.raises(ValueError, match="missing JAXRL_PROCESS_ID"):
        initialize_distributed(environ={dist.ENV_COORDINATOR: "h:1", dist.ENV_NUM_PROCESSES: "2"})
    with pytest.raises(ValueError, match="missing coordinator_address"):
        initialize_distributed(num_processes=2, process_id=0, environ={})
    with pytest.raises(ValueError, match="JAXRL_NUM_PROCESSES must be an integer, got 'two'"):
        initialize_distributed(
            environ={
                dist.ENV_COORDINATOR: "h:1",
                dist.ENV_NUM_PROCESSES: "two",
                dist.ENV_PROCESS_ID: "0",
            }
        )
    with pytest.raises(ValueError, match="0 <= process_id < num_processes, got process_id=2"):
        initialize_distributed("h:1", 2, 2, environ={})


def test_cluster_detection_sees_no_launcher_in_a_clean_environment():
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "KUBERNETES_"))
    }
    env["TPU_SKIP_MDS_QUERY"] = "1"
    code = "import sharding.distributed as d; print(d._cluster_environment())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"


def test_host_batch_slices_partition_the_batch():
    slices = [host_batch_slice(24, process_index=p, process_count=4) for p in range(4)]
    covered = np.concatenate([np.arange(24)[s] for s in slices])
    np.testing.assert_array_equal(covered, np.arange(24))
    assert slices[2] == slice(12, 18)
    assert host_batch_slice(5, process_index=0, process_count=1) == slice(0, 5)


def test_host_batch_slice_errors():
    with pytest.raises(
        ValueError, match="global_batch_size=10 is not divisible by the 4 processes"
    ):
        host_batch_slice(10, process_index=0, process_count=4)
    with pytest.raises(ValueError, match="global_batch_size must be >= 1"):
        host_batch_slice(0)
    with pytest.raises(ValueError, match="global_batch_size must be an int"):
        host_batch_slice(8.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"process_index=4 is outside \[0, 4\)"):
        host_batch_slice(8, process_index=4, process_count=4)


def test_make_global_batch_on_one_device():
    mesh = make_mesh(MeshConfig(), devices=dist.jax.devices()[:1])
    batch = make_global_batch({"x": np.arange(6.0).reshape(3, 2), "y": np.array([1, 2, 3])}, mesh)
    np.testing.assert_array_equal(np.asarray(batch["x"]), np.arange(6.0).reshape(3, 2))
    assert batch["y"].shape == (3,)
    with pytest.raises(ValueError, match="leaf 'z' is a scalar"):
        make_global_batch({"z": np.float32(1.0)}, mesh)


def test_fetch_global_on_one_process_reads_what_device_get_reads():
    jax = dist.jax
    tree = {
        "scalar": jax.numpy.float32(2.5) * 2,
        "rows": jax.numpy.arange(6, dtype=jax.numpy.int32).reshape(3, 2),
        "key": jax.random.key(3),  # an extended dtype: device_get's own rule
        "host": np.ones(2),
        "number": 7,
    }
    got, expected = dist.fetch_global(tree), jax.device_get(tree)
    assert got.keys() == expected.keys()
    for name in ("scalar", "rows", "host"):
        assert isinstance(got[name], np.ndarray)
        assert got[name].dtype == expected[name].dtype
        np.testing.assert_array_equal(got[name], expected[name])
    assert got["number"] == 7
    assert (jax.random.key_data(got["key"]) == jax.random.key_data(tree["key"])).all()


def test_two_processes_build_one_global_batch_and_agree_on_a_reduction():
    outputs, port, _ = run_two_processes("tests.sharding.two_process_runner")
    results = [parse_result(stdout) for stdout, _ in outputs]
    # the global batch: rows r of x are 3r .. 3r + 2 (the runner's data); float64 reference
    x = np.arange(16 * 3, dtype=np.float64).reshape(16, 3)
    expected_sum = float(np.sum(x * x))
    expected_rows = (x.sum(axis=1) ** 2).tolist()
    for pid, r in enumerate(results):
        assert r["process"] == pid and r["process_count"] == 2 and r["device_count"] == 8
        assert r["slice"] == [8 * pid, 8 * pid + 8]  # host_batch_slice(16, mesh=mesh)
        assert r["sum_sq"] == expected_sum
        assert r["rows"] == expected_rows
        assert r["again"] == r["info"]  # initialize_distributed is idempotent
        assert r["info"] == [pid, 2, f"127.0.0.1:{port}", "environment"]
    assert results[0]["sum_sq"] == results[1]["sum_sq"]
    for r in results:  # the job-wide host helpers
        assert r["fetched"] == x.tolist()
        assert (
            r["fetched_keys"]
            == jax.random.key_data(jax.random.split(jax.random.key(0), 8)).tolist()
        )
        exact = [1.0 + 2.0**-40, 1.0 + 2.0**-39]  # each process's float64, bit for bit
        assert r["from_main"] == {"ids": [0, 0, 0], "flag": [False], "exact": exact[0]}
        assert r["gathered"] == {
            "ids": [[0] * 3, [1] * 3],
            "flag": [[False], [True]],
            "exact": exact,
        }
        assert r["any_on_1"] is True and r["any_none"] is False
        assert r["none_error"].startswith("place_global: 'v' has no sharding (None)")
    # log_main: only process 0 logs
    assert "main says hello" in outputs[0][1] and "main says hello" not in outputs[1][1]
