"""Scalar-per-token heads on the decoder backbone: PPO critics and reward models.

`ValueModel` is a `Decoder` without its LM head plus a `ValueHead`, a bias-free `[D, 1]`
projection of the final-normed hidden states. The head has the layout of the `score` layer of
Hugging Face `*ForSequenceClassification` models with one label, so reward models trained with
`transformers` load (and export) directly; a critic initialised from a policy checkpoint keeps
the backbone and starts with a fresh head.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_llm.models._sharded_ops import compute_weight
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.decoder import Decoder, Remat
from jaxrl_llm.models.layers import make_param

Array = jax.Array


class ValueHead(nnx.Module):
    """`values[..., ] = hidden[..., D] @ kernel[D, 1]` in float32.

    Examples:
      >>> head = ValueHead(4, rngs=nnx.Rngs(0))
      >>> head(jnp.ones((2, 3, 4))).shape
      (2, 3)
    """

    def __init__(self, dim: int, *, param_dtype: Any = jnp.float32, rngs: nnx.Rngs):
        self.kernel = make_param(rngs.params(), (dim, 1), ("embed", None), param_dtype, "normal")

    def __call__(self, hidden: Array) -> Array:
        kernel = compute_weight(self.kernel, jnp.float32)  # [D, 1], gathered from FSDP shards
        return (hidden.astype(jnp.float32) @ kernel)[..., 0]


class ValueModel(nnx.Module):
    """Decoder backbone + `ValueHead`: one float32 value per token, `[N, S]`.

    A sequence-level reward is the value at the last real token of each row.

    Examples:
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> critic = ValueModel(cfg, rngs=nnx.Rngs(0))
      >>> critic(jnp.array([[1, 2, 3]]), jnp.arange(3)[None]).shape
      (1, 3)
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: Any = jnp.float32,
        param_dtype: Any = jnp.float32,
        remat: Remat = "dots",
        attention_chunk: int | None = None,
        fused_attention: bool = False,
        rngs: nnx.Rngs,
    ):
        self.backbone = Decoder(
            config,
            dtype=dtype,
            param_dtype=param_dtype,
            remat=remat,
            lm_head=False,
            attention_chunk=attention_chunk,
            fused_attention=fused_attention,
            rngs=rngs,
        )
        self.head = ValueHead(config.hidden_size, param_dtype=param_dtype, rngs=rngs)
        self.config = config
        self.param_dtype = param_dtype

    def __call__(
        self,
        tokens: Array,
        positions: Array,
        *,
        attention_mask: Array | None = None,
        segment_ids: Array | None = None,
    ) -> Array:
        """Float32 values `[N, S]` of `tokens[N, S]`."""
        hidden = self.backbone.hidden_states(
            tokens, positions, attention_mask=attention_mask, segment_ids=segment_ids
        )
        return self.head(hidden)
