"""`ModelConfig` from Hugging Face configs: legacy keys, per-family traits, round trips."""

from __future__ import annotations

import pytest

from jaxrl_llm.models import ModelConfig, RopeConfig
from tests.models.conftest import FAMILIES, hf_config


@pytest.mark.parametrize("family", FAMILIES)
def test_to_hf_dict_round_trips(family):
    config = ModelConfig.from_hf(hf_config(family))
    assert ModelConfig.from_hf(config.to_hf_dict()) == config


def test_legacy_rope_keys_and_derived_layer_types():
    legacy = {
        "model_type": "llama",
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "eos_token_id": [128001, 128009],
    }
    config = ModelConfig.from_hf(legacy)
    assert config.rope == RopeConfig(
        theta=500000.0, kind="llama3", factor=32.0, original_max_position_embeddings=8192
    )
    assert config.head_dim == 4 and config.eos_token_id == (128001, 128009)
    gemma2 = ModelConfig.from_hf(hf_config("gemma2", num_hidden_layers=4, layer_types=None))
    assert gemma2.layer_types == ("sliding_attention", "full_attention") * 2


def test_family_traits():
    traits = {f: ModelConfig.from_hf(hf_config(f)) for f in FAMILIES}
    assert traits["qwen2"].qkv_bias and not traits["qwen2"].o_bias
    assert traits["llama"].qkv_bias and traits["llama"].o_bias  # attention_bias=True in tests
    assert [f for f, c in traits.items() if c.qk_norm] == ["qwen3", "gemma3_text"]
    assert [f for f, c in traits.items() if c.sandwich_norm] == ["gemma2", "gemma3_text"]
    assert all(c.norm_plus_one == c.embed_scale == f.startswith("gemma") for f, c in traits.items())
    assert traits["gemma2"].attention_scale == 16**-0.5
    assert traits["gemma3_text"].local_rope == RopeConfig(theta=10000.0)


def test_keys_transformers_ignores_for_a_family_are_ignored_here_too():
    """A stray Gemma 2 key in a Llama / Qwen / Gemma 1 config.json changed our logits (0.2-6.0
    off transformers') while transformers never reads it for that family."""
    stray = {
        "query_pre_attn_scalar": 1,
        "attn_logit_softcapping": 0.5,
        "final_logit_softcapping": 0.5,
    }
    for family in ("llama", "qwen2", "qwen3", "gemma"):
        plain = ModelConfig.from_hf(hf_config(family).to_dict())
        assert ModelConfig.from_hf({**hf_config(family).to_dict(), **stray}) == plain, family
    gemma2 = ModelConfig.from_hf({**hf_config("gemma2").to_dict(), **stray})
    assert (gemma2.query_pre_attn_scalar, gemma2.attn_logit_softcap) == (1, 0.5)
    assert gemma2.final_logit_softcap == 0.5


def test_what_transformers_would_rewrite_or_reject_is_a_value_error():
    import dataclasses

    gemma = ModelConfig.from_hf(hf_config("gemma"))
    with pytest.raises(ValueError, match="Gemma runs the tanh GELU whatever hidden_act says"):
        dataclasses.replace(gemma, activation="gelu").to_hf_dict()
    linear_without_factor = {"rope_type": "linear", "rope_theta": 1e4}
    with pytest.raises(ValueError, match=r"llama config: .*factor"):  # a KeyError in transformers
        ModelConfig.from_hf(
            {**hf_config("llama").to_dict(), "rope_parameters": linear_without_factor}
        )
