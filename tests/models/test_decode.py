"""KV-cache decoding, padding and packing give the logits of the plain forward pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import KVCache, from_pretrained, positions_from_mask
from tests.models.conftest import FAMILIES, jit_forward, positions_for, random_tokens

TOL = 1e-4


def jit_decode(model):
    """`decode(tokens, positions, cache, attention_mask)` jitted over the split model."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens, positions, cache, mask):
        return nnx.merge(graphdef, state).decode(tokens, positions, cache, attention_mask=mask)

    def decode(tokens, positions, cache, mask=None):
        mask = np.ones(np.shape(tokens), bool) if mask is None else mask
        logits, cache = run(state, tokens, positions, cache, mask)
        return np.asarray(logits), cache

    return decode


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_decode_matches_full_forward_token_by_token(hf_checkpoints, family):
    model = from_pretrained(hf_checkpoints[family][1])
    tokens = random_tokens((2, 10), seed=5)
    positions = positions_for(tokens)
    full = jit_forward(model, tokens, positions)
    decode = jit_decode(model)
    cache = model.init_cache(batch=2, max_len=12)
    P = 4
    logits, cache = decode(tokens[:, :P], positions[:, :P], cache)
    np.testing.assert_allclose(logits, full[:, :P], atol=TOL, rtol=0)
    for t in range(P, tokens.shape[1]):
        logits, cache = decode(tokens[:, t : t + 1], positions[:, t : t + 1], cache)
        np.testing.assert_allclose(logits[:, 0], full[:, t], atol=TOL, rtol=0)
    assert np.asarray(cache.lengths).tolist() == [10, 10]
    assert np.asarray(cache.positions)[0].tolist() == [*range(10), -1, -1]


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3_text"])
def test_left_padded_prefill_then_decode_matches_unpadded(hf_checkpoints, family):
    model = from_pretrained(hf_checkpoints[family][1])
    decode = jit_decode(model)
    lengths = [6, 3]  # prompt lengths; both rows then decode 3 tokens
    seqs = [random_tokens((1, n + 3), seed=10 + i)[0] for i, n in enumerate(lengths)]
    P = max(lengths)
    prompt = np.zeros((2, P), np.int32)
    mask = np.zeros((2, P), bool)
    for i, n in enumerate(lengths):
        prompt[i, P - n :] = seqs[i][:n]
        mask[i, P - n :] = True
    positions = np.asarray(positions_from_mask(mask))
    logits, cache = decode(
        prompt, positions, KVCache.init(model.config, batch=2, max_len=P + 3), mask
    )
    steps = [logits[:, -1]]
    for t in range(2):
        nxt = np.array([[seqs[i][n + t]] for i, n in enumerate(lengths)], np.int32)
        pos = np.array([[n + t] for n in lengths], np.int32)
        logits, cache = decode(nxt, pos, cache)
        steps.append(logits[:, 0])
    for i, n in enumerate(lengths):
        seq = seqs[i][None, : n + 2]
        ref = jit_forward(model, seq, positions_for(seq))[0]
        np.testing.assert_allclose(np.stack([s[i] for s in steps]), ref[n - 1 :], atol=TOL, rtol=0)


@pytest.mark.parametrize("family", ["qwen2", "gemma2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_matches_unpadded_sequences(hf_checkpoints, family, side):
    model = from_pretrained(hf_checkpoints[family][1])
    lengths = [8, 5, 3]
    S = max(lengths)
    tokens = np.full((3, S), 7, np.int32)  # padding with a real token id: the mask must hide it
    mask = np.zeros((3, S), bool)
    seqs = [random_tokens((1, n), seed=20 + i) for i, n in enumerate(lengths)]
    for i, n in enumerate(lengths):
        cols = slice(S - n, S) if side == "left" else slice(0, n)
        tokens[i, cols], mask[i, cols] = seqs[i][0], True
    logits = jit_forward(
        model, tokens, np.asarray(positions_from_mask(mask)), attention_mask=jnp.asarray(mask)
    )
    assert np.isfinite(logits).all()
    for i, seq in enumerate(seqs):
        ref = jit_forward(model, seq, positions_for(seq))[0]
        np.testing.assert_allclose(logits[i][mask[i]], ref, atol=TOL, rtol=0)


def test_packed_segments_match_separate_sequences(hf_checkpoints):
    model = from_pretrained(hf_checkpoints["gemma3_text"][1])
    a, b = random_tokens((1, 6), seed=30), random_tokens((1, 4), seed=31)
    tokens = np.concatenate([a, b, np.zeros((1, 2), np.int32)], axis=1)
    segments = np.array([[1] * 6 + [2] * 4 + [0] * 2], np.int32)
    positions = np.array([[*range(6), *range(4), 0, 0]], np.int32)
    packed = jit_forward(model, tokens, positions, segment_ids=jnp.asarray(segments))
    np.testing.assert_allclose(packed[0, :6], jit_forward(model, a, positions_for(a))[0], atol=TOL)
    np.testing.assert_allclose(
        packed[0, 6:10], jit_forward(model, b, positions_for(b))[0], atol=TOL
    )


def test_cache_overflow_and_bad_inputs_raise(hf_checkpoints):
    model = from_pretrained(hf_checkpoints["llama"][1])
    tokens = jnp.asarray(random_tokens((1, 4)))
    positions = jnp.arange(4)[None]
    with pytest.raises(ValueError, match="KVCache overflow: writing 4 tokens needs 4 slots"):
        model.decode(tokens, positions, model.init_cache(batch=1, max_len=3))
    with pytest.raises(ValueError, match="positions must be an integer array"):
        model(tokens, jnp.arange(3)[None])
    with pytest.raises(ValueError, match="attention_mask must have the tokens' shape"):
        model(tokens, positions, attention_mask=jnp.ones((1, 5)))
    with pytest.raises(ValueError, match="not both"):
        model(tokens, positions, attention_mask=jnp.ones((1, 4)), segment_ids=jnp.ones((1, 4)))
