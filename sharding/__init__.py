"""`sharding`: device meshes, logical-axis rules, pytree shardings and multi-host start-up.

Imports nothing but jax. The mesh has three axes, `data`, `fsdp` and `tensor` (DESIGN.md §8);
`rules` maps the models' logical axis names onto them; `trees` turns whole pytrees
(parameters, batches, caches, optimizer states) into `NamedSharding`s; `constraints.shard`
constrains activations; `checks.check_replication` fails when too much stays replicated;
`distributed` starts multi-process jobs, assembles global batches from per-host slices and
keeps the processes' host sides in agreement.
"""

from sharding.checks import ReplicationReport, check_replication
from sharding.constraints import shard
from sharding.distributed import (
    ProcessInfo,
    any_process,
    fetch_global,
    from_main_process,
    gather_from_processes,
    host_batch_slice,
    initialize_distributed,
    is_main_process,
    log_main,
    make_global_batch,
    place_global,
    wait_for_all_processes,
)
from sharding.mesh import MESH_AXES, MeshConfig, make_mesh
from sharding.rules import (
    ACTIVATION_AXIS_RULES,
    LOGICAL_AXIS_RULES,
    logical_to_sharding,
    logical_to_spec,
)
from sharding.trees import batch_shardings, logical_shardings, optimizer_shardings, path_str

__all__ = [
    "ACTIVATION_AXIS_RULES",
    "LOGICAL_AXIS_RULES",
    "MESH_AXES",
    "MeshConfig",
    "ProcessInfo",
    "ReplicationReport",
    "any_process",
    "batch_shardings",
    "check_replication",
    "fetch_global",
    "from_main_process",
    "gather_from_processes",
    "host_batch_slice",
    "initialize_distributed",
    "is_main_process",
    "log_main",
    "logical_shardings",
    "logical_to_sharding",
    "logical_to_spec",
    "make_global_batch",
    "make_mesh",
    "optimizer_shardings",
    "path_str",
    "place_global",
    "shard",
    "wait_for_all_processes",
]
