"""Decoder, ValueModel, cached decoding and the sampler on Explicit-axes meshes (subprocess).

`explicit_mesh_runner` runs with 8 simulated CPU devices and checks, on the meshes
(data, fsdp, tensor) = (2,2,2), (1,4,2) and (1,2,4), that the sharded logits, training
log-probs and entropies (`completion_logprobs` → `losses.token_logprobs` on vocabulary-split
logits) with their gradients, cached-decode logits, values and sampler rollouts equal the
single-device ones (float32, atol 1e-5; sampled tokens identical) and that the weights are
really split. One process compiles 10 small programs; XLA's backend optimisation is turned off
to keep that quick (both sides of every comparison are compiled with the same flags).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_explicit_meshes_match_a_single_device():
    env = dict(os.environ)
    flags = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.models.explicit_mesh_runner"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for shape in ("(2, 2, 2)", "(1, 4, 2)", "(1, 2, 4)"):
        assert f"mesh {shape}: ok" in proc.stdout, proc.stdout
    assert "explicit meshes: ok" in proc.stdout
