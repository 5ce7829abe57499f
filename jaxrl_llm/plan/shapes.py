"""Model presets and the `Decoder`'s parameter layout, for planning without allocating."""

from __future__ import annotations

import math
import pathlib
from typing import Any, NamedTuple

from jax.sharding import AbstractMesh, NamedSharding

from jaxrl_llm.models.config import ModelConfig, RopeConfig
from jaxrl_llm.models.lora import INPUT_AXES
from sharding import LOGICAL_AXIS_RULES, logical_to_spec

# ------------------------------------------------------------------------------ model presets

_LLAMA31_ROPE = RopeConfig(theta=500000.0, kind="llama3", factor=8.0)
_LLAMA32_ROPE = RopeConfig(theta=500000.0, kind="llama3", factor=32.0)


def _preset(family: str, V: int, D: int, F: int, L: int, H: int, K: int, Hd: int, **kw: Any):
    return {
        "family": family,
        "vocab_size": V,
        "hidden_size": D,
        "intermediate_size": F,
        "num_layers": L,
        "num_heads": H,
        "num_kv_heads": K,
        "head_dim": Hd,
        **kw,
    }


_QWEN = {"rope": RopeConfig(theta=1e6), "rms_norm_eps": 1e-6}
_LLAMA3 = {"rope": RopeConfig(theta=500000.0), "rms_norm_eps": 1e-5}

# Public architecture numbers (the checkpoints' config.json), for planning without a download.
PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": _preset("qwen2", 151936, 896, 4864, 24, 14, 2, 64, tie_embeddings=True, **_QWEN),
    "qwen2.5-1.5b": _preset("qwen2", 151936, 1536, 8960, 28, 12, 2, 128, tie_embeddings=True, **_QWEN),
    "qwen2.5-3b": _preset("qwen2", 151936, 2048, 11008, 36, 16, 2, 128, tie_embeddings=True, **_QWEN),
    "qwen2.5-7b": _preset("qwen2", 152064, 3584, 18944, 28, 28, 4, 128, **_QWEN),
    "qwen2.5-14b": _preset("qwen2", 152064, 5120, 13824, 48, 40, 8, 128, **_QWEN),
    "qwen2.5-32b": _preset("qwen2", 152064, 5120, 27648, 64, 40, 8, 128, **_QWEN),
    "qwen2.5-72b": _preset("qwen2", 152064, 8192, 29568, 80, 64, 8, 128, **_QWEN),
    "qwen3-0.6b": _preset("qwen3", 151936, 1024, 3072, 28, 16, 8, 128, tie_embeddings=True, **_QWEN),
    "qwen3-1.7b": _preset("qwen3", 151936, 2048, 6144, 28, 16, 8, 128, tie_embeddings=True, **_QWEN),
    "qwen3-4b": _preset("qwen3", 151936, 2560, 9728, 36, 32, 8, 128, tie_embeddings=True, **_QWEN),
    "qwen3-8b": _preset("qwen3", 151936, 4096, 12288, 36, 32, 8, 128, **_QWEN),
    "qwen3-14b": _preset("qwen3", 151936, 5120, 17408, 40, 40, 8, 128, **_QWEN),
    "qwen3-32b": _preset("qwen3", 151936, 5120, 25600, 64, 64, 8, 128, **_QWEN),
    "llama-3-8b": _preset("llama", 128256, 4096, 14336, 32, 32, 8, 128, **_LLAMA3),
    "llama-3-70b": _preset("llama", 128256, 8192, 28672, 80, 64, 8, 128, **_LLAMA3),
    "llama-3.1-8b": _preset(
        "llama", 128256, 4096, 14336, 32, 32, 8, 128, rope=_LLAMA31_ROPE, rms_norm_eps=1e-5
    ),
    "llama-3.1-70b": _preset(
        "llama", 128256, 8192, 28672, 80, 64, 8, 128, rope=_LLAMA31_ROPE, rms_norm_eps=1e-5
    ),
    "llama-3.2-1b": _preset(
        "llama", 128256, 2048, 8192, 16, 32, 8, 64, tie_embeddings=True, rope=_LLAMA32_ROPE,
        rms_norm_eps=1e-5,
    ),
    "llama-3.2-3b": _preset(
        "llama", 128256, 3072, 8192, 28, 24, 8, 128, tie_embeddings=True, rope=_LLAMA32_ROPE,
        rms_norm_eps=1e-5,
    ),
}  # fmt: skip


def resolve_model(model: str | pathlib.Path | ModelConfig) -> tuple[str, ModelConfig]:
    """`(name, ModelConfig)` of a preset name, a `config.json` / checkpoint path, or a config.

    Examples:
      >>> name, cfg = resolve_model("llama-3-70b")
      >>> name, cfg.num_layers, cfg.num_kv_heads
      ('llama-3-70b', 80, 8)
    """
    if isinstance(model, ModelConfig):
        return model.family, model
    key = str(model)
    if key.lower() in PRESETS:
        return key.lower(), ModelConfig(**PRESETS[key.lower()])
    path = pathlib.Path(key)
    if path.exists():
        return path.name if path.is_dir() else path.parent.name, ModelConfig.from_json_file(path)
    raise ValueError(
        f"plan: model {key!r} is neither a preset nor an existing config.json / checkpoint "
        f"directory; presets: {', '.join(PRESETS)}."
    )


# ------------------------------------------------------------------------------ parameters


class ParamShape(NamedTuple):
    """One parameter of a `Decoder`: its state path, shape and logical axis names.

    Examples:
      >>> ParamShape("embed", (11, 8), ("vocab", "embed")).shape
      (11, 8)
    """

    path: str
    shape: tuple[int, ...]
    names: tuple[str | None, ...]


def parameter_shapes(config: ModelConfig) -> tuple[ParamShape, ...]:
    """Every parameter of `Decoder(config)` with its shape and logical axes (docs/models.md).

    Per layer: `q [D,H,Hd]`, `k, v [D,K,Hd]`, `o [H,Hd,D]`, `gate, up [D,F]`, `down [F,D]`, two
    RMSNorm scales `[D]` (four with Gemma 2/3 sandwich norms), biases on q/k/v (Qwen2, or
    `attention_bias`) and o (`attention_bias`, not Qwen2), QK-norm scales `[Hd]` (Qwen3,
    Gemma 3); stacked with a leading `L`. Plus `embed [V,D]`, `final_norm [D]`, and an untied
    `lm_head [D,V]`.

    Examples:
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> sum(math.prod(p.shape) for p in parameter_shapes(cfg))
      1368
    """
    V, D, F = config.vocab_size, config.hidden_size, config.intermediate_size
    L, H, K, Hd = config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim
    layer = [
        ("attn.q", (D, H, Hd), ("embed", "heads", "head_dim")),
        ("attn.k", (D, K, Hd), ("embed", "kv_heads", "head_dim")),
        ("attn.v", (D, K, Hd), ("embed", "kv_heads", "head_dim")),
        ("attn.o", (H, Hd, D), ("heads", "head_dim", "embed")),
    ]
    if config.qkv_bias:
        layer += [
            ("attn.q_bias", (H, Hd), ("heads", "head_dim")),
            ("attn.k_bias", (K, Hd), ("kv_heads", "head_dim")),
            ("attn.v_bias", (K, Hd), ("kv_heads", "head_dim")),
        ]
    if config.o_bias:
        layer.append(("attn.o_bias", (D,), ("embed",)))
    if config.qk_norm:
        layer += [
            ("attn.q_norm.scale", (Hd,), ("head_dim",)),
            ("attn.k_norm.scale", (Hd,), ("head_dim",)),
        ]
    norms = ["attn_norm", "mlp_norm"]
    if config.sandwich_norm:
        norms += ["attn_post_norm", "mlp_post_norm"]
    layer += [(f"{n}.scale", (D,), ("norm",)) for n in norms]
    layer += [
        ("mlp.gate", (D, F), ("embed", "mlp")),
        ("mlp.up", (D, F), ("embed", "mlp")),
        ("mlp.down", (F, D), ("mlp", "embed")),
    ]
    out = [ParamShape("embed", (V, D), ("vocab", "embed"))]
    out += [ParamShape(f"layers.{p}", (L, *s), ("layers", *n)) for p, s, n in layer]
    out.append(ParamShape("final_norm.scale", (D,), ("norm",)))
    if not config.tie_embeddings:
        out.append(ParamShape("lm_head", (D, V), ("embed", "vocab")))
    return tuple(out)


def lora_shapes(config: ModelConfig, rank: int, dora: bool = False) -> tuple[ParamShape, ...]:
    """The LoRA adapters of `add_lora(Decoder(config), LoRAConfig(rank=rank, use_dora=dora))`
    (every projection: q, k, v, o, gate, up, down): `A [L, *inputs, r]` and `B [L, r, *outputs]`,
    named like their weight with the rank axis unsplit (docs/models.md), and with `dora`
    DoRA's magnitudes `m [L, *outputs]`, named like the outputs.

    Examples:
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> sum(math.prod(p.shape) for p in lora_shapes(cfg, 2))  # 2·2·(2·(8+8) + 2·(8+4) + 3·(8+16))
      512
      >>> sum(math.prod(p.shape) for p in lora_shapes(cfg, 2, dora=True)) - 512  # 2·(8+4+4+8+16+16+8)
      128
    """
    out = []
    for weight in parameter_shapes(config):
        host, _, name = weight.path.removeprefix("layers.").partition(".")
        if host not in ("attn", "mlp") or name not in INPUT_AXES:
            continue
        split = 1 + INPUT_AXES[name]  # the layers axis, then the inputs
        shape, names = weight.shape, weight.names
        out.append(
            ParamShape(f"{weight.path}_lora_a", (*shape[:split], rank), (*names[:split], None))
        )
        out.append(
            ParamShape(
                f"{weight.path}_lora_b",
                (shape[0], rank, *shape[split:]),
                (names[0], None, *names[split:]),
            )
        )
        if dora:
            out.append(
                ParamShape(
                    f"{weight.path}_lora_m", (shape[0], *shape[split:]), (names[0], *names[split:])
                )
            )
    return tuple(out)


def critic_shapes(config: ModelConfig) -> tuple[ParamShape, ...]:
    """The parameters of PPO's separate critic, `ValueModel(config)`: the decoder without its
    LM head (`backbone.*`) and the value head `head.kernel [D, 1]`.

    Examples:
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> [p.path for p in critic_shapes(cfg)][-2:]
      ['backbone.final_norm.scale', 'head.kernel']
    """
    backbone = tuple(
        ParamShape(f"backbone.{p.path}", p.shape, p.names)
        for p in parameter_shapes(config)
        if p.path != "lm_head"
    )
    return (*backbone, ParamShape("head.kernel", (config.hidden_size, 1), ("embed", None)))


def _per_device_elements(params: tuple[ParamShape, ...], mesh: AbstractMesh) -> int:
    total = 0
    for p in params:
        spec = logical_to_spec(p.names, LOGICAL_AXIS_RULES, mesh, shape=p.shape)
        total += math.prod(NamedSharding(mesh, spec).shard_shape(p.shape))
    return total
