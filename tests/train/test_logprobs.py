"""Chunked completion log-probs / entropies / values of a real tiny model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import losses
from jaxrl_llm.models import positions_from_mask
from jaxrl_llm.train import (
    completion_logprobs,
    make_logprob_fn,
    make_value_fn,
    split_models,
)
from tests.train.helpers import sequences, tiny_critic, tiny_policy

N, P, T = 4, 6, 5


@pytest.fixture(scope="module")
def setup():
    policy = tiny_policy(family="qwen2")
    seqs = sequences(jax.random.key(3), N, P, T)
    graphdef, state = nnx.split(policy)

    @jax.jit
    def full_logits(state, seqs):
        mask = seqs.attention_mask
        return nnx.merge(graphdef, state)(
            seqs.tokens, positions_from_mask(mask), attention_mask=mask
        )

    return policy, seqs, np.asarray(full_logits(state, seqs), np.float64)


def _numpy_logprobs(logits, tokens, cmask, temperature=1.0):
    """lp[n,t] = log_softmax(z[n, P+t−1]/τ)[tokens[n, P+t]], entropy of the same softmax."""
    z = logits[:, P - 1 : P - 1 + T] / temperature
    z = z - z.max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    y = np.asarray(tokens)[:, P:]
    lp = np.take_along_axis(logp_all, y[..., None], -1)[..., 0]
    ent = -(np.exp(logp_all) * logp_all).sum(-1)
    return lp * cmask, ent * cmask


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 3])  # T = 5: 5, 3, 2 chunks (overlapping tails)
def test_chunked_logprobs_equal_the_full_logits_reference(setup, chunk_size):
    policy, seqs, logits = setup
    graphdef, state = nnx.split(policy)

    @jax.jit
    def forward(state, seqs):
        model = nnx.merge(graphdef, state)
        return completion_logprobs(
            model, seqs, temperature=0.7, chunk_size=chunk_size, with_entropy=True
        )

    lp, ent, hidden = forward(state, seqs)
    cm = np.asarray(seqs.completion_mask)
    ref_lp, ref_ent = _numpy_logprobs(logits, seqs.tokens, cm, temperature=0.7)
    np.testing.assert_allclose(lp, ref_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)
    assert hidden.shape == (N, T, policy.config.hidden_size)
    # the losses reference on the full logits: completion_logits + token_logprobs
    full = losses.token_logprobs(
        losses.completion_logits(jnp.asarray(logits, jnp.float32), P, T),
        seqs.tokens[:, P:],
        temperature=0.7,
        mask=seqs.completion_mask,
    )
    np.testing.assert_allclose(lp, full, rtol=1e-5, atol=1e-5)


def test_chunked_gradient_equals_the_unchunked_gradient(setup):
    _, seqs, _ = setup
    graphdef, state = nnx.split(tiny_policy(2, layers=1))  # one layer: half the compile time
    w = jax.random.normal(jax.random.key(0), (N, T))

    def objective(state, chunk):
        model = nnx.merge(graphdef, state)
        lp, ent, _ = completion_logprobs(model, seqs, chunk_size=chunk, with_entropy=True)
        return jnp.sum(lp * w) + 0.3 * jnp.sum(ent * w)

    def full_logits_objective(state):
        model = nnx.merge(graphdef, state)
        mask = seqs.attention_mask
        z = losses.completion_logits(
            model(seqs.tokens, positions_from_mask(mask), attention_mask=mask), P, T
        )
        lp = losses.token_logprobs(z, seqs.tokens[:, P:], mask=seqs.completion_mask)
        ent = losses.entropy_from_logits(z, mask=seqs.completion_mask)
        return jnp.sum(lp * w) + 0.3 * jnp.sum(ent * w)

    g_chunk = jax.jit(jax.grad(objective), static_argnums=1)(state, 2)
    g_full = jax.jit(jax.grad(full_logits_objective))(state)
    for a, b in zip(jax.tree.leaves(g_chunk), jax.tree.leaves(g_full), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_jitted_forward_with_a_shared_frozen_base(setup):
    policy, seqs, logits = setup
    graphs, params, frozen = split_models(policy, trainable=(r"final_norm",))
    fn = make_logprob_fn(graphs.policy, chunk_size=2)
    lp = fn(params["policy"], frozen["policy"], seqs)
    ref_lp, _ = _numpy_logprobs(logits, seqs.tokens, np.asarray(seqs.completion_mask))
    np.testing.assert_allclose(lp, ref_lp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["head", "model"])
def test_value_forward_reads_the_state_before_each_completion_token(kind):
    policy, critic = tiny_policy(), tiny_critic(kind)
    seqs = sequences(jax.random.key(4), N, P, T)
    graphs, params, frozen = split_models(policy, critic)
    values = make_value_fn(graphs)(params, frozen, seqs)
    mask = seqs.attention_mask
    pos = positions_from_mask(mask)
    if kind == "head":
        hidden = nnx.jit(type(policy).hidden_states)(policy, seqs.tokens, pos, attention_mask=mask)
        full = critic(hidden)
    else:
        full = nnx.jit(critic)(seqs.tokens, pos, attention_mask=mask)
    expected = np.asarray(full)[:, P - 1 : P - 1 + T] * np.asarray(seqs.completion_mask)
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-6)
