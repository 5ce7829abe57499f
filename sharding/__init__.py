"""`sharding`: device meshes and logical-axis rules for jaxrl_llm.

Imports nothing but jax. The mesh has three axes, `data`, `fsdp` and `tensor` (DESIGN.md §8);
`rules` maps the models' logical axis names onto them.
"""

from sharding.mesh import MESH_AXES, MeshConfig, make_mesh
from sharding.rules import (
    ACTIVATION_AXIS_RULES,
    LOGICAL_AXIS_RULES,
    logical_to_sharding,
    logical_to_spec,
)

__all__ = [
    "ACTIVATION_AXIS_RULES",
    "LOGICAL_AXIS_RULES",
    "MESH_AXES",
    "MeshConfig",
    "logical_to_sharding",
    "logical_to_spec",
    "make_mesh",
]
