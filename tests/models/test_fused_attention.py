"""Fused attention (`layers.fused_attend`, `Decoder(fused_attention=True)`).

`jax.nn.dot_product_attention` with per-row lengths (cuDNN's flash attention on GPUs, XLA's
composition here) after moving each row's real tokens to the front must give the default
attention's outputs at every real position, and the same gradients: against a float64 NumPy
reference and `attend`, through the decoder's forward over left-, right- and both-side
padded rows (Qwen3, Qwen2 with q/k/v biases), in bfloat16, through the critic and a loaded
checkpoint. Packed rows keep the default attention; Gemma 2's sliding windows and
soft-capping are refused with a message.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.config import ConfigError, build
from jaxrl_llm.models import Decoder, ValueModel, from_pretrained, save_pretrained
from jaxrl_llm.models.cache import positions_from_mask
from jaxrl_llm.models.layers import attend, fused_attend, fused_attention_kernel
from jaxrl_llm.runner.config import ModelSection
from tests.models.test_chunked_attention import _reference
from tests.models.test_shared_prompt import CONFIGS

# one row each: left padding (a prompt), right padding (a short completion), both, none
MASK = np.array(
    [
        [0, 0, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 1],
    ],
    bool,
)


def _rows(vocab, seed=0):
    tokens = np.random.default_rng(seed).integers(1, vocab, MASK.shape).astype(np.int32)
    mask = jnp.asarray(MASK.astype(np.int32))
    return jnp.asarray(tokens), mask, positions_from_mask(mask)


def test_fused_attend_equals_the_float64_reference_and_attend():
    rng = np.random.default_rng(0)
    N, S, H, K, Hd = 3, 7, 4, 2, 8
    q, k, v = (jnp.asarray(rng.normal(size=(N, S, heads, Hd)), jnp.float32) for heads in (H, K, K))
    lengths = jnp.array([7, 4, 1])
    mask = (
        np.tril(np.ones((S, S), bool))[None]
        & (np.arange(S) < np.asarray(lengths)[:, None])[:, None, :]
    )
    real = np.arange(S)[None] < np.asarray(lengths)[:, None]
    got = np.asarray(fused_attend(q, k, v, lengths, scale=0.3, softcap=None))
    want = _reference(q, k, v, mask, 0.3, None)
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-6)
    ours = np.asarray(attend(q, k, v, jnp.asarray(mask), scale=0.3, softcap=None))
    np.testing.assert_allclose(got[real], ours[real], rtol=1e-5, atol=1e-6)
    assert fused_attention_kernel(jnp.bfloat16) == "xla"  # cuDNN only on a GPU backend
    with pytest.raises(ValueError, match="no logit soft-capping"):
        fused_attend(q, k, v, lengths, scale=0.3, softcap=5.0)


def _pair(config, **kwargs):
    plain = Decoder(config, rngs=nnx.Rngs(0), **kwargs)
    fused = Decoder(config, fused_attention=True, rngs=nnx.Rngs(0), **kwargs)
    return plain, fused


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_the_fused_forward_and_its_gradients_equal_the_default_attention(family):
    plain, fused = _pair(CONFIGS[family])
    tokens, mask, positions = _rows(CONFIGS[family].vocab_size)

    def loss(model):  # a masked log-likelihood, as every loss reads the real positions only
        logits = model(tokens, positions, attention_mask=mask)[:, :-1]
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        weights = (mask[:, 1:] * mask[:, :-1]).astype(jnp.float32)
        return -jnp.sum(picked * weights) / jnp.sum(weights)

    hidden = [
        np.asarray(m.hidden_states(tokens, positions, attention_mask=mask)) for m in (plain, fused)
    ]
    np.testing.assert_allclose(hidden[1][MASK], hidden[0][MASK], rtol=1e-5, atol=1e-5)
    values, grads = zip(*(nnx.value_and_grad(loss)(m) for m in (plain, fused)), strict=True)
    np.testing.assert_allclose(values[1], values[0], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1]), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads[0])) > 1e-3


def test_bfloat16_compute_and_the_critic_follow_the_default_attention():
    config = CONFIGS["qwen3"]
    tokens, mask, positions = _rows(config.vocab_size, seed=1)
    plain, fused = _pair(config, dtype=jnp.bfloat16)
    got = [
        np.asarray(m.hidden_states(tokens, positions, attention_mask=mask), np.float32)
        for m in (plain, fused)
    ]
    np.testing.assert_allclose(got[1][MASK], got[0][MASK], rtol=0.05, atol=0.05)
    critics = [
        ValueModel(config, fused_attention=fused, rngs=nnx.Rngs(2)) for fused in (False, True)
    ]
    values = [np.asarray(c(tokens, positions, attention_mask=mask)) for c in critics]
    np.testing.assert_allclose(values[1][MASK], values[0][MASK], rtol=1e-5, atol=1e-5)


def test_packed_rows_keep_the_default_attention(tmp_path):
    config = CONFIGS["qwen3"]
    plain, fused = _pair(config)
    tokens, _, _ = _rows(config.vocab_size)
    segments = jnp.asarray(np.array([[1, 1, 1, 2, 2, 2, 3, 3, 0]] * 4, np.int32))
    positions = jnp.asarray(np.array([[0, 1, 2, 0, 1, 2, 0, 1, 0]] * 4, np.int32))
    a, b = (m.hidden_states(tokens, positions, segment_ids=segments) for m in (plain, fused))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    save_pretrained(plain, tmp_path)
    loaded = from_pretrained(tmp_path, fused_attention=True)
    assert loaded.fused_attention and not from_pretrained(tmp_path).fused_attention


def test_models_with_sliding_windows_or_soft_caps_refuse_it():
    with pytest.raises(ValueError, match="sliding-window layers and attention logit soft-cap"):
        Decoder(CONFIGS["gemma2"], fused_attention=True, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="fused_attention must be a bool"):
        Decoder(CONFIGS["qwen3"], fused_attention=1, rngs=nnx.Rngs(0))
    init = dataclasses.asdict(CONFIGS["gemma2"])
    with pytest.raises(ConfigError, match=r"model\.fused_attention: Decoder: fused_attention"):
        build(ModelSection, {"init": init, "fused_attention": True})
    section = build(
        ModelSection, {"init": dataclasses.asdict(CONFIGS["qwen3"]), "fused_attention": True}
    )
    assert section.fused_attention
