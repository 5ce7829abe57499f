"""Every `losses` function gives identical results on 8 simulated devices (subprocess)."""

from __future__ import annotations

from tests.simulated_devices import run_on_devices


def test_losses_match_on_8_simulated_devices():
    # compile time dominates (two programs per case file); `run_on_devices` turns most of
    # XLA's optimisations off
    out = run_on_devices("tests.losses.sharded_runner", timeout=900)
    assert " 0 failed" in out
