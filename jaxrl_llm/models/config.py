"""`ModelConfig`: the architecture of a decoder-only LM, read from a Hugging Face `config.json`.

Supported families (the HF `model_type`): `llama` (incl. Llama 3 rope scaling), `qwen2`
(attention biases), `qwen3` (QK-norm), `gemma` (`1 + w` RMSNorm, embeddings scaled by
`sqrt(D)`, GeGLU, tied embeddings), `gemma2` (plus logit soft-capping, alternating sliding-window
layers, pre/post "sandwich" norms) and `gemma3_text` (plus QK-norm and a separate rope for the
sliding layers). Any other `model_type`, and any option these families can set that we do not
implement (other rope types, MLP biases, bidirectional attention, partial rotary), raises a
`ValueError` that names it, so a checkpoint never loads into a model that computes something
else.

`transformers.AutoConfig` parses the file: it normalises legacy keys (`rope_scaling` and
`rope_theta` become `rope_parameters`, a missing `layer_types` is derived), so we read one
format only.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Literal

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
LayerType = Literal["full_attention", "sliding_attention"]
Activation = Literal["silu", "gelu_tanh", "gelu"]

_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}
# the reward-model / critic class (transformers' MODEL_FOR_SEQUENCE_CLASSIFICATION names):
# text-only Gemma 3's is Gemma3Text…, Gemma3ForSequenceClassification being the multimodal one
_SCORER_ARCHITECTURES = {
    "llama": "LlamaForSequenceClassification",
    "qwen2": "Qwen2ForSequenceClassification",
    "qwen3": "Qwen3ForSequenceClassification",
    "gemma": "GemmaForSequenceClassification",
    "gemma2": "Gemma2ForSequenceClassification",
    "gemma3_text": "Gemma3TextForSequenceClassification",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeConfig:
    """Rotary embedding frequencies: `inv_freq[i] = theta ** (-2i / head_dim)`, then rescaled.

    `kind="default"` uses them as is; `"linear"` divides them by `factor` (position
    interpolation); `"llama3"` divides the low frequencies by `factor` and interpolates smoothly
    between `low_freq_factor` and `high_freq_factor` (wavelengths measured against
    `original_max_position_embeddings`), as Llama 3.1 does.

    Examples:
      >>> RopeConfig(theta=500000.0, kind="llama3", factor=8.0).kind
      'llama3'
    """

    theta: float = 10000.0
    kind: Literal["default", "linear", "llama3"] = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ("default", "linear", "llama3"):
            raise ValueError(
                f"RopeConfig: unsupported rope type {self.kind!r}; supported: "
                "'default', 'linear', 'llama3'."
            )
        if self.theta <= 0 or self.factor <= 0:
            raise ValueError(f"RopeConfig: theta and factor must be > 0, got {self}.")
        if self.kind == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("RopeConfig: llama3 scaling needs high_freq_factor > low_freq_factor.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of one decoder-only LM (shape letters: V vocab, D width, L layers).

    Fields mirror the Hugging Face config names where one exists. `layer_types[l]` says whether
    layer `l` attends to all earlier tokens or only to the last `sliding_window` positions.
    The attention scale is `query_pre_attn_scalar ** -0.5` when that is set (Gemma 2/3), else
    `head_dim ** -0.5`.

    Examples:
      >>> cfg = ModelConfig(family="llama", vocab_size=128, hidden_size=32, intermediate_size=64,
      ...                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
      >>> cfg.layer_types, cfg.attention_scale
      (('full_attention', 'full_attention'), 0.3535533905932738)
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    activation: Activation = "silu"
    rope: RopeConfig = RopeConfig()
    local_rope: RopeConfig | None = None  # gemma3: rope of the sliding layers
    layer_types: tuple[LayerType, ...] = ()  # () = all "full_attention"
    sliding_window: int | None = None
    attention_bias: bool = False  # biases on q, k, v and o (qwen2: always on q, k, v only)
    tie_embeddings: bool = False
    query_pre_attn_scalar: float | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    max_position_embeddings: int = 8192
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.family not in SUPPORTED_FAMILIES:
            raise ValueError(_unsupported_family(self.family))
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_layers)
        _validate(self)

    @property
    def qkv_bias(self) -> bool:
        """Whether the q, k and v projections have biases (always for qwen2)."""
        return self.family == "qwen2" or self.attention_bias

    @property
    def o_bias(self) -> bool:
        """Whether the output projection has a bias (never for qwen2)."""
        return self.attention_bias and self.family != "qwen2"

    @property
    def qk_norm(self) -> bool:
        """RMSNorm over `head_dim` on queries and keys before rotary (qwen3, gemma3)."""
        return self.family in ("qwen3", "gemma3_text")

    @property
    def norm_plus_one(self) -> bool:
        """Gemma's RMSNorm multiplies by `1 + w` (weights stored as offsets from 1)."""
        return self.family.startswith("gemma")

    @property
    def embed_scale(self) -> bool:
        """Gemma multiplies the token embeddings by `sqrt(D)`."""
        return self.family.startswith("gemma")

    @property
    def sandwich_norm(self) -> bool:
        """Gemma 2/3 also normalise the attention and MLP outputs before the residual add."""
        return self.family in ("gemma2", "gemma3_text")

    @property
    def attention_scale(self) -> float:
        """Multiplier of `q·k` before the softmax."""
        base = self.query_pre_attn_scalar or self.head_dim
        return float(base) ** -0.5

    @property
    def architecture(self) -> str:
        """The `transformers` class name written to `config.json` (`architectures`)."""
        return _ARCHITECTURES[self.family]

    @property
    def scorer_architecture(self) -> str:
        """The `*ForSequenceClassification` class name of a `ValueModel` export."""
        return _SCORER_ARCHITECTURES[self.family]

    @classmethod
    def from_hf(cls, hf_config: Any) -> ModelConfig:
        """Build from a `transformers.PretrainedConfig` or a `config.json` mapping."""
        return _from_hf(hf_config)

    @classmethod
    def from_json_file(cls, path: str | pathlib.Path) -> ModelConfig:
        """Read `config.json` (or the `config.json` inside a checkpoint directory)."""
        path = pathlib.Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"no config.json at {path}")
        try:
            mapping = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from err
        if not isinstance(mapping, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(mapping).__name__}")
        return _from_hf(mapping)

    def to_hf_dict(self, *, dtype: str = "float32") -> dict[str, Any]:
        """The `config.json` mapping that `transformers` reads back into the same architecture."""
        from jaxrl_llm.models._hf_config import to_hf_dict

        return to_hf_dict(self, dtype=dtype)


def _unsupported_family(family: str) -> str:
    return (
        f"unsupported model_type {family!r}; supported families: {', '.join(SUPPORTED_FAMILIES)}."
    )


def _validate(cfg: ModelConfig) -> None:
    positive = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads")
    for name in (*positive, "num_kv_heads", "head_dim"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}.")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(
            f"ModelConfig: num_heads={cfg.num_heads} is not a multiple of "
            f"num_kv_heads={cfg.num_kv_heads} (grouped-query attention needs whole groups)."
        )
    if cfg.head_dim % 2:
        raise ValueError(f"ModelConfig.head_dim must be even for rotary, got {cfg.head_dim}.")
    if cfg.activation not in ("silu", "gelu_tanh", "gelu"):
        raise ValueError(f"ModelConfig.activation: unsupported {cfg.activation!r}.")
    if len(cfg.layer_types) != cfg.num_layers:
        raise ValueError(
            f"ModelConfig.layer_types has {len(cfg.layer_types)} entries for "
            f"{cfg.num_layers} layers."
        )
    bad = sorted(set(cfg.layer_types) - {"full_attention", "sliding_attention"})
    if bad:
        raise ValueError(
            f"ModelConfig.layer_types: unsupported {bad}; supported: full_attention, "
            "sliding_attention."
        )
    if "sliding_attention" in cfg.layer_types and not cfg.sliding_window:
        raise ValueError("ModelConfig: sliding_attention layers need a positive sliding_window.")


def _from_hf(hf_config: Any) -> ModelConfig:
    from jaxrl_llm.models._hf_config import from_hf

    return from_hf(hf_config)
