"""Shardings on 8 simulated devices (subprocess): see `multidevice_runner.py` for the checks."""

from __future__ import annotations

from tests.simulated_devices import run_on_devices


def test_shardings_on_8_simulated_devices():
    out = run_on_devices("tests.sharding.multidevice_runner", timeout=300)
    assert "multidevice: ok" in out
