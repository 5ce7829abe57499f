"""`Decoder.shared_prompt_hidden_states`: each group's prompt run once, the same hidden states.

Rows come in groups of `G` with the same left-padded prompt and different completions (some
padded after a stop). The shared forward must give `hidden_states`' values and gradients (to
float32 rounding) for dense, sliding-window + soft-capped (Gemma 2) and biased (Qwen2)
models, on a one-device mesh too, and refuse malformed groups.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import Decoder, ModelConfig, positions_from_mask
from sharding import MeshConfig, make_mesh

BASE = dict(
    vocab_size=23, hidden_size=16, intermediate_size=24, num_layers=3, num_heads=4, head_dim=4
)
CONFIGS = {
    "qwen3": ModelConfig(family="qwen3", num_kv_heads=2, **BASE),
    "gemma2": ModelConfig(
        family="gemma2",
        num_kv_heads=2,
        sliding_window=3,
        attn_logit_softcap=5.0,
        final_logit_softcap=8.0,
        layer_types=("sliding_attention", "full_attention", "sliding_attention"),
        **BASE,
    ),
    "qwen2": ModelConfig(family="qwen2", num_kv_heads=1, **BASE),  # q/k/v biases
}
P, T = 5, 6


def _batch(B, G, seed=0):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, 23, (B, P))
    prompt_mask = np.ones((B, P), np.int32)
    for b in range(B):
        prompt_mask[b, : b % P] = 0  # left padding, a different amount per prompt
    tokens = np.concatenate([np.repeat(prompts, G, 0), rng.integers(1, 23, (B * G, T))], 1)
    completion_mask = np.ones((B * G, T), np.int32)
    for n in range(B * G):
        completion_mask[n, T - n % 3 :] = 0  # some rows stopped early
    mask = np.concatenate([np.repeat(prompt_mask, G, 0), completion_mask], 1)
    tokens = jnp.asarray(np.where(mask > 0, tokens, 0))
    mask = jnp.asarray(mask)
    return tokens, positions_from_mask(mask), mask


def _model(name, seed=0):
    model = Decoder(CONFIGS[name], rngs=nnx.Rngs(seed))
    # weights large enough that attention is far from uniform
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(lambda x: x * 4.0, state))


@pytest.mark.parametrize(("name", "B", "G"), [("qwen3", 2, 4), ("gemma2", 3, 2), ("qwen2", 3, 2)])
def test_same_hidden_states_and_gradients(name, B, G):
    tokens, positions, mask = _batch(B, G)
    model = _model(name)
    graphdef, params = nnx.split(model)
    weights = jax.random.normal(jax.random.key(1), (B * G, P + T, CONFIGS[name].hidden_size))

    def loss(params, shared):
        m = nnx.merge(graphdef, params)
        if shared:
            h = m.shared_prompt_hidden_states(
                tokens, positions, attention_mask=mask, prompt_length=P, group_size=G
            )
        else:
            h = m.hidden_states(tokens, positions, attention_mask=mask)
        real = mask[..., None] > 0  # padding queries are finite but meaningless
        return jnp.sum(jnp.where(real, h * weights, 0.0)), h

    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (value, full), grads = value_and_grad(params, False)
    (value_s, shared), grads_s = value_and_grad(params, True)
    real = np.asarray(mask) > 0
    # the weights ×4 make attention sharp, which amplifies float32 rounding: two orders of the
    # same sums (8 more pad columns, or one row at a time) differ by up to 1.6e-4 on an AMD
    # EPYC host (|h| <= 11); a wrong mask or grouping differs by O(1)
    np.testing.assert_allclose(
        np.asarray(shared)[real], np.asarray(full)[real], rtol=1e-4, atol=5e-4
    )
    np.testing.assert_allclose(float(value_s), float(value), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads_s), jax.tree.leaves(grads), strict=True):
        scale = float(jnp.max(jnp.abs(b))) + 1e-6
        np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=2e-4)
    assert float(jnp.max(jnp.abs(full))) > 0.1  # the check compares something


def test_the_prompt_rows_share_their_states_and_differ_from_a_wrong_grouping():
    B, G = 2, 3
    tokens, positions, mask = _batch(B, G)
    model = _model("qwen3")
    shared = model.shared_prompt_hidden_states(
        tokens, positions, attention_mask=mask, prompt_length=P, group_size=G
    )
    np.testing.assert_array_equal(shared[0, :P], shared[G - 1, :P])  # one prompt, repeated
    # rows regrouped so that a group mixes two prompts: the shared forward then uses the
    # group's first prompt for every row, which the plain forward does not
    order = jnp.array([0, 3, 1, 4, 2, 5])
    wrong = model.shared_prompt_hidden_states(
        tokens[order], positions[order], attention_mask=mask[order], prompt_length=P, group_size=G
    )
    full = model.hidden_states(tokens[order], positions[order], attention_mask=mask[order])
    assert float(jnp.max(jnp.abs(wrong[:, P:] - full[:, P:]))) > 1e-2


def test_one_device_mesh_and_group_of_one():
    tokens, positions, mask = _batch(2, 2)
    model = _model("qwen3")
    full = model.hidden_states(tokens, positions, attention_mask=mask)
    mesh = make_mesh(MeshConfig(axis_types="explicit"), devices=jax.devices()[:1])

    @jax.jit
    def shared(tokens, positions, mask):
        return model.shared_prompt_hidden_states(
            tokens, positions, attention_mask=mask, prompt_length=P, group_size=2
        )

    with jax.set_mesh(mesh):
        on_mesh = shared(tokens, positions, mask)
    real = np.asarray(mask) > 0
    np.testing.assert_allclose(
        np.asarray(on_mesh)[real], np.asarray(full)[real], rtol=2e-5, atol=2e-5
    )
    alone = model.shared_prompt_hidden_states(
        tokens, positions, attention_mask=mask, prompt_length=P, group_size=1
    )
    np.testing.assert_array_equal(alone, full)  # G = 1 is `hidden_states`


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(prompt_length=P, group_size=3), "do not split into groups of `group_size` = 3"),
        (dict(prompt_length=P + T, group_size=2), "`prompt_length` must be < the 11 tokens"),
        (dict(prompt_length=0, group_size=2), "`prompt_length` must be an int >= 1, got 0"),
        (dict(prompt_length=P, group_size=True), "`group_size` must be an int >= 1, got True"),
    ],
)
def test_malformed_groups_are_refused(kwargs, message):
    tokens, positions, mask = _batch(2, 2)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        _model("qwen3").shared_prompt_hidden_states(
            tokens, positions, attention_mask=mask, **kwargs
        )
