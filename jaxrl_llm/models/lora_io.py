"""LoRA adapters in PEFT's file format: `adapter_config.json` + `adapter_model.safetensors`.

The format that Hugging Face PEFT (`PeftModel.from_pretrained`), TRL and vLLM's LoRA serving
read. For a projection whose Hugging Face weight is `W_hf [out, in]` (`hf_names`: ours is
`W_hf.T` with the input axes first), PEFT stores

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   [r, in]   = A.reshape(in, r).T
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   [out, r]  = B.reshape(r, out).T

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_magnitude_vector  [out]  = m.reshape(out)

so that its update `s · lora_B @ lora_A` is ours, `s · A·B`, transposed (the magnitude only
with DoRA, `use_dora`). `save_lora_adapter`
writes the adapters of a `Decoder`; `load_lora_adapter` adds a file's adapters to a base
`Decoder` (`add_lora` with the file's rank, α, targets, rsLoRA and DoRA switches, then its
values). `target_modules` written per layer (PEFT's `"all-linear"`) load when they cover every
layer. Settings this module does not implement (biases, per-layer ranks or layer subsets, a
regex `target_modules`, `fan_in_fan_out`, an `init_lora_weights` after which PEFT rebuilds
the base such as PiSSA or OLoRA, aLoRA's invocation tokens) are refused by name.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models.decoder import Decoder
from jaxrl_llm.models.hf_names import tensor_maps
from jaxrl_llm.models.lora import TARGETS, LoRAConfig, add_lora, has_lora

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_HOSTS = {
    **dict.fromkeys(("q", "k", "v", "o"), "attn"),
    **dict.fromkeys(("gate", "up", "down"), "mlp"),
}
# adapter_config.json settings whose non-default values change the computation
_UNSUPPORTED = {
    "bias": "none",
    "fan_in_fan_out": False,
    "layers_to_transform": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "modules_to_save": None,
    "lora_bias": False,  # a bias on B
    "trainable_token_indices": None,  # embedding rows trained as deltas
    "layer_replication": None,
    "target_parameters": None,  # adapters on parameters (MoE experts), not modules
}
# further settings of PEFT's LoraConfig that change what a loaded adapter computes; refused when
# read (not written: an older PEFT may not know them)
_REFUSED_ON_READ = {
    "alora_invocation_tokens": None,  # aLoRA: the adapter acts only after its invocation tokens
    "exclude_modules": None,
    "layers_pattern": None,
    "use_qalora": False,
    "use_bdlora": None,
    "arrow_config": None,
    "kasa_config": None,
    "monteclora_config": None,
    "velora_config": None,
    "megatron_config": None,
}
# `init_lora_weights` values after which the adapter is a plain `W + s·B·A` on the unchanged base;
# the others (PiSSA, OLoRA, CorDA, LoftQ, ...) make PEFT rebuild a residual base when it loads
_PLAIN_INITS = (True, False, "gaussian", "orthogonal", "eva", "nora")
# a per-layer module name, as PEFT writes `target_modules` for "all-linear"
_QUALIFIED = re.compile(r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+?)(?:_proj)?$")


def _module_names(config: Any, num_layers: int) -> dict[str, list[str]]:
    """Per target, the Hugging Face module name of each layer (`model.layers.0.self_attn.q_proj`)."""
    maps = {m.path: m for m in tensor_maps(config)}
    return {
        name: [
            n.removesuffix(".weight")
            for n in maps[f"layers.{_HOSTS[name]}.{name}"].hf_names(num_layers)
        ]
        for name in TARGETS
    }


# our adapter parameter → PEFT's tensor name suffix
_SIDES = {"a": "lora_A.weight", "b": "lora_B.weight", "m": "lora_magnitude_vector"}


def _adapters(model: Decoder) -> dict[str, dict[str, nnx.Param]]:
    """Per adapted target, its adapter parameters by side (`a`, `b`, and `m` with DoRA)."""
    out = {}
    for name, host in _HOSTS.items():
        module = getattr(model.layers, host)
        sides = {
            side: getattr(module, f"{name}_lora_{side}")
            for side in _SIDES
            if getattr(module, f"{name}_lora_{side}", None) is not None
        }
        if sides:
            out[name] = sides
    return out


def save_lora_adapter(
    model: Decoder, path: str | pathlib.Path, *, base_model: str | None = None
) -> pathlib.Path:
    """Write the LoRA adapters of `model` in PEFT's format (module docstring) to `path`.

    Args:
      model: a `Decoder` with adapters (`add_lora`).
      path: the output directory (created).
      base_model: recorded as `base_model_name_or_path` (the checkpoint the adapters apply to).

    Raises:
      ValueError: `model` is not a `Decoder` or has no adapters.

    Examples:
      >>> import tempfile
      >>> from jaxrl_llm.models import ModelConfig
      >>> cfg = ModelConfig(family="qwen3", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> model = add_lora(Decoder(cfg, rngs=nnx.Rngs(0)), LoRAConfig(rank=2, targets=("q", "v")),
      ...                  rngs=nnx.Rngs(1))
      >>> out = save_lora_adapter(model, tempfile.mkdtemp())
      >>> json.loads((out / CONFIG_FILE).read_text())["target_modules"]
      ['q_proj', 'v_proj']
    """
    from safetensors.numpy import save_file

    if not isinstance(model, Decoder) or not has_lora(model):
        raise ValueError("save_lora_adapter: `model` must be a Decoder with LoRA adapters.")
    adapters = _adapters(model)
    modules = _module_names(model.config, model.config.num_layers)
    tensors: dict[str, np.ndarray] = {}
    for name, sides in adapters.items():
        for side, param in sides.items():
            value = np.asarray(jax.device_get(param[...]))
            for layer, module in enumerate(modules[name]):
                tensors[f"{_PREFIX}{module}.{_SIDES[side]}"] = np.ascontiguousarray(
                    _TO_PEFT[side](value[layer])
                )
    lora = next(
        getattr(model.layers, host).lora_config
        for host in ("attn", "mlp")
        if hasattr(getattr(model.layers, host), "lora_config")
    )
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "use_rslora": lora.use_rslora,
        "use_dora": lora.use_dora,
        "target_modules": [f"{name}_proj" for name in adapters],
        "lora_dropout": 0.0,
        "base_model_name_or_path": base_model,
        "inference_mode": True,
        **_UNSUPPORTED,
    }
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    return path


def read_lora_config(path: str | pathlib.Path, num_layers: int | None = None) -> LoRAConfig:
    """The `LoRAConfig` of a PEFT adapter directory (`adapter_config.json`).

    `target_modules` may name the projections (`q_proj`, ...) or, as PEFT writes them for
    `"all-linear"`, each layer's module (`model.layers.0.self_attn.q_proj`): those must cover
    every one of the `num_layers` layers for each projection they name.

    Raises:
      ValueError: the file is missing, not a LoRA adapter, or uses a setting this library
        does not implement (named): per-layer subsets, biases, an `init_lora_weights` that
        rebuilds the base (PiSSA, OLoRA, CorDA, LoftQ: convert the adapter with PEFT's
        `path_initial_model_for_weight_conversion` first), aLoRA, ...
    """
    file = pathlib.Path(path) / CONFIG_FILE
    if not file.is_file():
        raise ValueError(f"load_lora_adapter: {file} does not exist (not a PEFT adapter).")
    config = json.loads(file.read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(
            f"load_lora_adapter: {file}: peft_type {config.get('peft_type')!r}, not 'LORA'."
        )
    for key, default in {**_UNSUPPORTED, **_REFUSED_ON_READ}.items():
        value = config.get(key, default)
        if value != default and value not in (None, [], {}):
            raise ValueError(f"load_lora_adapter: {file}: `{key}` = {value!r} is not supported.")
    init = config.get("init_lora_weights", True)
    if not any(
        init is plain or (isinstance(plain, str) and init == plain) for plain in _PLAIN_INITS
    ):
        raise ValueError(
            f"load_lora_adapter: {file}: `init_lora_weights` = {init!r} is not supported: PEFT "
            "loads such an adapter onto a base it rebuilds from the initial adapter (a residual "
            "weight); save it with PEFT's `path_initial_model_for_weight_conversion` to get a "
            "plain LoRA adapter."
        )
    return LoRAConfig(
        rank=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        targets=_targets(config.get("target_modules"), file, num_layers),
        use_rslora=bool(config.get("use_rslora", False)),
        use_dora=bool(config.get("use_dora", False)),
    )


def _targets(modules: Any, file: pathlib.Path, num_layers: int | None) -> tuple[str, ...]:
    """Our adapter targets from PEFT's `target_modules` (projection or per-layer names)."""
    if not isinstance(modules, list):
        raise ValueError(
            f"load_lora_adapter: {file}: `target_modules` must be a list of module names, got "
            f"{modules!r}."
        )
    short = [m.removesuffix("_proj") for m in modules if "." not in m]
    layers: dict[str, set[int]] = {}
    for module in (m for m in modules if "." in m):
        match = _QUALIFIED.fullmatch(module)
        if match is None:
            raise ValueError(
                f"load_lora_adapter: {file}: target module {module!r} is not a layer's projection."
            )
        layers.setdefault(match[2], set()).add(int(match[1]))
    if layers and num_layers is None:
        raise ValueError(
            f"load_lora_adapter: {file}: per-layer `target_modules` need the model's num_layers."
        )
    for name, found in layers.items():
        if found != set(range(num_layers)):
            raise ValueError(
                f"load_lora_adapter: {file}: `target_modules` adapt {name} in layers "
                f"{sorted(found)} of {num_layers}; adapters on a subset of the layers are not "
                "supported."
            )
    return tuple(dict.fromkeys([*short, *layers]))


def load_lora_adapter(model: Decoder, path: str | pathlib.Path) -> Decoder:
    """Add the adapters of a PEFT LoRA directory to the base `model` (in place; returned).

    Raises:
      ValueError: `model` is not a `Decoder` without adapters, the adapter is not supported
        (`read_lora_config`), a tensor is missing or has the wrong shape, or the file holds
        tensors the adapters do not use (all named).

    Examples:
      >>> import tempfile
      >>> from jaxrl_llm.models import ModelConfig
      >>> cfg = ModelConfig(family="qwen3", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> adapted = add_lora(Decoder(cfg, rngs=nnx.Rngs(0)), LoRAConfig(rank=2), rngs=nnx.Rngs(1))
      >>> out = save_lora_adapter(adapted, tempfile.mkdtemp())
      >>> loaded = load_lora_adapter(Decoder(cfg, rngs=nnx.Rngs(0)), out)
      >>> bool(jnp.array_equal(loaded.layers.mlp.up_lora_a[...], adapted.layers.mlp.up_lora_a[...]))
      True
    """
    from safetensors.numpy import load_file

    if not isinstance(model, Decoder) or has_lora(model):
        raise ValueError("load_lora_adapter: `model` must be a Decoder without LoRA adapters.")
    config = read_lora_config(path, model.config.num_layers)
    tensors = load_file(str(pathlib.Path(path) / WEIGHTS_FILE))
    add_lora(model, config, rngs=nnx.Rngs(0))  # shapes and metadata; the values follow
    modules = _module_names(model.config, model.config.num_layers)
    used = set()
    for name, sides in _adapters(model).items():
        for side, param in sides.items():
            value = param[...]
            layers = []
            for module in modules[name]:
                key = f"{_PREFIX}{module}.{_SIDES[side]}"
                used.add(key)
                if key not in tensors:
                    raise ValueError(f"load_lora_adapter: {WEIGHTS_FILE} lacks {key}.")
                expected = _TO_PEFT[side](np.zeros(value.shape[1:])).shape
                if tensors[key].shape != expected:
                    raise ValueError(
                        f"load_lora_adapter: {key} has shape {tensors[key].shape}, expected "
                        f"{expected}."
                    )
                layers.append(_FROM_PEFT[side](tensors[key], value.shape[1:]))
            param.set_value(jnp.asarray(np.stack(layers), value.dtype))
    unused = sorted(set(tensors) - used)
    if unused:  # e.g. LoRA biases, token deltas, or the layers of a deeper model
        shown = ", ".join(unused[:3]) + (f" and {len(unused) - 3} more" if len(unused) > 3 else "")
        raise ValueError(
            f"load_lora_adapter: {WEIGHTS_FILE} holds tensors this model's adapters do not use: "
            f"{shown}."
        )
    return model


# one layer's adapter in our layout (`A [*I, r]`, `B [r, *O]`, `m [*O]`) ↔ PEFT's tensor
_TO_PEFT = {
    "a": lambda a: a.reshape(-1, a.shape[-1]).T,  # [r, in]
    "b": lambda b: b.reshape(b.shape[0], -1).T,  # [out, r]
    "m": lambda m: m.reshape(-1),  # [out]
}
_FROM_PEFT = {
    "a": lambda t, shape: t.T.reshape(shape),
    "b": lambda t, shape: t.T.reshape(shape),
    "m": lambda t, shape: t.reshape(shape),
}
