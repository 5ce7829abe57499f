"""`jaxrl-llm plan`: per-device memory and a rough time split of one RL iteration, before renting.

Given a model (a preset name, a `config.json`, or a `ModelConfig`), a mesh `(data, fsdp,
tensor)`, the rollout shape and dtypes, `estimate` computes what each device holds and where an
iteration's time goes. Nothing is allocated: parameter shapes and logical axes come from
`parameter_shapes` (the `Decoder`'s layout, checked against the real model by the tests) and
each tensor's per-device size from the same rule table that places the real parameters
(`sharding.LOGICAL_AXIS_RULES`), so a dimension the mesh does not divide is counted replicated,
exactly as it would be.

Notation: mesh `d × f × t` (data, fsdp, tensor), `n = d·f·t` devices; `B` prompts, `G` samples
each, `N = B·G` sequences of `S = P + T` tokens (prompt, completion); `m` sequences per
micro-batch; `L` layers, `D` width, `F` MLP width, `H` / `K` query / KV heads of size `Hd`,
`V` vocabulary. `‖x‖_dev` is the per-device share of `x` under the rule table (≈ `x / (f·t)`
for weights). Bytes: `b_p` parameters, `b_o` optimizer moments, `b_c` compute (activations,
KV cache, sampler weights).

Memory per device (bytes):

    params      = ‖W‖_dev · b_p
    optimizer   = 2 · ‖W‖_dev · b_o                    (AdamW: first and second moments)
    gradients   = ‖W‖_dev · b_p                        (reduce-scattered onto the params' layout)
    reference   = ‖W‖_dev · b_c                        (frozen KL reference, optional)
    layer_bufs  = 2 · ‖W_layer‖_t · b_c                (a layer gathered over fsdp, twice)
    activations = L · a_saved · m/(d·f) · S + a_layer (with remat) + logits
    sampler     = ‖W‖_t · b_c                          (gathered over fsdp, split over tensor)
    kv_cache    = 2 · L · N/(d·f) · S · K_t · Hd · b_c (K_t = K/t if t divides K, else K)

with `‖·‖_t` the share when split over tensor only. Saved activations per token and layer
(`H_t = H/t`, `F_t = F/t`): without remat
`b_c·(4D + 3(H_t + K_t)·Hd + 4F_t) + (4 + b_c)·H_t·S` (norm inputs and outputs, projections,
float32 attention logits and probabilities, MLP gates); `remat="dots"` keeps the matmul outputs
`b_c·(3D + (H_t + 2K_t)·Hd + 2F_t)`; `remat="full"` keeps the layer input `b_c·D`, and both
recompute one layer (`a_layer`, the no-remat figure for one layer) in the backward pass.
Logits: `2 · 4 · V/t` bytes per completion token (float32 logits and their cotangent) over
`min(m/(d·f) · T, logits_chunk)` tokens (only completion positions are scored; the update
step's `chunk_size` positions of `m/(d·f)` rows give `logits_chunk = m/(d·f) · chunk_size`).

Peak = max(sampling phase, training phase). Sampling holds params + optimizer + reference +
sampler weights + KV cache + workspace; training holds params + optimizer + gradients +
reference + layer buffers + activations. The sampling workspace is the larger of the decode
step's `N/(d·f) · (8·V/t + 4·H_t·S)` (float32 logits and their filtered copy, one layer's
attention logits) and the prefill's `⌈B/(d·f)⌉ · P · (b_c·(D + (H_t + 2K_t)·Hd + 2F_t) +
4·H_t·P)` (one layer live).

Time of one iteration (seconds), FLOP-bound phases at `mfu · peak_flops` per device, the
decode loop at `bandwidth_efficiency · hbm_bandwidth`:

    prefill  = B · P · (2·W_mm + 4·L·H·Hd·P) / (n · mfu · peak)
    decode   = T · max(bytes_step / (eff · hbm_bw), flops_step / (mfu · peak))
      bytes_step = ‖W‖_t · b_c + 2·L·N/(d·f)·S·K_t·Hd·b_c        (weights + the whole cache)
      flops_step = N/(d·f) · (2·W_mm/t + 4·L·H_t·Hd·S)
    logprobs = passes · N · S · (2·W_mm + 4·L·H·Hd·S) / (n · mfu · peak)
    training = epochs · N · S · (6·W_mm + 12·L·H·Hd·S) · r / (n · mfu · peak)

Each decode step attends over all `S` slots of the fixed-size cache (masked), as the `Decoder`
does, so the cache term does not shrink for early steps. `W_mm` counts the weights used in
matmuls (all but the embedding lookup; the output projection counts once). `6·W·tokens` is the
usual forward + backward estimate (Kaplan et al., "Scaling Laws for Neural Language Models",
arXiv:2001.08361); `r = 4/3` with full remat (one more forward); `passes` counts the old-policy
forward pass (needed when a rollout feeds more than one optimizer update,
`epochs · minibatches > 1`; on-policy updates reuse the current log-probs) and the reference
policy's (optional).

Collectives of the update are reported separately, as if not overlapped with compute
(`train_comm_s`, per micro-batch, at the bandwidth of the link each mesh axis crosses; devices
are laid out tensor-innermost, so on GPUs an axis stays on NVLink while the product of it and
the axes inside it fits a node):

    fsdp    (g · ‖W‖_t · b_c + ‖W‖_t · b_p) · (f − 1)/f    (g = 2 weight all-gathers, 3 with
                                                           full remat; gradient reduce-scatter)
    data    2 · ‖W‖_dev · b_p · (d − 1)/d                  (gradient all-reduce)
    tensor  g · 2L · 2(t − 1)/t · m/(d·f) · S · D · b_c     (two activation all-reduces a layer)

The decode loop's tensor-parallel all-reduces (`2L` small ones per step) are latency-bound and
not modelled.

This is an estimate to choose a mesh with, not a promise: it ignores XLA's temporary buffers,
fragmentation and host offloading; keep a margin of 10–20% below the HBM size.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
from typing import Any, Literal, NamedTuple

from jax.sharding import AbstractMesh, NamedSharding

from jaxrl_llm.models.config import ModelConfig, RopeConfig
from sharding import LOGICAL_AXIS_RULES, MESH_AXES, logical_to_spec

GiB = 2**30
Remat = Literal["none", "dots", "full"]
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# ------------------------------------------------------------------------------ devices


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """One accelerator's public numbers (dense bf16 FLOP/s, HBM, bandwidths in bytes/s).

    `interconnect_bandwidth` is the one-way per-device bandwidth a collective along one mesh
    axis gets inside a fast domain (`fast_domain` devices: an NVLink node; `None`: the whole
    slice, TPU ICI); `network_bandwidth` applies to axes that leave the fast domain.

    Examples:
      >>> DEVICES["h100"].hbm_bytes / 1e9
      80.0
    """

    name: str
    hbm_bytes: float
    hbm_bandwidth: float
    peak_flops: float
    interconnect_bandwidth: float
    fast_domain: int | None
    network_bandwidth: float


DEVICES: dict[str, DeviceSpec] = {
    # Google Cloud TPU v5p: 459 TFLOP/s bf16, 95 GiB HBM2e at 2765 GB/s, ICI 1200 GB/s per chip
    # (bidirectional, all links); one mesh axis is taken to get a third of the one-way total.
    "tpu-v5p": DeviceSpec(
        name="TPU v5p",
        hbm_bytes=95 * GiB,
        hbm_bandwidth=2765e9,
        peak_flops=459e12,
        interconnect_bandwidth=200e9,
        fast_domain=None,
        network_bandwidth=200e9,
    ),
    # TPU v5e: 197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s, ICI 400 GB/s per chip (bidirectional).
    "tpu-v5e": DeviceSpec(
        name="TPU v5e",
        hbm_bytes=16e9,
        hbm_bandwidth=819e9,
        peak_flops=197e12,
        interconnect_bandwidth=100e9,
        fast_domain=None,
        network_bandwidth=100e9,
    ),
    # NVIDIA H100 SXM: 989 TFLOP/s dense bf16, 80 GB HBM3 at 3.35 TB/s, NVLink 450 GB/s one way
    # inside an 8-GPU node, 400 Gb/s InfiniBand (50 GB/s) per GPU between nodes.
    "h100": DeviceSpec(
        name="H100 SXM",
        hbm_bytes=80e9,
        hbm_bandwidth=3.35e12,
        peak_flops=989e12,
        interconnect_bandwidth=450e9,
        fast_domain=8,
        network_bandwidth=50e9,
    ),
    # NVIDIA H200: the H100's compute with 141 GB HBM3e at 4.8 TB/s.
    "h200": DeviceSpec(
        name="H200",
        hbm_bytes=141e9,
        hbm_bandwidth=4.8e12,
        peak_flops=989e12,
        interconnect_bandwidth=450e9,
        fast_domain=8,
        network_bandwidth=50e9,
    ),
    # NVIDIA A100 80GB SXM: 312 TFLOP/s bf16, 2.04 TB/s, NVLink 300 GB/s one way, 200 Gb/s IB.
    "a100-80gb": DeviceSpec(
        name="A100 80GB",
        hbm_bytes=80e9,
        hbm_bandwidth=2.039e12,
        peak_flops=312e12,
        interconnect_bandwidth=300e9,
        fast_domain=8,
        network_bandwidth=25e9,
    ),
}


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


def _per_device_elements(params: tuple[ParamShape, ...], mesh: AbstractMesh) -> int:
    total = 0
    for p in params:
        spec = logical_to_spec(p.names, LOGICAL_AXIS_RULES, mesh, shape=p.shape)
        total += math.prod(NamedSharding(mesh, spec).shard_shape(p.shape))
    return total


# ------------------------------------------------------------------------------ inputs


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """The workload: mesh, rollout shape, optimisation batch and dtypes.

    Examples:
      >>> PlanConfig(mesh=(1, 8, 1), batch=64, group_size=8).num_sequences
      512
    """

    mesh: tuple[int, int, int] = (1, 1, 1)  # (data, fsdp, tensor)
    prompt_len: int = 512  # P
    completion_len: int = 1024  # T
    batch: int = 64  # B prompts per iteration
    group_size: int = 8  # G samples per prompt
    micro_batch: int | None = None  # sequences per forward/backward; None: a whole update
    epochs: int = 1  # passes over the N sequences per iteration
    minibatches: int = 1  # optimizer updates per epoch
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    optimizer_dtype: str = "float32"
    remat: Remat = "full"
    reference: bool = False  # frozen reference policy for a KL term
    logits_chunk: int | None = None  # tokens per device whose logits exist at once; None: all
    mfu: float = 0.4
    bandwidth_efficiency: float = 0.8

    def __post_init__(self) -> None:
        mesh = tuple(self.mesh)
        if len(mesh) != 3 or any(not isinstance(s, int) or s < 1 for s in mesh):
            raise ValueError(
                f"PlanConfig.mesh must be three positive ints (data, fsdp, tensor), got "
                f"{self.mesh!r}."
            )
        object.__setattr__(self, "mesh", mesh)
        for name in (
            "prompt_len",
            "completion_len",
            "batch",
            "group_size",
            "epochs",
            "minibatches",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PlanConfig.{name} must be a positive int, got {value!r}.")
        for name in ("param_dtype", "compute_dtype", "optimizer_dtype"):
            if getattr(self, name) not in _DTYPE_BYTES:
                raise ValueError(
                    f"PlanConfig.{name} must be one of {sorted(_DTYPE_BYTES)}, got "
                    f"{getattr(self, name)!r}."
                )
        if self.remat not in ("none", "dots", "full"):
            raise ValueError(
                f"PlanConfig.remat must be 'none', 'dots' or 'full', got {self.remat!r}."
            )
        for name in ("micro_batch", "logits_chunk"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(
                    f"PlanConfig.{name} must be a positive int or None, got {value!r}."
                )
        for name in ("mfu", "bandwidth_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(
                    f"PlanConfig.{name} must be in (0, 1], got {getattr(self, name)!r}."
                )

    @property
    def num_sequences(self) -> int:
        """N = B·G sequences per iteration."""
        return self.batch * self.group_size


def _check_mesh(config: ModelConfig, plan: PlanConfig) -> list[str]:
    """Raise for meshes the model cannot use; return notes for legal but lossy layouts."""
    d, f, t = plan.mesh
    rows = d * f
    problems = []
    if config.num_heads % t:
        problems.append(f"num_heads={config.num_heads} is not divisible by tensor={t}")
    if config.intermediate_size % t:
        problems.append(
            f"intermediate_size={config.intermediate_size} is not divisible by tensor={t}"
        )
    if config.hidden_size % f:
        problems.append(f"hidden_size={config.hidden_size} is not divisible by fsdp={f}")
    N = plan.num_sequences
    if N % rows:
        problems.append(
            f"N = batch·group_size = {N} sequences do not split over data·fsdp = {rows}"
        )
    if N % plan.minibatches:
        problems.append(f"minibatches={plan.minibatches} does not divide N = {N}")
    update = N // plan.minibatches
    micro = plan.micro_batch
    if micro is not None and (micro % rows or update % micro):
        problems.append(
            f"micro_batch={micro} must be a multiple of data·fsdp = {rows} and divide the "
            f"{update} sequences of one optimizer update"
        )
    if problems:
        raise ValueError(
            f"plan: impossible mesh (data={d}, fsdp={f}, tensor={t}): " + "; ".join(problems) + "."
        )
    notes = []
    if config.num_kv_heads % t:
        notes.append(
            f"num_kv_heads={config.num_kv_heads} does not split over tensor={t}: k/v weights and "
            "the KV cache are replicated over tensor"
        )
    if config.vocab_size % t:
        notes.append(f"vocab_size={config.vocab_size} does not split over tensor={t}: replicated")
    return notes


# ------------------------------------------------------------------------------ estimate


class Plan(NamedTuple):
    """Per-device memory (bytes) and per-iteration time (seconds) of one workload on one mesh.

    Examples:
      >>> p = estimate("qwen3-0.6b", PlanConfig(mesh=(1, 1, 1), batch=4, group_size=2), "h100")
      >>> p.memory["peak"] == max(p.memory["sampling_peak"], p.memory["training_peak"])
      True
    """

    model: str
    num_params: int
    device: DeviceSpec
    config: PlanConfig
    memory: dict[str, float]  # bytes per device
    time: dict[str, float]  # seconds per iteration
    decode_bound: Literal["memory", "compute"]  # what limits one decode step
    notes: tuple[str, ...]

    @property
    def fits(self) -> bool:
        """Whether the peak fits the device's HBM."""
        return self.memory["peak"] <= self.device.hbm_bytes

    @property
    def iteration_s(self) -> float:
        """Sampling plus training compute time of one iteration (communication not included)."""
        return self.time["sampling_s"] + self.time["training_total_s"]


def _activation_bytes(config: ModelConfig, plan: PlanConfig, rows: int) -> dict[str, float]:
    """Saved activations of one micro-batch on one device (see the module docstring)."""
    t = plan.mesh[2]
    bc = _DTYPE_BYTES[plan.compute_dtype]
    D, Hd, L, S = (
        config.hidden_size,
        config.head_dim,
        config.num_layers,
        plan.prompt_len + plan.completion_len,
    )
    H_t = config.num_heads / t
    K_t = config.num_kv_heads / t if config.num_kv_heads % t == 0 else config.num_kv_heads
    F_t = config.intermediate_size / t
    tokens = rows * S
    full_layer = tokens * (bc * (4 * D + 3 * (H_t + K_t) * Hd + 4 * F_t) + (4 + bc) * H_t * S)
    if plan.remat == "none":
        saved, working = L * full_layer, 0.0
    elif plan.remat == "dots":
        saved = L * tokens * bc * (3 * D + (H_t + 2 * K_t) * Hd + 2 * F_t)
        working = full_layer
    else:
        saved, working = L * tokens * bc * D, full_layer
    scored = rows * plan.completion_len
    logit_tokens = scored if plan.logits_chunk is None else min(scored, plan.logits_chunk)
    logits = 2 * 4 * logit_tokens * config.vocab_size / t
    return {"saved": saved, "working": working, "logits": logits}


def _matmul_weights(config: ModelConfig) -> int:
    """Weights that take part in matmuls: everything but the embedding lookup (tied: once)."""
    total = sum(math.prod(p.shape) for p in parameter_shapes(config))
    if not config.tie_embeddings:
        total -= config.vocab_size * config.hidden_size  # the lookup table is not a matmul
    return total


def _axis_bandwidth(device: DeviceSpec, mesh: tuple[int, int, int], axis: int) -> float:
    """Bandwidth of a collective along mesh axis `axis` (devices are laid out tensor-innermost)."""
    span = math.prod(mesh[axis:])
    if device.fast_domain is None or span <= device.fast_domain:
        return device.interconnect_bandwidth
    return device.network_bandwidth


def estimate(
    model: str | pathlib.Path | ModelConfig,
    plan: PlanConfig,
    device: str | DeviceSpec = "h100",
) -> Plan:
    """Per-device memory and per-iteration time of `plan` for `model` (formulas: module docstring).

    Args:
      model: a preset name (`PRESETS`), a `config.json` or checkpoint directory, or a
        `ModelConfig`.
      plan: mesh, rollout shape, micro-batch and dtypes.
      device: a `DEVICES` name or a `DeviceSpec`.

    Returns:
      A `Plan` with `memory` (bytes per device) and `time` (seconds per iteration).

    Raises:
      ValueError: an unknown preset or device, or an impossible mesh (query heads or MLP width
        not divisible by `tensor`, model width not divisible by `fsdp`, sequences or
        micro-batches not divisible by `data·fsdp`).

    Examples:
      >>> p = estimate("qwen2.5-7b", PlanConfig(mesh=(1, 8, 1), batch=32, group_size=8), "h100")
      >>> round(p.num_params / 1e9, 2), round(p.memory["params"] / 2**30, 2)
      (7.62, 3.55)
    """
    name, config = resolve_model(model)
    if isinstance(device, str):
        if device not in DEVICES:
            raise ValueError(f"plan: unknown device {device!r}; known: {', '.join(DEVICES)}.")
        device = DEVICES[device]
    notes = _check_mesh(config, plan)
    sizes = _sizes(config, plan)
    memory = _memory(config, plan, sizes)
    time, bound = _time(config, plan, device, sizes)
    return Plan(name, sizes.num_params, device, plan, memory, time, bound, tuple(notes))


class _Sizes(NamedTuple):
    """Element counts and row counts shared by the memory and time estimates."""

    num_params: int
    w_dev: int  # parameter elements per device (rule table on the full mesh)
    w_t: int  # parameter elements per device when split over tensor only
    layer_t: int  # the same, for the stacked layers only (all L of them)
    kv_heads: int  # KV heads per device (K/t, or K when t does not divide K)
    rows: int  # sequences per device during sampling, N / (d·f)
    micro: int  # sequences per micro-batch (global)
    micro_rows: int  # sequences per micro-batch per device


def _sizes(config: ModelConfig, plan: PlanConfig) -> _Sizes:
    d, f, t = plan.mesh
    params = parameter_shapes(config)
    tensor_only = AbstractMesh((1, 1, t), MESH_AXES)
    layers = tuple(p for p in params if p.path.startswith("layers."))
    K = config.num_kv_heads
    micro = plan.micro_batch or plan.num_sequences // plan.minibatches
    return _Sizes(
        num_params=sum(math.prod(p.shape) for p in params),
        w_dev=_per_device_elements(params, AbstractMesh((d, f, t), MESH_AXES)),
        w_t=_per_device_elements(params, tensor_only),
        layer_t=_per_device_elements(layers, tensor_only),
        kv_heads=K // t if K % t == 0 else K,
        rows=plan.num_sequences // (d * f),
        micro=micro,
        micro_rows=micro // (d * f),
    )


def _memory(config: ModelConfig, plan: PlanConfig, z: _Sizes) -> dict[str, float]:
    d, f, t = plan.mesh
    bp, bo, bc = (
        _DTYPE_BYTES[x] for x in (plan.param_dtype, plan.optimizer_dtype, plan.compute_dtype)
    )
    L, Hd, H = config.num_layers, config.head_dim, config.num_heads
    P, S = plan.prompt_len, plan.prompt_len + plan.completion_len
    acts = _activation_bytes(config, plan, z.micro_rows)
    memory = {
        "params": z.w_dev * bp,
        "optimizer": 2 * z.w_dev * bo,
        "gradients": z.w_dev * bp,
        "reference": z.w_dev * bc if plan.reference else 0.0,
        "layer_buffers": 2 * z.layer_t / L * bc,
        "activations": acts["saved"] + acts["working"] + acts["logits"],
        "sampler_weights": z.w_t * bc,
        "kv_cache": 2 * L * z.rows * S * z.kv_heads * Hd * bc,
    }
    # prefill: one layer of B/(d·f) prompts live at a time, with float32 [P, P] attention logits
    prefill_rows = math.ceil(plan.batch / (d * f))
    widths = config.hidden_size + (H / t + 2 * z.kv_heads) * Hd + 2 * config.intermediate_size / t
    prefill = prefill_rows * P * (bc * widths + 4 * (H / t) * P)
    # decode: float32 logits (and their filtered copy) and one layer's attention logits
    vocab = config.vocab_size / t if config.vocab_size % t == 0 else config.vocab_size
    decode = z.rows * (2 * 4 * vocab + 4 * (H / t) * S)
    memory["sampling_workspace"] = max(prefill, decode)
    resident = memory["params"] + memory["optimizer"] + memory["reference"]
    memory["sampling_peak"] = (
        resident + memory["sampler_weights"] + memory["kv_cache"] + memory["sampling_workspace"]
    )
    memory["training_peak"] = (
        resident + memory["gradients"] + memory["layer_buffers"] + memory["activations"]
    )
    memory["peak"] = max(memory["sampling_peak"], memory["training_peak"])
    return memory


def _time(
    config: ModelConfig, plan: PlanConfig, device: DeviceSpec, z: _Sizes
) -> tuple[dict[str, float], Literal["memory", "compute"]]:
    d, f, t = plan.mesh
    n = d * f * t
    bp, bc = _DTYPE_BYTES[plan.param_dtype], _DTYPE_BYTES[plan.compute_dtype]
    L, Hd, H = config.num_layers, config.head_dim, config.num_heads
    P, T, N = plan.prompt_len, plan.completion_len, plan.num_sequences
    S = P + T
    flops = device.peak_flops * plan.mfu
    w_mm = _matmul_weights(config)
    attn = 4 * L * H * Hd  # forward FLOPs per token and context position
    prefill_s = plan.batch * P * (2 * w_mm + attn * P) / (n * flops)
    # each step reads the weights and the whole fixed-size cache (all S slots, masked)
    step_bytes = z.w_t * bc + 2 * L * z.rows * S * z.kv_heads * Hd * bc
    step_flops = z.rows * (2 * w_mm / t + attn / t * S)
    memory_s = step_bytes / (device.hbm_bandwidth * plan.bandwidth_efficiency)
    step_s = max(memory_s, step_flops / flops)
    bound: Literal["memory", "compute"] = "memory" if memory_s >= step_flops / flops else "compute"
    tokens = N * S
    passes = (plan.epochs * plan.minibatches > 1) + plan.reference
    logprob_s = passes * tokens * (2 * w_mm + attn * S) / (n * flops)
    remat_factor = 4 / 3 if plan.remat == "full" else 1.0
    train_s = plan.epochs * tokens * (6 * w_mm + 3 * attn * S) * remat_factor / (n * flops)

    gathers = 3 if plan.remat == "full" else 2
    fsdp_bytes = (gathers * z.w_t * bc + z.w_t * bp) * (f - 1) / f
    data_bytes = 2 * z.w_dev * bp * (d - 1) / d
    # tensor parallelism: two all-reduces of [tokens, D] per layer and pass
    tensor_bytes = gathers * 2 * L * 2 * (t - 1) / t * z.micro_rows * S * config.hidden_size * bc
    train_comm_s = (plan.epochs * N // z.micro) * (
        fsdp_bytes / _axis_bandwidth(device, plan.mesh, 1)
        + data_bytes / _axis_bandwidth(device, plan.mesh, 0)
        + tensor_bytes / _axis_bandwidth(device, plan.mesh, 2)
    )
    time = {
        "prefill_s": prefill_s,
        "decode_s": T * step_s,
        "decode_step_s": step_s,
        "sampling_s": prefill_s + T * step_s,
        "logprob_s": logprob_s,
        "training_s": train_s,
        "training_total_s": logprob_s + train_s,
        "train_comm_s": train_comm_s,
    }
    return time, bound


# ------------------------------------------------------------------------------ search, report


def mesh_candidates(num_devices: int) -> list[tuple[int, int, int]]:
    """Every `(data, fsdp, tensor)` with `data·fsdp·tensor = num_devices`.

    Examples:
      >>> mesh_candidates(4)
      [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    """
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(
            f"mesh_candidates: num_devices must be a positive int, got {num_devices!r}."
        )
    out = []
    for d in range(1, num_devices + 1):
        if num_devices % d:
            continue
        rest = num_devices // d
        for f in range(1, rest + 1):
            if rest % f == 0:
                out.append((d, f, rest // f))
    return out


def suggest_meshes(
    model: str | pathlib.Path | ModelConfig,
    plan: PlanConfig,
    device: str | DeviceSpec,
    num_devices: int,
    *,
    margin: float = 0.85,
) -> list[Plan]:
    """Plans for every legal mesh of `num_devices`, the fitting ones first, fastest first.

    A plan "fits" here when its peak is at most `margin` of the HBM (XLA needs room for its
    temporaries). Meshes the model cannot use (see `estimate`) are skipped. Fitting plans are
    ranked by iteration time plus the collectives' time (counted as not overlapped, which
    penalises axes that cross slow links) in 3% steps; within a step the lower peak memory wins.
    Meshes that do not fit follow, the smallest peak first.

    Examples:
      >>> plans = suggest_meshes("qwen3-0.6b", PlanConfig(batch=8, group_size=4), "h100", 8)
      >>> plans[0].config.mesh in mesh_candidates(8)
      True
    """
    if not 0 < margin <= 1:
        raise ValueError(f"suggest_meshes: margin must be in (0, 1], got {margin!r}.")
    plans = []
    for mesh in mesh_candidates(num_devices):
        try:
            plans.append(estimate(model, dataclasses.replace(plan, mesh=mesh), device))
        except ValueError:
            continue
    if not plans:
        raise ValueError(
            f"suggest_meshes: no mesh of {num_devices} devices can hold this workload's shape "
            "(heads, MLP width, model width and N must divide the axes)."
        )

    def key(p: Plan) -> tuple[int, int, float]:
        if p.memory["peak"] > margin * p.device.hbm_bytes:
            return (1, 0, p.memory["peak"])  # closest to fitting first
        time = p.iteration_s + p.time["train_comm_s"]
        return (0, round(math.log(time) / math.log(1.03)), p.memory["peak"])

    return sorted(plans, key=key)


_MEMORY_ROWS = (
    ("params", "parameters ({param})"),
    ("optimizer", "AdamW moments (2 × {opt})"),
    ("gradients", "gradients ({param})"),
    ("reference", "reference policy ({compute})"),
    ("layer_buffers", "gathered layer weights"),
    ("activations", "training activations (remat={remat})"),
    ("sampler_weights", "sampler weights ({compute}, split over tensor)"),
    ("kv_cache", "KV cache ({compute})"),
    ("sampling_workspace", "sampling workspace"),
)


def format_plan(p: Plan) -> str:
    """A human-readable report of `p`: memory per device and the time split.

    Examples:
      >>> p = estimate("qwen3-0.6b", PlanConfig(batch=4, group_size=2), "h100")
      >>> print(format_plan(p).splitlines()[0])
      qwen3-0.6b: 0.60 B parameters on 1 × H100 SXM (74.5 GiB), mesh data=1 fsdp=1 tensor=1
    """
    c, m, t = p.config, p.memory, p.time
    d, f, tp = c.mesh
    labels = {"param": c.param_dtype, "opt": c.optimizer_dtype, "compute": c.compute_dtype}
    lines = [
        f"{p.model}: {p.num_params / 1e9:.2f} B parameters on {d * f * tp} × {p.device.name} "
        f"({p.device.hbm_bytes / GiB:.1f} GiB), mesh data={d} fsdp={f} tensor={tp}",
        f"rollout: {c.batch} prompts × {c.group_size} samples = {c.num_sequences} sequences of "
        f"{c.prompt_len} + {c.completion_len} tokens; micro-batch "
        f"{c.micro_batch or c.num_sequences // c.minibatches}, {c.epochs} epoch(s) × "
        f"{c.minibatches} update(s)",
        "memory per device (GiB):",
    ]
    for key, label in _MEMORY_ROWS:
        if key == "reference" and not c.reference:
            continue
        text = label.format(**labels, remat=c.remat)
        lines.append(f"  {text:<46} {m[key] / GiB:9.2f}")
    verdict = "fits" if p.fits else "DOES NOT FIT"
    lines += [
        f"  {'peak while sampling':<46} {m['sampling_peak'] / GiB:9.2f}",
        f"  {'peak while training':<46} {m['training_peak'] / GiB:9.2f}",
        f"  {'peak':<46} {m['peak'] / GiB:9.2f}  ({verdict}; "
        f"{100 * m['peak'] / p.device.hbm_bytes:.0f}% of HBM)",
        f"time per iteration (estimate, mfu={c.mfu}, bandwidth efficiency "
        f"{c.bandwidth_efficiency}):",
        f"  sampling  {t['sampling_s']:9.2f} s  (prefill {t['prefill_s']:.2f} s, decode "
        f"{c.completion_len} steps × {1e3 * t['decode_step_s']:.2f} ms, {p.decode_bound}-bound)",
        f"  training  {t['training_total_s']:9.2f} s  (update {t['training_s']:.2f} s, log-prob "
        f"passes {t['logprob_s']:.2f} s)",
        f"  collectives {t['train_comm_s']:7.2f} s  (training, if not overlapped with compute)",
    ]
    total = p.iteration_s
    lines.append(
        f"  split     {100 * t['sampling_s'] / total:5.1f}% sampling / "
        f"{100 * t['training_total_s'] / total:5.1f}% training, {total:.2f} s per iteration"
    )
    lines += [f"note: {note}" for note in p.notes]
    return "\n".join(lines)


def plan_to_dict(p: Plan) -> dict[str, Any]:
    """A JSON-ready mapping of `p` (bytes, seconds, the inputs).

    Examples:
      >>> d = plan_to_dict(estimate("qwen3-0.6b", PlanConfig(batch=4, group_size=2), "h100"))
      >>> sorted(d)[:4]
      ['config', 'decode_bound', 'device', 'fits']
    """
    return {
        "model": p.model,
        "num_params": p.num_params,
        "device": dataclasses.asdict(p.device),
        "config": dataclasses.asdict(p.config),
        "memory_bytes": dict(p.memory),
        "time_s": dict(p.time),
        "decode_bound": p.decode_bound,
        "fits": p.fits,
        "notes": list(p.notes),
    }


def _parse_mesh(text: str) -> tuple[int, int, int]:
    parts = text.replace("x", ",").split(",")
    try:
        mesh = tuple(int(s) for s in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--mesh must be DATA,FSDP,TENSOR (e.g. 1,8,1), got {text!r}"
        ) from None
    if len(mesh) != 3:
        raise argparse.ArgumentTypeError(f"--mesh needs three sizes DATA,FSDP,TENSOR, got {text!r}")
    return mesh  # type: ignore[return-value]


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The `plan` command's arguments (on `parser`, e.g. a `jaxrl-llm` subparser).

    Examples:
      >>> args = build_parser().parse_args(["qwen2.5-7b", "--mesh", "1,8,1"])
      >>> args.model, args.mesh
      ('qwen2.5-7b', (1, 8, 1))
    """
    p = parser or argparse.ArgumentParser(
        prog="jaxrl-llm plan", description="Per-device memory and time split of an RL iteration."
    )
    p.add_argument("model", help=f"preset ({', '.join(PRESETS)}) or config.json / checkpoint dir")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--mesh", type=_parse_mesh, help="DATA,FSDP,TENSOR (default 1,1,1)")
    where.add_argument("--devices", type=int, help="rank every mesh of this many devices")
    p.add_argument("--device", default="h100", choices=sorted(DEVICES), help="accelerator")
    p.add_argument("--prompt-len", type=int, default=PlanConfig.prompt_len)
    p.add_argument("--completion-len", type=int, default=PlanConfig.completion_len)
    p.add_argument("--batch", type=int, default=PlanConfig.batch, help="prompts per iteration")
    p.add_argument("--group-size", type=int, default=PlanConfig.group_size)
    p.add_argument("--micro-batch", type=int, default=None, help="sequences per fwd/bwd pass")
    p.add_argument("--epochs", type=int, default=PlanConfig.epochs)
    p.add_argument(
        "--minibatches", type=int, default=PlanConfig.minibatches, help="updates per epoch"
    )
    p.add_argument("--param-dtype", default=PlanConfig.param_dtype, choices=sorted(_DTYPE_BYTES))
    p.add_argument(
        "--compute-dtype", default=PlanConfig.compute_dtype, choices=sorted(_DTYPE_BYTES)
    )
    p.add_argument(
        "--optimizer-dtype", default=PlanConfig.optimizer_dtype, choices=sorted(_DTYPE_BYTES)
    )
    p.add_argument("--remat", default=PlanConfig.remat, choices=["none", "dots", "full"])
    p.add_argument("--reference", action="store_true", help="hold a frozen KL reference policy")
    p.add_argument("--logits-chunk", type=int, default=None, help="tokens of logits at once")
    p.add_argument("--mfu", type=float, default=PlanConfig.mfu)
    p.add_argument("--bandwidth-efficiency", type=float, default=PlanConfig.bandwidth_efficiency)
    p.add_argument("--top", type=int, default=5, help="meshes listed with --devices")
    p.add_argument("--json", action="store_true", help="print JSON instead of the report")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the `plan` command on parsed arguments; returns the exit status (2: bad input).

    Examples:
      >>> run(build_parser().parse_args(["qwen3-0.6b", "--batch", "4", "--json"]))
      [...]
      0
    """
    try:
        config = PlanConfig(
            mesh=args.mesh or (1, 1, 1),
            prompt_len=args.prompt_len,
            completion_len=args.completion_len,
            batch=args.batch,
            group_size=args.group_size,
            micro_batch=args.micro_batch,
            epochs=args.epochs,
            minibatches=args.minibatches,
            param_dtype=args.param_dtype,
            compute_dtype=args.compute_dtype,
            optimizer_dtype=args.optimizer_dtype,
            remat=args.remat,
            reference=args.reference,
            logits_chunk=args.logits_chunk,
            mfu=args.mfu,
            bandwidth_efficiency=args.bandwidth_efficiency,
        )
        if args.devices is not None:
            plans = suggest_meshes(args.model, config, args.device, args.devices)[: args.top]
        else:
            plans = [estimate(args.model, config, args.device)]
    except ValueError as err:
        print(f"jaxrl-llm plan: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([plan_to_dict(p) for p in plans], indent=2))
    else:
        print("\n\n".join(format_plan(p) for p in plans))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`jaxrl-llm plan MODEL [--mesh D,F,T | --devices N] ...`: print the plan.

    Examples:
      >>> main(["llama-3-70b", "--mesh", "1,3,1"])  # 8192 wide: fsdp=3 is impossible
      2
    """
    return run(build_parser().parse_args(argv))
