"""The sampler's decode step against `Decoder.decode_hidden`, attention against NumPy, phases."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import KVCache, ModelConfig
from jaxrl_llm.models.cache import positions_from_mask
from jaxrl_llm.models.config import RopeConfig
from jaxrl_llm.models.layers import attend
from jaxrl_llm.sampler import SamplingConfig, jit_sample_tokens
from jaxrl_llm.sampler.core import phase_ends
from jaxrl_llm.sampler.decode import (
    decode_attention,
    decode_cache,
    decode_layers,
    decode_rope,
    decode_step,
    grow_decode_cache,
)
from tests.sampler.helpers import tiny_model

# Qwen3 (GQA, QK-norm), a 4-layer Qwen3 (the layer scan in groups of 2 with `layer_unroll=3`),
# and a 3-layer variant with mixed sliding / full layers, a second rope for the sliding layers
# and attention-logit soft-capping (the Gemma 2/3 features).
MODELS = {
    "qwen3": dict(),
    "qwen3_4_layers": dict(layers=4),
    "sliding_softcap": dict(
        layers=3,
        layer_types=("sliding_attention", "full_attention", "sliding_attention"),
        sliding_window=3,
        attn_logit_softcap=2.0,
        local_rope=RopeConfig(theta=100.0),
    ),
}
PROMPTS = np.array([[0, 3, 4, 5], [6, 7, 8, 9], [0, 0, 10, 11]])
MASK = PROMPTS > 0
STEPS = 5


@functools.cache
def model(name: str):
    return tiny_model(vocab=13, seed=3, **MODELS[name])


def _run_both(m, layer_unroll: int):
    """Prefill, then `STEPS` one-token steps through `decode_hidden` and through `decode_step`."""
    B, P = PROMPTS.shape
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(1, 13, (STEPS, B)), jnp.int32)
    active = jnp.asarray([[True, t < 2, True] for t in range(STEPS)])  # row 1 stops after 2
    positions = jnp.asarray(MASK.sum(1))[None] + jnp.arange(STEPS)[:, None]

    @jax.jit
    def run(state):
        m_ = nnx.merge(graphdef, state)
        mask = jnp.asarray(MASK)
        cache = m_.init_cache(batch=B, max_len=P + STEPS, shared_length=True)
        _, cache = m_.decode_hidden(
            jnp.asarray(PROMPTS), positions_from_mask(mask), cache, attention_mask=mask
        )
        layers = decode_layers(m_, layer_unroll)
        ours = decode_cache(cache, stacked=layers.per_layer is None)
        want, got, lengths = [], [], []
        for t in range(STEPS):
            h, cache = m_.decode_hidden(
                tokens[t][:, None],
                positions[t][:, None],
                cache,
                attention_mask=active[t][:, None],
            )
            want.append(h[:, 0])
            h, ours = decode_step(m_, layers, tokens[t], positions[t], active[t], ours)
            got.append(h)
            lengths.append((cache.lengths, ours.length))
        return jnp.stack(want), jnp.stack(got), lengths, cache, ours, layers.per_layer is None

    graphdef, state = nnx.split(m)
    return run(state)


CASES = [(name, unroll) for name in sorted(MODELS) for unroll in (8, 1)]
CASES += [("qwen3_4_layers", 3)]  # the layer scan in groups of 2


@pytest.mark.parametrize(("name", "layer_unroll"), CASES, ids=[f"{n}-unroll{u}" for n, u in CASES])
def test_decode_steps_match_decoder_decode_hidden(name, layer_unroll):
    m = model(name)
    want, got, lengths, cache, ours, scanned = _run_both(m, layer_unroll)
    assert bool(scanned) == (layer_unroll < m.config.num_layers)
    # the scan keeps the cache stacked, the loop one buffer per layer
    assert isinstance(ours.k, tuple) != bool(scanned)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    for theirs, mine in lengths:
        assert int(theirs) == int(mine)
    np.testing.assert_array_equal(np.asarray(ours.positions), np.asarray(cache.positions))
    for layer in range(m.config.num_layers):  # the caches hold the same keys and values
        np.testing.assert_allclose(
            np.asarray(ours.k[layer]), np.swapaxes(np.asarray(cache.k[layer]), -1, -2), atol=1e-5
        )
        np.testing.assert_allclose(
            np.asarray(ours.v[layer]), np.swapaxes(np.asarray(cache.v[layer]), -1, -2), atol=1e-5
        )


def test_precomputed_rope_equals_the_steps_own():
    m = model("sliding_softcap")
    B, P = PROMPTS.shape
    cache = decode_cache(m.init_cache(batch=B, max_len=P + 1, shared_length=True))
    cache = cache._replace(length=jnp.asarray(P, jnp.int32))
    layers = decode_layers(m, 8)
    tokens, active = jnp.array([1, 2, 3]), jnp.ones(B, bool)
    positions = jnp.asarray(MASK.sum(1), jnp.int32)
    table = decode_rope(m, positions[:, None] + jnp.arange(3)[None])  # [N, 3, Hd/2] per kind
    assert len(table) == 2 and table[0][0].shape == (B, 3, m.config.head_dim // 2)
    rope = jax.tree.map(lambda x: x[:, :1], table)
    own, _ = decode_step(m, layers, tokens, positions, active, cache)
    given, _ = decode_step(m, layers, tokens, positions, active, cache, rope)
    np.testing.assert_array_equal(np.asarray(own), np.asarray(given))


def _attention_reference(q, k, v, mask, scale, softcap):
    """Float64 GQA attention of one query: query head h reads kv head h // (H / K)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    N, _, H, Hd = q.shape
    K = k.shape[1]
    out = np.zeros((N, 1, H, Hd))
    for n in range(N):
        for h in range(H):
            kv = h // (H // K)
            logits = scale * (k[n, kv].T @ q[n, 0, h])  # keys [Hd, T] -> [T]
            if softcap is not None:
                logits = softcap * np.tanh(logits / softcap)
            allowed = np.asarray(mask[n, 0])
            # a fully masked row attends uniformly
            logits = np.where(allowed, logits, -np.inf) if allowed.any() else 0 * logits
            p = np.exp(logits - logits.max())
            out[n, 0, h] = (p / p.sum()) @ v[n, kv]
    return out


@pytest.mark.parametrize("softcap", [None, 1.5])
def test_decode_attention_matches_a_float64_reference(softcap):
    N, H, K, Hd, T = 3, 6, 2, 4, 7
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (N, 1, H, Hd))
    k = jax.random.normal(keys[1], (N, K, Hd, T))
    v = jax.random.normal(keys[2], (N, K, T, Hd))
    mask = jax.random.bernoulli(keys[3], 0.6, (N, 1, T)).at[2].set(False)  # row 2: none
    got = decode_attention(q, k, v, mask, scale=0.7, softcap=softcap)
    want = _attention_reference(q, k, v, mask, 0.7, softcap)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("softcap", [None, 1.5])
def test_decode_attention_rounds_like_the_training_forward_in_bfloat16(softcap):
    """bfloat16: the probabilities are rounded to the values' dtype as `layers.attend` rounds
    them, so one query's output equals the training forward's (float32 probabilities gave
    up to 20 % relative differences on small outputs, a source of sampler/trainer log-prob
    mismatch)."""
    N, H, K, Hd, T = 4, 4, 2, 16, 24
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (N, 1, H, Hd)).astype(jnp.bfloat16)
    k = jax.random.normal(keys[1], (N, T, K, Hd)).astype(jnp.bfloat16)
    v = jax.random.normal(keys[2], (N, T, K, Hd)).astype(jnp.bfloat16)
    mask = (jnp.arange(T)[None, :] < jnp.array([24, 10, 3, 17])[:, None])[:, None, :]
    forward = attend(q, k, v, mask, scale=0.25, softcap=softcap)
    cache_k, cache_v = jnp.transpose(k, (0, 2, 3, 1)), jnp.transpose(v, (0, 2, 1, 3))
    decoded = decode_attention(q, cache_k, cache_v, mask, scale=0.25, softcap=softcap)
    assert decoded.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(decoded, np.float32), np.asarray(forward, np.float32), rtol=2**-8, atol=2**-12
    )


def test_bad_inputs_raise_clear_errors():
    cfg = ModelConfig(
        family="llama",
        vocab_size=11,
        hidden_size=8,
        intermediate_size=16,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
    )
    with pytest.raises(ValueError, match="one shared length"):
        decode_cache(KVCache.init(cfg, batch=2, max_len=3))
    with pytest.raises(ValueError, match="layer_unroll"):
        decode_layers(model("qwen3"), 0)
    with pytest.raises(ValueError, match="one query per row"):
        decode_attention(
            jnp.ones((1, 2, 2, 4)),
            jnp.ones((1, 1, 4, 3)),
            jnp.ones((1, 1, 3, 4)),
            jnp.ones((1, 2, 3), bool),
            scale=1.0,
            softcap=None,
        )


def test_loop_shape_changes_nothing_but_the_program():
    # decode_phases (the cache length per phase) and unroll_loop_steps (an inner loop of fixed
    # trip count instead of an unrolled body) leave every token and log-prob as they are
    m = model("sliding_softcap")
    graphdef, state = nnx.split(m)
    prompts, mask = jnp.asarray(PROMPTS), jnp.asarray(MASK)
    budgets = jnp.array([3, 13, 13, 13, 9, 13])  # per row: stops inside the first phases
    runs = []
    for phases, unroll in ((1, True), (3, True), (3, False)):
        config = SamplingConfig(
            max_new_tokens=13,
            num_samples=2,
            stop_tokens=(5,),
            temperature=0.9,
            steps_per_loop=2,
            decode_phases=phases,
            unroll_loop_steps=unroll,
        )
        runs.append(
            jit_sample_tokens(
                graphdef,
                state,
                prompts,
                mask,
                jax.random.key(4),
                config=config,
                max_new_tokens=budgets,
            )
        )
    assert phase_ends(14, 2, 3) == (4, 10, 14)
    one = runs[0]
    assert int(np.asarray(one.lengths).max()) > 10  # some rows ran into the last phase
    for other in runs[1:]:
        np.testing.assert_array_equal(np.asarray(one.tokens), np.asarray(other.tokens))
        np.testing.assert_array_equal(np.asarray(one.lengths), np.asarray(other.lengths))
        np.testing.assert_allclose(np.asarray(one.logprobs), np.asarray(other.logprobs), atol=1e-6)


def test_layer_scan_groups_are_the_largest_divisor_of_the_depth():
    four, three = model("qwen3_4_layers"), model("sliding_softcap")
    assert decode_layers(four, 3).unroll == 2 and decode_layers(four, 1).unroll == 1
    assert decode_layers(three, 2).unroll == 1  # 3 layers: groups of 1
    assert decode_layers(four, 4).per_layer is not None  # all layers: the Python loop
    m = four
    with pytest.raises(ValueError, match="stacked=True"):  # the scan refuses per-layer buffers
        cache = decode_cache(m.init_cache(batch=1, max_len=2, shared_length=True))
        decode_step(
            m, decode_layers(m, 2), jnp.array([1]), jnp.array([0]), jnp.array([True]), cache
        )
    with pytest.raises(ValueError, match="stacked=False"):
        cache = decode_cache(m.init_cache(batch=1, max_len=2, shared_length=True), stacked=True)
        decode_step(
            m, decode_layers(m, 8), jnp.array([1]), jnp.array([0]), jnp.array([True]), cache
        )


def test_grow_decode_cache_appends_empty_slots():
    m = model("qwen3")
    cache = decode_cache(m.init_cache(batch=2, max_len=3, shared_length=True))
    grown = grow_decode_cache(cache, 5)
    assert grown.k[0].shape[-1] == 5 and grown.v[0].shape[-2] == 5
    np.testing.assert_array_equal(np.asarray(grown.positions[:, 3:]), -1)
    stacked = decode_cache(m.init_cache(batch=2, max_len=3, shared_length=True), stacked=True)
    grown_stack = grow_decode_cache(stacked, 5)
    for mine, theirs in ((grown_stack.k, grown.k), (grown_stack.v, grown.v)):
        assert mine.shape[0] == len(theirs)
        for layer, buffer in enumerate(theirs):
            np.testing.assert_array_equal(np.asarray(mine[layer]), np.asarray(buffer))
    with pytest.raises(ValueError, match="max_len=2"):
        grow_decode_cache(cache, 2)
    with pytest.raises(ValueError, match="decode_phases"):
        SamplingConfig(decode_phases=0)
    with pytest.raises(ValueError, match="unroll_loop_steps"):
        SamplingConfig(unroll_loop_steps=1)
