"""Tiny models and batches for the update-step tests (CPU, no downloads)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models import Decoder, ModelConfig, ValueHead, ValueModel
from jaxrl_llm.train import SequenceBatch

V, D = 53, 32


# The update-step tests use one layer: XLA unrolls the two-step layer scan, which doubles the
# compile time of every update step; the scanned layers themselves are tested in tests/models and
# by the two-layer log-prob tests here.
UPDATE_LAYERS = 1


def tiny_config(family: str = "qwen3", *, vocab: int = V, layers: int = 2) -> ModelConfig:
    """Width 32, GQA 4/2 heads of 8 (qwen2 adds q/k/v biases, qwen3 QK-norm)."""
    return ModelConfig(
        family=family,
        vocab_size=vocab,
        hidden_size=D,
        intermediate_size=64,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
    )


def tiny_policy(
    seed: int = 0, family: str = "qwen3", *, vocab: int = V, layers: int = 2
) -> Decoder:
    return Decoder(tiny_config(family, vocab=vocab, layers=layers), rngs=nnx.Rngs(seed))


def tiny_sliding_window_policy(seed: int = 0, *, vocab: int = V) -> Decoder:
    """A 2-layer Gemma 2 policy whose first layer attends over a window of 3 positions (what
    packed rows must keep: positions continuing the prompt in every completion)."""
    config = ModelConfig(
        family="gemma2", vocab_size=vocab, hidden_size=D, intermediate_size=64,
        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
        layer_types=("sliding_attention", "full_attention"), sliding_window=3,
    )  # fmt: skip
    return Decoder(config, rngs=nnx.Rngs(seed))


def tiny_critic(kind: str, seed: int = 1, family: str = "qwen3", *, layers: int = 2) -> nnx.Module:
    if kind == "head":
        return ValueHead(D, rngs=nnx.Rngs(seed))
    return ValueModel(tiny_config(family, layers=layers), rngs=nnx.Rngs(seed))


def sequences(key: jax.Array, N: int, P: int, T: int, *, vocab: int = V) -> SequenceBatch:
    """Random rows: prompts left-padded to P (lengths 2..P), completions right-padded (1..T)."""
    k_tok, k_p, k_c = jax.random.split(key, 3)
    tokens = jax.random.randint(k_tok, (N, P + T), 1, vocab)
    p_len = jax.random.randint(k_p, (N,), 2, P + 1)
    c_len = jax.random.randint(k_c, (N,), 1, T + 1)
    c_len = c_len.at[0].set(T)  # one full row
    prompt_mask = jnp.arange(P)[None, :] >= (P - p_len)[:, None]
    completion_mask = jnp.arange(T)[None, :] < c_len[:, None]
    attention = jnp.concatenate([prompt_mask, completion_mask], axis=1).astype(jnp.int32)
    tokens = jnp.where(attention > 0, tokens, 0).astype(jnp.int32)
    return SequenceBatch(tokens, attention, completion_mask.astype(jnp.float32))


def tree_max_abs_diff(a, b) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )
