"""Translation between `ModelConfig` and Hugging Face `config.json` (via `transformers` configs).

Reading goes through `transformers.AutoConfig.for_model`, which normalises legacy keys, so only
the current format (`rope_parameters`, `layer_types`) is read here. Options that change the
computation and that we do not implement are rejected by name.
"""

from __future__ import annotations

from typing import Any

from jaxrl_llm.models.config import (
    _ACTIVATIONS,
    SUPPORTED_FAMILIES,
    ModelConfig,
    RopeConfig,
    _unsupported_family,
)

_ACTIVATION_KEY = {
    "llama": "hidden_act",
    "qwen2": "hidden_act",
    "qwen3": "hidden_act",
    "gemma": "hidden_act",
    "gemma2": "hidden_activation",
    "gemma3_text": "hidden_activation",
}
_HF_ACTIVATION = {ours: theirs for theirs, ours in _ACTIVATIONS.items()}
_NO_SLIDING = ("llama", "gemma")  # families whose transformers attention has no window


_GEMMA_2_3 = ("gemma2", "gemma3_text")


def _parse(hf_config: Any) -> dict[str, Any]:
    """A normalised `config.json` mapping (unknown families rejected before transformers sees them)."""
    import transformers

    if isinstance(hf_config, transformers.PretrainedConfig):
        family = hf_config.model_type
        raw = None
    elif isinstance(hf_config, dict):
        family = hf_config.get("model_type")
        raw = hf_config
    else:
        raise ValueError(
            f"expected a transformers config or a config.json mapping, got {type(hf_config)}."
        )
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(_unsupported_family(family))
    if raw is not None:
        kwargs = {k: v for k, v in raw.items() if k != "model_type"}
        try:  # transformers' own checks raise KeyError / TypeError for some keys (rope's)
            hf_config = transformers.AutoConfig.for_model(family, **kwargs)
        except (KeyError, TypeError) as err:
            raise ValueError(f"{family} config: {err}") from err
    return hf_config.to_dict()


def _rope(params: dict[str, Any], where: str) -> RopeConfig:
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear", "llama3"):
        raise ValueError(
            f"{where}: unsupported rope type {kind!r} (supported: default, linear, llama3)."
        )
    partial = params.get("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor={partial} is not supported.")
    extra = {}
    if kind in ("linear", "llama3"):
        extra["factor"] = float(params["factor"])
    if kind == "llama3":
        extra["low_freq_factor"] = float(params["low_freq_factor"])
        extra["high_freq_factor"] = float(params["high_freq_factor"])
        extra["original_max_position_embeddings"] = int(params["original_max_position_embeddings"])
    return RopeConfig(theta=float(params["rope_theta"]), kind=kind, **extra)


def _reject_unsupported(d: dict[str, Any], family: str) -> None:
    problems = []
    if d.get("mlp_bias"):
        problems.append("mlp_bias=true")
    if d.get("use_bidirectional_attention"):
        problems.append("use_bidirectional_attention=true")
    if d.get("attention_dropout", 0.0):
        problems.append(f"attention_dropout={d['attention_dropout']} (dropout is not implemented)")
    if d.get("quantization_config"):
        method = d["quantization_config"]
        method = method.get("quant_method", method) if isinstance(method, dict) else method
        problems.append(f"quantization_config ({method!r}: quantized checkpoints are not read)")
    if d.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append(f"partial_rotary_factor={d['partial_rotary_factor']}")
    act = d.get(_ACTIVATION_KEY[family])
    if act not in _ACTIVATIONS:
        problems.append(f"{_ACTIVATION_KEY[family]}={act!r} (supported: {', '.join(_ACTIVATIONS)})")
    if problems:
        raise ValueError(f"{family} config: unsupported options: {'; '.join(problems)}.")


def from_hf(hf_config: Any) -> ModelConfig:
    """`ModelConfig` from a `transformers` config or a raw `config.json` mapping."""
    d = _parse(hf_config)
    family = d["model_type"]
    _reject_unsupported(d, family)
    rope_params = d["rope_parameters"]
    local_rope = None
    if family == "gemma3_text":
        rope = _rope(rope_params["full_attention"], f"{family} full_attention rope")
        local_rope = _rope(rope_params["sliding_attention"], f"{family} sliding_attention rope")
    else:
        rope = _rope(rope_params, f"{family} rope")
    layer_types = tuple(d.get("layer_types") or ("full_attention",) * d["num_hidden_layers"])
    if family in _NO_SLIDING:  # transformers' llama and gemma read no window, whatever
        layer_types = ("full_attention",) * d["num_hidden_layers"]  # `layer_types` says
    sliding = "sliding_attention" in layer_types
    eos = d.get("eos_token_id")
    return ModelConfig(
        family=family,
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_layers=d["num_hidden_layers"],
        num_heads=d["num_attention_heads"],
        num_kv_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
        head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
        rms_norm_eps=float(d["rms_norm_eps"]),
        activation=_ACTIVATIONS[d[_ACTIVATION_KEY[family]]],
        rope=rope,
        local_rope=local_rope,
        layer_types=layer_types,
        sliding_window=d.get("sliding_window") if sliding else None,
        attention_bias=bool(d.get("attention_bias", False)) and family != "qwen2",
        tie_embeddings=bool(d.get("tie_word_embeddings", False)),
        # only Gemma 2 and 3 use these keys in transformers (a stray one elsewhere is ignored
        # there, so here too); Gemma 3 reads the attention soft-cap but never applies it
        query_pre_attn_scalar=d.get("query_pre_attn_scalar") if family in _GEMMA_2_3 else None,
        attn_logit_softcap=d.get("attn_logit_softcapping") if family == "gemma2" else None,
        final_logit_softcap=d.get("final_logit_softcapping") if family in _GEMMA_2_3 else None,
        max_position_embeddings=d.get("max_position_embeddings") or 8192,
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        pad_token_id=d.get("pad_token_id"),
    )


def _rope_dict(rope: RopeConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_type": rope.kind, "rope_theta": rope.theta}
    if rope.kind in ("linear", "llama3"):
        out["factor"] = rope.factor
    if rope.kind == "llama3":
        out["low_freq_factor"] = rope.low_freq_factor
        out["high_freq_factor"] = rope.high_freq_factor
        out["original_max_position_embeddings"] = rope.original_max_position_embeddings
    return out


def _family_kwargs(cfg: ModelConfig) -> dict[str, Any]:
    sliding = "sliding_attention" in cfg.layer_types
    out: dict[str, Any] = {_ACTIVATION_KEY[cfg.family]: _HF_ACTIVATION[cfg.activation]}
    if cfg.family != "qwen2":
        out["attention_bias"] = cfg.attention_bias
    if cfg.family in ("qwen2", "qwen3"):
        out["use_sliding_window"] = sliding
    if cfg.family in ("qwen2", "qwen3", "gemma2", "gemma3_text"):
        out["layer_types"] = list(cfg.layer_types)
        out["sliding_window"] = cfg.sliding_window
        if cfg.family.startswith("gemma") and cfg.sliding_window is None:
            # transformers' Gemma 2/3 build a window mask whatever `layer_types` says;
            # one as long as the context changes nothing (every layer is full here)
            out["sliding_window"] = cfg.max_position_embeddings
    elif sliding:
        raise ValueError(f"{cfg.family} has no sliding-window layers in transformers.")
    if cfg.family == "gemma3_text" and cfg.attn_logit_softcap:
        raise ValueError(
            "gemma3_text has no attention logit soft-capping in transformers (its "
            "attn_logit_softcapping key is read and never applied)."
        )
    if cfg.family.startswith("gemma") and cfg.family != "gemma":
        scalar = cfg.query_pre_attn_scalar or cfg.head_dim  # None: the scale is head_dim ** -0.5
        if scalar != int(scalar):
            raise ValueError(
                f"{cfg.family}: transformers takes an integer query_pre_attn_scalar, got {scalar}."
            )
        out["query_pre_attn_scalar"] = int(scalar)
        out["attn_logit_softcapping"] = cfg.attn_logit_softcap
        out["final_logit_softcapping"] = cfg.final_logit_softcap
    elif cfg.query_pre_attn_scalar or cfg.attn_logit_softcap or cfg.final_logit_softcap:
        raise ValueError(
            f"{cfg.family} has no query_pre_attn_scalar or logit soft-capping in transformers."
        )
    if cfg.family == "gemma3_text":
        local = cfg.local_rope or cfg.rope
        out["rope_parameters"] = {
            "full_attention": _rope_dict(cfg.rope),
            "sliding_attention": _rope_dict(local),
        }
    else:
        out["rope_parameters"] = _rope_dict(cfg.rope)
    return out


def to_hf_dict(cfg: ModelConfig, *, dtype: str = "float32") -> dict[str, Any]:
    """The `config.json` mapping for `cfg`, built and normalised by `transformers`."""
    import transformers

    hf = transformers.AutoConfig.for_model(cfg.family, **hf_kwargs(cfg, dtype=dtype))
    hf.architectures = [cfg.architecture]
    return hf.to_dict()


def hf_kwargs(cfg: ModelConfig, *, dtype: str = "float32") -> dict[str, Any]:
    """The `transformers` config arguments for `cfg`, without importing `transformers`; a
    ValueError names what `transformers` cannot express (checked when a run's config loads)."""
    if cfg.family == "qwen2" and cfg.attention_bias:
        raise ValueError("qwen2 has fixed biases (q, k, v); attention_bias must be False.")
    if cfg.family == "gemma" and cfg.activation == "gelu":  # GemmaConfig rewrites it
        raise ValueError(
            "gemma: transformers' Gemma runs the tanh GELU whatever hidden_act says; use "
            "activation 'gelu_tanh' (exact 'gelu' is for Gemma 2 and 3)."
        )
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_id)
        if isinstance(cfg.eos_token_id, tuple)
        else cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "dtype": dtype,
        **_family_kwargs(cfg),
    }
