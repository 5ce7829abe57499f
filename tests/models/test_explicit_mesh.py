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

from tests.simulated_devices import run_on_devices


def test_explicit_meshes_match_a_single_device():
    out = run_on_devices(
        "tests.models.explicit_mesh_runner", xla_flags="--xla_backend_optimization_level=0"
    )
    for shape in ("(2, 2, 2)", "(1, 4, 2)", "(1, 2, 4)"):
        assert f"mesh {shape}: ok" in out, out
    assert "explicit meshes: ok" in out
