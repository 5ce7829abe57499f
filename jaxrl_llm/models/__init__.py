"""Flax NNX decoder-only language models with Hugging Face checkpoint import and export.

Families: llama, qwen2, qwen3, gemma, gemma2, gemma3_text (see `ModelConfig`). Load a local
checkpoint with `from_pretrained(path, dtype=..., param_dtype=..., mesh=...)`, write one back
with `save_pretrained(model, path)`; decode with a `KVCache`; score with a `ValueModel`; adapt
with LoRA (`add_lora(model, LoRAConfig(...))`, folded back by `merge_lora` / `save_pretrained`).
"""

from jaxrl_llm.models.cache import (
    CACHE_KEY_AXES,
    CACHE_VALUE_AXES,
    KVCache,
    positions_from_mask,
    positions_from_segments,
)
from jaxrl_llm.models.config import SUPPORTED_FAMILIES, ModelConfig, RopeConfig
from jaxrl_llm.models.decoder import Decoder, check_fused_attention
from jaxrl_llm.models.hf_io import copy_side_files, from_pretrained, save_pretrained
from jaxrl_llm.models.lora import LORA_PATTERN, LoRAConfig, add_lora, has_lora, merge_lora
from jaxrl_llm.models.value import ValueHead, ValueModel

__all__ = [
    "CACHE_KEY_AXES",
    "CACHE_VALUE_AXES",
    "LORA_PATTERN",
    "SUPPORTED_FAMILIES",
    "Decoder",
    "KVCache",
    "LoRAConfig",
    "ModelConfig",
    "RopeConfig",
    "ValueHead",
    "ValueModel",
    "add_lora",
    "check_fused_attention",
    "copy_side_files",
    "from_pretrained",
    "has_lora",
    "merge_lora",
    "positions_from_mask",
    "positions_from_segments",
    "save_pretrained",
]
