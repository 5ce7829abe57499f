"""Query-chunked attention (`layers.chunked_attend`, `Decoder(attention_chunk=...)`).

Blocks of queries attended one after another (and recomputed in the backward pass) must give
the whole attention's outputs and gradients: against a float64 NumPy reference and `attend`
(GQA, soft-capping, fully masked padding queries, `S` not a multiple of the block), through
the decoder's forwards (the shared-prompt forward with Gemma 2's sliding window and its
gradients, a long prefill into the KV cache, the critic's plain forward), and the float32 temporaries of a forward + backward must grow linearly with the
sequence length instead of quadratically. The sharded form runs in
`tests/models/explicit_mesh_runner.py` (its Gemma 3 decoder attends in blocks of 3).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.config import ConfigError, build
from jaxrl_llm.models import Decoder, ModelConfig, ValueModel, from_pretrained, save_pretrained
from jaxrl_llm.models.layers import attend, chunked_attend
from jaxrl_llm.runner.config import ModelSection, RunConfig
from jaxrl_llm.runner.models import build_policy
from jaxrl_llm.train import SFTConfig
from tests.models.test_shared_prompt import BASE, CONFIGS  # qwen3; gemma2 (sliding, soft-caps)

N, H, K, HD = 2, 4, 2, 8


def _inputs(S, seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(N, S, H, HD)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(N, S, K, HD)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(N, S, K, HD)), jnp.float32)
    mask = np.tril(np.ones((S, S), bool))[None].repeat(N, 0)
    mask[1, :, :2] = False  # row 1: two left-padding keys ...
    mask[1, :2, :] = False  # ... whose queries see nothing (attend uniformly, no NaN)
    return q, k, v, jnp.asarray(mask)


def _reference(q, k, v, mask, scale, softcap):
    """float64 grouped-query softmax attention; fully masked queries average all keys."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    k, v = np.repeat(k, H // K, axis=2), np.repeat(v, H // K, axis=2)
    logits = np.einsum("nshd,nthd->nhst", q, k) * scale
    if softcap is not None:
        logits = softcap * np.tanh(logits / softcap)
    logits = np.where(np.asarray(mask)[:, None], logits, -1e30)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("nhst,nthd->nshd", probs, v)


@pytest.mark.parametrize(("S", "chunk", "softcap"), [(7, 3, None), (8, 4, 5.0), (5, 1, None)])
def test_chunked_attend_matches_float64_and_attend(S, chunk, softcap):
    q, k, v, mask = _inputs(S)
    scale = 1 / math.sqrt(HD)
    got = chunked_attend(q, k, v, mask, scale=scale, softcap=softcap, chunk=chunk)
    assert got.shape == (N, S, H, HD) and bool(jnp.isfinite(got).all())
    np.testing.assert_allclose(got, _reference(q, k, v, mask, scale, softcap), atol=2e-6)
    whole = attend(q, k, v, mask, scale=scale, softcap=softcap)
    np.testing.assert_allclose(got, whole, atol=1e-6)
    # a block as large as the sequence is `attend` itself
    same = chunked_attend(q, k, v, mask, scale=scale, softcap=softcap, chunk=S)
    np.testing.assert_array_equal(same, whole)


def test_chunked_attend_gradients_match_attend():
    q, k, v, mask = _inputs(7, seed=1)
    w = jax.random.normal(jax.random.key(0), (N, 7, H, HD))

    def loss(fn, q, k, v):
        return jnp.sum(fn(q, k, v, mask, scale=0.3, softcap=4.0) * w)

    whole = jax.jit(jax.grad(lambda *a: loss(attend, *a), argnums=(0, 1, 2)))
    chunked = jax.jit(
        jax.grad(
            lambda q, k, v: loss(lambda *b, **kw: chunked_attend(*b, **kw, chunk=2), q, k, v),
            argnums=(0, 1, 2),
        )
    )
    for got, want in zip(chunked(q, k, v), whole(q, k, v), strict=True):
        assert float(jnp.abs(want).max()) > 0
        np.testing.assert_allclose(got, want, atol=2e-6)


def _batch(rows, length, prompt, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 23, (rows, length))
    tokens[1::2, :prompt] = tokens[::2, :prompt]  # groups of 2 rows share their prompt
    mask = np.ones((rows, length), np.int32)
    mask[2:4, :1] = 0  # a left-padded prompt
    mask[0, -2:] = 0  # a completion that stopped early
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    return jnp.asarray(np.where(mask > 0, tokens, 0)), jnp.asarray(positions), jnp.asarray(mask)


@functools.cache
def _models(name):
    """One random model's graphdefs with whole attention and blocks of 2 queries, its state."""
    model = Decoder(CONFIGS[name], rngs=nnx.Rngs(0))  # initialised once: the same weights
    whole, params = nnx.split(model)
    model.attention_chunk = 2
    return {None: whole, 2: nnx.split(model)[0]}, params


def test_shared_prompt_forward_and_gradients_match_whole_attention():
    # Gemma 2: sliding window and soft-caps (the plain forward: the critic and prefill tests)
    tokens, positions, mask = _batch(4, 9, prompt=4)
    w = jax.random.normal(jax.random.key(2), (4, 9, 16))
    graphdefs, params = _models("gemma2")
    params = jax.tree.map(lambda x: x * 3.0, params)  # attention far from uniform

    def run(chunk):
        def loss(params):
            h = nnx.merge(graphdefs[chunk], params).shared_prompt_hidden_states(
                tokens, positions, attention_mask=mask, prompt_length=4, group_size=2
            )
            return jnp.sum(jnp.where(mask[..., None] > 0, h * w, 0.0)), h

        return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

    (value, h), grads = run(None)
    (value_c, h_c), grads_c = run(2)
    np.testing.assert_allclose(h_c, h, atol=1e-5)
    np.testing.assert_allclose(value_c, value, atol=1e-4)  # a sum of ~200 terms
    for got, want in zip(jax.tree.leaves(grads_c), jax.tree.leaves(grads), strict=True):
        scale = float(jnp.max(jnp.abs(want))) + 1e-6  # float32 sums in another order
        np.testing.assert_allclose(np.asarray(got) / scale, np.asarray(want) / scale, atol=2e-5)


def test_a_long_prefill_attends_in_blocks_too():
    tokens, positions, mask = _batch(4, 9, prompt=4)
    graphdefs, params = _models("gemma2")
    outs = []
    for chunk in (None, 2):
        model = nnx.merge(graphdefs[chunk], params)
        cache = model.init_cache(batch=4, max_len=10)
        hidden, cache = model.decode_hidden(tokens, positions, cache, attention_mask=mask)
        step, _ = model.decode_hidden(tokens[:, :1], positions[:, -1:] + 1, cache)  # one token
        outs.append((hidden, cache.k, cache.v, step))
    for got, want in zip(outs[1], outs[0], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_critic_and_checkpoint_loading_carry_the_chunk(tmp_path: pathlib.Path):
    tokens, positions, mask = _batch(4, 9, prompt=4)
    cfg = CONFIGS["qwen3"]
    whole = ValueModel(cfg, rngs=nnx.Rngs(1))
    chunked = ValueModel(cfg, attention_chunk=4, rngs=nnx.Rngs(1))
    assert chunked.backbone.attention_chunk == 4
    np.testing.assert_allclose(
        chunked(tokens, positions, attention_mask=mask),
        whole(tokens, positions, attention_mask=mask),
        atol=1e-5,
    )
    save_pretrained(Decoder(cfg, rngs=nnx.Rngs(0)), tmp_path)
    assert from_pretrained(tmp_path, attention_chunk=5).attention_chunk == 5
    init = dataclasses.replace(cfg, vocab_size=259)  # the runner's byte tokenizer
    run = RunConfig(model=ModelSection(init=init, attention_chunk=6), sft=SFTConfig())
    assert build_policy(run).attention_chunk == 6  # the runner's `model.attention_chunk`


def _temp_bytes(S, chunk):
    cfg = ModelConfig(
        family="qwen3", vocab_size=11, hidden_size=8, intermediate_size=8, num_layers=1,
        num_heads=4, num_kv_heads=2, head_dim=2,
    )  # fmt: skip
    graphdef, params = nnx.split(Decoder(cfg, attention_chunk=chunk, rngs=nnx.Rngs(0)))
    tokens = jnp.zeros((2, S), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(S), (2, S))

    def loss(params):
        return jnp.sum(nnx.merge(graphdef, params).hidden_states(tokens, positions))

    compiled = jax.jit(jax.grad(loss)).lower(params).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_attention_memory_stops_growing_quadratically():
    # one layer, 4 heads: the whole attention's [2, 4, S, S] float32 logits, probabilities and
    # their gradients dominate the temporaries; in blocks of 16 queries what grows with S² is
    # only the [2, S, S] boolean mask (1 byte per pair)
    whole = [_temp_bytes(S, None) for S in (256, 512)]
    chunked = [_temp_bytes(S, 16) for S in (256, 512)]
    assert whole[1] / whole[0] > 3.5  # quadratic in S
    assert chunked[1] - chunked[0] < (whole[1] - whole[0]) / 10
    assert chunked[1] < whole[1] / 4


@pytest.mark.parametrize("bad", [0, -2, True, 2.0, "8"])
def test_bad_chunk_is_refused(bad):
    q, k, v, mask = _inputs(4)
    with pytest.raises(ValueError, match="`chunk` must be an int >= 1"):
        chunked_attend(q, k, v, mask, scale=1.0, softcap=None, chunk=bad)
    with pytest.raises(ValueError, match="attention_chunk must be None or an int >= 1"):
        Decoder(CONFIGS["qwen3"], attention_chunk=bad, rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match="attention_chunk"):
        build(
            ModelSection,
            {"init": dict(family="qwen3", num_kv_heads=2, **BASE), "attention_chunk": bad},
        )
