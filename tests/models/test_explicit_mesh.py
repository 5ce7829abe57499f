"""Decoder, ValueModel, cached decoding and the sampler on Explicit-axes meshes (subprocess).

`explicit_mesh_runner` runs with 8 simulated CPU devices and checks, on the meshes
(data, fsdp, tensor) = (2,2,2), (1,4,2) and (1,2,4), that the sharded logits, training
log-probs and entropies (`completion_logprobs` → `losses.token_logprobs` on vocabulary-split
logits) with their gradients, cached-decode logits, values and sampler rollouts equal the
single-device ones (float32, atol 1e-5; sampled tokens identical) and that the weights are
really split. One process compiles 10 small programs, with most of XLA's optimisations off to
keep that quick (`run_on_devices`; both sides of every comparison are compiled alike).
"""

from __future__ import annotations

from tests.simulated_devices import run_on_devices


def test_explicit_meshes_match_a_single_device():
    out = run_on_devices("tests.models.explicit_mesh_runner")
    for shape in ("(2, 2, 2)", "(1, 4, 2)", "(1, 2, 4)"):
        assert f"mesh {shape}: ok" in out, out
    assert "explicit meshes: ok" in out
