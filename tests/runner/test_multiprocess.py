"""`jaxrl-llm train` as a two-process `jax.distributed` job trains like one process.

Processes 0 and 1 (2 simulated CPU devices each, CPU collectives, one shared run directory)
run the PPO config with a value head, an adaptive KL controller, 2 minibatches × 2
micro-batches and a warm start (its SFT steps and its orbax cache on the same mesh) over one
global (data=2, fsdp=2) mesh, with the evaluation before and after training, a checkpoint and
the export; a single process with 4 simulated devices runs the same config on the same mesh
shape while the job runs (the repository's test of a run on a data × FSDP mesh). Each process
holds only its shards of the batch-sharded rollouts and of the FSDP-sharded parameters, so
every read on the host (completions for the rewards, evaluation, metrics, the export) is a
gather (`sharding.fetch_global`). The reward is a host function (`TINY`'s `checksum_reward`):
each process scores its half of the groups, and the scores and reward metrics are gathered
(`runner.scoring.process_groups`).
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxrl_llm.config import ConfigError
from jaxrl_llm.runner import load_run_config
from jaxrl_llm.runner.setup import _check_processes
from tests.runner.helpers import CONFIGS, TINY, records
from tests.simulated_devices import run_on_devices, run_two_processes

OVERRIDES = [
    *TINY,
    "train.prompts_per_step=4",
    "train.eval_prompts=4",
    "mesh={data: 2, fsdp: 2, tensor: 1, axis_types: auto}",
    "warm_start={steps: 2, learning_rate: 0.01, batch_size: 4}",
]
TOLERANCE = 1e-5  # the same SPMD programs; only the collectives' summation order differs
CLOCKS = ("time/", "perf/", "wall", "elapsed")  # the only values that may differ
CONFIG = CONFIGS / "ppo_value_head_adaptive_kl.yaml"  # 2 minibatches × 2 micro-batches


def _train_args(run_dir):
    return ("train", str(CONFIG), *OVERRIDES, "--run-dir", str(run_dir))


def test_two_processes_train_like_one_process(tmp_path):
    job, single = tmp_path / "job", tmp_path / "single"

    def single_process_run():
        return run_on_devices("jaxrl_llm", *_train_args(single), devices=4)

    outputs, _, single_out = run_two_processes(
        "jaxrl_llm",
        *_train_args(job),
        devices=2,
        timeout=600,
        while_running=single_process_run,
    )
    assert "jaxrl-llm train: done, 2 steps" in outputs[0][0], outputs[0]
    assert "jaxrl-llm train: done" not in outputs[1][0]  # process 0 reports for the job
    assert "jaxrl-llm train: done, 2 steps" in single_out

    ours, theirs = records(job), records(single)
    assert [r["step"] for r in ours] == [r["step"] for r in theirs]  # each record written once
    steps = [r for r in ours if "loss/total" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["optim/skipped"] == 0.0 and r["optim/grad_norm"] > 0 for r in steps)
    assert all("reward/checksum_reward/mean" in r for r in steps)  # scored on the host
    for mine, ref in zip(ours, theirs, strict=True):
        assert mine.keys() == ref.keys()
        for key, value in ref.items():
            if not key.startswith(CLOCKS) and isinstance(value, float):
                np.testing.assert_allclose(
                    mine[key], value, rtol=TOLERANCE, atol=TOLERANCE, err_msg=key
                )

    exported = load_file(job / "export" / "model.safetensors")
    reference = load_file(single / "export" / "model.safetensors")
    assert exported.keys() == reference.keys()
    for name, value in reference.items():
        np.testing.assert_allclose(exported[name], value, rtol=TOLERANCE, atol=TOLERANCE)

    summary = json.loads((job / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["interrupted"] is None
    assert (
        summary["accuracy_after_rl"]
        == json.loads((single / "summary.json").read_text())["accuracy_after_rl"]
    )
    assert (job / "checkpoints" / "2").is_dir() and (job / "warm_start").is_dir()


def test_the_compiled_iteration_is_refused_in_a_multi_process_job(monkeypatch):
    config = load_run_config(CONFIGS / "grpo.yaml", ["train.compiled_iterations=5"], run_dir="/r")
    _check_processes(config)  # one process: any form runs
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"train\.compiled_iterations: the compiled RL iteration"):
        _check_processes(config)
    _check_processes(load_run_config(CONFIGS / "grpo.yaml", [], run_dir="/r"))  # loop: runs
