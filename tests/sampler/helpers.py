"""Shared fixtures for the sampler tests: tiny random decoders and float64 NumPy references.

Model weights are redrawn with std 0.5 (the default init's 0.02 makes every next-token
distribution nearly uniform, which would hide mistakes and make greedy ties likely).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models import Decoder, ModelConfig


def tiny_model(
    *, vocab: int = 13, layers: int = 2, seed: int = 0, std: float = 0.5, **kw
) -> Decoder:
    """A random Qwen3-style decoder (GQA, QK-norm) with every parameter redrawn."""
    dims = dict(hidden_size=16, intermediate_size=24, num_heads=4, num_kv_heads=2, head_dim=4)
    dims.update(kw)
    cfg = ModelConfig(family="qwen3", vocab_size=vocab, num_layers=layers, **dims)
    model = Decoder(cfg, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed + 1000), len(leaves))
    leaves = [
        std * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)
    ]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens, mask):
    positions = jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)
    return nnx.merge(graphdef, state)(tokens, positions, attention_mask=mask)


def full_logits(model: Decoder, tokens, attention_mask) -> np.ndarray:
    """Float32 logits `[N, S, V]` of the plain (uncached) forward pass, as NumPy."""
    graphdef, state = nnx.split(model)
    mask = jnp.asarray(attention_mask, bool)
    return np.asarray(_forward(graphdef, state, jnp.asarray(tokens, jnp.int32), mask))


def reference_distribution(
    logits: np.ndarray,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> np.ndarray:
    """Float64 sampling distribution `[..., V]` written from the definitions.

    softmax(z/τ); top-k keeps the k most likely tokens; top-p keeps, in order of decreasing
    probability (renormalised after top-k), each token whose preceding mass is below p; min-p
    keeps tokens with probability >= min_p × the largest; the kept mass is renormalised.
    """
    z = np.asarray(logits, np.float64) / temperature
    out = np.zeros_like(z)
    for idx in np.ndindex(z.shape[:-1]):
        p = np.exp(z[idx] - z[idx].max())
        p /= p.sum()
        keep = np.ones(p.shape, bool)
        order = np.argsort(-p, kind="stable")
        if top_k is not None:
            keep[:] = False
            keep[order[:top_k]] = True
        if top_p is not None:
            q = np.where(keep, p, 0.0)
            q /= q.sum()
            mass = 0.0
            for v in order:
                if not keep[v]:
                    continue
                if mass >= top_p:
                    keep[v] = False
                mass += q[v]
        if min_p is not None:
            keep &= p >= min_p * p[keep].max()
        q = np.where(keep, p, 0.0)
        out[idx] = q / q.sum()
    return out
