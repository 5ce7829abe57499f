"""`MetricsLogger`, `read_metrics`, `plot_curves`: files, TensorBoard events, progress, resume."""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import struct
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest

from jaxrl_llm import metrics_log
from jaxrl_llm.config import ConfigError, build
from jaxrl_llm.metrics_log import (
    MetricsConfig,
    MetricsLogger,
    metric_series,
    plot_curves,
    read_metrics,
)


class _Terminal(io.StringIO):
    """A stream that says it is a terminal (rich then draws a live progress bar)."""

    def isatty(self) -> bool:
        return True


def _scalar_events(run_dir) -> list[tuple[str, int, float, float]]:
    """(tag, step, value, wall_time) of every scalar in the run's TensorBoard event files.

    Event files are TFRecord streams: u64 length, u32 crc, payload, u32 crc per record.
    """
    from tensorboardX.proto.event_pb2 import Event

    found = []
    for path in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            payload = data[offset + 12 : offset + 12 + length]
            offset += 12 + length + 4
            event = Event.FromString(payload)
            for value in event.summary.value:
                found.append((value.tag, event.step, value.simple_value, event.wall_time))
    return found


def _purge_steps(run_dir) -> list[int]:
    """Steps of the SessionLog START events (TensorBoard hides later steps logged before)."""
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    steps = []
    for path in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                steps.append(event.step)
    return steps


def test_jsonl_and_tensorboard_hold_every_value(tmp_path):
    rewards = np.float32([0.1, 0.35, 0.6])
    with MetricsLogger(tmp_path, total_steps=3, console=False) as log:
        for step, r in enumerate(rewards, start=1):
            log.log(
                step,
                {
                    "reward/mean": jnp.float32(r),
                    "kl/mean": jnp.asarray([r / 10]),  # size-1 arrays are scalars too
                    "rollout/tokens": jnp.int32(100 * step),
                    "optim/lr": 1e-3,
                },
            )
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    for r, expected in zip(records, rewards, strict=True):
        assert r["reward/mean"] == float(expected)  # float32 value, exactly
        assert r["kl/mean"] == float(np.float32(expected / np.float32(10)))
        assert r["rollout/tokens"] == 100 * r["step"] and isinstance(r["rollout/tokens"], int)
        assert r["optim/lr"] == 1e-3
        assert r["elapsed"] >= 0 and r["time"] > 1.6e9
    events = _scalar_events(tmp_path)
    by_tag = {}
    for tag, step, value, wall in events:
        by_tag.setdefault(tag, []).append((step, value, wall))
    assert set(by_tag) == {"reward/mean", "kl/mean", "rollout/tokens", "optim/lr"}
    assert [(s, v) for s, v, _ in by_tag["reward/mean"]] == [
        (i + 1, float(r)) for i, r in enumerate(rewards)
    ]
    assert [w for _, _, w in by_tag["reward/mean"]] == pytest.approx([r["time"] for r in records])


def test_one_host_transfer_per_call(tmp_path, monkeypatch):
    calls = []
    real = jax.device_get

    def spy(tree):
        calls.append(tree)
        return real(tree)

    monkeypatch.setattr(metrics_log.jax, "device_get", spy)
    with MetricsLogger(tmp_path, console=False, tensorboard=False) as log:
        log.log(1, {"a": jnp.float32(1), "b": jnp.float32(2), "c": jnp.int32(3)})
        log.log(2, {"a": jnp.float32(4)})
    assert len(calls) == 2 and set(calls[0]) == {"a", "b", "c"}


def test_plain_progress_lines_when_not_a_terminal(tmp_path):
    out = io.StringIO()
    with MetricsLogger(
        tmp_path,
        total_steps=7,
        tensorboard=False,
        print_every=3,
        progress_keys=("reward/mean", "kl/mean", "perf/tokens_per_sec"),
        stream=out,
    ) as log:
        for step in range(1, 8):
            metrics = {"reward/mean": step / 8, "perf/tokens_per_sec": 1000.0 * step}
            if step % 2:
                metrics["kl/mean"] = step / 100
            log.log(step, metrics)
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        "step 1/7",
        "step 3/7",
        "step 6/7",
        "step 7/7",
    ]
    # step 6 logs no KL: the last value (step 5) is shown
    assert lines[2] == "step 6/7 | reward/mean 0.75 | kl/mean 0.05 | perf/tokens_per_sec 6000"
    assert "\x1b[" not in out.getvalue()  # no terminal control codes in CI logs


def test_a_second_record_of_a_printed_step_prints_only_its_own_keys(tmp_path):
    """Train then eval metrics at one step: one full line, then one line with what eval adds
    (not the whole set again with a stale value in the first)."""
    out = io.StringIO()
    keys = ("reward/mean", "eval/accuracy")
    with MetricsLogger(
        tmp_path, total_steps=4, tensorboard=False, print_every=2, progress_keys=keys, stream=out
    ) as log:
        for step in range(1, 5):
            log.log(step, {"reward/mean": step / 4})
            if step % 2 == 0:
                log.log(step, {"eval/accuracy": step / 10})
            log.log(step, {"other": 1.0})  # no progress key: no line
    assert out.getvalue().splitlines() == [
        "step 1/4 | reward/mean 0.25",
        "step 2/4 | reward/mean 0.5",
        "step 2/4 | eval/accuracy 0.2",
        "step 4/4 | reward/mean 1 | eval/accuracy 0.2",
        "step 4/4 | eval/accuracy 0.4",
    ]


def test_live_progress_bar_on_a_terminal(tmp_path):
    out = _Terminal()
    with MetricsLogger(
        tmp_path, total_steps=4, tensorboard=False, print_every=100, stream=out
    ) as log:
        for step in range(1, 5):
            log.log(
                step, {"reward/mean": step / 4, "entropy/mean": 1.25, "perf/tokens_per_sec": 321.0}
            )
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # drop terminal control codes
    lines = [line.strip() for line in re.split(r"[\r\n]", text) if line.strip()]
    bars = [line for line in lines if line.startswith("train ━")]
    assert bars and re.fullmatch(r"train ━+ 4/4 .*", bars[-1]), bars[-1:]
    assert any(re.fullmatch(r"train ━+╺?━* 2/4 .*", bar) for bar in bars), bars  # live updates
    assert lines[-1] == "reward/mean 1  entropy/mean 1.25  perf/tokens_per_sec 321"
    # the first step's line is printed above the bar, unwrapped
    assert "step 1/4 | reward/mean 0.25 | entropy/mean 1.25 | perf/tokens_per_sec 321" in lines


def test_resume_drops_lines_after_the_checkpoint_step(tmp_path):
    with MetricsLogger(tmp_path, console=False) as log:
        for step in range(1, 11):
            log.log(step, {"reward/mean": float(step)})
    with pytest.raises(ValueError, match="already holds metrics; pass `resume_step`"):
        MetricsLogger(tmp_path, console=False)
    # the run crashed after step 10 but its last checkpoint is step 6: steps 7.. come again
    with MetricsLogger(tmp_path, console=False, resume_step=6) as log:
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]
        with pytest.raises(ValueError, match="`step` 5 is below the last logged step 6"):
            log.log(5, {"reward/mean": 0.0})
        for step in range(7, 9):
            log.log(step, {"reward/mean": 100.0 + step})
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == list(range(1, 9))
    assert [r["reward/mean"] for r in records] == [1, 2, 3, 4, 5, 6, 107, 108]
    assert _purge_steps(tmp_path)[-1] == 7  # TensorBoard hides the old events of steps >= 7


def test_torn_last_line_is_dropped_with_a_warning(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a"')
    with pytest.warns(RuntimeWarning, match="dropping an unfinished last line"):
        assert [r["step"] for r in read_metrics(path)] == [1, 2]
    with pytest.warns(RuntimeWarning, match="unfinished last line"):
        MetricsLogger(tmp_path, console=False, tensorboard=False, resume_step=2).close()
    assert path.read_text() == '{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n'
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a JSON line"):
        read_metrics(path)
    path.write_text('{"step": "1"}\n')
    with pytest.raises(ValueError, match=r":1: a metrics line needs an integer `step`"):
        read_metrics(path)
    with pytest.raises(ValueError, match="no metrics file at"):
        read_metrics(tmp_path / "nope.jsonl")


def test_nan_values_are_kept(tmp_path):
    with MetricsLogger(tmp_path, console=False, tensorboard=False) as log:
        log.log(1, {"kl/mean": jnp.float32(jnp.nan), "x": jnp.inf})
    record = read_metrics(tmp_path)[0]
    assert np.isnan(record["kl/mean"]) and record["x"] == float("inf")


def test_low_precision_floats_are_numbers(tmp_path):
    # bfloat16 / float8 (ml_dtypes, not NumPy number types) log their exact value
    with MetricsLogger(tmp_path, console=False, tensorboard=False) as log:
        log.log(1, {"a": jnp.bfloat16(1.5), "b": jnp.asarray([0.375], jnp.float8_e4m3fn)})
    record = read_metrics(tmp_path)[0]
    assert (record["a"], record["b"]) == (1.5, 0.375)


def test_bad_input_is_named(tmp_path):
    with MetricsLogger(tmp_path, console=False, tensorboard=False) as log:
        for step, metrics, message in (
            (-1, {}, "`step` must be an int >= 0, got -1"),
            (1.5, {}, "`step` must be an int >= 0, got 1.5"),
            (1, [("a", 1.0)], "`metrics` must be a mapping, got list"),
            (1, {"step": 1.0}, "metric key 'step' is reserved"),
            (1, {3: 1.0}, "metric keys must be non-empty str, got 3"),
            (1, {"m": jnp.zeros((2, 2))}, r"metric 'm' must be a scalar, got shape \(2, 2\)"),
            (1, {"m": "high"}, "metric 'm' must be a real number, got <U4"),
            (1, {"m": 1 + 2j}, "metric 'm' must be a real number, got complex128"),
            (1, {"m": None}, "metric 'm' must be a real number, got object"),
        ):
            with pytest.raises(ValueError, match=message):
                log.log(step, metrics)
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # nothing half-written
    for kwargs, message in (
        ({"total_steps": 0}, "`total_steps` must be an int >= 1, got 0"),
        ({"print_every": 0}, "`print_every` must be an int >= 1, got 0"),
        ({"resume_step": -2}, "`resume_step` must be None or an int >= 0, got -2"),
        ({"progress_keys": "reward/mean"}, "`progress_keys` must be a sequence of non-empty str"),
        ({"wandb": "my-project"}, "`wandb` must be None or a mapping"),
    ):
        with pytest.raises(ValueError, match=message):
            MetricsLogger(tmp_path / "new", console=False, tensorboard=False, **kwargs)


def test_only_the_main_process_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics_log, "is_main_process", lambda: False)
    out = io.StringIO()
    with MetricsLogger(tmp_path / "run", print_every=1, stream=out) as log:
        log.log(5, {"reward/mean": jnp.float32(1.0)})
        # still validated as on process 0 (which raises there), without fetching the values
        with pytest.raises(ValueError, match="must be an int >= 0"):
            log.log(-1, {})
        with pytest.raises(ValueError, match="metric 'loss' must be a scalar, got shape"):
            log.log(5, {"loss": jnp.zeros(2)})
        with pytest.raises(ValueError, match="`step` 3 is below the last logged step 5"):
            log.log(3, {"a": 1.0})
    assert not (tmp_path / "run").exists() and out.getvalue() == ""


def test_print_lines_follow_print_every_whatever_the_log_interval(tmp_path):
    """Logged every 3 steps, printed every 10: the first record (the evaluation at step 0),
    the first training step, then the first logged step at or past each multiple of 10."""
    out = io.StringIO()
    with MetricsLogger(
        tmp_path, total_steps=50, tensorboard=False, print_every=10, stream=out
    ) as log:
        log.log(0, {"eval/accuracy": 0.1})
        for step in [1, *range(3, 50, 3), 50]:
            log.log(step, {"reward/mean": step / 50})
    printed = [int(line.split()[1].split("/")[0]) for line in out.getvalue().splitlines()]
    assert printed == [0, 1, 12, 21, 30, 42, 50]


def test_tensorboard_tags_that_tensorboardx_renames_are_warned_once(tmp_path):
    with MetricsLogger(tmp_path, console=False) as log:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the library's own pass@k keys: documented, silent
            log.log(1, {"eval/pass@1": 0.5, "reward/mean": 0.25})
        with pytest.warns(RuntimeWarning, match="'my metric' is the TensorBoard tag 'my_metric'"):
            log.log(1, {"my metric": 1.0})
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # not repeated
            log.log(2, {"eval/pass@1": 0.75, "my metric": 2.0})
        with pytest.warns(RuntimeWarning, match="'eval/pass@1' and 'eval/pass_1' share"):
            log.log(3, {"eval/pass_1": 1.0})
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a collision logged again is not warned again
            log.log(4, {"eval/pass@1": 0.5, "eval/pass_1": 1.0})
    tags = {tag for tag, *_ in _scalar_events(tmp_path)}
    assert tags == {"eval/pass_1", "reward/mean", "my_metric"}
    assert [r.get("eval/pass@1") for r in read_metrics(tmp_path)] == [0.5, None, 0.75, None, 0.5]


def _open_files(path) -> list[str]:
    """The open file descriptors of this process that point below `path` (Linux)."""
    fds = pathlib.Path("/proc/self/fd")
    return [
        target
        for fd in fds.iterdir()
        if (target := os.path.realpath(fd)).startswith(os.path.realpath(path))
    ]


@pytest.mark.skipif(not pathlib.Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_a_sink_that_fails_to_start_or_finish_leaves_no_file_open(tmp_path, monkeypatch):
    def refused(settings, run_dir):
        raise RuntimeError("wandb.init failed: api_key not configured")

    monkeypatch.setattr(metrics_log, "_start_wandb", refused)
    with pytest.raises(RuntimeError, match="api_key not configured"):
        MetricsLogger(tmp_path / "a", console=False, wandb={"project": "x"})
    assert _open_files(tmp_path / "a") == []  # metrics.jsonl and the TensorBoard events closed

    class Finishing:
        def log(self, values, step):
            pass

        def finish(self):
            raise ConnectionError("network error")

    monkeypatch.setattr(metrics_log, "_start_wandb", lambda settings, run_dir: Finishing())
    log = MetricsLogger(tmp_path / "b", console=False, wandb={"project": "x"})
    log.log(1, {"a": 1.0})
    with pytest.warns(RuntimeWarning, match="W&B could not finish the run .*network error"):
        log.close()
    assert _open_files(tmp_path / "b") == []
    assert read_metrics(tmp_path / "b")[0]["a"] == 1.0


def test_wandb_used_only_when_installed(tmp_path, monkeypatch):
    calls = []

    class FakeRun:
        def log(self, values, step):
            calls.append(("log", dict(values), step))

        def finish(self):
            calls.append(("finish",))

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: calls.append(("init", kwargs)) or FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = MetricsConfig(console=False, tensorboard=False, wandb_project="rl")
    with MetricsLogger.from_config(tmp_path / "r1", cfg, run_config={"lr": 0.1}) as log:
        log.log(3, {"reward/mean": jnp.float32(0.5)})
    assert calls[0] == (
        "init",
        {"dir": str(tmp_path / "r1"), "name": "r1", "project": "rl", "config": {"lr": 0.1}},
    )
    assert calls[1:] == [("log", {"reward/mean": 0.5}, 3), ("finish",)]

    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed: import fails
    with pytest.warns(RuntimeWarning, match="`wandb` package is not installed"):
        log = MetricsLogger(
            tmp_path / "r2", console=False, tensorboard=False, wandb={"project": "x"}
        )
    log.log(1, {"a": 1.0})
    log.close()
    assert read_metrics(tmp_path / "r2")[0]["a"] == 1.0


def test_config_builds_and_validates():
    cfg = build(MetricsConfig, {"print_every": 5, "progress_keys": ["reward/mean", "kl/mean"]})
    assert cfg.progress_keys == ("reward/mean", "kl/mean") and cfg.print_every == 5
    with pytest.raises(ConfigError, match="unknown key 'tensorbord'"):
        build(MetricsConfig, {"tensorbord": False})
    with pytest.raises(ValueError, match="`wandb_project` must be a non-empty str or None"):
        MetricsConfig(wandb_project="")
    with pytest.raises(ValueError, match="must be a MetricsConfig"):
        MetricsLogger.from_config("run", {"console": False})


def test_metric_series_skips_records_without_the_key():
    records = [{"step": 1, "a": 1.0}, {"step": 2, "b": 5.0}, {"step": 4, "a": -2.5}]
    steps, values = metric_series(records, "a")
    np.testing.assert_array_equal(steps, [1, 4])
    np.testing.assert_array_equal(values, [1.0, -2.5])
    assert values.dtype == np.float64


def test_plot_curves_draws_the_logged_series(tmp_path):
    rng = np.random.default_rng(0)
    with MetricsLogger(tmp_path, console=False, tensorboard=False) as log:
        for step in range(1, 31):
            metrics = {"reward/mean": float(rng.uniform()), "kl/mean": step * 1e-3, "other": 1.0}
            if step % 10 == 0:
                metrics["eval/accuracy"] = step / 40
            log.log(step, metrics)
    backend = matplotlib.get_backend()
    pyplot_figures = (
        sys.modules["matplotlib.pyplot"].get_fignums() if "matplotlib.pyplot" in sys.modules else []
    )
    drawn = plot_curves(tmp_path / "metrics.jsonl", tmp_path / "plots" / "curves.png")
    assert drawn == ["reward/mean", "eval/accuracy", "kl/mean"]
    assert matplotlib.get_backend() == backend  # no global side effects
    if "matplotlib.pyplot" in sys.modules:
        assert sys.modules["matplotlib.pyplot"].get_fignums() == pyplot_figures
    from matplotlib.image import imread

    image = imread(tmp_path / "plots" / "curves.png")
    assert image.ndim == 3 and image.shape[0] > image.shape[1] / 2  # three stacked panels

    records = read_metrics(tmp_path)
    figure, keys = metrics_log._curves_figure(records, ["eval/accuracy", "other"], "t")
    assert keys == ["eval/accuracy", "other"]
    x, y = figure.axes[0].lines[0].get_data()
    np.testing.assert_array_equal(x, [10, 20, 30])
    np.testing.assert_allclose(y, [0.25, 0.5, 0.75])
    assert figure.axes[0].get_ylabel() == "eval/accuracy"

    with pytest.raises(ValueError, match=r"keys \['nope'\] do not occur .*available: \['eval"):
        plot_curves(tmp_path, tmp_path / "x.png", keys=["nope"])
    (tmp_path / "other_run").mkdir()
    (tmp_path / "other_run" / "metrics.jsonl").write_text(json.dumps({"step": 1, "z": 1}) + "\n")
    with pytest.raises(ValueError, match=r"none of the default keys .* pass `keys` from: \['z'\]"):
        plot_curves(tmp_path / "other_run", tmp_path / "y.png")


def test_the_default_plot_keys_and_gaps_in_a_series():
    """The five documented default curves; a key missing or null on a line is a gap in its
    series, not a NaN point."""
    assert metrics_log.DEFAULT_PLOT_KEYS == (
        "reward/mean",
        "eval/accuracy",
        "kl/mean",
        "entropy/mean",
        "response/length_mean",
    )
    records = [{"step": 1, "a": None}, {"step": 2, "a": 1.0}, {"step": 3}]
    assert metrics_log.metric_series(records, "a") == ([2], [1.0])
