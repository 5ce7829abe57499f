"""Sharding edge cases that mutation testing found unpinned (2026-12-08): bool sizes, the
activation and parameter tables, optimizer-state matching, replication reports, Manual axes in
shard_map, and the multi-process start-up rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

import sharding.distributed as dist
from sharding import (
    ACTIVATION_AXIS_RULES,
    MeshConfig,
    check_replication,
    initialize_distributed,
    logical_to_spec,
    optimizer_shardings,
    path_str,
)

MESH = AbstractMesh((2, 4, 2), ("data", "fsdp", "tensor"))
CMESH = AbstractMesh((3, 4, 2), ("data", "fsdp", "tensor"))


def sds(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


# (mesh)
def test_bool_sizes_are_refused():
    with pytest.raises(ValueError, match="`fsdp` must be a positive int or -1"):
        MeshConfig(fsdp=True)


# (rules)
def test_activation_table_keeps_the_width_whole_and_splits_heads_mlp_vocab_over_tensor():
    # without a batch axis to take fsdp first, `embed` still stays whole (activations)
    assert tuple(logical_to_spec(("length", "embed"), ACTIVATION_AXIS_RULES, MESH)) == (None, None)
    for name in ("heads", "kv_heads", "mlp", "vocab"):
        spec = logical_to_spec(("batch", "length", name), ACTIVATION_AXIS_RULES, MESH)
        assert tuple(spec) == (("data", "fsdp"), None, "tensor"), name


# (trees)
def test_path_str_of_the_root():
    assert path_str(()) == "<root>"


def test_a_longest_match_of_another_shape_is_replicated_not_matched_shorter():
    params = {"q": jnp.zeros((6, 4)), "attn": {"q": jnp.zeros((4, 6))}}
    shardings = {
        "q": NamedSharding(MESH, P("data", "fsdp")),
        "attn": {"q": NamedSharding(MESH, P("fsdp", "tensor"))},
    }
    # mu.attn.q has q's shape but sits under attn.q (another shape): replicated
    state = {"mu": {"attn": {"q": jnp.zeros((6, 4))}}}
    out = optimizer_shardings(state, params, shardings, MESH)
    assert out["mu"]["attn"]["q"].spec == P()


# (checks)
def test_a_mesh_with_nothing_to_split_still_reports_the_bytes():
    data_only = AbstractMesh((24, 1, 1), ("data", "fsdp", "tensor"))
    params = {"a": sds(8, 8), "b": sds(16, dtype=jnp.bfloat16)}
    report = check_replication(params, {k: NamedSharding(data_only, P()) for k in params})
    assert report.total_bytes == 8 * 8 * 4 + 16 * 2


def test_zero_size_parameters_count_nothing():
    split = NamedSharding(CMESH, P("fsdp", "tensor"))
    report = check_replication({"empty": sds(0, 8), "w": sds(8, 8)}, {"empty": split, "w": split})
    assert report.fraction == 0.0 and report.total_bytes == 8 * 8 * 4
    only_empty = check_replication({"empty": sds(0, 8)}, {"empty": NamedSharding(CMESH, P())})
    assert only_empty.fraction == 0.0 and only_empty.total_bytes == 0


def test_worst_lists_human_sizes():
    params = {"big": sds(1024, 1024)}  # 4 MiB replicated on W = 8: 3.5 MiB wasted per device
    report = check_replication(
        params, {"big": NamedSharding(CMESH, P())}, max_replicated_fraction=1.0
    )
    assert report.worst == (
        "big (1024, 1024) float32 spec=(): 3.5 MiB/device over perfect sharding",
    )


def test_any_fraction_above_the_tolerance_fails():
    params = {"w": sds(1000, 8), "bias": sds(8)}  # 32 of 32032 bytes replicated: 0.1%
    shardings = {"w": NamedSharding(CMESH, P("fsdp", "tensor")), "bias": NamedSharding(CMESH, P())}
    assert 0 < check_replication(params, shardings).fraction < 0.002
    with pytest.raises(ValueError, match=r"tolerance 0\.0%"):
        check_replication(params, shardings, max_replicated_fraction=0.0)


def test_excess_bytes_are_rounded():
    # one float32 (4 bytes) replicated over W = 8: 3.5 bytes over perfect sharding
    report = check_replication(
        {"s": sds(1)}, {"s": NamedSharding(CMESH, P())}, max_replicated_fraction=1.0
    )
    assert report.excess_bytes_per_device == 4


# (distributed)
@pytest.fixture
def no_cluster(monkeypatch):
    monkeypatch.setattr(dist, "_cluster_environment", lambda: None)
    monkeypatch.setattr(dist, "_STARTED", None)


def test_a_bool_is_not_a_process_count(no_cluster):
    with pytest.raises(ValueError, match="num_processes must be an integer, got True"):
        initialize_distributed("h:1", True, 0, environ={})


def test_an_initialized_runtime_refuses_another_layout(no_cluster, monkeypatch):
    monkeypatch.setattr(dist.jax.distributed, "initialize", lambda **k: None)
    info = initialize_distributed("h:1", 2, 1, environ={})
    monkeypatch.setattr(dist.jax.distributed, "is_initialized", lambda: True)
    assert initialize_distributed(environ={}) == info
    with pytest.raises(ValueError, match="already initialized as process 1 of 2, asked for 1 of 4"):
        initialize_distributed("h:1", 4, 1, environ={})
    with pytest.raises(ValueError, match="already initialized as process 1 of 2, asked for 0 of 2"):
        initialize_distributed("h:1", 2, 0, environ={})


def test_a_launcher_whose_start_fails_is_an_error(monkeypatch):
    monkeypatch.setattr(dist, "_STARTED", None)
    monkeypatch.setattr(dist, "_cluster_environment", lambda: "SlurmCluster")
    monkeypatch.setattr(dist, "_cluster_process_count", lambda cluster: 4)

    def broken(**kwargs):
        raise ValueError("launcher says no")

    monkeypatch.setattr(dist.jax.distributed, "initialize", broken)
    with pytest.raises(ValueError, match="launcher says no"):
        initialize_distributed(environ={})


def test_empty_environment_settings_are_unset(no_cluster):
    env = {dist.ENV_COORDINATOR: "", dist.ENV_NUM_PROCESSES: "", dist.ENV_PROCESS_ID: ""}
    assert initialize_distributed(environ=env) == dist.ProcessInfo(0, 1, None, "single")
    assert initialize_distributed(environ={dist.ENV_COORDINATOR: ""}).source == "single"


class _Device:
    def __init__(self, process_index):
        self.process_index = process_index


class _Sharding:
    """A stand-in for a NamedSharding: rows of each device."""

    def __init__(self, rows_by_device):
        self.rows = rows_by_device

    def devices_indices_map(self, shape):
        return {d: (slice(a, b),) for d, (a, b) in self.rows.items()}


def test_process_rows_must_be_contiguous():
    contiguous = _Sharding({_Device(0): (0, 2), _Device(0): (2, 4), _Device(1): (4, 8)})
    assert dist._process_rows(contiguous, 8, 0) == (0, 4, 2)
    assert dist._process_rows(contiguous, 8, 1) == (4, 8, 1)
    assert dist._process_rows(contiguous, 8, 2) is None
    gap = _Sharding(
        {_Device(0): (0, 2), _Device(1): (2, 4), _Device(0): (4, 6), _Device(1): (6, 8)}
    )
    with pytest.raises(ValueError, match=r"process 0's rows .* are not contiguous"):
        dist._process_rows(gap, 8, 0)


def test_an_empty_device_list_also_warns(no_cluster):
    with pytest.warns(UserWarning, match=r"local_device_ids=\[\] has no effect"):
        initialize_distributed(local_device_ids=[], environ={})


def test_opt_in_launchers_are_not_detected(monkeypatch):
    from jax._src.clusters import ClusterEnv

    class OptIn:
        opt_in_only_method = True

        @staticmethod
        def is_env_present():
            return True

    monkeypatch.setattr(ClusterEnv, "_cluster_types", [OptIn])
    assert dist._cluster_environment() is None


def test_parameter_table_splits_a_batch_axis_data_first():
    from sharding import LOGICAL_AXIS_RULES

    assert tuple(logical_to_spec(("batch",), LOGICAL_AXIS_RULES, MESH)) == (("data", "fsdp"),)


def test_the_error_lists_five_tensors_by_default():
    params = {f"p{i}": sds(10 + i) for i in range(7)}
    with pytest.raises(ValueError) as err:
        check_replication(params, {k: NamedSharding(CMESH, P()) for k in params})
    listed = [line for line in str(err.value).splitlines() if line.startswith("  p")]
    assert [line.split()[0] for line in listed] == ["p6", "p5", "p4", "p3", "p2"]


# (constraints)
def test_manual_axes_are_dropped_inside_shard_map_on_one_device():
    from sharding import make_mesh, shard
    from sharding.constraints import out_sharding

    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    x = jnp.arange(8.0).reshape(4, 2)
    seen = {}

    def over_data(a):  # `data` manual: the batch is constrained over `fsdp` only
        seen["data"] = out_sharding(("batch", "embed"), shape=a.shape)
        return shard(a + 1.0, ("batch", "embed"))

    def everything_manual(a):  # nothing left to constrain
        seen["all"] = out_sharding(("batch", "embed"), shape=a.shape)
        return shard(a * 2.0, ("batch", "embed"))

    with jax.set_mesh(mesh):
        one = jax.jit(
            jax.shard_map(over_data, in_specs=P("data"), out_specs=P("data"), axis_names={"data"})
        )(x)
        two = jax.jit(jax.shard_map(everything_manual, in_specs=P(), out_specs=P()))(x)
    assert seen["data"] == P("fsdp", None) and seen["all"] is None
    np.testing.assert_array_equal(np.asarray(one), np.asarray(x) + 1)
    np.testing.assert_array_equal(np.asarray(two), 2 * np.asarray(x))


def test_numpy_integers_are_process_counts(no_cluster, monkeypatch):
    monkeypatch.setattr(dist.jax.distributed, "initialize", lambda **k: None)
    info = initialize_distributed("h:1", np.int64(2), np.int32(1), environ={})
    assert (info.num_processes, info.process_id) == (2, 1) and type(info.num_processes) is int
