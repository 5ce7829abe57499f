"""`Decoder.prompt_indexed_hidden_states`: prompts once, completion rows that each read one of
them, the same states as the padded rows.

The rows come from `jaxrl_llm.train.pack_groups` (several completions of a group per row,
completions of different lengths, some empty): every completion state must equal the padded
forward's, with its gradients, for dense, sliding-window + soft-capped (Gemma 2: the window
counts positions, which continue the prompt in every completion) and biased (Qwen2) models;
and the fallback for a mesh of several devices (each row runs its prompt itself) too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxrl_llm.models.decoder as decoder_module
from jaxrl_llm.train import SequenceBatch, completion_hidden, pack_groups, packed_completion_hidden
from tests.models.test_shared_prompt import CONFIGS, P, T, _batch, _model


def _packed_rows(B, G, width):
    tokens, positions, mask = _batch(B, G)
    batch = SequenceBatch(tokens, mask, mask[:, P:].astype(jnp.float32))
    packed = jax.tree.map(jnp.asarray, pack_groups(jax.tree.map(np.asarray, batch), G, width=width))
    return (tokens, positions, mask), packed


def _arguments(packed) -> list:
    """`prompt_indexed_hidden_states`' arguments for the whole batch's packing."""
    names = ("prompt_tokens", "prompt_positions", "prompt_mask", "tokens", "positions", "roles")
    return [getattr(packed, n) for n in names] + [packed.batch_prompt_row]


@pytest.mark.parametrize(("name", "B", "G"), [("qwen3", 2, 4), ("gemma2", 3, 2), ("qwen2", 3, 2)])
def test_same_states_and_gradients_as_the_padded_rows(name, B, G):
    """The states that predict each completion token (`packed_completion_hidden`: token 0 from
    the prompt's last state, later ones from the completion rows) against the padded rows'."""
    (tokens, _, mask), packed = _packed_rows(B, G, width=2 * T)
    assert packed.tokens.shape[0] < B * G  # completions share rows
    batch = SequenceBatch(tokens, mask, mask[:, P:].astype(jnp.float32))
    model = _model(name)
    graphdef, params = nnx.split(model)
    keep = jnp.asarray(mask[:, P:] > 0)
    weights = jax.random.normal(jax.random.key(1), (B * G, T, CONFIGS[name].hidden_size))

    def loss(params, packed_form):
        m = nnx.merge(graphdef, params)
        h = packed_completion_hidden(m, packed) if packed_form else completion_hidden(m, batch)
        return jnp.sum(jnp.where(keep[..., None], h * weights, 0.0)), h

    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (value, padded), grads = value_and_grad(params, False)
    (value_p, packed_h), grads_p = value_and_grad(params, True)
    k = np.asarray(keep)
    # float32 rounding of sharp attention (tests/models/test_shared_prompt.py): up to 1.6e-4
    np.testing.assert_allclose(np.asarray(packed_h)[k], np.asarray(padded)[k], atol=5e-4)
    np.testing.assert_allclose(float(value_p), float(value), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads_p), jax.tree.leaves(grads), strict=True):
        scale = float(jnp.max(jnp.abs(b))) + 1e-6
        np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=2e-4)
    assert float(jnp.max(jnp.abs(padded))) > 0.1  # the check compares something


def test_prompt_states_and_the_mesh_fallback(monkeypatch):
    (tokens, positions, mask), packed = _packed_rows(3, 2, width=2 * T)
    model = _model("gemma2")
    args = _arguments(packed)
    x_p, x_c = model.prompt_indexed_hidden_states(*args)
    padded = model.hidden_states(tokens, positions, attention_mask=mask)
    prompt_real = np.asarray(packed.prompt_mask) > 0
    np.testing.assert_allclose(  # each prompt once: the padded rows' prompt part
        np.asarray(x_p)[prompt_real], np.asarray(padded[::2, :P])[prompt_real], atol=2e-5
    )
    monkeypatch.setattr(decoder_module, "plain_layout", lambda: False)
    f_p, f_c = model.prompt_indexed_hidden_states(*args)
    slots = np.asarray(packed.roles) > 0
    np.testing.assert_allclose(np.asarray(f_c)[slots], np.asarray(x_c)[slots], atol=2e-5)
    np.testing.assert_allclose(
        np.asarray(f_p)[prompt_real], np.asarray(x_p)[prompt_real], atol=2e-5
    )


def test_malformed_inputs_are_refused():
    (_, _, _), packed = _packed_rows(2, 2, width=T)
    model = _model("qwen3")
    args = _arguments(packed)
    with pytest.raises(ValueError, match=r"`prompt_index` must be \[R\]"):
        model.prompt_indexed_hidden_states(*args[:-1], packed.batch_prompt_row[:-1])
    with pytest.raises(ValueError, match="`prompt_mask` must have the prompt tokens' shape"):
        model.prompt_indexed_hidden_states(*args[:2], packed.prompt_mask[:, 1:], *args[3:])
