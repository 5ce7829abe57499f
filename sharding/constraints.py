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
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, PartitionSpec

from sharding.rules import ACTIVATION_AXIS_RULES, MeshAxes, Rules, logical_to_spec


def _drop_axes(entry: MeshAxes, dropped: set[str]) -> MeshAxes:
    if entry is None:
        return None
    axes = tuple(a for a in ((entry,) if isinstance(entry, str) else entry) if a not in dropped)
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


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
    context = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
    if context.empty:
        return x
    spec = logical_to_spec(names, rules, context, shape=x.shape)
    types = dict(zip(context.axis_names, context.axis_types, strict=True))
    manual = {a for a, t in types.items() if t == AxisType.Manual}
    if manual:
        spec = PartitionSpec(*(_drop_axes(e, manual) for e in spec))
    kinds = {t for a, t in types.items() if a not in manual}
    if not kinds:
        return x
    if len(kinds) > 1:
        raise ValueError(
            f"shard: the mesh mixes axis types {dict(types)}; use all Explicit or all Auto axes "
            "(MeshConfig.axis_types)."
        )
    target = spec if mesh is None else NamedSharding(mesh, spec)
    if kinds == {AxisType.Explicit}:
        return jax.sharding.reshard(x, target)
    return jax.lax.with_sharding_constraint(x, target)
