"""Device meshes with the project's three axes: `data`, `fsdp`, `tensor`.

`MeshConfig` names the size of each axis; `-1` means "all remaining devices" (at most one axis).
`make_mesh` validates the sizes against the device count and builds the mesh with explicit axis
types (STYLE.md §2: Explicit sharding turns sharding mistakes into trace-time errors instead of
silent replication; `axis_types="auto"` is the documented fallback).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import jax
from jax.sharding import AxisType, Mesh

MESH_AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")


@dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Sizes of the mesh axes (`-1`: the rest of the devices) and their axis type.

    Examples:
      >>> MeshConfig(data=-1, fsdp=2).resolve(8)
      (4, 2, 1)
    """

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    axis_types: Literal["explicit", "auto"] = "explicit"

    def __post_init__(self) -> None:
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        for name, size in sizes.items():
            if isinstance(size, numbers.Integral) and not isinstance(size, bool | int):
                size = int(size)  # a NumPy integer read from an array is its Python int
                object.__setattr__(self, name, size)
            if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
                raise ValueError(
                    f"MeshConfig: `{name}` must be a positive int or -1, got {size!r}."
                )
        if sum(size == -1 for size in sizes.values()) > 1:
            raise ValueError(f"MeshConfig: at most one axis may be -1, got {sizes}.")
        if self.axis_types not in ("explicit", "auto"):
            raise ValueError(
                f"MeshConfig: `axis_types` must be 'explicit' or 'auto', got {self.axis_types!r}."
            )

    def resolve(self, device_count: int) -> tuple[int, int, int]:
        """Axis sizes `(data, fsdp, tensor)` for `device_count` devices, `-1` filled in."""
        sizes = [self.data, self.fsdp, self.tensor]
        fixed = math.prod(s for s in sizes if s != -1)
        if -1 in sizes:
            if device_count % fixed:
                raise ValueError(
                    f"MeshConfig: the fixed axis sizes (product {fixed}) do not divide the "
                    f"{device_count} available devices."
                )
            sizes[sizes.index(-1)] = device_count // fixed
        elif fixed != device_count:
            raise ValueError(
                f"MeshConfig: data×fsdp×tensor = {fixed} must equal the number of devices "
                f"({device_count}); use -1 for one axis to take the rest."
            )
        return sizes[0], sizes[1], sizes[2]


def make_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Build the `(data, fsdp, tensor)` mesh described by `config` over `devices` (default: all).

    Examples:
      >>> mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
      >>> mesh.axis_names, tuple(mesh.shape.values())
      (('data', 'fsdp', 'tensor'), (1, 1, 1))
    """
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("make_mesh: `devices` is empty; a mesh needs at least one device.")
    shape = config.resolve(len(devices))
    axis_type = AxisType.Explicit if config.axis_types == "explicit" else AxisType.Auto
    return jax.make_mesh(shape, MESH_AXES, axis_types=(axis_type,) * 3, devices=devices)
