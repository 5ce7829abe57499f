"""Logical-axis rules: the one table that maps model axis names to the `data/fsdp/tensor` mesh.

Models name the axes of every parameter and activation with logical names (`embed`, `mlp`,
`heads`, ...) and never mention the mesh (DESIGN.md §8, STYLE.md §3.13). This module turns those
names into `PartitionSpec`s. A rule table is a tuple of `(logical_name, mesh_axes)` pairs, where
`mesh_axes` is one mesh axis name, a tuple of them, or `None` (replicated). A logical name may
appear several times: the first candidate whose mesh axes are still free in this spec (and, when
the dimension size is known, divide it) wins, as in MaxText's `logical_axis_rules`; if no
candidate fits, that dimension is replicated.

Two tables, because weights and activations are laid out differently (Levanter's separate
parameter and compute mappings):

- `LOGICAL_AXIS_RULES` (parameters): weights are stored FSDP-sharded over `fsdp` on their
  model-width axis and tensor-parallel over `tensor` on heads / MLP / vocabulary.
- `ACTIVATION_AXIS_RULES` (activations, KV cache): the batch is split over `data` and `fsdp`,
  the model-width axis is whole on each device, heads and MLP follow `tensor`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

MeshAxes = str | tuple[str, ...] | None
Rules = tuple[tuple[str, MeshAxes], ...]

LOGICAL_AXIS_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
    ("cache_seq", None),
)

ACTIVATION_AXIS_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("cache_seq", None),
    ("vocab", "tensor"),
    ("embed", None),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
)


def _as_tuple(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def check_logical_names(
    names: Sequence[str | None], rules: Rules, *, shape: Sequence[int] | None = None
) -> None:
    """Raise `ValueError` when a logical name has no rule in `rules` or, given `shape`, the
    number of names is not the array's rank (a check that needs no mesh).

    Examples:
      >>> check_logical_names(("batch", None), ACTIVATION_AXIS_RULES, shape=(4, 3))
      >>> check_logical_names(("batch",), ACTIVATION_AXIS_RULES, shape=(4, 3))
      Traceback (most recent call last):
      ...
      ValueError: logical_to_spec: 1 names ('batch',) for an array of rank 2.
    """
    if shape is not None and len(shape) != len(names):
        raise ValueError(
            f"logical_to_spec: {len(names)} names {tuple(names)} for an array of rank {len(shape)}."
        )
    known = {name for name, _ in rules}
    for name in names:
        if name is not None and name not in known:
            raise ValueError(
                f"logical_to_spec: no rule for logical axis '{name}'; known: {sorted(known)}."
            )


def logical_to_spec(
    names: Sequence[str | None],
    rules: Rules,
    mesh: Mesh | AbstractMesh,
    *,
    shape: Sequence[int] | None = None,
) -> PartitionSpec:
    """The `PartitionSpec` for an array whose axes have the logical `names`.

    Args:
      names: one logical name (or `None`: replicated) per array axis.
      rules: a rule table such as `LOGICAL_AXIS_RULES`.
      mesh: the mesh (or abstract mesh) whose axis names the rules refer to.
      shape: the array's shape; when given, a candidate is used only if the product of its mesh
        axis sizes divides that dimension (e.g. 2 KV heads cannot be split 4 ways).

    Returns:
      A spec with one entry per axis: a mesh axis name, a tuple of them, or `None`.

    Raises:
      ValueError: a name has no rule, a rule names an axis the mesh lacks, or `shape` has the
        wrong rank.

    Examples:
      >>> import jax
      >>> from sharding import MeshConfig, make_mesh
      >>> mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
      >>> tuple(logical_to_spec(("embed", "mlp"), LOGICAL_AXIS_RULES, mesh))
      ('fsdp', 'tensor')
      >>> tuple(logical_to_spec(("layers", "embed", "heads", "head_dim"), LOGICAL_AXIS_RULES, mesh))
      (None, 'fsdp', 'tensor', None)
      >>> tuple(logical_to_spec(("batch", "length"), ACTIVATION_AXIS_RULES, mesh))
      (('data', 'fsdp'), None)
    """
    check_logical_names(names, rules, shape=shape)
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for dim, name in enumerate(names):
        if name is None:
            spec.append(None)
            continue
        chosen: MeshAxes = None
        for rule_name, axes in rules:
            if rule_name != name:
                continue
            candidate = _as_tuple(axes)
            missing = [a for a in candidate if a not in mesh.shape]
            if missing:
                raise ValueError(
                    f"logical_to_spec: rule '{name}' -> {axes} names mesh axes {missing} that "
                    f"the mesh {tuple(mesh.axis_names)} lacks."
                )
            if len(set(candidate)) < len(candidate):
                raise ValueError(
                    f"logical_to_spec: rule '{name}' -> {axes} names a mesh axis twice."
                )
            if used.intersection(candidate):
                continue
            size = math.prod(mesh.shape[a] for a in candidate)
            if shape is not None and shape[dim] % size:
                continue
            chosen = axes if isinstance(axes, str) or axes is None else tuple(axes)
            used.update(candidate)
            break
        spec.append(chosen)
    return PartitionSpec(*spec)


def logical_to_sharding(
    names: Sequence[str | None],
    mesh: Mesh,
    *,
    rules: Rules = LOGICAL_AXIS_RULES,
    shape: Sequence[int] | None = None,
) -> NamedSharding:
    """`NamedSharding(mesh, logical_to_spec(names, rules, mesh, shape=shape))`.

    Examples:
      >>> import jax
      >>> from sharding import MeshConfig, make_mesh
      >>> mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
      >>> tuple(logical_to_sharding(("vocab", "embed"), mesh, shape=(128, 32)).spec)
      ('tensor', 'fsdp')
    """
    return NamedSharding(mesh, logical_to_spec(names, rules, mesh, shape=shape))
