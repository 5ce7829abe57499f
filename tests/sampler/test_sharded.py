"""The sampler on a simulated 8-device mesh equals the single-device sampler (subprocess)."""

from __future__ import annotations

from tests.simulated_devices import run_on_devices


def test_sharded_sampler_on_8_simulated_devices():
    assert "sharded sampler: ok" in run_on_devices("tests.sampler.sharded_runner")
