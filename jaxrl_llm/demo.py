"""`make demo` / `jaxrl-llm demo`: RL with a verifier reward fixes what imitation cannot, on a CPU.

Two real training runs of `jaxrl_llm.runner` (the `jaxrl-llm train` machinery: the YAML
configs, the loop, evaluation, checkpoints, metrics), on 2-digit addition (`"12+34="` →
`"46"`) with the byte tokenizer and a tiny Qwen3-shaped model (2 layers, width 64, ~90k
parameters):

1. **SFT** (`configs/demo_sft.yaml`, run directory `<run_dir>/sft`): supervised fine-tuning of
   the random model on a *noisy teacher's* demonstrations: with probability 0.4 the last digit
   of a train answer is replaced by a different digit (`data.arithmetic.answer_noise`). A
   perfect imitation of this teacher answers correctly with probability 1 − 0.4 = 0.6 when it
   samples at temperature 1: supervised learning on these demonstrations cannot pass that.
   The stage's exported checkpoint is cached: a later demo with the same SFT config reuses it.
2. **GRPO** (`configs/demo_grpo.yaml`, `<run_dir>/grpo`): from the SFT checkpoint, GRPO with
   the exact-answer verifier reward on the clean train problems. Held-out accuracy at
   temperature 1 (`eval/accuracy`, the same 256 eval problems as stage 1, never trained on)
   is measured before the first RL step and after the last.

The demo writes, in `run_dir`: `summary.json` (`accuracy_before_rl`, `accuracy_after_rl`,
greedy accuracies, `gain_points`, `steps`, `sft_steps`, `wall_seconds`, ...), `metrics.jsonl`
(both stages' records, `stage` = "sft" / "grpo", `step` counted across the stages) and
`curves.png` (held-out accuracy through both stages, the RL reward, the SFT loss). See
docs/demo.md for the measured numbers and the control experiment.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jaxrl_llm.config import ConfigError
from jaxrl_llm.metrics_log import METRICS_FILE, metric_series, read_metrics
from jaxrl_llm.runner import RunConfig, config_hash, load_run_config, train

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "configs"
SFT_CONFIG = CONFIG_DIR / "demo_sft.yaml"
RL_CONFIG = CONFIG_DIR / "demo_grpo.yaml"
DEFAULT_RUN_DIR = pathlib.Path("runs") / "demo"
STAGES = ("sft", "grpo")
STAGE_FILE = "demo_stage.json"  # in each stage directory: written by the demo, its cache key
SUMMARY_FILE = "summary.json"
CURVES_FILE = "curves.png"


def demo_configs(
    run_dir: str | pathlib.Path = DEFAULT_RUN_DIR,
    *,
    sft_overrides: Sequence[str] = (),
    rl_overrides: Sequence[str] = (),
) -> tuple[RunConfig, RunConfig]:
    """The two stages' validated run configs: `(sft, grpo)`, in `run_dir/sft` and `run_dir/grpo`.

    The GRPO stage starts from the SFT stage's exported checkpoint (`model.checkpoint` is set
    to `run_dir/sft/<export.directory>`). Overrides are `KEY=VALUE` strings as on the
    `jaxrl-llm train` command line, applied to one stage each.

    Raises:
      ConfigError: a bad override (named).
      ValueError: stages that do not fit together (`check_stages`).

    Examples:
      >>> sft, rl = demo_configs("runs/demo", rl_overrides=["train.steps=50"])
      >>> sft.kind, sft.data.arithmetic.answer_noise, rl.kind, rl.train.steps
      ('sft', 0.4, 'rl', 50)
      >>> rl.model.checkpoint
      'runs/demo/sft/export'
    """
    for flag, overrides in (("--sft", sft_overrides), ("--rl", rl_overrides)):
        for override in overrides:
            if override.partition("=")[0].strip() == "run_dir":
                raise ConfigError(
                    f"{flag} {override}: the stages run in RUN_DIR/sft and RUN_DIR/grpo; set "
                    "RUN_DIR with --run-dir."
                )
    root = pathlib.Path(run_dir)
    sft = load_run_config(SFT_CONFIG, sft_overrides, run_dir=root / "sft")
    export = root / "sft" / sft.export.directory
    rl = load_run_config(
        RL_CONFIG, [f"model.checkpoint={export}", *rl_overrides], run_dir=root / "grpo"
    )
    check_stages(sft, rl)
    return sft, rl


def check_stages(sft: RunConfig, rl: RunConfig) -> None:
    """Check that the RL stage can start from the SFT stage and is evaluated on the same split.

    Raises:
      ValueError: naming the first mismatch: the SFT stage is not an exported `sft:` run, the
        RL stage is not an `algorithm:` run, the RL train answers are noisy (the reward would
        check the corrupted answers), or the two stages differ in tokenizer, data source, task
        seed, problems, eval prompts or completion length.

    Examples:
      >>> sft, rl = demo_configs()
      >>> check_stages(rl, sft)
      Traceback (most recent call last):
      ...
      ValueError: demo: the first stage must be an `sft:` run with `export.enabled: true`, got a rl run (export enabled: True).
    """
    if sft.kind != "sft" or not sft.export.enabled:
        raise ValueError(
            "demo: the first stage must be an `sft:` run with `export.enabled: true`, got a "
            f"{sft.kind} run (export enabled: {sft.export.enabled})."
        )
    if rl.kind != "rl":
        raise ValueError(f"demo: the second stage must be an `algorithm:` run, got {rl.kind}.")
    if rl.data.arithmetic.answer_noise:
        raise ValueError(
            "demo: the RL stage's data.arithmetic.answer_noise must be 0 (its reward checks the "
            f"train answers), got {rl.data.arithmetic.answer_noise}."
        )
    task_keys = ("min_digits", "max_digits", "operations", "allow_negative", "eval_size")
    pairs = {
        "tokenizer": (sft.tokenizer, rl.tokenizer),
        "data.source": (sft.data.source, rl.data.source),
        "data.seed": (sft.data.seed, rl.data.seed),
        "data.template": (sft.data.template, rl.data.template),
        "train.eval_prompts": (sft.train.eval_prompts, rl.train.eval_prompts),
        "sampling.max_new_tokens": (sft.sampling.max_new_tokens, rl.sampling.max_new_tokens),
        **{
            f"data.arithmetic.{k}": (
                getattr(sft.data.arithmetic, k),
                getattr(rl.data.arithmetic, k),
            )
            for k in (*task_keys, "eval_fraction")
        },
    }
    for key, (a, b) in pairs.items():
        if a != b:
            raise ValueError(
                f"demo: `{key}` must be the same in both stages (the RL stage continues the "
                f"SFT policy on the same task and eval split), got {a!r} (SFT) and {b!r} (RL)."
            )


def sft_cache_key(config: RunConfig) -> str:
    """The hash that decides whether a cached SFT stage can be reused: its whole config except
    the run directory.

    Examples:
      >>> sft, _ = demo_configs("runs/a")
      >>> sft_cache_key(sft) == sft_cache_key(demo_configs("runs/b")[0])
      True
    """
    return config_hash(dataclasses.replace(config, run_dir=None))


def _read_stage(directory: pathlib.Path) -> dict[str, Any] | None:
    path = directory / STAGE_FILE
    if not directory.exists():
        return None
    if not path.is_file():
        raise ValueError(
            f"demo: {directory} exists but was not written by the demo (no {STAGE_FILE}); "
            "choose another --run-dir or move it away."
        )
    return json.loads(path.read_text())


def check_stage_dirs(run_dir: str | pathlib.Path = DEFAULT_RUN_DIR) -> None:
    """Check that `run_dir/sft` and `run_dir/grpo`, where they exist, were written by the demo
    (which replaces or reuses them), so that no other directory is ever removed.

    Raises:
      ValueError: naming the directory that holds something else.

    Examples:
      >>> import tempfile
      >>> root = pathlib.Path(tempfile.mkdtemp())
      >>> check_stage_dirs(root)  # nothing there yet
      >>> (root / "grpo").mkdir()
      >>> check_stage_dirs(root)  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: demo: .../grpo exists but was not written by the demo (no demo_stage.json); choose another --run-dir or move it away.
    """
    for name in STAGES:
        _read_stage(pathlib.Path(run_dir) / name)


class DemoInterruptedError(Exception):
    """A stage's training stopped on SIGINT / SIGTERM (`signal_name`): the stage stays
    incomplete (the next demo trains it again) and the demo stops there."""

    def __init__(self, stage: str, signal_name: str) -> None:
        super().__init__(
            f"interrupted ({signal_name}) during the {stage.upper()} stage; the stage is left "
            "incomplete and the next `jaxrl-llm demo` trains it again"
        )
        self.stage = stage
        self.signal_name = signal_name


def _train_stage(config: RunConfig, stage: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """`train(config)`, then the stage marked complete, unless a signal stopped it."""
    summary = train(config)
    if summary.get("interrupted"):
        raise DemoInterruptedError(stage, summary["interrupted"])
    _write_stage(pathlib.Path(config.run_dir), {**record, "complete": True})
    return summary


def _write_stage(directory: pathlib.Path, record: Mapping[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / STAGE_FILE).write_text(json.dumps(dict(record), indent=2, sort_keys=True) + "\n")


def _fresh_stage(directory: pathlib.Path, record: Mapping[str, Any]) -> None:
    """Remove a previous demo's stage directory (checked to be one) and mark a new one."""
    if _read_stage(directory) is not None:
        shutil.rmtree(directory)
    _write_stage(directory, {**record, "complete": False})


def run_sft_stage(config: RunConfig, *, fresh: bool = False) -> tuple[dict[str, Any], bool]:
    """Train the SFT stage, or reuse it when its directory holds a complete run of this config.

    Args:
      config: the SFT stage's config (from `demo_configs`).
      fresh: train again even when a matching cached stage exists.

    Returns:
      `(summary, cached)`: the stage's `summary.json` and whether it was reused.

    Examples:
      >>> _, rl = demo_configs()
      >>> run_sft_stage(rl)
      Traceback (most recent call last):
      ...
      ValueError: run_sft_stage: `config` must be an `sft:` run, got rl.
    """
    if config.kind != "sft":
        raise ValueError(f"run_sft_stage: `config` must be an `sft:` run, got {config.kind}.")
    directory = pathlib.Path(config.run_dir)
    key = sft_cache_key(config)
    stage = _read_stage(directory)
    reusable = (
        not fresh
        and stage is not None
        and stage.get("cache_key") == key
        and stage.get("complete")
        and (directory / SUMMARY_FILE).is_file()
        and (directory / config.export.directory).is_dir()
    )
    if reusable:
        return json.loads((directory / SUMMARY_FILE).read_text()), True
    _fresh_stage(directory, {"stage": "sft", "cache_key": key})
    return _train_stage(config, "sft", {"stage": "sft", "cache_key": key}), False


def run_rl_stage(config: RunConfig) -> dict[str, Any]:
    """Run the GRPO stage from scratch (a previous demo's RL directory is replaced).

    Examples:
      >>> sft, _ = demo_configs()
      >>> run_rl_stage(sft)
      Traceback (most recent call last):
      ...
      ValueError: run_rl_stage: `config` must be an `algorithm:` run, got sft.
    """
    if config.kind != "rl":
        raise ValueError(f"run_rl_stage: `config` must be an `algorithm:` run, got {config.kind}.")
    directory = pathlib.Path(config.run_dir)
    _fresh_stage(directory, {"stage": "grpo"})
    return _train_stage(config, "grpo", {"stage": "grpo"})


def merge_metrics(
    sft_dir: str | pathlib.Path, rl_dir: str | pathlib.Path, out: str | pathlib.Path
) -> list[dict[str, Any]]:
    """Both stages' `metrics.jsonl` records in one file, on one step axis.

    Each record gets `stage` ("sft" / "grpo") and `stage_step` (its step in its own run);
    `step` is the SFT step, then the number of SFT steps plus the RL step.

    Returns:
      The records written, in order.

    Examples:
      >>> import tempfile
      >>> root = pathlib.Path(tempfile.mkdtemp())
      >>> for name, lines in (("sft", ['{"step": 0}', '{"step": 5, "sft/nll": 1.0}']),
      ...                     ("grpo", ['{"step": 0}', '{"step": 2, "reward/mean": 0.5}'])):
      ...     (root / name).mkdir()
      ...     _ = (root / name / "metrics.jsonl").write_text("\\n".join(lines) + "\\n")
      >>> [(r["stage"], r["stage_step"], r["step"])
      ...  for r in merge_metrics(root / "sft", root / "grpo", root / "metrics.jsonl")]
      [('sft', 0, 0), ('sft', 5, 5), ('grpo', 0, 5), ('grpo', 2, 7)]
    """
    sft = read_metrics(sft_dir)
    rl = read_metrics(rl_dir)
    offset = max(r["step"] for r in sft)
    merged = [{**r, "stage": "sft", "stage_step": r["step"]} for r in sft]
    merged += [
        {**r, "stage": "grpo", "stage_step": r["step"], "step": offset + r["step"]} for r in rl
    ]
    with open(out, "w") as f:
        for record in merged:
            f.write(json.dumps(record) + "\n")
    return merged


def plot_demo(
    records: Sequence[Mapping[str, Any]],
    out_png: str | pathlib.Path,
    *,
    imitation_ceiling: float | None = None,
) -> None:
    """The demo's figure: held-out accuracy through both stages, the RL reward, the SFT loss.

    Args:
      records: `merge_metrics` records.
      out_png: the PNG to write.
      imitation_ceiling: the accuracy of a perfect imitation of the teacher, drawn as a line.

    Examples:
      >>> import tempfile
      >>> out = pathlib.Path(tempfile.mkdtemp()) / "c.png"
      >>> plot_demo([{"stage": "sft", "stage_step": 0, "eval/accuracy": 0.0, "sft/nll": 2.0},
      ...            {"stage": "grpo", "stage_step": 0, "eval/accuracy": 0.5, "reward/mean": 0.4}],
      ...           out, imitation_ceiling=0.6)
      >>> out.read_bytes()[:4]
      b'\\x89PNG'
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def series(stage: str, key: str) -> tuple[Any, Any]:
        stage_records = [{**r, "step": r["stage_step"]} for r in records if r["stage"] == stage]
        return metric_series(stage_records, key)

    figure = Figure(figsize=(10.0, 6.0), layout="constrained")
    axes = figure.subplots(2, 2)
    titles = {"sft": "1. SFT on the noisy teacher", "grpo": "2. GRPO with the verifier reward"}
    for column, (stage, color) in enumerate((("sft", "tab:blue"), ("grpo", "tab:red"))):
        acc, curve = axes[0, column], axes[1, column]
        acc.plot(
            *series(stage, "eval/accuracy"), "-", color=color, marker=".", label="temperature 1"
        )
        acc.plot(
            *series(stage, "eval/accuracy_greedy"), ":", color=color, marker=".", label="greedy"
        )
        if imitation_ceiling is not None:
            acc.axhline(imitation_ceiling, color="gray", linewidth=0.8, linestyle="--")
            acc.text(0, imitation_ceiling + 0.015, "perfect imitation of the teacher", color="gray")
        acc.set_title(titles[stage])
        acc.set_ylim(-0.02, 1.02)
        acc.legend(loc="lower right", fontsize="small")
        key, label = ("sft/nll", "SFT loss (NLL)") if stage == "sft" else ("reward/mean", "")
        curve.plot(*series(stage, key), color=color, linewidth=1.0)
        curve.set_ylabel(label or "GRPO train reward (mean)")
        if stage == "grpo":
            curve.set_ylim(-0.02, 1.02)
        curve.set_xlabel(f"{stage.upper()} step")
        for ax in (acc, curve):
            ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("held-out accuracy")
    axes[0, 1].set_ylabel("held-out accuracy")
    figure.suptitle("jaxrl-llm demo: held-out accuracy on 2-digit addition")
    FigureCanvasAgg(figure).print_png(str(out_png))


def demo_summary(
    sft_config: RunConfig,
    rl_config: RunConfig,
    sft: Mapping[str, Any],
    rl: Mapping[str, Any],
    *,
    cached: bool,
    wall_seconds: float,
) -> dict[str, Any]:
    """The demo's `summary.json` from the two stages' summaries.

    Examples:
      >>> sft_cfg, rl_cfg = demo_configs()
      >>> s = demo_summary(sft_cfg, rl_cfg, {"steps": 10, "wall_seconds": 5.0, "accuracy_after_rl": 0.4,
      ...                            "greedy_accuracy_after_rl": 0.8},
      ...                  {"steps": 3, "wall_seconds": 2.0, "accuracy_before_rl": 0.45,
      ...                   "accuracy_after_rl": 0.7, "greedy_accuracy_before_rl": 0.8,
      ...                   "greedy_accuracy_after_rl": 0.9}, cached=True, wall_seconds=2.5)
      >>> s["accuracy_before_rl"], s["accuracy_after_rl"], s["gain_points"], s["steps"]
      (0.45, 0.7, 25.0, 3)
    """
    before, after = rl["accuracy_before_rl"], rl["accuracy_after_rl"]
    noise = sft_config.data.arithmetic.answer_noise
    return {
        "accuracy_before_rl": before,
        "accuracy_after_rl": after,
        "gain_points": round(100.0 * (after - before), 2),
        "greedy_accuracy_before_rl": rl["greedy_accuracy_before_rl"],
        "greedy_accuracy_after_rl": rl["greedy_accuracy_after_rl"],
        "teacher_answer_noise": noise,
        "imitation_ceiling": 1.0 - noise,
        "sft_accuracy": sft["accuracy_after_rl"],
        "sft_greedy_accuracy": sft["greedy_accuracy_after_rl"],
        "steps": rl["steps"],
        "sft_steps": sft["steps"],
        "sft_cached": cached,
        "wall_seconds": wall_seconds,
        "rl_wall_seconds": rl["wall_seconds"],
        "sft_wall_seconds": sft["wall_seconds"],
        "eval_prompts": rl_config.train.eval_prompts,
        "eval_samples": rl_config.eval_samples,
        "stages": {name: str(pathlib.Path(sft_config.run_dir).parent / name) for name in STAGES},
    }


def format_report(summary: Mapping[str, Any]) -> str:
    """The lines the demo ends with.

    Examples:
      >>> print(format_report({"accuracy_before_rl": 0.5, "accuracy_after_rl": 0.9,
      ...     "greedy_accuracy_before_rl": 0.8, "greedy_accuracy_after_rl": 0.95,
      ...     "gain_points": 40.0, "imitation_ceiling": 0.6, "steps": 300, "sft_steps": 2400,
      ...     "sft_cached": False, "wall_seconds": 200.0, "sft_wall_seconds": 120.0,
      ...     "rl_wall_seconds": 70.0, "eval_prompts": 256, "eval_samples": 4}))
      Held-out accuracy at temperature 1 (256 eval problems x 4 samples, never trained on):
        before RL (after SFT on the noisy teacher): 0.500   (greedy 0.800)
        after 300 GRPO steps:                       0.900   (greedy 0.950)
        change: +40.0 points; a perfect imitation of the teacher scores 0.60 at temperature 1
      Wall time: 200.0 s (SFT 2400 steps: 120.0 s; GRPO: 70.0 s)
    """
    sft_time = (
        "reused from the cache" if summary["sft_cached"] else f"{summary['sft_wall_seconds']:.1f} s"
    )
    return "\n".join(
        [
            f"Held-out accuracy at temperature 1 ({summary['eval_prompts']} eval problems x "
            f"{summary['eval_samples']} samples, never trained on):",
            f"  before RL (after SFT on the noisy teacher): {summary['accuracy_before_rl']:.3f}"
            f"   (greedy {summary['greedy_accuracy_before_rl']:.3f})",
            f"  after {summary['steps']} GRPO steps:{'':23}{summary['accuracy_after_rl']:.3f}"
            f"   (greedy {summary['greedy_accuracy_after_rl']:.3f})",
            f"  change: {summary['gain_points']:+.1f} points; a perfect imitation of the teacher "
            f"scores {summary['imitation_ceiling']:.2f} at temperature 1",
            f"Wall time: {summary['wall_seconds']:.1f} s (SFT {summary['sft_steps']} steps: "
            f"{sft_time}; GRPO: {summary['rl_wall_seconds']:.1f} s)",
        ]
    )


def run_demo(
    run_dir: str | pathlib.Path = DEFAULT_RUN_DIR,
    *,
    sft_overrides: Sequence[str] = (),
    rl_overrides: Sequence[str] = (),
    fresh: bool = False,
    print_fn: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the demo (module docstring): SFT (or its cache), GRPO, then the merged outputs.

    Args:
      run_dir: the demo's directory (stages in `run_dir/sft` and `run_dir/grpo`).
      sft_overrides: `KEY=VALUE` overrides of `configs/demo_sft.yaml`.
      rl_overrides: `KEY=VALUE` overrides of `configs/demo_grpo.yaml`.
      fresh: retrain the SFT stage even when it is cached.
      print_fn: where the stage headers and the final report go.

    Returns:
      The summary, also written to `run_dir/summary.json`.

    Examples:
      `tests/test_demo.py` runs it with a few steps per stage, then again from the cache:

      >>> run_demo(sft_overrides=["train.stepz=1"])
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: train: unknown key 'stepz' (did you mean 'steps'?); allowed keys: steps, prompts_per_step, max_prompt_tokens, eval_every, eval_prompts, eval_samples, eval_pass_k, log_every, max_refills, overlong, truncation_penalty, max_consecutive_skips, compiled_iterations, compilation_cache, shared_prompt_forward, reference_sync, trim_completions, trim_minimum, pack_groups, pack_min_saving
    """
    started = time.perf_counter()
    sft_config, rl_config = demo_configs(
        run_dir, sft_overrides=sft_overrides, rl_overrides=rl_overrides
    )
    check_stage_dirs(run_dir)
    root = pathlib.Path(run_dir)
    noise = sft_config.data.arithmetic.answer_noise
    print_fn(
        f"jaxrl-llm demo: 2-digit addition, byte tokenizer, tiny random model; run directory "
        f"{root}\nStage 1/2: SFT on a noisy teacher (a train answer's last digit is wrong with "
        f"probability {noise}), {sft_config.train.steps} steps ({SFT_CONFIG.name})"
    )
    sft, cached = run_sft_stage(sft_config, fresh=fresh)
    if cached:
        print_fn(
            f"  reused the cached SFT checkpoint in {sft_config.run_dir} (same config; "
            "--fresh trains it again)"
        )
    print_fn(
        f"Stage 2/2: GRPO with the exact-answer reward from the SFT checkpoint, "
        f"{rl_config.train.steps} steps ({RL_CONFIG.name})"
    )
    rl = run_rl_stage(rl_config)
    summary = demo_summary(
        sft_config, rl_config, sft, rl, cached=cached, wall_seconds=time.perf_counter() - started
    )
    records = merge_metrics(sft_config.run_dir, rl_config.run_dir, root / METRICS_FILE)
    plot_demo(records, root / CURVES_FILE, imitation_ceiling=summary["imitation_ceiling"])
    summary["wall_seconds"] = time.perf_counter() - started
    (root / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print_fn(format_report(summary))
    print_fn(f"Written: {root / SUMMARY_FILE}, {root / METRICS_FILE}, {root / CURVES_FILE}")
    return summary
