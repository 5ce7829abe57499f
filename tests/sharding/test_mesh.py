"""`MeshConfig` / `make_mesh`: sizes, validation, and an 8-device mesh in a subprocess."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sharding import MeshConfig, make_mesh

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("config", "devices", "expected"),
    [
        (MeshConfig(), 8, (8, 1, 1)),
        (MeshConfig(data=-1, fsdp=2, tensor=2), 8, (2, 2, 2)),
        (MeshConfig(data=2, fsdp=-1), 8, (2, 4, 1)),
        (MeshConfig(data=1, fsdp=1, tensor=1), 1, (1, 1, 1)),
    ],
)
def test_resolve(config, devices, expected):
    assert config.resolve(devices) == expected


def test_bad_configs_name_the_problem():
    with pytest.raises(ValueError, match="`fsdp` must be a positive int or -1"):
        MeshConfig(fsdp=0)
    # a NumPy integer is its Python int (it was refused); an empty device list is named
    assert MeshConfig(data=np.int64(-1), fsdp=np.int32(2)) == MeshConfig(data=-1, fsdp=2)
    with pytest.raises(ValueError, match="`devices` is empty"):
        make_mesh(MeshConfig(), devices=[])
    with pytest.raises(ValueError, match="at most one axis may be -1"):
        MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="do not divide"):
        MeshConfig(data=-1, fsdp=3).resolve(8)
    with pytest.raises(ValueError, match="must equal the number of devices"):
        MeshConfig(data=2, fsdp=2).resolve(8)
    with pytest.raises(ValueError, match="`axis_types`"):
        MeshConfig(axis_types="manual")  # type: ignore[arg-type]


def test_eight_device_mesh_is_explicit():
    script = textwrap.dedent(
        """
        import jax
        from jax.sharding import AxisType
        from sharding import MeshConfig, make_mesh
        mesh = make_mesh(MeshConfig(data=2, fsdp=-1, tensor=2))
        assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}, mesh.shape
        assert all(t == AxisType.Explicit for t in mesh.axis_types), mesh.axis_types
        auto = make_mesh(MeshConfig(axis_types="auto"))
        assert all(t == AxisType.Auto for t in auto.axis_types)
        print("mesh ok")
        """
    )
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "mesh ok" in proc.stdout
