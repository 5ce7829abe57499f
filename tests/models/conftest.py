"""Tiny Hugging Face reference models for the model tests (CPU, no downloads).

Each family gets a 2-layer random `transformers` model with its special options switched on
(GQA everywhere; Llama 3 rope scaling and attention biases; Qwen2 biases with tied embeddings;
Qwen3 QK-norm; Gemma's 1+w norms, GeGLU, embedding scaling; Gemma 2 soft-capping and a sliding
window shorter than the test sequences; Gemma 3 QK-norm, two ropes and mixed layer types). All
weights, norms and biases included, are redrawn with std 0.3 so that every mapping matters.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import transformers
from flax import nnx

try:  # test-only dependency: tests that need the reference model skip without it
    import torch
except ModuleNotFoundError:
    torch = None

FAMILIES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
DIMS = dict(
    vocab_size=131,
    hidden_size=40,
    intermediate_size=72,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=12,
)
OPTIONS = {
    "llama": dict(
        attention_bias=True,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=10000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(),
    "gemma": dict(),
    "gemma2": dict(
        sliding_window=4,
        attn_logit_softcapping=3.0,
        final_logit_softcapping=5.0,
        query_pre_attn_scalar=16,
    ),
    "gemma3_text": dict(
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=16,
        rope_parameters=dict(
            full_attention=dict(rope_type="linear", factor=4.0, rope_theta=100000.0),
            sliding_attention=dict(rope_type="default", rope_theta=10000.0),
        ),
    ),
}


def hf_config(family: str, **overrides):
    """A tiny `transformers` config of `family` with its options on."""
    kwargs = {**DIMS, **OPTIONS[family], **overrides}
    return transformers.AutoConfig.for_model(family, **kwargs)


def hf_model(family: str, seed: int = 0, **overrides):
    """A random float32 `transformers` causal LM (eager attention), every weight redrawn."""
    torch.manual_seed(seed)
    config = hf_config(family, **overrides)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def torch_logits(model, tokens: np.ndarray, attention_mask: np.ndarray | None = None):
    """Float32 logits `[N, S, V]` of the torch model as NumPy."""
    kwargs = {}
    if attention_mask is not None:
        kwargs["attention_mask"] = torch.tensor(attention_mask)
    with torch.no_grad():
        return model(torch.tensor(tokens), **kwargs).logits.float().numpy()


def random_tokens(shape, seed: int = 0, vocab: int = DIMS["vocab_size"]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)


def positions_for(tokens: np.ndarray) -> np.ndarray:
    return np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape).copy()


def jit_forward(model, tokens, positions, **kwargs):
    """`model(tokens, positions, **kwargs)` under `jax.jit` with split/merge, as NumPy."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens, positions, kwargs):
        return nnx.merge(graphdef, state)(tokens, positions, **kwargs)

    return np.asarray(run(state, tokens, positions, kwargs))


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """`{family: (torch model, checkpoint dir)}`, saved by `transformers` once per session."""
    pytest.importorskip("torch")
    out = {}
    for family in FAMILIES:
        model = hf_model(family)
        path = tmp_path_factory.mktemp(f"hf_{family}")
        model.save_pretrained(path)
        out[family] = (model, path)
    return out
