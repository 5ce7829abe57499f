"""Frozen-dataclass configs built from YAML, validated on load.

One loader for every component config (DESIGN.md §6, STYLE.md §3.9): unknown keys fail with a
"did you mean" suggestion, values are checked against the field's annotation (bool, int, float,
str, `Literal[...]`, `X | None`, nested dataclasses and tuples of them; a float must be finite:
YAML's `.nan` / `.inf` are rejected), and the error names the key path, the expected type or
allowed values, and what was received.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import pathlib
import re
import types
import typing
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or mapping does not match its dataclass (the message names the key)."""


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader with two changes for configs: `1e-3` is a float (YAML 1.1, which
    PyYAML follows, needs a dot: `1.0e-3`; a learning rate written `1e-3` was the string
    '1e-3'), and a key repeated in one mapping is an error (PyYAML kept the last silently).
    Merge keys (`<<: *anchor`) merge as in YAML, the mapping's own keys winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: merged below
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable) and key in first:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {first[key].line + 1})",
                    key_node.start_mark,
                )
            if isinstance(key, typing.Hashable):
                first[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    """`text` as YAML, read as configs are (`1e-3` a float, repeated keys refused).

    Examples:
      >>> parse_yaml("{lr: 1e-3, warmup: 5E2, name: 1e3x}")
      {'lr': 0.001, 'warmup': 500.0, 'name': '1e3x'}
      >>> parse_yaml("{steps: 1, steps: 2}")
      Traceback (most recent call last):
      ...
      yaml.constructor.ConstructorError: duplicate key 'steps' (first at line 1)
      ...
      >>> parse_yaml("base: &b {lr: 1}\\nrun: {<<: *b, steps: 2}")["run"]
      {'lr': 1, 'steps': 2}
    """
    return _unshared(yaml.load(text, Loader=_ConfigLoader))


def _unshared(value: Any) -> Any:
    """A copy in which no two places share a mapping or list: YAML aliases (`*anchor`) load as
    one shared object, and an override of one place would change every alias."""
    if isinstance(value, dict):
        return {k: _unshared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshared(v) for v in value]
    return value


def load_yaml(path: str | pathlib.Path) -> dict[str, Any]:
    """Read a YAML mapping from `path` (a clear error if it is missing or not a mapping)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read the config file ({error}).") from None
    try:
        data = parse_yaml(text) or {}
    except yaml.YAMLError as error:  # one line: where the YAML breaks and why
        mark = getattr(error, "problem_mark", None)
        at = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{path}:{at}: not valid YAML ({problem}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}.")
    return data


def build(cls: type[T], data: Any, *, path: str = "") -> T:
    """Build the frozen dataclass `cls` from a mapping, validating every key and value.

    Examples:
      >>> @dataclasses.dataclass(frozen=True, kw_only=True)
      ... class Opt:
      ...     lr: float = 1e-3
      ...     name: typing.Literal["adam", "sgd"] = "adam"
      >>> build(Opt, {"lr": 0.1})
      Opt(lr=0.1, name='adam')
      >>> build(Opt, {"nmae": "sgd"})
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: unknown key 'nmae' (did you mean 'name'?); allowed keys: lr, name
      >>> build(Opt, {"name": "adamw"})
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: name: must be one of 'adam', 'sgd', got 'adamw'.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{path or cls.__name__}: expected a mapping, got {type(data).__name__}.")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    prefix = f"{path}." if path else ""
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            where = f"{path}: " if path else ""
            raise ConfigError(
                f"{where}unknown key '{key}'{hint}; allowed keys: {', '.join(fields)}"
            )
    kwargs = {k: _convert(hints[k], v, f"{prefix}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as err:  # a required field is missing
        missing = [
            name
            for name, f in fields.items()
            if name not in kwargs
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            keys = ", ".join(f"'{name}'" for name in missing)
            raise ConfigError(f"{path or cls.__name__}: missing required key(s) {keys}.") from None
        raise ConfigError(f"{path or cls.__name__}: {err}") from None
    except ValueError as err:  # the dataclass's own checks: name the key path they came from
        named = not path or str(err).startswith(path)
        raise ConfigError(str(err) if named else f"{path}: {err}") from None


def _convert(annotation: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{path}: must be one of {allowed}, got {value!r}.")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, path)
            except ConfigError as err:
                errors.append(str(err))
        if len(errors) == 1:
            raise ConfigError(errors[0])
        reasons = [e.removeprefix(f"{path}: ").removesuffix(".") for e in errors]
        raise ConfigError(f"{path}: {'; or '.join(reasons)}.")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__}.")
        item = args[0] if args else Any
        return tuple(_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(annotation):
        return build(annotation, value, path=path)  # type: ignore[arg-type]
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}.")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}.")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: expected a number, got {value!r}.")
        if not math.isfinite(value):  # YAML's .nan / .inf: never a meaningful setting
            raise ConfigError(f"{path}: expected a finite number, got {value!r}.")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}.")
        return value
    return value
