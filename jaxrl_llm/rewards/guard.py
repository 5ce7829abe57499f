"""Run reward functions on a batch without ever failing silently.

`score_rewards` calls each reward function once on the whole batch (in a worker thread, with a
per-call timeout), checks what it returns, and applies one failure policy:

| failure (`RewardFailure.kind`) | detected when |
|---|---|
| `raised` | the call raised; with `isolate=True` the rows are re-scored one at a time, so the report names the example(s) that raise and the other rows keep their scores |
| `timeout` | the call did not return within `timeout_s` (every row of the call fails) |
| `wrong_length` | the output is not one value per completion (every row fails) |
| `wrong_type` | the output is not a sequence of numbers (whole call), or one entry is not a number (that row) |
| `none` | an entry is None |
| `nonfinite` | an entry is NaN or ±inf, or beyond float32's range (±3.4e38) |

Policies (`on_failure`):

- `"fail"`: raise `RewardFunctionError` naming the function, the failure and the offending
  example (prompt, completion, example fields).
- `"score"`: the failed entries get `failure_score`; counted in the metrics, logged.
- `"drop_group"`: every group (`group_size` consecutive rows, prompt-major) with a failed row
  is marked invalid in `valid[N]`, so its advantages and tokens can be excluded
  (`losses.group_advantages(..., valid=...)`, `mask * valid[:, None]`); counted and logged.
  Failed entries hold `failure_score` so the array stays finite.

Isolation re-runs a raising batch as `N` single-row calls (each with the same timeout), so it
costs up to `N` extra calls, only for batches that raised.

A timed-out call cannot be interrupted in Python: its (daemon) thread is abandoned and keeps
running in the background until the function returns, so a reward function that hangs forever
costs one idle thread per timeout.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from jaxrl_llm.rewards.decode import _is_int
from jaxrl_llm.rewards.registry import RewardFunction

FailurePolicy = Literal["fail", "score", "drop_group"]
FailureKind = Literal["raised", "timeout", "wrong_length", "wrong_type", "none", "nonfinite"]
FAILURE_KINDS: tuple[str, ...] = (
    "raised",
    "timeout",
    "wrong_length",
    "wrong_type",
    "none",
    "nonfinite",
)
_POLICIES = ("fail", "score", "drop_group")
_SHOW_CHARS = 300

log = logging.getLogger(__name__)


class RewardFunctionError(RuntimeError):
    """A reward function failed under `on_failure="fail"`; the message shows the example.

    Examples:
      >>> def broken(prompts, completions, **fields):
      ...     return [None] * len(completions)
      >>> score_rewards([RewardFunction("broken", broken, 1.0)], ["1+1="], ["2"])
      Traceback (most recent call last):
      ...
      jaxrl_llm.rewards.guard.RewardFunctionError: reward function 'broken' returned None on row 0 of 1
        prompt:     '1+1='
        completion: '2'
        fields:     {}
      on_failure='fail'; set it to 'score' or 'drop_group' to go on past failing examples.
    """


class RewardFailure(NamedTuple):
    """One failed reward entry (or one failed call, `row=None`, which fails every row).

    Examples:
      >>> f = RewardFailure("acc", "none", 3, "returned None")
      >>> f.kind, f.row
      ('none', 3)
    """

    function: str
    kind: FailureKind
    row: int | None
    detail: str


class RewardScores(NamedTuple):
    """What `score_rewards` returns.

    Attributes:
      rewards: `[N, K]` float32, column `k` from reward function `k`; always finite.
      valid: `[N]` bool, False on rows of dropped groups (only under `"drop_group"`).
      failures: every failure found in the batch.
      metrics: flat dict of floats: `reward/<name>/mean` (over rows where the function
        succeeded), `reward/<name>/failures`, `reward/failures/<kind>`, `reward/dropped_groups`.
      failed: `[N, K]` bool, True where function `k` failed on the row (its reward is then the
        failure score, not a judgement of the completion); None only in a hand-built value.

    Examples:
      >>> s = RewardScores(np.zeros((2, 1), np.float32), np.ones(2, bool), (), {})
      >>> s.rewards.shape
      (2, 1)
    """

    rewards: np.ndarray
    valid: np.ndarray
    failures: tuple[RewardFailure, ...]
    metrics: dict[str, float]
    failed: np.ndarray | None = None


class CallTimeoutError(TimeoutError):
    """`call_with_timeout` gave up waiting (distinct from a `TimeoutError` the function raises).

    Examples:
      >>> issubclass(CallTimeoutError, TimeoutError)
      True
    """


def call_with_timeout(fn: Any, /, *args: Any, timeout_s: float | None, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` in a daemon thread; `CallTimeoutError` if it takes over `timeout_s`.

    The function's own exception is re-raised unchanged. `timeout_s=None` calls it directly.
    A keyword argument of `fn` that is itself named `timeout_s` needs `functools.partial`.

    Examples:
      >>> call_with_timeout(sum, [1, 2], timeout_s=1.0)
      3
      >>> import time
      >>> call_with_timeout(time.sleep, 5, timeout_s=0.01)
      Traceback (most recent call last):
      ...
      jaxrl_llm.rewards.guard.CallTimeoutError: no result within 0.01 s
    """
    if timeout_s is None:
        return fn(*args, **kwargs)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    worker = threading.Thread(target=target, daemon=True, name="reward-fn")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise CallTimeoutError(f"no result within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _as_entries(out: Any, n: int) -> tuple[list[Any] | None, str, str]:
    """Split an output into per-row entries, or say why it is not one value per row."""
    unordered = isinstance(out, set | frozenset)  # no row order to read the values in
    if (
        out is None
        or unordered
        or isinstance(out, str | bytes | Mapping)
        or not hasattr(out, "__len__")
    ):
        return (
            None,
            "wrong_type",
            f"returned {type(out).__name__} {_short(out)}, not a sequence of {n} numbers",
        )
    if isinstance(out, np.ndarray) or hasattr(out, "shape"):
        shape = tuple(np.shape(out))
        if len(shape) != 1:
            return None, "wrong_length", f"returned an array of shape {shape}, expected ({n},)"
        out = np.asarray(out).tolist()
    entries = list(out)
    if len(entries) != n:
        return None, "wrong_length", f"returned {len(entries)} values for {n} completions"
    return entries, "", ""


def _entry_value(entry: Any) -> tuple[float | None, str, str]:
    if entry is None:
        return None, "none", "returned None"
    if hasattr(entry, "__array__") and np.ndim(entry) == 0:  # NumPy / JAX / torch scalars
        entry = np.asarray(entry).item()
    if entry is None:
        return None, "none", "returned None"
    if not isinstance(entry, numbers.Real):
        return None, "wrong_type", f"returned {type(entry).__name__} {_short(entry)}, not a number"
    try:
        value = float(entry)
    except OverflowError:  # a Python int beyond any float
        return None, "nonfinite", f"returned {_short(entry)}, beyond float32's range"
    if not math.isfinite(value):
        return None, "nonfinite", f"returned {value}"
    if abs(value) > _FLOAT32_MAX:  # the rewards are stored as float32: it would become inf
        return None, "nonfinite", f"returned {value}, beyond float32's range"
    return value, "", ""


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOW_CHARS else text[:_SHOW_CHARS] + "…"


def _row_fields(fields: Mapping[str, Sequence[Any]], rows: Sequence[int]) -> dict[str, list[Any]]:
    return {k: [v[i] for i in rows] for k, v in fields.items()}


def _exception_text(err: BaseException) -> str:
    return f"raised {type(err).__name__}: {err}"


def _score_one(
    rf: RewardFunction,
    prompts: Sequence[str],
    completions: Sequence[str],
    fields: Mapping[str, Sequence[Any]],
    *,
    timeout_s: float | None,
    isolate: bool,
) -> tuple[list[float | None], list[RewardFailure]]:
    """One function on the batch: per-row values (None where it failed) and the failures."""
    n = len(completions)
    try:
        # the fields bound first: an example field may be named like the helper's arguments
        call = functools.partial(rf.fn, list(prompts), list(completions), **fields)
        out = call_with_timeout(call, timeout_s=timeout_s)
    except CallTimeoutError:
        return [None] * n, [RewardFailure(rf.name, "timeout", None, f"took over {timeout_s:g} s")]
    except Exception as err:
        if not isolate or n == 1:
            return [None] * n, [
                RewardFailure(rf.name, "raised", None if n > 1 else 0, _exception_text(err))
            ]
        return _score_rows(rf, prompts, completions, fields, timeout_s=timeout_s, batch_error=err)
    entries, kind, detail = _as_entries(out, n)
    if entries is None:
        return [None] * n, [RewardFailure(rf.name, kind, None, detail)]  # type: ignore[arg-type]
    values: list[float | None] = []
    failures = []
    for row, entry in enumerate(entries):
        value, kind, detail = _entry_value(entry)
        values.append(value)
        if value is None:
            failures.append(RewardFailure(rf.name, kind, row, detail))  # type: ignore[arg-type]
    return values, failures


def _score_rows(
    rf: RewardFunction,
    prompts: Sequence[str],
    completions: Sequence[str],
    fields: Mapping[str, Sequence[Any]],
    *,
    timeout_s: float | None,
    batch_error: Exception,
) -> tuple[list[float | None], list[RewardFailure]]:
    """Re-score a batch that raised, one row per call, to find the example(s) that raise."""
    values: list[float | None] = []
    failures: list[RewardFailure] = []
    for row in range(len(completions)):
        sub_values, sub_failures = _score_one(
            rf,
            [prompts[row]],
            [completions[row]],
            _row_fields(fields, [row]),
            timeout_s=timeout_s,
            isolate=False,
        )
        values.append(sub_values[0])
        failures.extend(f._replace(row=row) for f in sub_failures)
    if not failures:  # every row passes alone: the batch as a whole is what fails
        detail = f"{_exception_text(batch_error)} on the batch, but on no row alone"
        return [None] * len(completions), [RewardFailure(rf.name, "raised", None, detail)]
    return values, failures


def describe_failure(
    failure: RewardFailure,
    prompts: Sequence[str],
    completions: Sequence[str],
    fields: Mapping[str, Sequence[Any]],
) -> str:
    """A readable report of one failure with its example (the first row for whole-call ones).

    Examples:
      >>> f = RewardFailure("acc", "nonfinite", 1, "returned nan")
      >>> print(describe_failure(f, ["a", "b"], ["x", "y"], {"answer": ["1", "2"]}))
      reward function 'acc' returned nan on row 1 of 2
        prompt:     'b'
        completion: 'y'
        fields:     {'answer': '2'}
    """
    n = len(completions)
    row = 0 if failure.row is None else failure.row
    where = f"on all {n} rows; first example" if failure.row is None else f"on row {row} of {n}"
    example = {k: v[row] for k, v in fields.items()} if n else {}
    lines = [f"reward function {failure.function!r} {failure.detail} {where}"]
    if n:
        lines += [
            f"  prompt:     {_short(prompts[row])}",
            f"  completion: {_short(completions[row])}",
            f"  fields:     {_short(example)}",
        ]
    return "\n".join(lines)


def _check_inputs(
    prompts: Sequence[str],
    completions: Sequence[str],
    fields: Mapping[str, Sequence[Any]],
    group_size: int,
    on_failure: str,
    failure_score: float,
) -> None:
    if on_failure not in _POLICIES:
        raise ValueError(
            f"score_rewards: `on_failure` must be one of {', '.join(map(repr, _POLICIES))}, "
            f"got {on_failure!r}."
        )
    if (
        isinstance(failure_score, bool)
        or not isinstance(failure_score, numbers.Real)
        or not math.isfinite(failure_score)
    ):
        raise ValueError(
            f"score_rewards: `failure_score` must be a finite number (the returned rewards are "
            f"always finite), got {failure_score!r}."
        )
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"score_rewards: {len(prompts)} prompts for {n} completions.")
    for key, values in fields.items():
        if isinstance(values, str | bytes) or not hasattr(values, "__len__") or len(values) != n:
            got = len(values) if hasattr(values, "__len__") else type(values).__name__
            raise ValueError(
                f"score_rewards: example field {key!r} must hold one value per completion "
                f"({n}), got {got}."
            )
    if not _is_int(group_size) or group_size < 1 or n % group_size:
        raise ValueError(
            f"score_rewards: `group_size` must be a positive divisor of the {n} completions, "
            f"got {group_size!r}."
        )


def score_rewards(
    functions: Sequence[RewardFunction],
    prompts: Sequence[str],
    completions: Sequence[str],
    fields: Mapping[str, Sequence[Any]] | None = None,
    *,
    group_size: int = 1,
    on_failure: FailurePolicy = "fail",
    failure_score: float = 0.0,
    timeout_s: float | None = None,
    isolate: bool = True,
) -> RewardScores:
    """Score `N` completions with `K` reward functions, applying the failure policy.

    Args:
      functions: the `K` resolved reward functions (`resolve_reward_function`).
      prompts: `N` rendered prompts.
      completions: `N` decoded completions (`decode_completions`).
      fields: example fields, each a sequence of `N` values (one per completion).
      group_size: `G`, samples per prompt; rows `b·G … b·G+G−1` form group `b`.
      on_failure: `"fail"`, `"score"` or `"drop_group"` (module docstring).
      failure_score: the value of a failed entry under `"score"` (and the filler under
        `"drop_group"`).
      timeout_s: per-call time limit in seconds (None: no limit).
      isolate: when a batched call raises, re-score it row by row to find the failing rows.

    Returns:
      `RewardScores(rewards[N,K] float32, valid[N] bool, failures, metrics, failed[N,K] bool)`.

    Examples:
      >>> from jaxrl_llm.rewards.registry import RewardFunctionConfig, resolve_reward_function
      >>> fns = [resolve_reward_function(RewardFunctionConfig(fn="exact_answer"))]
      >>> s = score_rewards(fns, ["1+1="] * 2, ["2", "3"], {"answer": ["2", "2"]}, group_size=2)
      >>> s.rewards[:, 0].tolist(), s.valid.tolist(), s.metrics["reward/exact_answer/mean"]
      ([1.0, 0.0], [True, True], 0.5)
      >>> def flaky(prompts, completions, **fields):
      ...     return [None if c == "3" else 1.0 for c in completions]
      >>> s = score_rewards([RewardFunction("flaky", flaky, 1.0)], ["q"] * 2, ["2", "3"],
      ...                   on_failure="score", failure_score=-1.0)
      >>> s.rewards[:, 0].tolist(), s.metrics["reward/failures/none"]
      ([1.0, -1.0], 1.0)
    """
    fields = dict(fields or {})
    _check_inputs(prompts, completions, fields, group_size, on_failure, failure_score)
    n, k = len(completions), len(functions)
    if k == 0:
        raise ValueError(
            "score_rewards: `functions` is empty; configure at least one reward function."
        )
    rewards = np.full((n, k), failure_score, np.float32)
    failed = np.zeros((n, k), bool)
    failures: list[RewardFailure] = []
    metrics: dict[str, float] = {}
    for col, rf in enumerate(functions):
        values, fn_failures = _score_one(
            rf, prompts, completions, fields, timeout_s=timeout_s, isolate=isolate
        )
        for f in fn_failures:
            if f.row is None:
                failed[:, col] = True
            else:
                failed[f.row, col] = True
        ok = [i for i, v in enumerate(values) if v is not None and not failed[i, col]]
        rewards[ok, col] = [values[i] for i in ok]
        metrics[f"reward/{rf.name}/mean"] = float(np.mean(rewards[ok, col])) if ok else 0.0
        metrics[f"reward/{rf.name}/failures"] = float(failed[:, col].sum())
        failures.extend(fn_failures)
    for kind in FAILURE_KINDS:
        metrics[f"reward/failures/{kind}"] = float(sum(f.kind == kind for f in failures))
    if failures and on_failure == "fail":
        first = describe_failure(failures[0], prompts, completions, fields)
        more = f"\n({len(failures) - 1} more failure(s) in this batch)" if len(failures) > 1 else ""
        raise RewardFunctionError(
            f"{first}{more}\non_failure='fail'; set it to 'score' or 'drop_group' to go on past "
            "failing examples."
        )
    row_failed = failed.any(axis=1)
    valid = np.ones(n, bool)
    if on_failure == "drop_group":
        group_failed = row_failed.reshape(-1, group_size).any(axis=1)
        valid = ~np.repeat(group_failed, group_size)
        metrics["reward/dropped_groups"] = float(group_failed.sum())
    else:
        metrics["reward/dropped_groups"] = 0.0
    by_function: dict[str, list[RewardFailure]] = {}
    for f in failures:
        by_function.setdefault(f.function, []).append(f)
    for name, fn_failures in by_function.items():
        log.warning(
            "%s\n(%d failure(s) of %r in this batch; on_failure=%r)",
            describe_failure(fn_failures[0], prompts, completions, fields),
            len(fn_failures),
            name,
            on_failure,
        )
    return RewardScores(rewards, valid, tuple(failures), metrics, failed)


def reward_metric_names(function_names: Sequence[str]) -> list[str]:
    """The keys of `RewardScores.metrics` for reward functions of these names, in order.

    Examples:
      >>> reward_metric_names(["acc"])[:3]
      ['reward/acc/mean', 'reward/acc/failures', 'reward/failures/raised']
    """
    names = [f"reward/{name}/{stat}" for name in function_names for stat in ("mean", "failures")]
    return [*names, *(f"reward/failures/{kind}" for kind in FAILURE_KINDS), "reward/dropped_groups"]


def merge_reward_metrics(
    parts: Sequence[Mapping[str, float]], rows: Sequence[int]
) -> dict[str, float]:
    """The `score_rewards` metrics of a batch from those of its parts: whole groups of the
    batch scored separately (one part per process of a multi-host job), `rows[i]` rows in
    part `i`. Counts add up; `reward/<name>/mean`, a mean over the rows where the function
    succeeded, is weighted by each part's `rows − failures`. Row counts then equal those of
    the whole batch scored at once; `reward/failures/<kind>` counts failed calls or rows, and
    a call that fails as a whole (a timeout) counts once per part that made it.

    Args:
      parts: each part's metrics, all with the same keys in the same order.
      rows: each part's number of rows.

    Raises:
      ValueError: no parts, a row count per part missing, or parts with different keys.

    Examples:
      >>> a = {"reward/f/mean": 1.0, "reward/f/failures": 1.0, "reward/dropped_groups": 0.0}
      >>> b = {"reward/f/mean": 0.25, "reward/f/failures": 0.0, "reward/dropped_groups": 1.0}
      >>> merge_reward_metrics([a, b], [2, 4])  # (1 · 1.0 + 4 · 0.25) / 5
      {'reward/f/mean': 0.4, 'reward/f/failures': 1.0, 'reward/dropped_groups': 1.0}
    """
    if not parts or len(parts) != len(rows):
        raise ValueError(
            f"merge_reward_metrics: need one row count per part and at least one part, got "
            f"{len(parts)} parts and {len(rows)} row counts."
        )
    keys = list(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if list(part) != keys:
            raise ValueError(
                f"merge_reward_metrics: part {i} has the keys {sorted(part)}, part 0 {sorted(keys)}."
            )
    merged: dict[str, float] = {}
    for key in keys:
        failures = key.removesuffix("/mean") + "/failures"
        if key.endswith("/mean") and failures in parts[0]:
            ok = [n - part[failures] for part, n in zip(parts, rows, strict=True)]
            total = sum(ok)
            weighted = sum(w * part[key] for w, part in zip(ok, parts, strict=True))
            merged[key] = float(weighted / total) if total else 0.0
        else:
            merged[key] = float(sum(part[key] for part in parts))
    return merged
