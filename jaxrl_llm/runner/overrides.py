"""Command-line overrides (`key.sub=value`) and loading a `RunConfig` from YAML.

    jaxrl-llm train configs/grpo.yaml train.steps=20 optim.learning_rate=3e-4 warm_start=null

Each override is a dotted key path and a value parsed as a YAML scalar (`20` → int, `3e-4` →
float, `true`, `null`, `grpo`, a flow list `[1, 4]`, or a flow mapping `{steps: 50}`, which
replaces the whole section), read as config files are (`jaxrl_llm.config.parse_yaml`:
exponent notation without a dot, `1e-3`, which YAML 1.1 reads as a string, is a number). It
replaces that key of the YAML mapping before the config is built, creating intermediate
sections that the file leaves out (`warm_start.steps=50` on a file without `warm_start:`). Unknown keys and bad values then fail
in `jaxrl_llm.config.build` with the key path and a "did you mean" suggestion.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import pathlib
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from jaxrl_llm.config import ConfigError, build, load_yaml, parse_yaml
from jaxrl_llm.config import _convert as convert_value
from jaxrl_llm.runner.config import RunConfig
from jaxrl_llm.train.algorithms import PRESETS, AlgorithmConfig

log = logging.getLogger(__name__)


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """`"a.b=value"` → `(("a", "b"), parsed value)`.

    Examples:
      >>> parse_override("optim.learning_rate=3e-4")
      (('optim', 'learning_rate'), 0.0003)
      >>> parse_override("optim.learning_rate=1e-3")
      (('optim', 'learning_rate'), 0.001)
      >>> parse_override("train.eval_pass_k=[1, 4]")
      (('train', 'eval_pass_k'), [1, 4])
      >>> parse_override("steps")
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: override 'steps': expected KEY=VALUE with a dotted key, e.g. train.steps=10.
    """
    key, sep, raw = text.partition("=")
    path = tuple(key.strip().split("."))
    if not sep or not all(path):
        raise ConfigError(
            f"override {text!r}: expected KEY=VALUE with a dotted key, e.g. train.steps=10."
        )
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        problem = str(err).splitlines()[0]
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({problem}).") from None
    return path, value


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of the YAML mapping `data` with each `KEY=VALUE` override applied in order.

    Examples:
      >>> apply_overrides({"train": {"steps": 10}}, ["train.steps=3", "warm_start.steps=5"])
      {'train': {'steps': 3}, 'warm_start': {'steps': 5}}
      >>> apply_overrides({"seed": 1}, ["seed.value=2"])
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: override 'seed.value=2': 'seed' is a value (1), not a section.
    """
    out = copy.deepcopy(dict(data))
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for depth, key in enumerate(path[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            elif not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raise ConfigError(
                    f"override {text!r}: {where!r} is a value ({child!r}), not a section."
                )
            node = child
        node[path[-1]] = value
    return out


def build_run_config(data: Mapping[str, Any]) -> RunConfig:
    """Build a `RunConfig` from a mapping, section by section.

    An error raised by a component config's own validation (a plain `ValueError` naming its
    class) is re-raised as a `ConfigError` prefixed with the section's key.

    Examples:
      >>> build_run_config({"model": {"checkpoint": "/m"}, "sft": {}, "optm": {}})
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: unknown key 'optm' (did you mean 'optim'?); allowed keys: model, ...
      >>> build_run_config({"model": {"checkpoint": "/m"}, "sft": {"epochs": 0}})
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: sft: SFTConfig: `epochs` must be >= 1, got 0.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"the config must be a mapping, got {type(data).__name__}.")
    names = [f.name for f in dataclasses.fields(RunConfig)]
    unknown = [k for k in data if k not in names]
    if unknown:
        build(RunConfig, {unknown[0]: None})  # raises with the "did you mean" message
    hints = typing.get_type_hints(RunConfig)
    sections = {}
    for key, value in data.items():
        try:
            sections[key] = convert_value(hints[key], value, key)
        except ConfigError:
            raise
        except ValueError as err:
            raise ConfigError(f"{key}: {err}") from None
    if "model" not in sections:
        raise ConfigError("model: missing; set model.checkpoint or model.init.")
    return RunConfig(**sections)


def load_run_config(
    path: str | pathlib.Path,
    overrides: Sequence[str] = (),
    *,
    run_dir: str | pathlib.Path | None = None,
) -> RunConfig:
    """Read a run config from YAML, apply overrides, fill in `run_dir`, validate.

    Args:
      path: the YAML file.
      overrides: `KEY=VALUE` strings (see the module docstring).
      run_dir: the run directory (wins over the file's `run_dir`); when neither sets one,
        `runs/<file name without .yaml>`.

    Returns:
      The validated `RunConfig`.

    Raises:
      ConfigError: a missing file, an unknown key, a bad value or a cross-section conflict,
        naming the key.

    Examples:
      >>> import tempfile, pathlib
      >>> p = pathlib.Path(tempfile.mkdtemp()) / "tiny.yaml"
      >>> _ = p.write_text("model: {checkpoint: /m}\\nsft: {}\\ntrain: {steps: 5}\\n")
      >>> cfg = load_run_config(p, ["train.steps=2"])
      >>> cfg.train.steps, cfg.run_dir
      (2, 'runs/tiny')
      >>> load_run_config(p, ["train.stpes=2"])
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: train: unknown key 'stpes' (did you mean 'steps'?); allowed keys: steps, prompts_per_step, max_prompt_tokens, eval_every, eval_prompts, eval_samples, eval_pass_k, log_every, max_refills, overlong, truncation_penalty, max_consecutive_skips, compiled_iterations, compilation_cache, shared_prompt_forward, reference_sync, trim_completions, trim_minimum, pack_groups, pack_min_saving
    """
    path = pathlib.Path(path)
    data = apply_overrides(load_yaml(path), overrides)
    if run_dir is not None:
        data["run_dir"] = str(run_dir)
    elif data.get("run_dir") is None:
        data["run_dir"] = str(pathlib.Path("runs") / path.stem)
    config = build_run_config(data)
    warning = _preset_label_warning(data.get("algorithm"), config.algorithm)
    if warning:
        log.warning("%s", warning)
    return config


def _preset_label_warning(section: Any, algorithm: AlgorithmConfig | None) -> str | None:
    """A warning when `algorithm.name` is a preset's name but does not describe the settings:
    the name is only a label, so `algorithm: {name: dapo}` (or `algorithm.name=dapo` on another
    preset's file) trains something else under DAPO's name. None when it describes them, is
    no preset's name, or differs from its preset only by deliberate changes to its fields.

    Examples:
      >>> from jaxrl_llm.train import PRESETS
      >>> print(_preset_label_warning({"name": "dapo"}, dataclasses.replace(
      ...     PRESETS["grpo"], name="dapo")))  # doctest: +ELLIPSIS
      algorithm.name is 'dapo', but the settings are those of the 'grpo' preset: ...
      >>> _preset_label_warning({}, PRESETS["dapo"]) is None
      True
    """
    if algorithm is None or algorithm.name not in PRESETS:
        return None
    name = algorithm.name
    if dataclasses.replace(algorithm, name=PRESETS[name].name) == PRESETS[name]:
        return None
    others = [
        other
        for other, config in PRESETS.items()
        if other != name and dataclasses.replace(algorithm, name=config.name) == config
    ]
    hint = (
        f"the name is only a label for logs; for the {name!r} preset start from "
        f"configs/{name}.yaml (or jaxrl_llm.train.preset({name!r}))"
    )
    if others:
        return f"algorithm.name is {name!r}, but the settings are those of the {others[0]!r} preset: {hint}."
    if isinstance(section, Mapping) and set(section) == {"name"}:
        return (
            f"algorithm: {{name: {name}}} gives the default settings, not the {name!r} "
            f"preset's: {hint}."
        )
    return None
