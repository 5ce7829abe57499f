"""`jaxrl_llm.parallel`: logical axes of NNX states, parameter and KV-cache shardings (abstract)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from jaxrl_llm.models import (
    CACHE_KEY_AXES,
    CACHE_VALUE_AXES,
    Decoder,
    KVCache,
    ModelConfig,
    ValueModel,
)
from jaxrl_llm.parallel import cache_shardings, logical_axes, param_shardings
from sharding import LOGICAL_AXIS_RULES, logical_to_spec

MESH = AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"))
CFG = ModelConfig(
    family="qwen3",
    vocab_size=23,
    hidden_size=8,
    intermediate_size=12,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=4,
)


def abstract_state(cls=Decoder):
    return nnx.state(nnx.eval_shape(lambda: cls(CFG, rngs=nnx.Rngs(0))))


@pytest.mark.parametrize("cls", [Decoder, ValueModel])
def test_every_parameter_gets_the_spec_of_its_metadata(cls):
    state = abstract_state(cls)
    shardings = dict(nnx.to_flat_state(param_shardings(state, MESH)))
    names = dict(nnx.to_flat_state(logical_axes(state)))
    flat = list(nnx.to_flat_state(state))
    assert len(flat) == len(shardings) > 10
    for key, var in flat:
        expected_names = var.get_metadata()["out_sharding"]
        assert names[key].get_value() == tuple(expected_names)
        spec = logical_to_spec(
            expected_names, LOGICAL_AXIS_RULES, MESH, shape=var.get_value().shape
        )
        assert shardings[key].get_value().spec == spec, key
        assert type(shardings[key]) is type(var)  # the state's structure is kept
    embed = ("embed",) if cls is Decoder else ("backbone", "embed")
    assert shardings[embed].get_value().spec == P(None, "fsdp")  # 23 rows: not over tensor=2


def test_shardings_mirror_the_state_for_jit_and_device_put():
    state = abstract_state()
    shardings = param_shardings(state, MESH)
    assert jax.tree.structure(shardings) == jax.tree.structure(state)


def test_a_parameter_without_names_is_an_error():
    class Bare(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(jnp.zeros((2, 3)))

    with pytest.raises(ValueError, match="parameter 'w' has no logical axis names"):
        param_shardings(nnx.state(Bare()), MESH)


def test_cache_shardings_follow_cache_axes():
    assert CACHE_KEY_AXES == ("layers", "batch", "kv_heads", "cache_seq", "head_dim")
    assert CACHE_VALUE_AXES == ("layers", "batch", "kv_heads", "head_dim", "cache_seq")
    cache = jax.eval_shape(lambda: KVCache.init(CFG, batch=4, max_len=5))
    out = cache_shardings(cache, MESH)
    assert out.k.spec == P(None, ("data", "fsdp"), "tensor", None, None) == out.v.spec
    assert out.positions.spec == P(("data", "fsdp"), None)
    assert out.lengths.spec == P(("data", "fsdp"))
    shared = jax.eval_shape(lambda: KVCache.init(CFG, batch=4, max_len=5, shared_length=True))
    assert cache_shardings(shared, MESH).lengths.spec == P()
    one_head = ModelConfig(**{**CFG.__dict__, "num_kv_heads": 1, "layer_types": ()})
    cache = jax.eval_shape(lambda: KVCache.init(one_head, batch=4, max_len=5))
    assert cache_shardings(cache, MESH).k.spec == P(None, ("data", "fsdp"), None, None, None)


def test_cache_rows_must_split():
    cache = jax.eval_shape(lambda: KVCache.init(CFG, batch=6, max_len=5))
    with pytest.raises(ValueError, match=r"leaf 'k': axis 1 \('batch'\) has size 6.*\(4 ways\)"):
        cache_shardings(cache, MESH)
