"""`sharding`: device meshes and (in later releases) logical-axis rules for jaxrl_llm.

Imports nothing but jax. The mesh has three axes, `data`, `fsdp` and `tensor` (DESIGN.md §8).
"""

from sharding.mesh import MESH_AXES, MeshConfig, make_mesh

__all__ = ["MESH_AXES", "MeshConfig", "make_mesh"]
