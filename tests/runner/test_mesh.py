"""A run on a (data=2, fsdp=2) mesh of 4 simulated CPU devices, in a subprocess, with a
warm start (its SFT step runs on the same mesh)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from tests.runner.helpers import CONFIGS, ROOT, TINY, records


def test_a_run_on_a_data_and_fsdp_mesh(tmp_path):
    overrides = [
        *TINY,
        "train.prompts_per_step=4",
        "train.eval_prompts=0",
        "mesh={data: 2, fsdp: 2, tensor: 1, axis_types: auto}",
        "export.enabled=false",
        "warm_start={steps: 2, learning_rate: 0.01, batch_size: 4}",
    ]
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        JAX_DISABLE_MOST_OPTIMIZATIONS="1",
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
    )
    path = CONFIGS / "ppo_value_head_adaptive_kl.yaml"  # 2 minibatches × 2 micro-batches
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "jaxrl_llm",
            "train",
            str(path),
            *overrides,
            "--run-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    steps = [r for r in records(tmp_path) if "loss/total" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(np.isfinite(r["loss/total"]) and r["optim/skipped"] == 0.0 for r in steps)
    assert all(r["optim/grad_norm"] > 0 for r in steps)
