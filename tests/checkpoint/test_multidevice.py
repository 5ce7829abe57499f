"""Resharding restore on 8 simulated devices (subprocess): see `multidevice_runner.py`."""

from __future__ import annotations

from tests.simulated_devices import run_on_devices


def test_checkpoint_from_8_way_mesh_restores_onto_2x2x2_and_one_device(tmp_path):
    out = run_on_devices("tests.checkpoint.multidevice_runner", str(tmp_path), timeout=300)
    assert "checkpoint multidevice: ok" in out
