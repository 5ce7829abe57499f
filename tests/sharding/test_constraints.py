"""`shard` without a mesh and its errors (the 8-device behaviour: `test_multidevice.py`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, AxisType

from sharding import shard
from sharding.constraints import out_sharding


def test_without_a_mesh_the_array_is_returned_unchanged():
    x = jnp.arange(6.0).reshape(2, 3)
    assert shard(x, ("batch", "embed")) is x
    assert jax.jit(lambda a: shard(a, ("batch", "embed")))(x).tolist() == x.tolist()


def test_errors_name_the_problem():
    mesh = AbstractMesh((1, 1, 1), ("data", "fsdp", "tensor"), axis_types=(AxisType.Explicit,) * 3)
    with pytest.raises(ValueError, match="2 names"):
        shard(jnp.ones(3), ("batch", "embed"), mesh=mesh)
    with pytest.raises(ValueError, match="no rule for logical axis 'btach'"):
        shard(jnp.ones(3), ("btach",), mesh=mesh)
    # the same mistakes without a mesh: caught on one device, not first on a pod
    with pytest.raises(ValueError, match="2 names"):
        shard(jnp.ones(3), ("batch", "embed"))
    with pytest.raises(ValueError, match="no rule for logical axis 'btach'"):
        jax.jit(lambda a: shard(a, ("btach",)))(jnp.ones(3))
    with pytest.raises(ValueError, match="3 names"):
        out_sharding(("batch", "length", "embed"), shape=(4, 3))
    mixed = AbstractMesh(
        (1, 1, 1),
        ("data", "fsdp", "tensor"),
        axis_types=(AxisType.Explicit, AxisType.Auto, AxisType.Explicit),
    )
    with pytest.raises(ValueError, match="mixes axis types"):
        shard(jnp.ones(3), ("batch",), mesh=mixed)
