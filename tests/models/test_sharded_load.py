"""`from_pretrained(mesh=...)` places every parameter by its logical axes (8 simulated devices)."""

from __future__ import annotations

from tests.simulated_devices import run_on_devices


def test_sharded_load_on_8_simulated_devices(hf_checkpoints):
    path = str(hf_checkpoints["gemma2"][1])
    assert "sharded load: ok" in run_on_devices("tests.models.sharded_load_runner", path)
