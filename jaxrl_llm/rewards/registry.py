"""Reward functions by name: the built-ins, or any importable `module:function`.

A config names each reward function with `fn` (a built-in name such as `math_answer`, or an
import path `my_pkg.rewards:score`), a `weight`, and `kwargs` bound to the function's
keyword-only options. Every kwarg must be a parameter the function declares by name (a
misspelt option is an error with a suggestion, not silently swallowed by `**fields`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from jaxrl_llm.config import ConfigError
from jaxrl_llm.rewards.builtin import BUILTIN_OPTION_CHECKS, BUILTIN_REWARDS
from jaxrl_llm.rewards.model_reward import reward_model

# built-ins built once from their options when resolved (`fn(**kwargs)` returns the function)
BUILTIN_FACTORIES = {"reward_model": reward_model}

RewardFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardFunctionConfig:
    """One reward function of a `RewardConfig`.

    Attributes:
      fn: a built-in name (`math_answer`, `exact_match`, `exact_answer`, `tag_format`,
        `regex_format`, `overlong`, `reward_model`) or `module.path:function`.
      name: the name used in metrics and error messages (default: `fn`'s last part).
      weight: its weight `w_k` when rewards are combined (`jaxrl_llm.rewards.combine`).
      kwargs: keyword options bound to the function (e.g. `{answer_field: short_answer}`).

    Examples:
      >>> from jaxrl_llm.config import build
      >>> build(RewardFunctionConfig, {"fn": "math_answer", "kwargs": {"extract": "boxed"}})
      RewardFunctionConfig(fn='math_answer', name=None, weight=1.0, kwargs={'extract': 'boxed'})
    """

    fn: str
    name: str | None = None
    weight: float = 1.0
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise ConfigError(
                f"reward function {self.fn!r}: `kwargs` must be a mapping of option names to "
                f"values, got {self.kwargs!r}."
            )
        if self.name is not None and not self.name:
            raise ConfigError(f"reward function {self.fn!r}: `name` must not be empty.")
        for key, value in self.kwargs.items():
            _check_json_value(value, f"reward function {self.fn!r}: `kwargs.{key}`")


def _check_json_value(value: Any, where: str) -> None:
    """`value` is JSON data (the run's config is saved in every checkpoint's JSON meta): YAML
    also makes dates (`2024-01-01`), sets and bytes, which would fail the first save."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{where}: mapping keys must be strings, got {key!r}.")
            _check_json_value(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json_value(item, f"{where}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value}.")
    elif not (value is None or isinstance(value, str | int | float | bool)):
        raise ConfigError(
            f"{where}: {value!r} is a {type(value).__name__}; options must be JSON data "
            "(strings, numbers, booleans, null, lists, mappings): quote it to pass a string."
        )


class RewardFunction(NamedTuple):
    """A resolved reward function: `fn(prompts, completions, **fields)` with its options bound.

    Examples:
      >>> rf = resolve_reward_function(RewardFunctionConfig(fn="exact_answer"))
      >>> rf.name, rf.weight, rf.fn(["1+1="], ["2"], answer=["2"])
      ('exact_answer', 1.0, [1.0])
    """

    name: str
    fn: RewardFn
    weight: float


def import_callable(path: str) -> RewardFn:
    """The callable at `module.path:attribute` (attributes may be dotted: `mod:Class.method`).

    Examples:
      >>> import_callable("math:sqrt")(9.0)
      3.0
      >>> import_callable("math.sqrt")
      Traceback (most recent call last):
      ...
      ValueError: reward function 'math.sqrt': expected a built-in name (...) or 'module:function'.
    """
    if path.count(":") != 1 or not all(path.split(":")):
        builtins = ", ".join(BUILTIN_REWARDS)
        raise ValueError(
            f"reward function {path!r}: expected a built-in name ({builtins}) or 'module:function'."
        )
    module_name, attr = path.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"reward function {path!r}: cannot import module {module_name!r}: {err} (a module "
            "of your own must be importable: in the current directory, or on PYTHONPATH)"
        ) from err
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, public, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"reward function {path!r}: {obj!r} has no attribute {part!r}{hint}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"reward function {path!r}: {type(obj).__name__} {obj!r} is not callable.")
    return obj


def _binds(fn: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError:
        return False
    return True


def _check_kwargs(fn: RewardFn, kwargs: dict[str, Any], spec: str) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: nothing to check against
        return
    named = [p.name for p in params.values() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for key in kwargs:
        if key not in named:
            close = difflib.get_close_matches(key, named, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            options = ", ".join(named) or "none"
            raise ValueError(
                f"reward function {spec!r}: unknown option {key!r}{hint}; it takes: {options}."
            )


def check_reward_call(function: RewardFunction, fields: Sequence[str]) -> None:
    """Check that `function.fn(prompts, completions, **fields)` binds, as the run calls it
    with every example field (`fields`): two positional arguments, and each field taken by
    name or by `**fields`. Raises a ValueError naming the function and what it lacks.

    Examples:
      >>> def score(completions): return [1.0] * len(completions)
      >>> check_reward_call(RewardFunction("score", score, 1.0), ["answer"])
      Traceback (most recent call last):
      ...
      ValueError: reward function 'score' must take (prompts, completions, **fields): it takes (completions).
    """
    try:
        signature = inspect.signature(function.fn)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check against
        return
    try:
        signature.bind([], [], **dict.fromkeys(fields))
    except TypeError as err:
        raise ValueError(
            f"reward function {function.name!r} must take (prompts, completions, **fields): it "
            f"takes {signature}" + ("." if "positional" in str(err) else f"; {err}.")
        ) from None
    options = getattr(function.fn, "keywords", None) or {}  # a built-in's bound options
    for option in ("answer_field", "lengths_field"):
        field = options.get(option)
        if isinstance(field, str) and field not in fields:  # every row would fail
            raise ValueError(
                f"reward function {function.name!r}: `{option}` = {field!r} is not a field of "
                f"the data (its fields: {', '.join(fields)})."
            )


def resolve_reward_function(config: RewardFunctionConfig) -> RewardFunction:
    """Look up `config.fn`, check and bind `config.kwargs`, and name it.

    Examples:
      >>> rf = resolve_reward_function(RewardFunctionConfig(fn="tag_format", weight=0.5,
      ...                              kwargs={"tags": ["answer"]}))
      >>> rf.fn(["q"], ["<answer>7</answer>"]), rf.weight
      ([1.0], 0.5)
      >>> resolve_reward_function(RewardFunctionConfig(fn="math_anser"))
      Traceback (most recent call last):
      ...
      ValueError: unknown built-in reward function 'math_anser' (did you mean 'math_answer'?); ...
    """
    spec = config.fn
    name = config.name or spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    if spec in BUILTIN_FACTORIES:  # built once from its options (a model to load)
        factory = BUILTIN_FACTORIES[spec]
        _check_kwargs(factory, config.kwargs, spec)
        return RewardFunction(name=name, fn=factory(**config.kwargs), weight=float(config.weight))
    if ":" in spec:
        fn = import_callable(spec)
    elif spec in BUILTIN_REWARDS:
        fn = BUILTIN_REWARDS[spec]
    else:
        close = difflib.get_close_matches(spec, [*BUILTIN_REWARDS, *BUILTIN_FACTORIES], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown built-in reward function {spec!r}{hint}; built-ins: "
            f"{', '.join([*BUILTIN_REWARDS, *BUILTIN_FACTORIES])}; or give an import path "
            "'module:function'."
        )
    _check_kwargs(fn, config.kwargs, spec)
    check = BUILTIN_OPTION_CHECKS.get(spec)
    if check is not None and _binds(check, config.kwargs):  # a missing option: check_reward_call
        check(**config.kwargs)  # bad option values now, not as failures of every call
    bound = functools.partial(fn, **config.kwargs) if config.kwargs else fn
    return RewardFunction(name=name, fn=bound, weight=float(config.weight))
