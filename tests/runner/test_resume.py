"""Reliability: bit-for-bit resume through the CLI, and a graceful stop on SIGTERM."""

from __future__ import annotations

import json
import logging
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from jaxrl_llm import metrics_log
from jaxrl_llm.checkpoint import Checkpointer
from jaxrl_llm.cli import main
from jaxrl_llm.config import ConfigError
from jaxrl_llm.data import IteratorState
from jaxrl_llm.runner import load_run_config, prepare_run, train
from tests.compile_settings import fast_compile_env
from tests.runner.helpers import CONFIGS, ROOT, SFT_OPTIM, TINY, records, train_records, tree_equal

GRPO = str(CONFIGS / "grpo.yaml")
SIX = [*TINY, "train.steps=6", "checkpoint.every=3"]


def _final_state(run_dir):
    """The newest checkpoint of a finished run, restored as host arrays (typed keys as data)."""
    prepared = prepare_run(load_run_config(GRPO, SIX, run_dir=run_dir), resume=True)
    prepared.checkpointer.close()
    leaves = jax.tree.leaves(prepared.state)
    out = [
        np.asarray(
            jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
        )
        for x in leaves
    ]
    return prepared.start_step, prepared.data, out


def _check_resume_with_other_data(run_dir, caplog):
    """The checkpoint after 3 steps of 2 prompts holds position 6 of epoch 0 over 32 prompts:
    resumed over 40 prompts, that position means nothing, so the run goes on from epoch 1's
    start, with a warning naming both sizes; over the same 32 it carries over unchanged."""
    config = load_run_config(GRPO, [*SIX, "train.steps=3"], run_dir=run_dir)
    prepared = prepare_run(config, resume=True)
    prepared.checkpointer.close()
    assert prepared.meta["data_examples"] == 32
    assert prepared.data == IteratorState(seed=0, epoch=0, position=6)
    more = [*SIX, "train.steps=3", "data.arithmetic.train_size=40"]
    with caplog.at_level(logging.WARNING, logger="jaxrl_llm"):
        prepared = prepare_run(load_run_config(GRPO, more, run_dir=run_dir), resume=True)
    prepared.checkpointer.close()
    assert prepared.data == IteratorState(seed=0, epoch=1, position=0)
    assert "walked 32 examples, the data now holds 40" in caplog.text, caplog.text
    # a fixed KL coefficient changed on resume applies (the restored β once won silently)
    stronger = [*SIX, "train.steps=3", "algorithm.kl.coef=0.5"]
    prepared = prepare_run(load_run_config(GRPO, stronger, run_dir=run_dir), resume=True)
    prepared.checkpointer.close()
    assert float(prepared.state.kl.beta) == 0.5
    # another seed on resume would apply halfway (the order and update key are checkpointed)
    for override, message in (("data.seed=5", "data.seed: a resumed run keeps the seeds"),
                              ("seed=3", "seed: a resumed run keeps the seeds")):  # fmt: skip
        config = load_run_config(GRPO, [*SIX, "train.steps=3", override], run_dir=run_dir)
        with pytest.raises(ConfigError, match=message):
            prepare_run(config, resume=True)


def _check_resume_of_a_finished_run(run_dir):
    """The same `train.steps` as the finished run (as after a crash in its export): no step
    runs, the final evaluation is not logged a second time, and the rewritten summary keeps
    the last step's metrics."""
    logged = records(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").unlink()
    assert main(["train", GRPO, *SIX, "--resume", "--run-dir", str(run_dir)]) == 0
    assert records(run_dir) == logged
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["final_metrics"] == summary["final_metrics"] and again["final_metrics"]
    for key in ("accuracy_after_rl", "greedy_accuracy_after_rl", "pass_at_k_after_rl", "steps"):
        assert again[key] == summary[key], key


def test_six_steps_equal_three_plus_resume_plus_three(tmp_path, capsys, caplog):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", GRPO, *SIX, "--run-dir", str(straight)]) == 0
    _check_resume_of_a_finished_run(straight)
    assert main(["train", GRPO, *SIX, "train.steps=3", "--run-dir", str(split)]) == 0
    assert [r["step"] for r in records(split) if "loss/total" in r] == [1, 2, 3]
    _check_resume_with_other_data(split, caplog)
    assert main(["train", GRPO, *SIX, "--resume", "--run-dir", str(split)]) == 0

    step_a, data_a, state_a = _final_state(straight)
    step_b, data_b, state_b = _final_state(split)
    assert step_a == step_b == 6 and data_a == data_b
    assert tree_equal(state_a, state_b)  # params, optimizer state, step, key, KL: bit for bit
    assert train_records(straight) == train_records(split)  # every logged train metric, exactly
    export_a = (straight / "export" / "model.safetensors").read_bytes()
    assert export_a == (split / "export" / "model.safetensors").read_bytes()
    summary = (split / "summary.json").read_text()
    assert '"steps": 6' in summary
    # the resumed run keeps the pre-training evaluation (from the checkpoint's meta)
    resumed, whole = json.loads(summary), json.loads((straight / "summary.json").read_text())
    assert resumed["accuracy_before_rl"] == whole["accuracy_before_rl"] is not None
    # fewer steps than the checkpoint holds: one line, exit 2, nothing rerun
    capsys.readouterr()
    assert main(["train", GRPO, *SIX, "train.steps=4", "--resume", "--run-dir", str(split)]) == 2
    err = capsys.readouterr().err
    assert "train.steps: 4 is below the step of the checkpoint to resume (6" in err, err
    assert (split / "summary.json").read_text() == summary


def test_a_run_whose_logger_fails_to_start_leaves_its_directory_usable(tmp_path, monkeypatch):
    """`wandb.init` fails (no API key): the error reaches the caller, the checkpointer and the
    files opened are closed, and the same command without W&B then starts in that directory
    (its empty metrics.jsonl holds no run)."""
    closed = []
    close = Checkpointer.close
    monkeypatch.setattr(Checkpointer, "close", lambda self: closed.append(1) or close(self))

    def refused(settings, run_dir):
        raise RuntimeError("wandb.init failed: api_key not configured")

    monkeypatch.setattr(metrics_log, "_start_wandb", refused)
    run_dir = tmp_path / "run"
    sft = str(CONFIGS / "sft.yaml")
    overrides = [*TINY, *SFT_OPTIM, "train.eval_prompts=0", "export.enabled=false"]
    config = load_run_config(sft, [*overrides, "metrics.wandb_project=x"], run_dir=run_dir)
    with pytest.raises(RuntimeError, match="api_key not configured"):
        train(config)
    assert closed and (run_dir / "metrics.jsonl").read_text() == ""
    monkeypatch.undo()
    assert main(["train", sft, *overrides, "--run-dir", str(run_dir)]) == 0
    assert [r["step"] for r in records(run_dir)] == [0, 1, 2]


def test_a_restart_from_step_0_removes_the_old_tensorboard_events(tmp_path):
    """`--resume` of a run that stopped before its first checkpoint starts again from step 0:
    its metrics and its TensorBoard events are replaced, not mixed with the new run's."""
    run_dir = tmp_path / "run"
    (run_dir / "tensorboard").mkdir(parents=True)
    (run_dir / "tensorboard" / "events.out.tfevents.1.old").write_bytes(b"old")
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "time": 1.0, "elapsed": 0.0}\n')
    config = load_run_config(str(CONFIGS / "sft.yaml"), [*TINY, *SFT_OPTIM], run_dir=run_dir)
    prepared = prepare_run(config, resume=True)
    prepared.checkpointer.close()
    assert prepared.start_step == 0
    assert not (run_dir / "tensorboard").exists() and not (run_dir / "metrics.jsonl").exists()


def _wait_for(predicate, process, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def test_sigterm_finishes_the_step_checkpoints_and_resumes(tmp_path):
    """An SFT run (no sampler to compile) in a subprocess; SIGTERM after its first logged step."""
    run_dir = tmp_path / "run"
    overrides = [
        *TINY,
        *SFT_OPTIM,
        "train.steps=100000",
        "train.eval_prompts=0",
        "checkpoint.every=100000",
        "export.enabled=false",
    ]
    command = [sys.executable, "-m", "jaxrl_llm", "train", str(CONFIGS / "sft.yaml"), *overrides]
    env = fast_compile_env(JAX_PLATFORMS="cpu")
    process = subprocess.Popen(
        [*command, "--run-dir", str(run_dir)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = pathlib.Path(run_dir) / "metrics.jsonl"
    try:
        started = _wait_for(
            lambda: metrics.exists() and '"sft/nll"' in metrics.read_text(), process, 240
        )
        assert started, process.communicate(timeout=60)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGTERM, err
    assert "received SIGTERM; stopped after step" in out, out
    assert "--resume" in out and str(run_dir) in out
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    last = max(r["step"] for r in records(run_dir))
    assert records(run_dir)[0]["step"] == 0  # the setup facts (eval is off)
    assert steps == [last]  # the step it was in was finished and checkpointed
    assert not (run_dir / "summary.json").exists()

    resumed = [
        o if not o.startswith("train.steps=") else f"train.steps={last + 1}" for o in overrides
    ]
    assert (
        main(["train", str(CONFIGS / "sft.yaml"), *resumed, "--resume", "--run-dir", str(run_dir)])
        == 0
    )
    logged = [r["step"] for r in records(run_dir) if "sft/nll" in r]
    assert logged == list(range(1, last + 2))
