"""`logical_shardings`, `batch_shardings`, `optimizer_shardings` on abstract meshes (no devices)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sharding import (
    ACTIVATION_AXIS_RULES,
    batch_shardings,
    logical_shardings,
    optimizer_shardings,
    path_str,
)

MESH = AbstractMesh((2, 3, 2), ("data", "fsdp", "tensor"))


def sds(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


PARAMS = {
    "embed": sds(14, 6),  # vocab 14 splits over tensor=2, embed 6 over fsdp=3
    "layers": {"w": sds(5, 6, 4), "norm": sds(5, 6)},
    "head": [sds(6, 7)],  # vocab 7 does not split over tensor=2
}
NAMES = {
    "embed": ("vocab", "embed"),
    "layers": {"w": ("layers", "embed", "mlp"), "norm": ("layers", "norm")},
    "head": [("embed", "vocab")],
}


def specs(tree):
    return jax.tree.map(
        lambda s: tuple(s.spec), tree, is_leaf=lambda x: isinstance(x, NamedSharding)
    )


def test_logical_shardings_follow_the_rules_and_shapes():
    out = logical_shardings(PARAMS, NAMES, MESH)
    assert specs(out) == {
        "embed": ("tensor", "fsdp"),
        "layers": {"w": (None, "fsdp", "tensor"), "norm": (None, None)},
        "head": [("fsdp", None)],
    }
    assert all(s.mesh == MESH for s in jax.tree.leaves(out))


def test_none_names_replicate_a_leaf_and_scalars_take_empty_tuples():
    out = logical_shardings({"a": sds(4, 4), "b": sds()}, {"a": None, "b": ()}, MESH)
    assert out["a"].spec == P() and out["b"].spec == P()


def test_mismatched_trees_and_ranks_are_named():
    with pytest.raises(ValueError, match="first difference: 'embed' vs 'embedding'"):
        logical_shardings({"embed": sds(4, 6)}, {"embedding": ("vocab", "embed")}, MESH)
    with pytest.raises(ValueError, match="1 leaves vs 2 name tuples"):
        logical_shardings({"a": sds(4)}, {"a": ("mlp",), "b": ("mlp",)}, MESH)
    with pytest.raises(ValueError, match=r"leaf 'a' of shape \(4, 6\) needs one logical name"):
        logical_shardings({"a": sds(4, 6)}, {"a": ("mlp",)}, MESH)
    with pytest.raises(
        ValueError, match="leaf 'a': logical_to_spec: no rule for logical axis 'mpl'"
    ):
        logical_shardings({"a": sds(4)}, {"a": ("mpl",)}, MESH)
    with pytest.raises(ValueError, match=r"expected an array or jax\.ShapeDtypeStruct"):
        logical_shardings({"a": 3.0}, {"a": ()}, MESH)


def test_must_split_turns_a_fallback_into_an_error():
    names = {"kv": ("layers", "batch", "kv_heads")}
    rules = ACTIVATION_AXIS_RULES
    out = logical_shardings({"kv": sds(5, 12, 2)}, names, MESH, rules=rules, must_split=("batch",))
    assert tuple(out["kv"].spec) == (None, ("data", "fsdp"), "tensor")
    # without must_split, 8 rows fall back to replication; with it they are an error
    out = logical_shardings({"kv": sds(5, 8, 2)}, names, MESH, rules=rules)
    assert tuple(out["kv"].spec) == (None, None, "tensor")
    with pytest.raises(ValueError, match=r"axis 1 \('batch'\) has size 8.*\(6 ways\)"):
        logical_shardings({"kv": sds(5, 8, 2)}, names, MESH, rules=rules, must_split=("batch",))


def test_must_split_refuses_rules_that_give_its_axes_to_another_dimension():
    """Custom rules that send an earlier axis to a mesh axis of the batch's: the rows fell back
    to replication silently although they divide."""
    rules = (("kv_heads", "data"), *ACTIVATION_AXIS_RULES)
    names = {"kv": ("layers", "kv_heads", "batch")}
    out = logical_shardings({"kv": sds(5, 2, 12)}, names, MESH, rules=rules)
    assert tuple(out["kv"].spec) == (None, "data", None)  # the fallback, without must_split
    with pytest.raises(ValueError, match=r"axis 2 \('batch'\) must be split over the mesh axes"):
        logical_shardings({"kv": sds(5, 2, 12)}, names, MESH, rules=rules, must_split=("batch",))


def test_batch_shardings_split_rows_and_reject_uneven_batches():
    batch = {"tokens": sds(12, 5, dtype=jnp.int32), "reward": sds(12), "count": sds()}
    assert specs(batch_shardings(batch, MESH)) == {
        "tokens": (("data", "fsdp"), None),
        "reward": (("data", "fsdp"),),
        "count": (),
    }
    with pytest.raises(ValueError, match=r"leaf 'mask' has 9 rows.*product 6"):
        batch_shardings({"mask": sds(9, 4)}, MESH)


class _Moments(NamedTuple):
    count: jax.Array
    mu: dict
    nu: dict


def _param_shardings():
    return logical_shardings(PARAMS, NAMES, MESH)


def test_optimizer_state_leaves_inherit_their_parameters_sharding():
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), PARAMS)
    shardings = _param_shardings()
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    state = jax.eval_shape(tx.init, params)
    out = optimizer_shardings(state, params, shardings, MESH)
    adam = out[1][0]  # ScaleByAdamState inside the chain
    assert specs(adam.mu) == specs(shardings) and specs(adam.nu) == specs(shardings)
    assert adam.count.spec == P()
    scalars = [
        s
        for s, leaf in zip(jax.tree.leaves(out), jax.tree.leaves(state), strict=True)
        if leaf.shape == ()
    ]
    assert scalars and all(s.spec == P() for s in scalars)


def test_multisteps_accumulators_and_custom_namedtuples_match_by_path():
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), PARAMS)
    shardings = _param_shardings()
    state = jax.eval_shape(optax.MultiSteps(optax.adam(1e-3), every_k_schedule=2).init, params)
    out = optimizer_shardings(state, params, shardings, MESH)
    assert specs(out.acc_grads) == specs(shardings)
    assert out.mini_step.spec == P()
    custom = _Moments(jnp.zeros((), jnp.int32), params, params)
    out = optimizer_shardings(custom, params, shardings, MESH)
    assert specs(out.mu) == specs(shardings) and out.count.spec == P()


def test_longest_path_wins_and_other_shapes_are_replicated():
    params = {"q": jnp.zeros((4, 6)), "attn": {"q": jnp.zeros((6, 4))}}
    shardings = {
        "q": NamedSharding(MESH, P("data", "fsdp")),
        "attn": {"q": NamedSharding(MESH, P("fsdp", "tensor"))},
    }
    state = {
        "mu": {"attn": {"q": jnp.zeros((6, 4))}, "q": jnp.zeros((4, 6))},
        "v_row": {"q": jnp.zeros((4,))},
    }
    out = optimizer_shardings(state, params, shardings, MESH)
    assert out["mu"]["attn"]["q"].spec == P("fsdp", "tensor")
    assert out["mu"]["q"].spec == P("data", "fsdp")
    assert out["v_row"]["q"].spec == P()  # a factored statistic: another shape, replicated
    # Adafactor's factored second moments are replicated, its unfactored ones mirror the weight
    adafactor = jax.eval_shape(optax.adafactor(1e-3).init, params)
    out = optimizer_shardings(adafactor, params, shardings, MESH)
    shapes = [leaf.shape for leaf in jax.tree.leaves(adafactor)]
    for shape, sharding in zip(shapes, jax.tree.leaves(out), strict=True):
        if shape not in ((4, 6), (6, 4)):
            assert sharding.spec == P(), shape


def test_mismatched_parameter_shardings_are_rejected():
    params = {"a": jnp.zeros((4,))}
    with pytest.raises(ValueError, match="must mirror `params`"):
        optimizer_shardings(
            {}, params, {"a": NamedSharding(MESH, P()), "b": NamedSharding(MESH, P())}, MESH
        )


def test_path_str():
    tree = {"a": [jnp.zeros(1), {"b": jnp.zeros(1)}]}
    assert [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]] == [
        "a.0",
        "a.1.b",
    ]
