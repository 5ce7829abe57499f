"""Metrics output of a training run: JSONL, TensorBoard, optional W&B, live progress, plots.

`MetricsLogger(run_dir).log(step, metrics)` fetches the step's metrics from the devices in one
`jax.device_get`, then

- appends one JSON line `{"step": s, "time": unix_seconds, "elapsed": seconds, <metrics>}` to
  `run_dir/metrics.jsonl` (flushed per line, so a crash loses at most the line being written);
- writes TensorBoard scalars to `run_dir/tensorboard/` (tensorboardX; no TensorFlow). Its tags
  take letters, digits and `_ - . /` only: another character becomes `_` there
  (`eval/pass@1` is the tag `eval/pass_1`), said once per key in a warning;
- forwards them to Weights & Biases when asked for *and* `wandb` is installed (a warning, not
  an error, when it is not);
- shows a live rich progress bar (step/total, ETA, a few chosen metrics) when the output is a
  terminal, and prints a plain line in any case (CI logs): for the first record, the first
  record of a step after 0 (the first training step), the first record at or past each
  multiple of `print_every`, and the last step.

Resume rule: `MetricsLogger(run_dir, resume_step=N)` keeps the lines of steps `<= N` and drops
later ones (they were logged after the checkpoint of step N and will be logged again); the
TensorBoard writer purges its events after N the same way. Opening a run directory that already
has metrics without `resume_step` is an error, so nothing is overwritten or duplicated.

In multi-host runs only process 0 (`sharding.is_main_process`) writes or prints; the other
processes' loggers do nothing. At the end of a run `plot_curves` draws the reward, eval
accuracy, KL, entropy and response-length curves found in `metrics.jsonl` into a PNG.

NaN and ±inf metrics are written as the JSON tokens `NaN` / `Infinity` (Python's `json`
reads them back; nothing is dropped or replaced).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import os
import pathlib
import re
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import jax
import numpy as np

from sharding import is_main_process

__all__ = [
    "DEFAULT_PLOT_KEYS",
    "DEFAULT_PROGRESS_KEYS",
    "METRICS_FILE",
    "MetricsConfig",
    "MetricsLogger",
    "metric_series",
    "plot_curves",
    "read_metrics",
]

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
DEFAULT_PROGRESS_KEYS = ("reward/mean", "kl/mean", "entropy/mean", "perf/tokens_per_sec")
DEFAULT_PLOT_KEYS = (
    "reward/mean",
    "eval/accuracy",
    "kl/mean",
    "entropy/mean",
    "response/length_mean",
)
_RESERVED = ("step", "time", "elapsed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MetricsConfig:
    """Where metrics go (the `metrics:` section of a training config).

    Attributes:
      console: show progress (live bar on a terminal, plain lines every `print_every` steps).
      tensorboard: write TensorBoard event files under `run_dir/tensorboard`.
      wandb_project: a W&B project name to log to (None: W&B off); used only when the `wandb`
        package is installed.
      progress_keys: metric keys shown next to the progress bar and in the plain lines.
      print_every: a plain progress line about every this many steps (the first logged
        step at or past each multiple), and at the first and last steps.

    Examples:
      >>> from jaxrl_llm.config import build
      >>> build(MetricsConfig, {"tensorboard": False, "progress_keys": ["reward/mean"]})
      MetricsConfig(console=True, tensorboard=False, wandb_project=None, progress_keys=('reward/mean',), print_every=10)
      >>> MetricsConfig(print_every=0)
      Traceback (most recent call last):
      ...
      ValueError: MetricsConfig: `print_every` must be an int >= 1, got 0.
    """

    console: bool = True
    tensorboard: bool = True
    wandb_project: str | None = None
    progress_keys: tuple[str, ...] = DEFAULT_PROGRESS_KEYS
    print_every: int = 10

    def __post_init__(self) -> None:
        _check_positive_int("MetricsConfig", "print_every", self.print_every)
        _check_keys("MetricsConfig", self.progress_keys)
        if self.wandb_project is not None and not (
            isinstance(self.wandb_project, str) and self.wandb_project
        ):
            raise ValueError(
                "MetricsConfig: `wandb_project` must be a non-empty str or None, got "
                f"{self.wandb_project!r}."
            )


def _check_positive_int(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{owner}: `{name}` must be an int >= 1, got {value!r}.")


def _check_keys(owner: str, keys: Any) -> None:
    if isinstance(keys, str) or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(
            f"{owner}: `progress_keys` must be a sequence of non-empty str, got {keys!r}."
        )


def _parse_line(line: str, number: int, path: pathlib.Path) -> dict[str, Any]:
    record = json.loads(line)
    if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        raise ValueError(f"{path}:{number}: a metrics line needs an integer `step`, got {line!r}.")
    return record


def _read_lines(path: pathlib.Path) -> list[tuple[str, dict[str, Any]]]:
    """`(raw line, record)` pairs; a torn last line (crash mid-write) is dropped with a warning."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    complete, last = lines[:-1], lines[-1]  # `last` is "" when the file ends with a newline
    out = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            out.append((line, _parse_line(line, number, path)))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not a JSON line ({err}): {line[:120]!r}.") from None
    if last.strip():
        try:
            out.append((last, _parse_line(last, len(lines), path)))
        except json.JSONDecodeError:
            warnings.warn(
                f"{path}: dropping an unfinished last line {last[:80]!r} (the run stopped while "
                "writing it).",
                RuntimeWarning,
                stacklevel=3,
            )
    return out


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a `metrics.jsonl` file, in file order.

    Args:
      path: the JSONL file (or a run directory containing `metrics.jsonl`).

    Returns:
      One dict per line (`step`, `time`, `elapsed` and the metrics). An unfinished last line
      (the process died while writing it) is dropped with a `RuntimeWarning`.

    Raises:
      ValueError: the file is missing, or a line (other than the last) is not a JSON object
        with an integer `step` (the message names the line number).

    Examples:
      >>> import tempfile, pathlib
      >>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
      >>> _ = path.write_text('{"step": 1, "reward/mean": 0.5}\\n{"step": 2, "reward/mean": 0.75}\\n')
      >>> [r["reward/mean"] for r in read_metrics(path)]
      [0.5, 0.75]
    """
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise ValueError(f"read_metrics: no metrics file at {path}.")
    return [record for _, record in _read_lines(path)]


def metric_series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """`(steps, values)` of one metric over the records that have it (float64 values).

    Examples:
      >>> steps, values = metric_series([{"step": 1, "a": 2.0}, {"step": 2}, {"step": 3, "a": 4}], "a")
      >>> steps.tolist(), values.tolist()
      ([1, 3], [2.0, 4.0])
    """
    pairs = [(r["step"], r[key]) for r in records if key in r and r[key] is not None]
    steps = np.asarray([p[0] for p in pairs], dtype=np.int64)
    values = np.asarray([p[1] for p in pairs], dtype=np.float64)
    return steps, values


def _truncate_after(path: pathlib.Path, step: int) -> int:
    """Keep the lines of steps <= `step` (atomically rewritten); return how many were dropped."""
    lines = _read_lines(path)
    kept = [raw for raw, record in lines if record["step"] <= step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)
    return len(lines) - len(kept)


def _check_value(key: str, value: Any) -> None:
    """A scalar real number or bool: read from the value's shape and dtype (no device transfer
    for a JAX array), so that every process of a job checks what process 0 writes."""
    shape = np.shape(value)
    dtype = getattr(value, "dtype", None)
    dtype = np.asarray(value).dtype if dtype is None else np.dtype(dtype)
    if int(np.prod(shape)) != 1:
        raise ValueError(f"MetricsLogger.log: metric '{key}' must be a scalar, got shape {shape}.")
    real = jax.numpy.issubdtype(dtype, jax.numpy.floating) or np.issubdtype(dtype, np.integer)
    if not (real or dtype == np.bool_):  # complex values too: JSON has no complex numbers
        raise ValueError(
            f"MetricsLogger.log: metric '{key}' must be a real number, got {dtype} ({value!r})."
        )


def _to_number(value: Any) -> int | float:
    """A checked (`_check_value`) host value as a Python int or float (bools and floats of any
    width as float)."""
    array = np.asarray(value)
    if jax.numpy.issubdtype(array.dtype, jax.numpy.floating):  # also bfloat16, float8
        array = array.astype(np.float64)
    item = array.reshape(()).item()
    return item if isinstance(item, int) and not isinstance(item, bool) else float(item)


_TAG_CHARACTERS = re.compile(r"[^-/\w.]")  # what tensorboardX replaces by "_" in a tag
# the library's own keys that TensorBoard shows renamed, documented (pass@k → pass_k): no warning
_KNOWN_RENAMES = re.compile(r"(.+/)?pass@\d+")


def _format(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class MetricsLogger:
    """Writes each step's metrics to JSONL / TensorBoard / W&B and shows progress (process 0).

    Args:
      run_dir: the run directory (created if missing); metrics go to `run_dir/metrics.jsonl`.
      total_steps: the run's length, for the progress bar and the `step s/total` lines.
      console: show progress (see the module docstring).
      tensorboard: write TensorBoard events under `run_dir/tensorboard`.
      wandb: keyword arguments of `wandb.init` (e.g. `{"project": "grpo"}`); None: W&B off.
        Ignored with a warning when `wandb` is not installed.
      progress_keys: metrics shown in the progress display (those logged so far).
      print_every: a plain progress line at the first logged step at or past each multiple
        of this (and for the first record, the first training step and the last step).
      resume_step: the checkpoint step a resumed run restarts from; lines of later steps are
        removed. None: a new run, `run_dir` must not hold metrics yet.
      stream: where progress goes (default `sys.stdout`); a terminal gets a live bar.

    Raises:
      ValueError: bad arguments, or existing metrics without `resume_step`.

    Examples:
      >>> import tempfile, jax.numpy as jnp
      >>> run = tempfile.mkdtemp()
      >>> with MetricsLogger(run, total_steps=2, tensorboard=False, print_every=1) as log:
      ...     log.log(1, {"reward/mean": jnp.float32(0.25), "kl/mean": 0.01})
      ...     log.log(2, {"reward/mean": jnp.float32(0.5)})
      step 1/2 | reward/mean 0.25 | kl/mean 0.01
      step 2/2 | reward/mean 0.5 | kl/mean 0.01
      >>> [(r["step"], r["reward/mean"]) for r in read_metrics(run)]
      [(1, 0.25), (2, 0.5)]
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        total_steps: int | None = None,
        console: bool = True,
        tensorboard: bool = True,
        wandb: Mapping[str, Any] | None = None,
        progress_keys: Sequence[str] = DEFAULT_PROGRESS_KEYS,
        print_every: int = 10,
        resume_step: int | None = None,
        stream: TextIO | None = None,
    ) -> None:
        if not isinstance(run_dir, str | os.PathLike) or not str(run_dir):
            raise ValueError(f"MetricsLogger: `run_dir` must be a non-empty path, got {run_dir!r}.")
        if total_steps is not None:
            _check_positive_int("MetricsLogger", "total_steps", total_steps)
        _check_positive_int("MetricsLogger", "print_every", print_every)
        _check_keys("MetricsLogger", progress_keys)
        if resume_step is not None and (
            isinstance(resume_step, bool) or not isinstance(resume_step, int) or resume_step < 0
        ):
            raise ValueError(
                f"MetricsLogger: `resume_step` must be None or an int >= 0, got {resume_step!r}."
            )
        if wandb is not None and not isinstance(wandb, Mapping):
            raise ValueError(
                f"MetricsLogger: `wandb` must be None or a mapping of wandb.init arguments, got "
                f"{type(wandb).__name__}."
            )
        self.run_dir = pathlib.Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.total_steps = total_steps
        self.print_every = int(print_every)
        self.progress_keys = tuple(progress_keys)
        self._active = is_main_process()
        self._last_step: int | None = resume_step
        self._shown: dict[str, int | float] = {}
        self._printed_step: int | None = None  # the step of the last plain line
        self._start = time.time()
        self._file: io.TextIOBase | None = None
        self._writer: Any = None
        self._wandb_run: Any = None
        self._progress: Any = None
        self._live: Any = None
        self._task: Any = None
        self._stream = stream if stream is not None else sys.stdout
        self._console = console
        self._tags: dict[str, str] = {}  # TensorBoard tag -> the metric key written under it
        self._renamed: set[str] = set()  # keys whose tag differs (warned about once)
        if not self._active:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._open_jsonl(resume_step)
        try:  # a sink that cannot start (e.g. wandb.init) closes those already open
            if tensorboard:
                from tensorboardX import SummaryWriter  # imported only when used

                purge = None if resume_step is None else resume_step + 1
                self._writer = SummaryWriter(str(self.run_dir / TENSORBOARD_DIR), purge_step=purge)
            if wandb is not None:
                self._wandb_run = _start_wandb(wandb, self.run_dir)
            if console:
                self._start_progress(resume_step)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(
        cls,
        run_dir: str | os.PathLike[str],
        config: MetricsConfig,
        *,
        total_steps: int | None = None,
        resume_step: int | None = None,
        run_config: Mapping[str, Any] | None = None,
    ) -> MetricsLogger:
        """A `MetricsLogger` with the settings of a `MetricsConfig`.

        `run_config` (the training config as a dict) is passed to W&B as the run's config.

        Examples:
          >>> import tempfile
          >>> cfg = MetricsConfig(console=False, tensorboard=False)
          >>> log = MetricsLogger.from_config(tempfile.mkdtemp(), cfg, total_steps=5)
          >>> log.total_steps
          5
          >>> log.close()
        """
        if not isinstance(config, MetricsConfig):
            raise ValueError(
                f"MetricsLogger.from_config: `config` must be a MetricsConfig, got "
                f"{type(config).__name__}."
            )
        wandb = None
        if config.wandb_project is not None:
            wandb = {"project": config.wandb_project, "config": dict(run_config or {})}
        return cls(
            run_dir,
            total_steps=total_steps,
            console=config.console,
            tensorboard=config.tensorboard,
            wandb=wandb,
            progress_keys=config.progress_keys,
            print_every=config.print_every,
            resume_step=resume_step,
        )

    def _open_jsonl(self, resume_step: int | None) -> None:
        if self.path.exists() and self.path.stat().st_size:
            if resume_step is None:
                raise ValueError(
                    f"MetricsLogger: {self.path} already holds metrics; pass `resume_step` (the "
                    "restored checkpoint's step) to continue that run, or use a new run_dir."
                )
            _truncate_after(self.path, resume_step)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def _start_progress(self, resume_step: int | None) -> None:
        """A live display on terminals: the progress bar, and the chosen metrics below it."""
        from rich.console import Console

        console = Console(file=self._stream)
        if not console.is_terminal:
            return
        from rich.console import Group
        from rich.live import Live
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self._task = self._progress.add_task("train", total=self.total_steps)
        self._progress.update(self._task, completed=resume_step or 0)
        self._live = Live(Group(self._progress), console=console, refresh_per_second=4)
        self._live.start()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record one step's metrics (scalars: Python numbers, NumPy or JAX arrays of size 1).

        Args:
          step: the update step (int >= 0, never below the last logged step; several calls
            with the same step, e.g. train then eval metrics, are allowed).
          metrics: flat mapping from str keys to scalars; `step`, `time`, `elapsed` are reserved.

        Raises:
          ValueError: a bad step, key or value (named in the message).

        Examples:
          >>> import tempfile
          >>> log = MetricsLogger(tempfile.mkdtemp(), console=False, tensorboard=False)
          >>> log.log(3, {"loss": [1.0, 2.0]})
          Traceback (most recent call last):
          ...
          ValueError: MetricsLogger.log: metric 'loss' must be a scalar, got shape (2,).
          >>> log.close()
        """
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"MetricsLogger.log: `step` must be an int >= 0, got {step!r}.")
        step = int(step)
        if self._last_step is not None and step < self._last_step:
            raise ValueError(
                f"MetricsLogger.log: `step` {step} is below the last logged step "
                f"{self._last_step}; steps must not go backwards."
            )
        if not isinstance(metrics, Mapping):
            raise ValueError(
                f"MetricsLogger.log: `metrics` must be a mapping, got {type(metrics).__name__}."
            )
        for key in metrics:
            if not isinstance(key, str) or not key:
                raise ValueError(
                    f"MetricsLogger.log: metric keys must be non-empty str, got {key!r}."
                )
            if key in _RESERVED:
                raise ValueError(
                    f"MetricsLogger.log: metric key '{key}' is reserved ({', '.join(_RESERVED)})."
                )
            _check_value(key, metrics[key])
        self._last_step = step
        if not self._active:
            return
        host = jax.device_get(dict(metrics))  # one transfer (all copies start before any waits)
        values = {key: _to_number(value) for key, value in host.items()}
        now = time.time()
        record = {"step": step, "time": now, "elapsed": now - self._start, **values}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._writer is not None:
            for key, value in values.items():
                self._writer.add_scalar(self._tag(key), value, step, walltime=now)
        if self._wandb_run is not None:
            self._wandb_run.log(values, step=step)
        self._show(step, values)

    def _tag(self, key: str) -> str:
        """The TensorBoard tag of `key`, with a warning the first time it differs from the key
        (except the library's `pass@k` keys, shown as `pass_k`) or collides with another key's
        tag."""
        tag = _TAG_CHARACTERS.sub("_", key)
        owner = self._tags.setdefault(tag, key)  # the first key of a tag keeps it
        if owner != key:
            if key in self._renamed:
                return tag
            self._renamed.add(key)  # one warning per colliding key, not one per step
            warnings.warn(
                f"MetricsLogger: metrics '{owner}' and '{key}' share the TensorBoard tag '{tag}' "
                "(its tags allow letters, digits and _ - . / only); metrics.jsonl keeps both "
                "apart.",
                RuntimeWarning,
                stacklevel=3,
            )
        elif tag != key and key not in self._renamed and not _KNOWN_RENAMES.fullmatch(key):
            self._renamed.add(key)
            warnings.warn(
                f"MetricsLogger: metric '{key}' is the TensorBoard tag '{tag}' (its tags allow "
                "letters, digits and _ - . / only).",
                RuntimeWarning,
                stacklevel=3,
            )
        return tag

    def _show(self, step: int, values: Mapping[str, int | float]) -> None:
        if not self._console:
            return
        self._shown.update({k: values[k] for k in self.progress_keys if k in values})
        shown = [f"{k} {_format(self._shown[k])}" for k in self.progress_keys if k in self._shown]
        if step == self._printed_step:  # a second record of a printed step (e.g. eval after
            # train): its plain line shows only what this record brings, not the whole set again
            new = [f"{k} {_format(values[k])}" for k in self.progress_keys if k in values]
            if new:
                self._print_line(step, new)
            if self._live is not None:
                self._live.update(self._live_group(shown), refresh=True)
            return
        if self._live is not None:
            self._progress.update(self._task, completed=step)
            self._live.update(self._live_group(shown), refresh=True)
        if self._due(step):
            self._printed_step = step
            self._print_line(step, shown)

    def _due(self, step: int) -> bool:
        """A plain line for the first record, the first of a step after 0, the first at or
        past each multiple of `print_every` (whatever `log_every` is), and the last step."""
        last = self._printed_step
        if last is None or step == self.total_steps or (last == 0 and step > 0):
            return True
        return step // self.print_every > last // self.print_every

    def _live_group(self, shown: list[str]) -> Any:
        from rich.console import Group
        from rich.text import Text

        return Group(self._progress, Text("  ".join(shown)))

    def _print_line(self, step: int, shown: list[str]) -> None:
        total = f"/{self.total_steps}" if self.total_steps else ""
        line = " | ".join([f"step {step}{total}", *shown])
        if self._live is not None:
            self._live.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self._stream, flush=True)

    def close(self) -> None:
        """Stop the progress bar and close the files (idempotent; also done by `with`).

        Examples:
          >>> import tempfile
          >>> log = MetricsLogger(tempfile.mkdtemp(), console=False, tensorboard=False)
          >>> log.close(); log.close()
        """
        live, writer, run, file = self._live, self._writer, self._wandb_run, self._file
        self._live = self._writer = self._wandb_run = self._file = None
        with contextlib.ExitStack() as closing:  # every sink closes, whatever another raises
            for close in (
                None if run is None else functools.partial(_finish_wandb, run),
                None if file is None else file.close,
                None if writer is None else writer.close,
                None if live is None else live.stop,  # first: callbacks run last-in, first-out
            ):
                if close is not None:
                    closing.callback(close)


def _finish_wandb(run: Any) -> None:
    """`run.finish()`; an error there (e.g. the network) is a warning: the run's own files are
    written and closed, and its export and summary still follow."""
    try:
        run.finish()
    except Exception as err:  # any failure of the remote service
        warnings.warn(
            f"MetricsLogger: W&B could not finish the run ({type(err).__name__}: {err}); the "
            "metrics are in metrics.jsonl.",
            RuntimeWarning,
            stacklevel=3,
        )


def _start_wandb(settings: Mapping[str, Any], run_dir: pathlib.Path) -> Any:
    try:
        import wandb
    except ImportError:
        warnings.warn(
            "MetricsLogger: W&B logging was requested but the `wandb` package is not installed; "
            "metrics go to metrics.jsonl and TensorBoard only (pip install wandb to enable it).",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    kwargs = {"dir": str(run_dir), "name": run_dir.name, **settings}
    return wandb.init(**kwargs)


def plot_curves(
    metrics_jsonl: str | os.PathLike[str],
    out_png: str | os.PathLike[str],
    keys: Sequence[str] | None = None,
    *,
    title: str | None = None,
) -> list[str]:
    """Draw one panel per metric (value against step) into a PNG.

    Uses matplotlib's Agg canvas on a standalone `Figure`: no pyplot, no global backend change.

    Args:
      metrics_jsonl: a `metrics.jsonl` file (or the run directory holding it).
      out_png: the PNG to write (its directory is created).
      keys: metrics to draw, each must occur in the file; None draws those of
        `DEFAULT_PLOT_KEYS` (reward, eval accuracy, KL, entropy, response length) present.
      title: figure title (default: the run directory's name).

    Returns:
      The keys drawn, in panel order.

    Raises:
      ValueError: a requested key never occurs, or (keys=None) none of the defaults does; the
        message lists the keys the file has.

    Examples:
      >>> import tempfile, pathlib
      >>> run = pathlib.Path(tempfile.mkdtemp())
      >>> lines = [f'{{"step": {s}, "reward/mean": {s / 10}}}' for s in range(1, 6)]
      >>> _ = (run / "metrics.jsonl").write_text("\\n".join(lines) + "\\n")
      >>> plot_curves(run, run / "curves.png")
      ['reward/mean']
      >>> (run / "curves.png").read_bytes()[:4]
      b'\\x89PNG'
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    source = pathlib.Path(metrics_jsonl)
    records = read_metrics(source)
    figure, drawn = _curves_figure(
        records, keys, title or (source if source.is_dir() else source.parent).name
    )
    out = pathlib.Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure).print_png(str(out))
    return drawn


def _curves_figure(
    records: Sequence[Mapping[str, Any]], keys: Sequence[str] | None, title: str
) -> tuple[Any, list[str]]:
    from matplotlib.figure import Figure

    present = sorted({k for r in records for k in r if k not in _RESERVED})
    if keys is None:
        drawn = [k for k in DEFAULT_PLOT_KEYS if k in present]
        if not drawn:
            raise ValueError(
                f"plot_curves: none of the default keys {list(DEFAULT_PLOT_KEYS)} occurs in the "
                f"metrics; pass `keys` from: {present}."
            )
    else:
        if isinstance(keys, str) or not keys:
            raise ValueError(f"plot_curves: `keys` must be a non-empty list of str, got {keys!r}.")
        missing = [k for k in keys if k not in present]
        if missing:
            raise ValueError(
                f"plot_curves: keys {missing} do not occur in the metrics; available: {present}."
            )
        drawn = list(keys)
    figure = Figure(figsize=(7.0, 2.2 * len(drawn) + 0.6), layout="constrained")
    axes = figure.subplots(len(drawn), 1, sharex=True, squeeze=False)[:, 0]
    for ax, key in zip(axes, drawn, strict=True):
        steps, values = metric_series(records, key)
        ax.plot(steps, values, marker="." if len(steps) < 50 else None, linewidth=1.2)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    figure.suptitle(title)
    return figure, drawn
