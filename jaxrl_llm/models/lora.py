"""LoRA adapters on a decoder's projections (Hu et al., "LoRA: Low-Rank Adaptation of Large
Language Models", arXiv 2106.09685).

A targeted projection `W` (input axes `I`, output axes `O`: `q`, `k`, `v` `[D, H|K, Hd]`, `o`
`[H, Hd, D]`, `gate`, `up` `[D, F]`, `down` `[F, D]`) gains two parameters, stacked over the
layers like `W`:

    A  [*I, r]    drawn U(−1/√fan_in, 1/√fan_in)   (PEFT's Kaiming-uniform with a = √5)
    B  [r, *O]    zeros
    y  = x·W + s · (x·A)·B,    s = α / r   (rsLoRA, arXiv 2312.03732: s = α / √r)

so an adapted model starts as exactly its base model. DoRA (`use_dora`; Liu et al.,
arXiv 2402.09353) adds a magnitude per output feature, `m [*O]` = the norm of `W` over its
input axes at the start, and rescales each output feature:

    y  = m / sg(‖W + s·A·B‖) ⊙ (x·W + s · (x·A)·B)      (`layers.dora_ratio`; PEFT's formula)

Train only the adapters with the `trainable` patterns `LORA_PATTERN` (`split_models`): the
optimizer state and the reference policy's copy (`reference_params`: the adapters at B = 0,
i.e. the base model) are then the size of the adapters. The adapters live next to their
weight in the `Attention` / `MLP` module (`q_lora_a`, `q_lora_b`, ...; `layers.project`
applies them), so the sampler, the training forwards, sharding and checkpoints see ordinary
parameters (the rank axis is never split).
`merge_lora` folds them into `W` (`W + s · A·B`, times DoRA's factor): `save_pretrained` writes
the merged model, a plain Hugging Face checkpoint. The sampler merges the adapters once per call
(`SamplingConfig.merge_lora`), or else folds DoRA's factor into `W` and `B` once per call
(`fold_dora_magnitudes`) instead of recomputing the norms at every token.

Examples:
  >>> from jaxrl_llm.models import Decoder, ModelConfig
  >>> cfg = ModelConfig(family="qwen3", vocab_size=11, hidden_size=8, intermediate_size=16,
  ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
  >>> model = add_lora(Decoder(cfg, rngs=nnx.Rngs(0)), LoRAConfig(rank=2), rngs=nnx.Rngs(1))
  >>> nnx.state(model)["layers"]["attn"]["q_lora_a"][...].shape  # [L, D, r]
  (2, 8, 2)
  >>> has_lora(model), has_lora(merge_lora(model))
  (True, False)
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_llm.config import ConfigError
from jaxrl_llm.models.layers import (
    MLP,
    Attention,
    adapted_weight,
    dora_ratio,
    dora_ratio_of,
)

# the projections that take adapters: the rank of their own weight, and of its input axes
TARGETS = {"q": 3, "k": 3, "v": 3, "o": 3, "gate": 2, "up": 2, "down": 2}
INPUT_AXES = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}
LORA_PATTERN = r"_lora_[abm]$"  # `split_models` / `model.trainable`: the adapters alone


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """Where and how large the adapters are (module docstring).

    Attributes:
      rank: `r`, the adapters' inner dimension.
      alpha: `α`; the update is scaled by `α / r` (`α / √r` with `use_rslora`).
      targets: the adapted projections, a subset of q, k, v, o, gate, up, down (default all:
        PEFT's "all-linear" without the output head).
      use_rslora: rank-stabilised scaling `α / √r` (Kalajdzievski, arXiv 2312.03732).
      use_dora: DoRA's trained magnitude per output feature (module docstring; PEFT's
        `use_dora`).

    Examples:
      >>> LoRAConfig(rank=8, alpha=16).scale
      2.0
      >>> LoRAConfig(targets=("q", "proj"))
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: LoRAConfig: unknown `targets` ['proj']; choose from q, k, v, o, gate, up, down.
    """

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = tuple(TARGETS)
    use_rslora: bool = False
    use_dora: bool = False

    def __post_init__(self) -> None:
        where = "LoRAConfig"
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ConfigError(f"{where}: `rank` must be an int >= 1, got {self.rank!r}.")
        if not math.isfinite(self.alpha) or self.alpha <= 0:
            raise ConfigError(f"{where}: `alpha` must be a finite number > 0, got {self.alpha!r}.")
        object.__setattr__(self, "targets", tuple(self.targets))
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown:
            raise ConfigError(
                f"{where}: unknown `targets` {unknown}; choose from {', '.join(TARGETS)}."
            )
        if not self.targets or len(set(self.targets)) != len(self.targets):
            raise ConfigError(
                f"{where}: `targets` must name each projection at most once and at least one, "
                f"got {list(self.targets)}."
            )

    @property
    def scale(self) -> float:
        """`s`: `α / r`, or `α / √r` with `use_rslora`."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def _hosts(model: nnx.Module) -> list[nnx.Module]:
    """The `Attention` and `MLP` modules of a model (stacked over its layers)."""
    return [node for _, node in nnx.iter_graph(model) if isinstance(node, Attention | MLP)]


def _targets_of(host: nnx.Module, targets: tuple[str, ...]) -> list[str]:
    return [name for name in targets if isinstance(getattr(host, name, None), nnx.Param)]


def add_lora(model: nnx.Module, config: LoRAConfig, *, rngs: nnx.Rngs) -> nnx.Module:
    """Give every targeted projection of `model` (a `Decoder`, or a `ValueModel`'s backbone)
    its adapters `A` (random) and `B` (zeros), in place; returns `model`.

    Raises:
      ValueError: the model already has adapters, or none of its modules has a target.
    """
    if has_lora(model):
        raise ValueError("add_lora: the model already has LoRA adapters.")
    added = 0
    for host in _hosts(model):
        for name in _targets_of(host, config.targets):
            weight = getattr(host, name)
            value = weight[...]
            names = tuple(weight.get_metadata().get("out_sharding") or (None,) * value.ndim)
            split = value.ndim - TARGETS[name] + INPUT_AXES[name]  # leading axes + inputs
            fan_in = math.prod(value.shape[value.ndim - TARGETS[name] : split])
            bound = 1.0 / math.sqrt(fan_in)
            a_shape = (*value.shape[:split], config.rank)
            a = jax.random.uniform(rngs.params(), a_shape, jnp.float32, -bound, bound)
            b_shape = (
                *value.shape[: value.ndim - TARGETS[name]],
                config.rank,
                *value.shape[split:],
            )
            lead = names[: value.ndim - TARGETS[name]]
            a_names = (*names[:split], None)
            b_names = (*lead, None, *names[split:])
            setattr(host, f"{name}_lora_a", _param(a.astype(value.dtype), a_names))
            setattr(host, f"{name}_lora_b", _param(jnp.zeros(b_shape, value.dtype), b_names))
            if config.use_dora:  # m = ‖W‖ over the input axes: the factor starts at 1
                axes = tuple(range(value.ndim - TARGETS[name], split))
                norm = jnp.sqrt(jnp.sum(jnp.square(value.astype(jnp.float32)), axis=axes))
                m_names = (*lead, *names[split:])
                setattr(host, f"{name}_lora_m", _param(norm.astype(value.dtype), m_names))
            added += 1
            host.lora_config = config  # static: its scale enters the forward
    if not added:
        raise ValueError(f"add_lora: no projection of the model matches {list(config.targets)}.")
    return model


def _param(value: jax.Array, names: tuple[str | None, ...]) -> nnx.Param:
    return nnx.Param(value, out_sharding=names, eager_sharding=False)


def has_lora(model: nnx.Module) -> bool:
    """Whether any projection of `model` has adapters."""
    return any(
        getattr(host, f"{name}_lora_a", None) is not None
        for host in _hosts(model)
        for name in TARGETS
    )


def merge_lora(model: nnx.Module) -> nnx.Module:
    """A copy of `model` with every adapter folded into its weight (`W + s · A·B`, with DoRA
    `m / ‖W + s·A·B‖ ⊙ (W + s·A·B)`, computed in float32, stored in `W`'s dtype) and the
    adapters removed: a plain model of the base architecture (`save_pretrained` writes this).

    Examples:
      >>> from jaxrl_llm.models import Decoder, ModelConfig
      >>> cfg = ModelConfig(family="qwen3", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> base = Decoder(cfg, rngs=nnx.Rngs(0))
      >>> merged = merge_lora(add_lora(nnx.clone(base), LoRAConfig(), rngs=nnx.Rngs(1)))
      >>> bool(jnp.array_equal(merged.layers.mlp.up[...], base.layers.mlp.up[...]))  # B = 0
      True
    """
    model = nnx.clone(model)
    for host, name, stacked in _adapted(model):
        weight, a, b = (getattr(host, f"{name}{suffix}") for suffix in ("", "_lora_a", "_lora_b"))
        dtype, scale = weight[...].dtype, host.lora_config.scale
        merged = adapted_weight(weight, a, b, scale)
        magnitude = getattr(host, f"{name}_lora_m", None)
        if magnitude is not None:
            inputs = INPUT_AXES[name]
            ratio = dora_ratio_of(merged, magnitude, lead=stacked, inputs=inputs)
            merged = merged * _expand_over_inputs(ratio, stacked, inputs)
        weight.set_value(merged.astype(dtype))
        _drop_adapters(host, name)
    return model


def fold_dora_magnitudes(model: nnx.Module) -> nnx.Module:
    """Fold every DoRA factor `ρ = m / ‖W + s·A·B‖` into its weight and `B` (`W ← ρ ⊙ W`,
    `B ← ρ ⊙ B`, float32 products stored in their dtypes) and drop `m`, in place: a plain LoRA
    model with the same outputs (`ρ ⊙ (x·W + s·(x·A)·B)` = `x·(ρ⊙W) + s·(x·A)·(ρ⊙B)`). Models
    without DoRA are returned unchanged. The sampler calls it once per rollout, inside its
    program, so that decoding does not recompute the weight norms at every token; the result
    is not for training (`ρ` would no longer be a constant of the gradient).
    """
    for host, name, stacked in _adapted(model):
        magnitude = getattr(host, f"{name}_lora_m", None)
        if magnitude is None:
            continue
        weight, a, b = (getattr(host, f"{name}{suffix}") for suffix in ("", "_lora_a", "_lora_b"))
        ratio = dora_ratio(weight, a, b, magnitude, host.lora_config.scale, inputs=INPUT_AXES[name])
        for param, axes in ((weight, INPUT_AXES[name]), (b, 1)):
            value = param[...]
            scaled = value.astype(jnp.float32) * _expand_over_inputs(ratio, stacked, axes)
            param.set_value(scaled.astype(value.dtype))
        delattr(host, f"{name}_lora_m")
    return model


def _adapted(model: nnx.Module) -> list[tuple[nnx.Module, str, int]]:
    """`(host, projection, number of stacked leading axes)` of every adapted projection."""
    return [
        (host, name, getattr(host, name)[...].ndim - TARGETS[name])
        for host in _hosts(model)
        for name in TARGETS
        if getattr(host, f"{name}_lora_a", None) is not None
    ]


def _expand_over_inputs(ratio: jax.Array, stacked: int, inputs: int) -> jax.Array:
    """`ratio [*lead, *O]` with `inputs` unit axes after the leading ones (`[*lead, 1.., *O]`)."""
    return jnp.expand_dims(ratio, tuple(range(stacked, stacked + inputs)))


def _drop_adapters(host: nnx.Module, name: str) -> None:
    for side in ("a", "b", "m"):
        if getattr(host, f"{name}_lora_{side}", None) is not None:
            delattr(host, f"{name}_lora_{side}")
    if hasattr(host, "lora_config") and not any(
        getattr(host, f"{t}_lora_a", None) is not None for t in TARGETS
    ):
        delattr(host, "lora_config")


def lora_parameter_count(model: nnx.Module) -> int:
    """The number of adapter parameters of `model` (0 without adapters)."""
    total = 0
    for host in _hosts(model):
        for name in TARGETS:
            for side in ("a", "b", "m"):
                param = getattr(host, f"{name}_lora_{side}", None)
                if param is not None:
                    total += int(param[...].size)
    return total
