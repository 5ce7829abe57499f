"""`estimate`: per-device memory and the time split of one RL iteration (formulas: the
`jaxrl_llm.plan` package docstring); `suggest_meshes` ranks the meshes of a device count."""

from __future__ import annotations

import dataclasses
import math
import numbers
import pathlib
from typing import Literal, NamedTuple

from jax.sharding import AbstractMesh

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.plan.devices import DEVICES, DeviceSpec
from jaxrl_llm.plan.shapes import (
    _per_device_elements,
    critic_shapes,
    lora_shapes,
    parameter_shapes,
    resolve_model,
)
from sharding import MESH_AXES

Remat = Literal["none", "dots", "full"]
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _is_positive_int(value: object) -> bool:
    """A positive Python or NumPy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


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
    optimizer_dtype: str | None = None  # None: the parameters' (optax's moments follow them)
    remat: Remat = "full"
    reference: bool = False  # frozen reference policy for a KL term
    old_logprobs: Literal["forward", "sampler"] = "forward"  # algorithm.old_logprobs
    lora_rank: int | None = None  # train LoRA adapters of this rank on every projection
    critic: bool = False  # PPO's separate critic (`critic.kind: model`), trained alongside
    critic_lora_rank: int | None = None  # the critic's LoRA adapters (`model.critic_lora`)
    dora: bool = False  # DoRA: the adapters also train a magnitude per output feature
    logits_chunk: int | None = None  # tokens per device whose logits exist at once; None: all
    attention_chunk: int | None = None  # queries per attention block (model.attention_chunk)
    mfu: float = 0.4
    bandwidth_efficiency: float = 0.8

    def __post_init__(self) -> None:
        mesh = tuple(self.mesh)
        if len(mesh) != 3 or not all(_is_positive_int(s) for s in mesh):
            raise ValueError(
                f"PlanConfig.mesh must be three positive ints (data, fsdp, tensor), got "
                f"{self.mesh!r}."
            )
        object.__setattr__(self, "mesh", tuple(int(s) for s in mesh))
        if self.old_logprobs not in ("forward", "sampler"):
            raise ValueError(
                f"PlanConfig.old_logprobs must be 'forward' or 'sampler', got "
                f"{self.old_logprobs!r}."
            )
        for name in (
            "prompt_len",
            "completion_len",
            "batch",
            "group_size",
            "epochs",
            "minibatches",
        ):
            value = getattr(self, name)
            if not _is_positive_int(value):
                raise ValueError(f"PlanConfig.{name} must be a positive int, got {value!r}.")
            object.__setattr__(self, name, int(value))
        for name in ("param_dtype", "compute_dtype", "optimizer_dtype"):
            if name == "optimizer_dtype" and self.optimizer_dtype is None:
                continue
            if getattr(self, name) not in _DTYPE_BYTES:
                raise ValueError(
                    f"PlanConfig.{name} must be one of {sorted(_DTYPE_BYTES)}, got "
                    f"{getattr(self, name)!r}."
                )
        if self.remat not in ("none", "dots", "full"):
            raise ValueError(
                f"PlanConfig.remat must be 'none', 'dots' or 'full', got {self.remat!r}."
            )
        names = ("micro_batch", "logits_chunk", "attention_chunk", "lora_rank", "critic_lora_rank")
        for name in names:
            value = getattr(self, name)
            if value is not None and not _is_positive_int(value):
                raise ValueError(
                    f"PlanConfig.{name} must be a positive int or None, got {value!r}."
                )
            if value is not None:
                object.__setattr__(self, name, int(value))
        if self.critic_lora_rank is not None and not self.critic:
            raise ValueError("PlanConfig.critic_lora_rank needs critic=True (a separate critic).")
        if self.dora and self.lora_rank is None and self.critic_lora_rank is None:
            raise ValueError("PlanConfig.dora needs LoRA adapters (lora_rank or critic_lora_rank).")
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
    N = plan.num_sequences
    if plan.batch % rows:  # the runner's rule: prefill splits the B prompts over data·fsdp
        problems.append(f"batch={plan.batch} prompts do not split over data·fsdp = {rows}")
    if N % plan.minibatches:
        problems.append(f"minibatches={plan.minibatches} does not divide N = {N}")
    update = N // plan.minibatches
    micro = plan.micro_batch
    if micro is not None and update % micro:
        problems.append(
            f"micro_batch={micro} must divide the {update} sequences of one optimizer update"
        )
    if problems:
        raise ValueError(
            f"plan: impossible mesh (data={d}, fsdp={f}, tensor={t}): " + "; ".join(problems) + "."
        )
    notes = []
    # dimensions the mesh does not divide are replicated by the rule table (the runtime runs
    # them so), and counted that way here
    for name, size, axis, ways in (
        ("num_heads", config.num_heads, "tensor", t),
        ("intermediate_size", config.intermediate_size, "tensor", t),
        ("hidden_size", config.hidden_size, "fsdp", f),
    ):
        if size % ways:
            notes.append(f"{name}={size} does not split over {axis}={ways}: replicated")
    if config.num_kv_heads % t:
        notes.append(
            f"num_kv_heads={config.num_kv_heads} does not split over tensor={t}: k/v weights and "
            "the KV cache are replicated over tensor"
        )
    if config.vocab_size % t:
        notes.append(f"vocab_size={config.vocab_size} does not split over tensor={t}: replicated")
    micro = micro or update
    if micro % rows:
        notes.append(
            f"a micro-batch of {micro} sequences does not split evenly over data·fsdp = "
            f"{rows}: counted as if every device computed all {micro} (an upper bound; XLA "
            "decides the layout of such rows)"
        )
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
    H_t = _split(config.num_heads, t)
    K_t = _split(config.num_kv_heads, t)
    F_t = _split(config.intermediate_size, t)
    tokens = rows * S
    dense = tokens * bc * (4 * D + 3 * (H_t + K_t) * Hd + 4 * F_t)
    attention = (4 + bc) * H_t * S  # per query: float32 logits and probabilities over S keys
    if plan.attention_chunk is None:
        kept = live = tokens * attention  # kept: without remat, every layer's
    else:  # one block of queries at a time, recomputed; the whole boolean mask
        kept, live = 0.0, rows * min(plan.attention_chunk, S) * attention + rows * S * S
    if plan.remat == "none":
        saved, working = L * (dense + kept), live - kept
    elif plan.remat == "dots":
        saved = L * tokens * bc * (3 * D + (H_t + 2 * K_t) * Hd + 2 * F_t)
        working = dense + live
    else:
        saved, working = L * tokens * bc * D, dense + live
    scored = rows * plan.completion_len
    logit_tokens = scored if plan.logits_chunk is None else min(scored, plan.logits_chunk)
    logits = 2 * 4 * logit_tokens * _vocab_per_device(config, t)
    return {"saved": saved, "working": working, "logits": logits}


_REPLICATED_LAYOUT = ("num_heads=", "intermediate_size=", "hidden_size=")  # their notes


def _split(size: int, ways: int) -> float:
    """A dimension's per-device size: split when `ways` divides it, else whole (replicated)."""
    return size / ways if size % ways == 0 else size


def _vocab_per_device(config: ModelConfig, t: int) -> float:
    """The vocabulary columns of the logits on one device: split over `tensor` when it divides
    the vocabulary, else whole (the rule table's fallback: replicated)."""
    V = config.vocab_size
    return V / t if V % t == 0 else V


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
      ValueError: an unknown preset or device, or an impossible batch split (prompts (B) not
        divisible by `data·fsdp`, minibatches that do not divide the rows, a `micro_batch`
        that does not divide an update). Weights that do not split over their mesh axis
        (query heads or MLP width over `tensor`, model width over `fsdp`) are counted
        replicated, as the rule table places them, with a note; a micro-batch that does not
        split evenly over `data·fsdp` (the runner allows it) is counted as if every device
        computed all its rows, an upper bound, with a note.

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
    a_dev: int  # LoRA adapter elements per device (0 without LoRA)
    a_t: int  # the same, split over tensor only
    trained_dev: int  # trained elements per device: the adapters with LoRA, else every weight
    trained_t: int  # the same, split over tensor only
    critic_dev: int  # the separate critic's elements per device, its adapters included (0: none)
    critic_t: int  # its weights split over tensor only (what an FSDP gather assembles)
    critic_trained_dev: int  # its trained elements per device (adapters and head with LoRA)
    critic_trained_t: int  # the same, split over tensor only
    critic_mm: int  # the critic's weights that take part in matmuls (all but the embedding)


def _sizes(config: ModelConfig, plan: PlanConfig) -> _Sizes:
    d, f, t = plan.mesh
    params = parameter_shapes(config)
    tensor_only = AbstractMesh((1, 1, t), MESH_AXES)
    layers = tuple(p for p in params if p.path.startswith("layers."))
    K = config.num_kv_heads
    micro = plan.micro_batch or plan.num_sequences // plan.minibatches
    mesh = AbstractMesh((d, f, t), MESH_AXES)
    adapters = lora_shapes(config, plan.lora_rank, plan.dora) if plan.lora_rank else ()
    a_dev, a_t = _per_device_elements(adapters, mesh), _per_device_elements(adapters, tensor_only)
    w_dev, w_t = _per_device_elements(params, mesh), _per_device_elements(params, tensor_only)
    critic = critic_shapes(config) if plan.critic else ()
    head = tuple(p for p in critic if p.path == "head.kernel")
    c_adapters = (
        lora_shapes(config, plan.critic_lora_rank, plan.dora) if plan.critic_lora_rank else ()
    )
    c_trained = (*c_adapters, *head) if c_adapters else critic
    embed = config.vocab_size * config.hidden_size
    return _Sizes(
        num_params=sum(math.prod(p.shape) for p in params),
        w_dev=w_dev,
        w_t=w_t,
        layer_t=_per_device_elements(layers, tensor_only),
        kv_heads=K // t if K % t == 0 else K,
        rows=plan.num_sequences // (d * f),
        micro=micro,
        micro_rows=micro // (d * f) if micro % (d * f) == 0 else micro,  # uneven: replicated
        a_dev=a_dev,
        a_t=a_t,
        trained_dev=a_dev if adapters else w_dev,
        trained_t=a_t if adapters else w_t,
        critic_dev=_per_device_elements((*critic, *c_adapters), mesh),
        critic_t=_per_device_elements(critic, tensor_only),
        critic_trained_dev=_per_device_elements(c_trained, mesh),
        critic_trained_t=_per_device_elements(c_trained, tensor_only),
        critic_mm=sum(math.prod(p.shape) for p in (*critic, *c_adapters)) - embed * bool(critic),
    )


def _memory(config: ModelConfig, plan: PlanConfig, z: _Sizes) -> dict[str, float]:
    d, f, t = plan.mesh
    bp, bo, bc = (
        _DTYPE_BYTES[x]
        for x in (plan.param_dtype, plan.optimizer_dtype or plan.param_dtype, plan.compute_dtype)
    )
    L, Hd, H = config.num_layers, config.head_dim, config.num_heads
    P, S = plan.prompt_len, plan.prompt_len + plan.completion_len
    acts = _activation_bytes(config, plan, z.micro_rows)
    # the sampler's weights: gathered over fsdp (`compute_layout`), LoRA adapters merged into
    # a copy; neither on fsdp = 1 without adapters (the parameters themselves). Gathers and
    # merges keep the parameter dtype, as does the reference (a copy of the parameters)
    merged = z.w_t * bp if z.a_dev else 0.0
    sampler_weights = (z.w_t + z.a_t) * bp if f > 1 else merged
    accumulating = z.micro < plan.num_sequences // plan.minibatches
    memory = {
        "params": (z.w_dev + z.a_dev) * bp,
        "optimizer": 2 * z.trained_dev * bo,
        # optax.MultiSteps' float32 running mean of the micro-batches' gradients
        "accumulator": 4 * (z.trained_dev + z.critic_trained_dev * plan.critic) * accumulating,
        "gradients": z.trained_dev * bp,
        "reference": z.trained_dev * bp if plan.reference else 0.0,
        "layer_buffers": 2 * z.layer_t / L * bc,
        "activations": acts["saved"] + acts["working"] + acts["logits"],
        "sampler_weights": sampler_weights,
        "kv_cache": 2 * L * z.rows * S * z.kv_heads * Hd * bc,
        "critic_params": z.critic_dev * bp,
        "critic_optimizer": 2 * z.critic_trained_dev * bo,
        "critic_gradients": z.critic_trained_dev * bp,
        # the critic's forward runs beside the policy's in the update: its saved residuals
        # stay until the backward pass (no logits; one layer is recomputed at a time)
        "critic_activations": acts["saved"] if plan.critic else 0.0,
    }
    # prefill: one layer of B/(d·f) prompts live at a time, with float32 [P, P] attention logits
    prefill_rows = plan.batch // (d * f)
    H_t, F_t = _split(H, t), _split(config.intermediate_size, t)
    widths = config.hidden_size + (H_t + 2 * z.kv_heads) * Hd + 2 * F_t
    prefill = prefill_rows * P * (bc * widths + 4 * H_t * P)
    # decode: float32 logits (and their filtered copy) and one layer's attention logits
    decode = z.rows * (2 * 4 * _vocab_per_device(config, t) + 4 * H_t * S)
    memory["sampling_workspace"] = max(prefill, decode)
    resident = memory["params"] + memory["optimizer"] + memory["reference"]
    resident += memory["accumulator"]
    resident += memory["critic_params"] + memory["critic_optimizer"]
    memory["sampling_peak"] = (
        resident + memory["sampler_weights"] + memory["kv_cache"] + memory["sampling_workspace"]
    )
    memory["training_peak"] = (
        resident
        + memory["gradients"]
        + memory["layer_buffers"]
        + memory["activations"]
        + memory["critic_gradients"]
        + memory["critic_activations"]
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
    reuses = plan.epochs * plan.minibatches > 1 and plan.old_logprobs == "forward"
    passes = reuses + plan.reference
    logprob_s = passes * tokens * (2 * w_mm + attn * S) / (n * flops)
    if plan.critic:  # the values of the rollout, before the update
        logprob_s += tokens * (2 * z.critic_mm + attn * S) / (n * flops)
    remat_factor = 4 / 3 if plan.remat == "full" else 1.0
    attention_passes = 3 if plan.attention_chunk is None else 4  # blocks: one more forward
    weight_passes = 4 if plan.lora_rank else 6  # LoRA: no weight gradient of the base
    per_token = weight_passes * w_mm + attention_passes * attn * S
    if plan.critic:  # the critic's forward and backward in the same update
        critic_passes = 4 if plan.critic_lora_rank else 6
        per_token += critic_passes * z.critic_mm + attention_passes * attn * S
    train_s = plan.epochs * tokens * per_token * remat_factor / (n * flops)

    gathers = 3 if plan.remat == "full" else 2
    weights_t = z.w_t + z.critic_t
    fsdp_bytes = (gathers * weights_t * bc + (z.trained_t + z.critic_trained_t) * bp) * (f - 1) / f
    data_bytes = 2 * (z.trained_dev + z.critic_trained_dev) * bp * (d - 1) / d
    # tensor parallelism: two all-reduces of [tokens, D] per layer and pass (and model)
    models = 2 if plan.critic else 1
    tensor_bytes = (
        models * gathers * 2 * L * 2 * (t - 1) / t * z.micro_rows * S * config.hidden_size * bc
    )
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
    temporaries). Meshes the workload cannot use (see `estimate`) are skipped, and so are
    meshes that would replicate the query heads, the MLP or the model width (they run, but
    compute those parts on every device of the axis; `estimate` still plans them). Fitting plans are
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
            candidate = estimate(model, dataclasses.replace(plan, mesh=mesh), device)
        except ValueError:
            continue
        if not any(n.startswith(_REPLICATED_LAYOUT) for n in candidate.notes):
            plans.append(candidate)
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
