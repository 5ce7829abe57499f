"""`shard(x, names)`: constrain an activation's sharding by its logical axis names.

One function for both mesh modes (STYLE.md §2), the only place that branches on the axis type:

- Explicit axes (our default): the sharding is part of the array's type, so the constraint is
  a `jax.sharding.reshard` that changes the type (and inserts the collective if needed).
  `jax.lax.with_sharding_constraint` would only assert the current sharding in this mode.
- Auto axes (`MeshConfig(axis_types="auto")`): `jax.lax.with_sharding_constraint`, a hint the
  compiler's propagation must respect.

Manual axes (inside `jax.shard_map`, e.g. the data-parallel pmap path) are already split by
hand; they are dropped from the spec and the remaining axes are constrained as above. With no
mesh at all (no `mesh=` and no `jax.set_mesh` context) there is nothing to constrain and `x` is
returned unchanged, so models that call `shard` also run on one device without a mesh.

`out_sharding(names, shape=...)` is the companion for ops that cannot infer their result's
sharding under Explicit axes (`jnp.einsum(..., out_sharding=)`, `x.at[i].get(out_sharding=)`,
`jnp.reshape(..., out_sharding=)`): the spec under Explicit axes, `None` otherwise, so the
same model code also runs under Auto axes (followed by `shard`) and without a mesh.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from sharding.rules import (
    ACTIVATION_AXIS_RULES,
    MeshAxes,
    Rules,
    check_logical_names,
    logical_to_spec,
)


def _drop_axes(entry: MeshAxes, dropped: set[str]) -> MeshAxes:
    if entry is None:
        return None
    axes = tuple(a for a in ((entry,) if isinstance(entry, str) else entry) if a not in dropped)
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def _resolve(
    names: Sequence[str | None],
    shape: Sequence[int],
    rules: Rules,
    mesh: Mesh | AbstractMesh | None,
) -> tuple[AxisType, PartitionSpec | NamedSharding] | None:
    """The axis type and target sharding for logical `names`, or None when nothing applies."""
    check_logical_names(names, rules, shape=shape)  # on one device too, not only on a mesh
    context = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
    if context.empty:
        return None
    spec = logical_to_spec(names, rules, context, shape=shape)
    types = dict(zip(context.axis_names, context.axis_types, strict=True))
    manual = {a for a, t in types.items() if t == AxisType.Manual}
    if manual:
        spec = PartitionSpec(*(_drop_axes(e, manual) for e in spec))
    kinds = {t for a, t in types.items() if a not in manual}
    if not kinds:
        return None
    if len(kinds) > 1:
        raise ValueError(
            f"shard: the mesh mixes axis types {dict(types)}; use all Explicit or all Auto axes "
            "(MeshConfig.axis_types)."
        )
    return kinds.pop(), (spec if mesh is None else NamedSharding(mesh, spec))


def shard(
    x: jax.Array,
    names: Sequence[str | None],
    *,
    rules: Rules = ACTIVATION_AXIS_RULES,
    mesh: Mesh | AbstractMesh | None = None,
) -> jax.Array:
    """Constrain `x` to the sharding its logical axis `names` get from `rules`.

    Args:
      x: an array (inside or outside `jax.jit`).
      names: one logical name (or `None`) per axis of `x`, e.g. `("batch", "length", "embed")`.
      rules: the rule table; activations use `ACTIVATION_AXIS_RULES` (batch over
        `("data", "fsdp")`, model width whole, heads / MLP / vocabulary over `tensor`).
      mesh: the mesh; default: the context mesh of `jax.set_mesh` (abstract inside `jit`).

    Returns:
      `x` with the constrained sharding (same values); `x` itself when there is no mesh.

    Raises:
      ValueError: `names` does not match the rank of `x`, a name has no rule, or the mesh mixes
        Explicit and Auto axes (not supported: choose one `axis_types`).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from sharding import MeshConfig, make_mesh
      >>> mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
      >>> with jax.set_mesh(mesh):
      ...     y = jax.jit(lambda a: shard(a * 2, ("batch", "embed")))(jnp.ones((4, 3)))
      >>> tuple(y.sharding.spec), y.sum().item()
      ((('data', 'fsdp'), None), 24.0)
      >>> shard(jnp.ones(2), ("batch",)).shape  # no mesh: unchanged
      (2,)
    """
    resolved = _resolve(names, x.shape, rules, mesh)
    if resolved is None:
        return x
    kind, target = resolved
    if kind == AxisType.Explicit:
        return jax.sharding.reshard(x, target)
    return jax.lax.with_sharding_constraint(x, target)


def out_sharding(
    names: Sequence[str | None],
    *,
    shape: Sequence[int],
    rules: Rules = ACTIVATION_AXIS_RULES,
    mesh: Mesh | AbstractMesh | None = None,
) -> PartitionSpec | NamedSharding | None:
    """The `out_sharding=` argument of an op whose result has the logical axes `names`.

    Under Explicit axes some ops cannot infer their result's sharding (an embedding gather from
    a vocabulary-sharded table, a matmul that contracts a tensor-parallel axis, a reshape that
    splits a sharded axis) and need it spelled out: `jnp.einsum(..., out_sharding=...)`,
    `x.at[i].get(out_sharding=...)`, `jnp.reshape(..., out_sharding=...)`. This gives that
    spec. Under Auto axes (JAX rejects Auto axis names there) and without a mesh it returns
    `None`, so the op runs unannotated; follow it with `shard(y, names)` to hint the compiler.

    Args:
      names: one logical name (or `None`) per axis of the result.
      shape: the result's shape (a rule is used only where its mesh axes divide the dimension).
      rules: the rule table (activations by default).
      mesh: the mesh; default: the context mesh of `jax.set_mesh`.

    Returns:
      A `PartitionSpec` (a `NamedSharding` when `mesh` is given) under Explicit axes, else None.

    Raises:
      ValueError: as `shard`.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from jax.sharding import AbstractMesh, AxisType
      >>> mesh = AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"),
      ...                     axis_types=(AxisType.Explicit,) * 3)
      >>> tuple(out_sharding(("batch", "length", "embed"), shape=(8, 5, 6), mesh=mesh).spec)
      (('data', 'fsdp'), None, None)
      >>> auto = AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"),
      ...                     axis_types=(AxisType.Auto,) * 3)
      >>> print(out_sharding(("batch", "embed"), shape=(8, 6), mesh=auto))  # Auto: unannotated
      None
      >>> print(out_sharding(("batch", "embed"), shape=(8, 6)))  # no mesh
      None
    """
    resolved = _resolve(names, shape, rules, mesh)
    if resolved is None or resolved[0] != AxisType.Explicit:
        return None
    return resolved[1]
