"""`check_replication`: the replicated fraction against a hand-written reference, and its errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sharding import check_replication

MESH = AbstractMesh((3, 4, 2), ("data", "fsdp", "tensor"))  # W = fsdp·tensor = 8


def sds(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def reference_fraction(sizes_bytes, shards, W):
    """Σ b·max(0, 1/s − 1/W) / Σ b·(1 − 1/W) in float64, written from the definition."""
    b = np.asarray(sizes_bytes, np.float64)
    s = np.asarray(shards, np.float64)
    return float(np.sum(b * np.maximum(0.0, 1 / s - 1 / W)) / (np.sum(b) * (1 - 1 / W)))


def test_fraction_matches_the_definition():
    params = {
        "embed": sds(64, 16),  # split 8 ways: no excess
        "mlp": sds(16, 32, dtype=jnp.bfloat16),  # fsdp only: 4 shards
        "bias": sds(30),  # replicated
        "data_split": sds(6, 8),  # data × fsdp = 12 shards (more than W: clamps to 0)
    }
    shardings = {
        "embed": NamedSharding(MESH, P("fsdp", "tensor")),
        "mlp": NamedSharding(MESH, P("fsdp")),
        "bias": NamedSharding(MESH, P()),
        "data_split": NamedSharding(MESH, P("data", "fsdp")),
    }
    report = check_replication(params, shardings, max_replicated_fraction=1.0)
    sizes = [64 * 16 * 4, 16 * 32 * 2, 30 * 4, 6 * 8 * 4]
    expected = reference_fraction(sizes, [8, 4, 1, 12], 8)
    np.testing.assert_allclose(report.fraction, expected, rtol=1e-12)
    assert report.total_bytes == sum(sizes)
    excess = 16 * 32 * 2 * (1 / 4 - 1 / 8) + 30 * 4 * (1 - 1 / 8)
    assert report.excess_bytes_per_device == round(excess)
    assert report.worst[0].startswith("mlp (16, 32) bfloat16 spec=('fsdp',)")
    assert report.worst[1].startswith("bias (30,) float32 spec=()")
    assert len(report.worst) == 2


def test_extremes_and_a_mesh_with_nothing_to_split():
    params = {"a": sds(8, 8), "b": sds(16)}
    everything = {k: NamedSharding(MESH, P()) for k in params}
    assert check_replication(params, everything, max_replicated_fraction=1.0).fraction == 1.0
    split = {
        "a": NamedSharding(MESH, P("fsdp", "tensor")),
        "b": NamedSharding(MESH, P(("fsdp", "tensor"))),
    }
    assert check_replication(params, split).fraction == 0.0
    data_only = AbstractMesh((24, 1, 1), ("data", "fsdp", "tensor"))
    report = check_replication(params, {k: NamedSharding(data_only, P()) for k in params})
    assert report.fraction == 0.0  # W = 1: replication is the only option


def test_failure_lists_the_biggest_replicated_tensors_in_order():
    params = {"small": sds(10), "big": sds(100, 10), "mid": sds(50, 10), "ok": sds(800, 8)}
    shardings = {k: NamedSharding(MESH, P()) for k in ("small", "big", "mid")}
    shardings["ok"] = NamedSharding(MESH, P("fsdp", "tensor"))
    with pytest.raises(
        ValueError,
        match=r"(?s)fsdp×tensor = 8 devices.*tolerance 2\.0%.*\n  big .*\n  mid .*\n  small ",
    ) as err:
        check_replication(params, shardings)
    assert "ok (800, 8)" not in str(err.value)
    with pytest.raises(ValueError) as err:
        check_replication(params, shardings, top=1)
    assert "big" in str(err.value) and "mid" not in str(err.value)


def test_shardings_default_to_the_leaves_own():
    a = jax.ShapeDtypeStruct((64, 8), jnp.float32, sharding=NamedSharding(MESH, P()))
    with pytest.raises(ValueError, match=r"100\.0% of the parameter bytes"):
        check_replication({"a": a})


def test_bad_inputs_are_named():
    params = {"a": sds(4)}
    with pytest.raises(ValueError, match=r"max_replicated_fraction must be in \[0, 1\]"):
        check_replication(params, {"a": NamedSharding(MESH, P())}, max_replicated_fraction=2.0)
    with pytest.raises(ValueError, match="parameter 'a' has sharding None"):
        check_replication(params)
    with pytest.raises(ValueError, match=r"axes \['model'\] are not in the mesh"):
        check_replication(params, {"a": NamedSharding(MESH, P())}, axes=("model",))
    with pytest.raises(ValueError, match="must mirror `params`"):
        check_replication(params, {"b": NamedSharding(MESH, P())})
