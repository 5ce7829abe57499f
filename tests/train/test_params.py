"""split_models: trainable / frozen selection by path regexes, errors, the shared reference."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.train import param_path, reference_params, split_models
from tests.train.helpers import tiny_critic, tiny_policy


def _names(tree) -> set[str]:
    return {param_path(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)}


def test_everything_trains_by_default_and_merge_restores_the_model():
    policy = tiny_policy()
    _, full = nnx.split(policy)
    graphs, params, frozen = split_models(policy)
    assert not jax.tree.leaves(frozen["policy"])
    assert _names(params["policy"]) == _names(full)
    merged = nnx.merge(graphs.policy, params["policy"], frozen["policy"])
    assert isinstance(merged, type(policy))


def test_trainable_and_frozen_patterns_partition_the_parameters():
    graphs, params, frozen = split_models(
        tiny_policy(),
        tiny_critic("head"),
        trainable=(r"policy\.layers\.attn\.", r"^value\."),
        frozen=(r"_norm",),
    )
    trained = _names(params["policy"])
    fixed = _names(frozen["policy"])
    assert trained == {"layers.attn.q", "layers.attn.k", "layers.attn.v", "layers.attn.o"}
    assert {"embed", "lm_head", "layers.attn.q_norm.scale", "layers.mlp.up"} <= fixed
    assert not trained & fixed
    assert _names(params["value"]) == {"kernel"}
    merged = nnx.merge(graphs.policy, params["policy"], frozen["policy"])
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(merged)))
    n_split = sum(x.size for x in jax.tree.leaves((params["policy"], frozen["policy"])))
    assert n_params == n_split


def test_reference_params_copy_the_trainable_subset_only():
    _, params, _ = split_models(tiny_policy(), trainable=(r"final_norm",))
    ref = reference_params(params)
    assert _names(ref) == {"final_norm.scale"}
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(params["policy"]), strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.unsafe_buffer_pointer() != b.unsafe_buffer_pointer()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trainable": ("attention",)}, "match no parameter path"),
        ({"frozen": (r"policy\.",)}, "no trainable parameters left"),
        ({"trainable": ("[",)}, "is not a regex"),
    ],
)
def test_bad_patterns_raise(kwargs, message):
    with pytest.raises(ValueError, match=None) as info:
        split_models(tiny_policy(), **kwargs)
    assert message in str(info.value)
