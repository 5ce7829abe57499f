"""The embedded demo (`jaxrl-llm demo`): its plumbing on tiny runs, and its learning claim.

- plumbing: both stages run through the runner with a few steps of a tiny model; the demo's
  `summary.json`, merged `metrics.jsonl` and plot are written; a second demo reuses the cached
  SFT stage (not retrained) and reruns RL; a changed SFT config or `fresh` retrains it
  (identically: the stage is deterministic);
  mismatched stages, foreign directories and bad overrides are user errors.
- learning (slow): a shortened demo (fewer SFT and RL steps, same model, task and seed) must
  raise held-out accuracy at temperature 1 by at least 15 points during RL.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from jaxrl_llm.cli import main
from jaxrl_llm.config import ConfigError
from jaxrl_llm.demo import (
    STAGE_FILE,
    check_stage_dirs,
    demo_configs,
    run_demo,
    run_sft_stage,
    sft_cache_key,
)
from tests.compile_settings import user_env

ROOT = pathlib.Path(__file__).resolve().parents[1]

TINY_MODEL = [
    "model.init.hidden_size=16",
    "model.init.intermediate_size=32",
    "model.init.num_layers=1",
    "model.init.num_heads=2",
    "model.init.num_kv_heads=1",
    "model.init.head_dim=8",
]
SHARED = [  # both stages: the same small eval split
    "data.arithmetic.eval_size=8",
    "train.eval_prompts=8",
    "train.prompts_per_step=4",
    "train.eval_every=0",
    "train.log_every=1",
]
TINY_SFT = [*TINY_MODEL, *SHARED, "data.arithmetic.train_size=64", "train.steps=3"]
TINY_RL = [*SHARED, "data.arithmetic.train_size=64", "sampling.num_samples=2", "train.steps=2"]

SUMMARY_KEYS = {
    "accuracy_before_rl",
    "accuracy_after_rl",
    "gain_points",
    "greedy_accuracy_before_rl",
    "greedy_accuracy_after_rl",
    "imitation_ceiling",
    "teacher_answer_noise",
    "sft_accuracy",
    "sft_greedy_accuracy",
    "steps",
    "sft_steps",
    "sft_cached",
    "wall_seconds",
    "rl_wall_seconds",
    "sft_wall_seconds",
    "eval_prompts",
    "eval_samples",
    "stages",
}


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_demo_writes_its_outputs_and_reuses_the_cached_sft_stage(tmp_path):
    root = tmp_path / "demo"
    lines: list[str] = []
    summary = run_demo(root, sft_overrides=TINY_SFT, rl_overrides=TINY_RL, print_fn=lines.append)

    assert set(summary) == SUMMARY_KEYS
    assert json.loads((root / "summary.json").read_text()) == summary
    assert summary["steps"] == 2 and summary["sft_steps"] == 3 and not summary["sft_cached"]
    for key in ("accuracy_before_rl", "accuracy_after_rl", "greedy_accuracy_after_rl"):
        assert 0.0 <= summary[key] <= 1.0
    gain = 100 * (summary["accuracy_after_rl"] - summary["accuracy_before_rl"])
    assert summary["gain_points"] == pytest.approx(gain, abs=0.01)
    assert summary["imitation_ceiling"] == pytest.approx(0.6)
    rl_summary = json.loads((root / "grpo" / "summary.json").read_text())
    assert summary["accuracy_before_rl"] == rl_summary["accuracy_before_rl"]
    assert summary["wall_seconds"] >= summary["rl_wall_seconds"] > 0
    report = "\n".join(lines)
    assert "before RL" in report and "after 2 GRPO steps" in report and "Wall time" in report

    # the merged metrics: SFT steps 0..3, then RL steps 0..2 offset by the 3 SFT steps
    records = _records(root / "metrics.jsonl")
    stages = [(r["stage"], r["stage_step"], r["step"]) for r in records if "loss/total" in r]
    assert stages == [("sft", 1, 1), ("sft", 2, 2), ("sft", 3, 3), ("grpo", 1, 4), ("grpo", 2, 5)]
    evals = [(r["stage"], r["step"]) for r in records if "eval/accuracy" in r]
    assert evals == [("sft", 0), ("sft", 3), ("grpo", 3), ("grpo", 5)]
    assert (root / "curves.png").read_bytes()[:4] == b"\x89PNG"
    for stage in ("sft", "grpo"):
        assert json.loads((root / stage / STAGE_FILE).read_text())["complete"] is True
    assert (root / "sft" / "export" / "config.json").is_file()

    # a second demo: the SFT stage is reused as it is, RL runs again
    sft_files = {p: p.stat().st_mtime_ns for p in (root / "sft").rglob("*") if p.is_file()}
    lines.clear()
    again = run_demo(root, sft_overrides=TINY_SFT, rl_overrides=TINY_RL, print_fn=lines.append)
    assert again["sft_cached"] and again["sft_wall_seconds"] == summary["sft_wall_seconds"]
    assert any("reused the cached SFT checkpoint" in line for line in lines)
    assert {p: p.stat().st_mtime_ns for p in (root / "sft").rglob("*") if p.is_file()} == sft_files
    assert again["accuracy_before_rl"] == summary["accuracy_before_rl"]  # same start, same eval
    assert len(_records(root / "metrics.jsonl")) == len(records)

    # another SFT config, or `fresh`, trains the SFT stage again
    sft, _ = demo_configs(root, sft_overrides=[*TINY_SFT, "train.steps=4"], rl_overrides=TINY_RL)
    changed, cached = run_sft_stage(sft)
    assert not cached and changed["steps"] == 4
    assert run_sft_stage(sft)[1]
    fresh, cached = run_sft_stage(sft, fresh=True)
    assert not cached
    # the SFT stage is deterministic: training it again gives the same policy
    for key in ("accuracy_after_rl", "greedy_accuracy_after_rl"):
        assert fresh[key] == changed[key]
    assert fresh["final_metrics"]["sft/nll"] == changed["final_metrics"]["sft/nll"]


def test_stage_configs_must_fit_together(tmp_path):
    sft, rl = demo_configs(tmp_path)
    assert rl.model.checkpoint == str(tmp_path / "sft" / "export")
    assert sft.data.arithmetic.answer_noise == 0.4 and rl.data.arithmetic.answer_noise == 0.0
    assert sft_cache_key(sft) != sft_cache_key(demo_configs(tmp_path, sft_overrides=["seed=1"])[0])
    with pytest.raises(ValueError, match="answer_noise must be 0"):
        demo_configs(tmp_path, rl_overrides=["data.arithmetic.answer_noise=0.1"])
    with pytest.raises(ValueError, match=r"`data.arithmetic.eval_size` must be the same"):
        demo_configs(tmp_path, sft_overrides=["data.arithmetic.eval_size=100"])
    with pytest.raises(ValueError, match=r"`data.seed` must be the same"):
        demo_configs(tmp_path, rl_overrides=["data.seed=3"])
    with pytest.raises(ConfigError, match="did you mean 'steps'"):
        demo_configs(tmp_path, rl_overrides=["train.stepz=3"])
    with pytest.raises(ConfigError, match="--rl run_dir=elsewhere: the stages run in RUN_DIR"):
        demo_configs(tmp_path, rl_overrides=["run_dir=elsewhere"])  # it was silently ignored


def test_a_directory_the_demo_did_not_write_is_never_replaced(tmp_path):
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "precious.txt").write_text("keep")
    with pytest.raises(ValueError, match="was not written by the demo"):
        check_stage_dirs(tmp_path)
    with pytest.raises(ValueError, match="was not written by the demo"):
        run_demo(tmp_path, print_fn=lambda _: None)
    assert (tmp_path / "sft" / "precious.txt").read_text() == "keep"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rl", "train.stepz=3"], "unknown key 'stepz' (did you mean 'steps'?)"),
        (["--sft", "data.arithmetic.eval_size=9"], "`data.arithmetic.eval_size` must be the same"),
    ],
)
def test_cli_reports_user_errors_without_a_traceback(tmp_path, capsys, args, message):
    assert main(["demo", "--run-dir", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrl-llm demo: ") and message in err
    assert "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing was started


def test_a_run_dir_that_cannot_be_created_is_one_line(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    assert main(["demo", "--run-dir", str(tmp_path / "a_file" / "demo")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrl-llm demo: --run-dir: ") and "cannot be created" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("stopped", "signal_name", "status"), [("sft", "SIGINT", 130), ("grpo", "SIGTERM", 143)]
)
def test_an_interrupted_stage_stops_the_demo_and_stays_incomplete(
    tmp_path, capsys, monkeypatch, stopped, signal_name, status
):
    """A signal during a stage (its step finished and saved by the runner) ends the demo with
    128 + the signal: the stage is not marked complete, and stage 2 never starts after stage 1."""
    import jaxrl_llm.demo as demo

    ran = []

    def train(config):  # the runner's summary of a run stopped by a signal, or of a full run
        stage = "sft" if config.kind == "sft" else "grpo"
        ran.append(stage)
        if stage == stopped:
            return {"interrupted": signal_name}
        (tmp_path / "sft" / "export").mkdir(parents=True)
        (tmp_path / "sft" / "summary.json").write_text("{}")
        return {"interrupted": None}

    monkeypatch.setattr(demo, "train", train)
    overrides = [a for s in TINY_SFT for a in ("--sft", s)] + [
        a for r in TINY_RL for a in ("--rl", r)
    ]
    assert main(["demo", "--run-dir", str(tmp_path), *overrides]) == status
    err = capsys.readouterr().err
    assert f"interrupted ({signal_name}) during the {stopped.upper()} stage" in err, err
    assert "Traceback" not in err
    assert ran == ["sft"] if stopped == "sft" else ["sft", "grpo"]
    stage = json.loads((tmp_path / stopped / STAGE_FILE).read_text())
    assert stage["complete"] is False
    if stopped == "grpo":
        assert json.loads((tmp_path / "sft" / STAGE_FILE).read_text())["complete"] is True
    assert not (tmp_path / "summary.json").exists()


# A shortened demo: the same model, task, seed and RL recipe; 1000 instead of 2400 SFT steps
# (the SFT policy must be past its jump from ~0.1 to ~0.4 accuracy, which comes between steps
# 600 and 1500 depending on the seed; seed 0's comes before step 900: 0.330 -> 0.667 after 1000
# steps) and 60 instead of 300 RL steps (docs/demo.md).
SHORT_SFT = ["train.steps=1000", "train.eval_every=0", "train.log_every=50"]
SHORT_RL = ["train.steps=60", "train.eval_every=0", "train.log_every=10"]


def test_shortened_demo_learns_from_the_verifier_reward(tmp_path):
    # `jaxrl-llm demo` in a subprocess that compiles as users do (`user_env`): XLA's default
    # optimisations, which pay for themselves over 1,060 steps, and its default fusion emitters
    # (the suite's XLA_FLAGS cannot be undone in this process); the learning claim is about
    # the programs users run
    overrides = [arg for o in SHORT_SFT for arg in ("--sft", o)]
    overrides += [arg for o in SHORT_RL for arg in ("--rl", o)]
    env = user_env(JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "jaxrl_llm", "demo", "--run-dir", str(tmp_path), *overrides],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,  # a hang, not a budget: about a minute on 2 CPU cores
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["sft_steps"], summary["steps"]) == (1000, 60), summary
    before, after = summary["accuracy_before_rl"], summary["accuracy_after_rl"]
    assert after - before >= 0.15, summary
    # the RL train reward rose too (first vs last logged steps)
    rewards = [r["reward/mean"] for r in _records(tmp_path / "metrics.jsonl") if "reward/mean" in r]
    assert np.mean(rewards[-2:]) > np.mean(rewards[:2]), rewards
