"""Name and layout mapping between our parameters and Hugging Face `*ForCausalLM` tensors.

Each of our parameters (a path in the model's `nnx.State`, e.g. `layers.attn.q`) corresponds to
one HF tensor, or to one per layer for the stacked `layers.*` parameters (`{i}` in the name):

| ours (per layer)               | shape         | Hugging Face                                    |
|--------------------------------|---------------|-------------------------------------------------|
| `embed`                        | `[V, D]`      | `model.embed_tokens.weight`                     |
| `layers.attn.q` / `k` / `v`    | `[D, H|K, Hd]`| `model.layers.{i}.self_attn.{q,k,v}_proj.weight`|
| `layers.attn.o`                | `[H, Hd, D]`  | `model.layers.{i}.self_attn.o_proj.weight`      |
| `layers.attn.{q,k,v,o}_bias`   | `[H|K, Hd]`   | `model.layers.{i}.self_attn.{q,k,v,o}_proj.bias`|
| `layers.attn.{q,k}_norm.scale` | `[Hd]`        | `model.layers.{i}.self_attn.{q,k}_norm.weight`  |
| `layers.attn_norm.scale`       | `[D]`         | `model.layers.{i}.input_layernorm.weight`       |
| `layers.mlp_norm.scale`        | `[D]`         | `post_attention_layernorm` (Llama, Qwen, Gemma) or `pre_feedforward_layernorm` (Gemma 2/3) |
| `layers.attn_post_norm.scale`  | `[D]`         | `post_attention_layernorm` (Gemma 2/3)          |
| `layers.mlp_post_norm.scale`   | `[D]`         | `post_feedforward_layernorm` (Gemma 2/3)        |
| `layers.mlp.gate` / `up`       | `[D, F]`      | `model.layers.{i}.mlp.{gate,up}_proj.weight`    |
| `layers.mlp.down`              | `[F, D]`      | `model.layers.{i}.mlp.down_proj.weight`         |
| `final_norm.scale`             | `[D]`         | `model.norm.weight`                             |
| `lm_head`                      | `[D, V]`      | `lm_head.weight` (absent when tied)             |

A "linear" tensor is stored by torch as `[out, in]`; ours is `hf.T` reshaped so the input
axes come first (`n_in` of them: 2 for `o`, 1 otherwise). Everything else is a plain reshape.
Gemma's norm weights are stored as offsets from 1 in both formats, so they copy unchanged.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxrl_llm.models.config import ModelConfig

_LAYER = "model.layers.{i}."
# Tensors that some checkpoints carry but that hold no parameters (recomputed buffers).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """How one of our parameters maps to HF tensors.

    `path` is the dotted path in our state, `hf` the HF name (with `{i}` when `layered`),
    `shape` our per-layer shape, `n_in` the number of leading input axes of a linear kernel
    (0 for a plain tensor, which HF stores flattened unless `keep_shape`).
    """

    path: str
    hf: str
    layered: bool
    shape: tuple[int, ...]
    n_in: int
    keep_shape: bool = False

    @property
    def hf_shape(self) -> tuple[int, ...]:
        """Shape of one HF tensor (`[out, in]` for linear kernels)."""
        if not self.n_in:
            return self.shape if self.keep_shape else (math.prod(self.shape),)
        return (math.prod(self.shape[self.n_in :]), math.prod(self.shape[: self.n_in]))

    def hf_names(self, num_layers: int) -> list[str]:
        """The HF tensor names, one per layer when `layered`."""
        if self.layered:
            return [self.hf.format(i=i) for i in range(num_layers)]
        return [self.hf]

    def to_ours(self, hf_tensor: np.ndarray) -> np.ndarray:
        """One HF tensor in our per-layer layout."""
        if self.n_in:
            return hf_tensor.T.reshape(self.shape)
        return hf_tensor.reshape(self.shape)

    def to_hf(self, ours: np.ndarray) -> np.ndarray:
        """One per-layer value of ours in the HF layout (contiguous)."""
        if self.n_in:
            n_in = math.prod(self.shape[: self.n_in])
            return np.ascontiguousarray(ours.reshape(n_in, -1).T)
        return np.ascontiguousarray(ours.reshape(self.hf_shape))


def _norm_names(config: ModelConfig) -> dict[str, str]:
    if config.sandwich_norm:
        return {
            "attn_norm": "input_layernorm",
            "attn_post_norm": "post_attention_layernorm",
            "mlp_norm": "pre_feedforward_layernorm",
            "mlp_post_norm": "post_feedforward_layernorm",
        }
    return {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def tensor_maps(config: ModelConfig, *, lm_head: bool = True) -> list[TensorMap]:
    """Every parameter of a `Decoder(config)` with its HF counterpart.

    Examples:
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> q = {m.path: m for m in tensor_maps(cfg)}["layers.attn.q"]
      >>> q.hf.format(i=1), q.shape, q.hf_shape
      ('model.layers.1.self_attn.q_proj.weight', (8, 2, 4), (8, 8))
    """
    V, D, F = config.vocab_size, config.hidden_size, config.intermediate_size
    H, K, Hd = config.num_heads, config.num_kv_heads, config.head_dim
    maps = [TensorMap("embed", "model.embed_tokens.weight", False, (V, D), 0, keep_shape=True)]
    attn = _LAYER + "self_attn."
    for name, heads in (("q", H), ("k", K), ("v", K)):
        maps.append(
            TensorMap(f"layers.attn.{name}", f"{attn}{name}_proj.weight", True, (D, heads, Hd), 1)
        )
        if config.qkv_bias:
            maps.append(
                TensorMap(
                    f"layers.attn.{name}_bias", f"{attn}{name}_proj.bias", True, (heads, Hd), 0
                )
            )
    maps.append(TensorMap("layers.attn.o", f"{attn}o_proj.weight", True, (H, Hd, D), 2))
    if config.o_bias:
        maps.append(TensorMap("layers.attn.o_bias", f"{attn}o_proj.bias", True, (D,), 0))
    if config.qk_norm:
        for name in ("q_norm", "k_norm"):
            maps.append(
                TensorMap(f"layers.attn.{name}.scale", f"{attn}{name}.weight", True, (Hd,), 0)
            )
    for ours, theirs in _norm_names(config).items():
        maps.append(TensorMap(f"layers.{ours}.scale", f"{_LAYER}{theirs}.weight", True, (D,), 0))
    for name, shape in (("gate", (D, F)), ("up", (D, F)), ("down", (F, D))):
        maps.append(
            TensorMap(f"layers.mlp.{name}", f"{_LAYER}mlp.{name}_proj.weight", True, shape, 1)
        )
    maps.append(TensorMap("final_norm.scale", "model.norm.weight", False, (D,), 0))
    if lm_head and not config.tie_embeddings:
        maps.append(TensorMap("lm_head", "lm_head.weight", False, (D, V), 1))
    return maps


def value_head_map(config: ModelConfig) -> TensorMap:
    """`head.kernel [D, 1]` of a `ValueModel` ↔ `score.weight [1, D]` (`*ForSequenceClassification`)."""
    return TensorMap("head.kernel", "score.weight", False, (config.hidden_size, 1), 1)


def check_names(
    maps: list[TensorMap], available: set[str], num_layers: int, *, ignore: set[str] = frozenset()
) -> None:
    """Raise `ValueError` listing missing and unexpected tensors (none of them loaded yet).

    `ignore` names tensors that may be present without being loaded (a redundant
    `lm_head.weight` of tied embeddings, the LM head when loading a critic backbone); buffers
    such as `rotary_emb.inv_freq` are always ignored.
    """
    expected = {name for m in maps for name in m.hf_names(num_layers)}
    ignorable = {n for n in available if n.endswith(IGNORED_SUFFIXES)} | (ignore & available)
    missing = sorted(expected - available)
    unexpected = sorted(available - expected - ignorable)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors ({len(missing)}): {_preview(missing)}")
        if unexpected:
            parts.append(f"unexpected tensors ({len(unexpected)}): {_preview(unexpected)}")
        raise ValueError("checkpoint does not match the config: " + "; ".join(parts))


def _preview(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... ({len(names) - limit} more)"
