"""`logical_to_spec`: rule order, free mesh axes, divisibility, and errors that name the axis."""

from __future__ import annotations

import pytest
from jax.sharding import AbstractMesh

from sharding import ACTIVATION_AXIS_RULES, LOGICAL_AXIS_RULES, logical_to_spec

MESH = AbstractMesh((2, 4, 2), ("data", "fsdp", "tensor"))


def test_parameter_and_activation_tables():
    assert tuple(logical_to_spec(("layers", "embed", "mlp"), LOGICAL_AXIS_RULES, MESH)) == (
        None,
        "fsdp",
        "tensor",
    )
    names = ("batch", "length", "embed")
    assert tuple(logical_to_spec(names, ACTIVATION_AXIS_RULES, MESH)) == (
        ("data", "fsdp"),
        None,
        None,
    )


def test_a_mesh_axis_is_used_once_and_must_divide_the_dimension():
    # two dimensions asking for `tensor`: the second one is replicated
    assert tuple(logical_to_spec(("heads", "mlp"), LOGICAL_AXIS_RULES, MESH)) == ("tensor", None)
    # 131 vocabulary rows do not split over tensor=2; 1 KV head does not either
    spec = logical_to_spec(("vocab", "embed"), LOGICAL_AXIS_RULES, MESH, shape=(131, 40))
    assert tuple(spec) == (None, "fsdp")
    spec = logical_to_spec(("kv_heads",), LOGICAL_AXIS_RULES, MESH, shape=(1,))
    assert tuple(spec) == (None,)


def test_later_candidates_are_tried_in_order():
    rules = (("embed", ("fsdp", "tensor")), ("embed", "fsdp"), ("embed", None))
    assert tuple(logical_to_spec(("embed",), rules, MESH, shape=(16,))) == (("fsdp", "tensor"),)
    assert tuple(logical_to_spec(("embed",), rules, MESH, shape=(12,))) == ("fsdp",)
    assert tuple(logical_to_spec(("embed",), rules, MESH, shape=(6,))) == (None,)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="no rule for logical axis 'emb'"):
        logical_to_spec(("emb",), LOGICAL_AXIS_RULES, MESH)
    with pytest.raises(ValueError, match=r"names mesh axes \['model'\]"):
        logical_to_spec(("embed",), (("embed", "model"),), MESH)
    with pytest.raises(ValueError, match=r"rule 'x' -> \('fsdp', 'fsdp'\) names a mesh axis twice"):
        logical_to_spec(("x",), (("x", ("fsdp", "fsdp")),), MESH)
    with pytest.raises(ValueError, match="for an array of rank 1"):
        logical_to_spec(("embed", "mlp"), LOGICAL_AXIS_RULES, MESH, shape=(4,))
