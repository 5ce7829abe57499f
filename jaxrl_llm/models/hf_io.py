"""Load and save Hugging Face checkpoints (`config.json` + `*.safetensors`).

`from_pretrained` validates everything before reading any weight: the config (unsupported
families and options fail by name), every safetensors header (a truncated or corrupt file fails
naming the file), the set of tensor names (missing and unexpected tensors are listed) and every
tensor shape. Only then does it build the model: the module is created abstractly
(`nnx.eval_shape`, no random weights), and each parameter is assembled with
`jax.make_array_from_callback`, which asks for one shard per device. The callback reads the HF
tensors it needs from the memory-mapped files (one layer at a time), converts them to our layout
and `param_dtype`, and cuts out the shard. The host holds the distinct shards of one parameter
(for a stacked layer weight on one device, all its layers) plus one HF tensor, never the model;
identical shards (replicas along `data`) are read once. With a `mesh`, each parameter's sharding comes from its logical axis names
through `sharding.logical_to_spec` and the rule table.

`save_pretrained` writes `config.json` and safetensors shards (with an index when there is more
than one) that `transformers.AutoModelForCausalLM.from_pretrained` loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import shutil
from collections.abc import Iterator
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding

from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.decoder import Decoder, Remat
from jaxrl_llm.models.hf_names import TensorMap, check_names, tensor_maps, value_head_map
from jaxrl_llm.models.lora import has_lora, merge_lora
from jaxrl_llm.models.value import ValueHead, ValueModel
from jaxrl_llm.tokenizer import TOKENIZER_FILES
from sharding.rules import LOGICAL_AXIS_RULES, Rules, logical_to_spec

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
_PARTIAL = ".partial.safetensors"  # a shard being written


def _weight_files(path: pathlib.Path) -> dict[str, pathlib.Path]:
    """Map each tensor name to its file (not opened yet): empty for a single `model.safetensors`
    (filled from its header), else from the index. A directory holding both reads the single
    file, as `transformers` does."""
    index = path / INDEX_FILE
    if (path / SINGLE_FILE).is_file():
        return {}
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no 'weight_map' mapping.")
        missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
        if missing:
            raise ValueError(f"{index} names files that are not in {path}: {missing}")
        return {name: path / file for name, file in weight_map.items()}
    raise ValueError(f"no {SINGLE_FILE} or {INDEX_FILE} in {path}")


@contextlib.contextmanager
def open_checkpoint(path: pathlib.Path) -> Iterator[dict[str, Any]]:
    """Open every safetensors file of `path`; yields `{tensor name: open file handle}`."""
    from safetensors import SafetensorError, safe_open

    files = _weight_files(path)
    paths = sorted(set(files.values())) or [path / SINGLE_FILE]
    with contextlib.ExitStack() as stack:
        handles = {}
        for file in paths:
            try:
                handles[file] = stack.enter_context(safe_open(str(file), framework="np"))
            except SafetensorError as err:
                raise ValueError(
                    f"{file}: truncated or corrupt safetensors file ({err})."
                ) from None
        by_name = {}
        for file, handle in handles.items():
            names = handle.keys()  # a safe_open handle is not iterable itself
            for name in names:
                if files and files.get(name) != file:
                    raise ValueError(f"{file} holds {name!r}, which {INDEX_FILE} puts elsewhere.")
                by_name[name] = handle
        absent = sorted(set(files) - set(by_name))
        if absent:
            raise ValueError(
                f"tensors listed in {INDEX_FILE} but absent from their files: {absent}"
            )
        yield by_name


# safetensors' names of the floating-point types a weight may be stored in
_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})


def _check_shapes(maps: list[TensorMap], handles: dict[str, Any], num_layers: int) -> None:
    wrong = []
    for m in maps:
        for name in m.hf_names(num_layers):
            tensor = handles[name].get_slice(name)
            shape, dtype = tuple(tensor.get_shape()), tensor.get_dtype()
            if shape != m.hf_shape:
                wrong.append(f"{name}: expected {m.hf_shape}, found {shape}")
            if dtype not in _FLOAT_DTYPES:  # an integer tensor is a quantized weight, not a value
                wrong.append(f"{name}: expected a floating-point tensor, found {dtype}")
    if wrong:
        raise ValueError("checkpoint tensors have the wrong shape or type: " + "; ".join(wrong))


def _shard_reader(m: TensorMap, handles: dict[str, Any], num_layers: int, dtype: Any) -> Any:
    """`callback(index) -> np.ndarray` for `jax.make_array_from_callback` (memoised per index)."""
    names = m.hf_names(num_layers)
    done: dict[str, np.ndarray] = {}

    def read(name: str) -> np.ndarray:
        return m.to_ours(handles[name].get_tensor(name))

    def callback(index: tuple[slice, ...]) -> np.ndarray:
        key = repr(index)
        if key not in done:
            if m.layered:
                layers = range(num_layers)[index[0]]
                shard = np.stack([read(names[i])[index[1:]] for i in layers])
            else:
                shard = read(names[0])[index]
            done[key] = np.asarray(shard, dtype=dtype)
        return done[key]

    return callback


def _model_maps(config: ModelConfig, head: str) -> list[TensorMap]:
    if head == "lm":
        return tensor_maps(config)
    backbone = tensor_maps(config, lm_head=False)
    return [dataclasses.replace(m, path=f"backbone.{m.path}") for m in backbone] + [
        value_head_map(config)
    ]


def _sharding(var: Any, mesh: Mesh | None, rules: Rules) -> jax.sharding.Sharding:
    if mesh is None:
        return SingleDeviceSharding(jax.devices()[0])
    names = var.get_metadata().get("out_sharding")
    return NamedSharding(mesh, logical_to_spec(names, rules, mesh, shape=var.get_value().shape))


def from_pretrained(
    path: str | pathlib.Path,
    *,
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
    mesh: Mesh | None = None,
    rules: Rules = LOGICAL_AXIS_RULES,
    remat: Remat = "dots",
    attention_chunk: int | None = None,
    fused_attention: bool = False,
    head: Literal["lm", "value"] = "lm",
    seed: int = 0,
) -> Decoder | ValueModel:
    """Load a local HF checkpoint directory into a `Decoder` (or a `ValueModel`).

    Args:
      path: directory with `config.json` and `model.safetensors` or a sharded
        `model.safetensors.index.json` set.
      dtype: compute dtype of the returned model.
      param_dtype: dtype the weights are stored in (converted on the host while loading).
      mesh: place each parameter with the `NamedSharding` its logical axes get from `rules`;
        `None` puts everything on the default device.
      rules: logical-axis rule table (`sharding.LOGICAL_AXIS_RULES` by default).
      remat: the model's rematerialisation policy (see `Decoder`).
      attention_chunk: queries per attention block in the forwards without a cache (see
        `Decoder`); None attends all at once.
      fused_attention: attend through `jax.nn.dot_product_attention` (cuDNN's flash
        attention on GPUs) in the forwards without a cache (see `Decoder`).
      head: "lm" for a causal LM; "value" for a `ValueModel`, whose head is the checkpoint's
        `score.weight` (a `*ForSequenceClassification` reward model) or, when absent (a critic
        started from a policy checkpoint, whose `lm_head.weight` is then not loaded), a fresh
        head drawn with `seed`.
      seed: PRNG seed of a fresh value head.

    Raises:
      ValueError: no or bad `config.json`, unsupported family or option, truncated or corrupt
        file, missing / unexpected tensors (listed), or wrong shapes. Nothing is returned then.

    Examples:
      >>> import tempfile
      >>> cfg = ModelConfig(family="qwen2", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> path = pathlib.Path(tempfile.mkdtemp())
      >>> save_pretrained(Decoder(cfg, rngs=nnx.Rngs(0)), path)
      >>> sorted(p.name for p in path.iterdir())
      ['config.json', 'model.safetensors']
      >>> model = from_pretrained(path, param_dtype=jnp.bfloat16)
      >>> model.config == cfg, model.layers.attn.q[...].dtype
      (True, dtype(bfloat16))
    """
    if head not in ("lm", "value"):
        raise ValueError(f"from_pretrained: head must be 'lm' or 'value', got {head!r}.")
    path = pathlib.Path(path)
    config = ModelConfig.from_json_file(path)
    cls = Decoder if head == "lm" else ValueModel
    maps = _model_maps(config, head)
    L = config.num_layers
    with open_checkpoint(path) as handles:
        fresh = head == "value" and "score.weight" not in handles
        to_load = [m for m in maps if not (fresh and m.path == "head.kernel")]
        ignore = {"lm_head.weight"} if (config.tie_embeddings or head == "value") else set()
        check_names(to_load, set(handles), L, ignore=ignore)
        _check_shapes(to_load, handles, L)
        kwargs = {
            "dtype": dtype,
            "param_dtype": param_dtype,
            "remat": remat,
            "attention_chunk": attention_chunk,
            "fused_attention": fused_attention,
        }
        # shapes only: outside any ambient mesh, whose axes are not the logical names in the
        # variables' metadata (`nnx.eval_shape` would read them as mesh axes)
        with jax.set_mesh(None):
            abstract = nnx.eval_shape(lambda: cls(config, **kwargs, rngs=nnx.Rngs(seed)))
        graphdef, state = nnx.split(abstract)
        by_path = {m.path: m for m in to_load}
        leaves = []
        for key, var in nnx.to_flat_state(state):
            m = by_path.get(".".join(str(k) for k in key))
            sharding = _sharding(var, mesh, rules)
            if m is None:  # the fresh value head
                fresh_head = ValueHead(
                    config.hidden_size, param_dtype=param_dtype, rngs=nnx.Rngs(seed)
                )
                value = jax.device_put(fresh_head.kernel.get_value(), sharding)
            else:
                reader = _shard_reader(m, handles, L, np.dtype(param_dtype))
                value = jax.make_array_from_callback(var.get_value().shape, sharding, reader)
            leaves.append((key, var.replace(value=value)))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def _host_tensors(
    model: Decoder | ValueModel, maps: list[TensorMap], dtype: Any
) -> Iterator[tuple[str, np.ndarray]]:
    """`(hf name, numpy tensor)` pairs of `model`, one parameter gathered at a time."""
    num_layers = model.config.num_layers
    by_path = {m.path: m for m in maps}
    for key, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        m = by_path[".".join(str(k) for k in key)]
        value = np.asarray(jax.device_get(var.get_value())).astype(dtype)
        layers = value if m.layered else value[None]
        for name, layer in zip(m.hf_names(num_layers), layers, strict=True):
            yield name, m.to_hf(layer)


def save_pretrained(
    model: Decoder | ValueModel,
    path: str | pathlib.Path,
    *,
    dtype: Any = None,
    max_shard_bytes: int = 4 * 1024**3,
) -> None:
    """Write `model` as a Hugging Face checkpoint directory.

    A `Decoder` becomes a `*ForCausalLM` checkpoint, a `ValueModel` a
    `*ForSequenceClassification` one with a single label (`score.weight`).

    Args:
      model: a `Decoder` (with its LM head) or a `ValueModel`.
      path: output directory (created). An earlier export there is replaced: its config,
        weight files and index; a save that fails while writing the tensors leaves it as it was.
      dtype: dtype of the written tensors; default the model's `param_dtype`.
      max_shard_bytes: start a new `model-XXXXX-of-YYYYY.safetensors` file past this size.

    Each parameter is gathered to the host on its own (`jax.device_get`), so the host holds at
    most one shard file's worth of tensors.

    Examples:
      >>> import tempfile
      >>> cfg = ModelConfig(family="gemma", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> path = pathlib.Path(tempfile.mkdtemp())
      >>> save_pretrained(Decoder(cfg, rngs=nnx.Rngs(0)), path, dtype=jnp.bfloat16)
      >>> written = json.loads((path / "config.json").read_text())
      >>> written["architectures"], written["dtype"], written["tie_word_embeddings"]
      (['GemmaForCausalLM'], 'bfloat16', False)
    """
    from safetensors.numpy import save_file

    if has_lora(model):  # LoRA adapters are folded into their weights: a plain checkpoint
        model = merge_lora(model)
    config = model.config
    if isinstance(model, ValueModel):
        maps = _model_maps(config, "value")
        architecture = config.scorer_architecture
    elif not model.has_lm_head and not config.tie_embeddings:
        raise ValueError("save_pretrained: this Decoder has no lm_head (built with lm_head=False).")
    else:
        maps, architecture = tensor_maps(config), config.architecture
    np_dtype = np.dtype(model.param_dtype if dtype is None else dtype)
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config_dict = config.to_hf_dict(dtype=str(jnp.dtype(np_dtype)))
    config_dict["architectures"] = [architecture]
    if isinstance(model, ValueModel):
        config_dict["id2label"], config_dict["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    pending: dict[str, np.ndarray] = {}
    size = total = 0
    written: list[tuple[pathlib.Path, list[str]]] = []
    try:
        for name, tensor in _host_tensors(model, maps, np_dtype):
            if pending and size + tensor.nbytes > max_shard_bytes:
                written.append(_flush(pending, path, len(written), save_file))
                size = 0
            pending[name] = tensor
            size += tensor.nbytes
            total += tensor.nbytes
        written.append(_flush(pending, path, len(written), save_file))
    except BaseException:  # the directory keeps what it held before: no half-written files
        for file in path.glob(f"model-*{_PARTIAL}"):
            file.unlink(missing_ok=True)
        raise
    # an earlier export's config.json goes first and the new one comes last, so an interrupted
    # finish leaves a directory that nothing loads, never new weights under an old config
    (path / CONFIG_FILE).unlink(missing_ok=True)
    _finish_shards(path, written, total)
    tmp = path / f"{CONFIG_FILE}.tmp"
    tmp.write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    tmp.replace(path / CONFIG_FILE)


GENERATION_CONFIG_FILE = "generation_config.json"


def copy_side_files(
    source: str | pathlib.Path, dest: str | pathlib.Path, *, tokenizer: bool = True
) -> list[str]:
    """Copy a checkpoint's files other than its config and weights into another checkpoint
    directory: `generation_config.json` (the EOS ids and sampling defaults `transformers` and
    vLLM generate with) and, with `tokenizer`, the tokenizer's files. Missing ones are skipped.

    Returns:
      The names copied.

    Examples:
      >>> import tempfile
      >>> src, dst = pathlib.Path(tempfile.mkdtemp()), pathlib.Path(tempfile.mkdtemp())
      >>> _ = (src / "generation_config.json").write_text('{"eos_token_id": [1, 2]}')
      >>> _ = (src / "tokenizer.json").write_text("{}")
      >>> copy_side_files(src, dst), copy_side_files(src, dst, tokenizer=False)
      (['generation_config.json', 'tokenizer.json'], ['generation_config.json'])
    """
    source, dest = pathlib.Path(source), pathlib.Path(dest)
    names = (GENERATION_CONFIG_FILE, *(TOKENIZER_FILES if tokenizer else ()))
    copied = []
    for name in names:
        if (source / name).is_file() and (source / name).resolve() != (dest / name).resolve():
            shutil.copyfile(source / name, dest / name)
            copied.append(name)
    return copied


def _flush(
    tensors: dict[str, np.ndarray], path: pathlib.Path, i: int, save_file: Any
) -> tuple[pathlib.Path, list[str]]:
    """Write `tensors` to a partial shard file and empty the dict."""
    file = path / f"model-{i + 1:05d}{_PARTIAL}"
    save_file(tensors, str(file), metadata={"format": "pt"})
    names = sorted(tensors)
    tensors.clear()
    return file, names


def _finish_shards(
    path: pathlib.Path, written: list[tuple[pathlib.Path, list[str]]], total_bytes: int
) -> None:
    """Rename the partial files to their final names, write the index when sharded, and
    remove an earlier export's weight files that the new one does not replace."""
    (path / INDEX_FILE).unlink(missing_ok=True)
    finals = (
        [SINGLE_FILE]
        if len(written) == 1
        else [f"model-{i + 1:05d}-of-{len(written):05d}.safetensors" for i in range(len(written))]
    )
    for old in [path / SINGLE_FILE, *path.glob("model-*-of-*.safetensors")]:
        if old.name not in finals:
            old.unlink(missing_ok=True)
    for (file, _), final in zip(written, finals, strict=True):
        file.replace(path / final)
    if len(written) == 1:
        return
    weight_map = {}
    for (_, names), final in zip(written, finals, strict=True):
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
