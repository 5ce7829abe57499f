"""`RewardConfig`: which reward functions, how they combine, what a failure does."""

from __future__ import annotations

import dataclasses
import math

from jaxrl_llm.config import ConfigError
from jaxrl_llm.rewards.combine import CombineMode
from jaxrl_llm.rewards.guard import FailurePolicy
from jaxrl_llm.rewards.registry import (
    RewardFunction,
    RewardFunctionConfig,
    resolve_reward_function,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """The reward side of a training config (the YAML `rewards:` section).

    Attributes:
      functions: the reward functions (`RewardFunctionConfig`: `fn`, `name`, `weight`,
        `kwargs`). Default: `exact_answer`, the built-in tasks' correctness reward.
      combine: `"sum"` (weighted sum, then group-normalise) or `"decoupled"` (GDPO: normalise
        each component in its group, then weighted sum); `jaxrl_llm.rewards.combine`.
      on_failure: what a failing reward function does (`jaxrl_llm.rewards.guard`):
        `"fail"` (raise, naming the example), `"score"` (use `failure_score`),
        `"drop_group"` (exclude the whole group).
      failure_score: the reward of a failed entry under `"score"`.
      timeout_s: per-call time limit in seconds (None: none).
      isolate: re-score a raising batch one row at a time to find the failing example(s).
      jax_native: use the in-graph reward of the built-in task (`exact_answer_reward`) instead
        of calling `functions` on decoded text; allowed only when `functions` is the single
        `exact_answer` reward, which it reproduces exactly. It compares tokens, so a run
        refuses it with `sampling.stop_strings` (whose tokens end up in the completion).

    Examples:
      >>> from jaxrl_llm.config import build
      >>> cfg = build(RewardConfig, {"functions": [{"fn": "math_answer"},
      ...     {"fn": "tag_format", "weight": 0.2}], "combine": "decoupled"})
      >>> [f.name for f in cfg.resolve()], cfg.weights()
      (['math_answer', 'tag_format'], (1.0, 0.2))
      >>> build(RewardConfig, {"functions": []})
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: rewards.functions: configure at least one reward function.
    """

    functions: tuple[RewardFunctionConfig, ...] = (RewardFunctionConfig(fn="exact_answer"),)
    combine: CombineMode = "sum"
    on_failure: FailurePolicy = "fail"
    failure_score: float = 0.0
    timeout_s: float | None = 60.0
    isolate: bool = True
    jax_native: bool = False

    def __post_init__(self) -> None:
        if not self.functions:
            raise ConfigError("rewards.functions: configure at least one reward function.")
        if self.timeout_s is not None and not 0 < self.timeout_s < math.inf:
            raise ConfigError(f"rewards.timeout_s: must be > 0 or null, got {self.timeout_s}.")
        if not math.isfinite(self.failure_score):
            raise ConfigError(
                f"rewards.failure_score: must be a finite number (it replaces failed rewards, "
                f"which must stay finite), got {self.failure_score}."
            )
        bad_weights = [f.weight for f in self.functions if not math.isfinite(f.weight)]
        if bad_weights:
            raise ConfigError(
                f"rewards.functions: every `weight` must be a finite number, got {bad_weights}."
            )
        names = [f.name or f.fn.rsplit(":", 1)[-1].rsplit(".", 1)[-1] for f in self.functions]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"rewards.functions: names must be unique (they key the metrics), got "
                f"{duplicates} more than once; set `name` to tell them apart."
            )
        if self.jax_native and [f.fn for f in self.functions] != ["exact_answer"]:
            raise ConfigError(
                "rewards.jax_native: the in-graph reward reproduces only the single built-in "
                f"'exact_answer' reward, got functions {[f.fn for f in self.functions]}."
            )

    def resolve(self) -> list[RewardFunction]:
        """The resolved reward functions, in order (errors name the bad `fn` or option)."""
        return [resolve_reward_function(f) for f in self.functions]

    def weights(self) -> tuple[float, ...]:
        """The weights `w_k`, in order."""
        return tuple(float(f.weight) for f in self.functions)
