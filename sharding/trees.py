"""Shardings of whole pytrees: parameters, batches, KV caches and optimizer states.

Every function here returns a pytree of `NamedSharding`s with the structure of its input, ready
for `jax.jit(in_shardings=..., out_shardings=...)` or `jax.device_put`. Leaves may be arrays or
`jax.ShapeDtypeStruct`s (anything with `.shape`), so shardings can be planned before a single
weight exists (`jax.eval_shape`).

- `logical_shardings(tree, names, mesh)`: one logical-name tuple per leaf, mapped by a rule table
  (parameters: `LOGICAL_AXIS_RULES`; activations and caches: `ACTIVATION_AXIS_RULES`).
- `batch_shardings(batch, mesh)`: the leading axis of every leaf is the `batch` axis, split over
  `("data", "fsdp")`; a batch that does not split evenly is an error, never a silent replica.
- `optimizer_shardings(opt_state, params, param_shardings, mesh)`: optimizer-state leaves that
  mirror a parameter (same tree path suffix and shape, e.g. Adam's `mu` and `nu`) take that
  parameter's sharding; everything else (step counts, factored statistics) is replicated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from sharding.rules import ACTIVATION_AXIS_RULES, LOGICAL_AXIS_RULES, Rules, logical_to_spec

AnyMesh = Mesh | AbstractMesh


def _is_names(x: Any) -> bool:
    """A logical-name tuple (`("embed", "mlp")`, `()`) or `None` (replicated) is one leaf."""
    if x is None:
        return True
    return isinstance(x, tuple) and all(e is None or isinstance(e, str) for e in x)


def _key_str(entry: Any) -> str:
    """One path entry as a plain string: dict key, attribute name or sequence index."""
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def path_str(path: Sequence[Any]) -> str:
    """`a.b.0.c` for a `jax.tree_util` key path (attribute hops such as `.value` included).

    Examples:
      >>> import jax
      >>> [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path({"a": [1, 2]})[0]]
      ['a.0', 'a.1']
    """
    return ".".join(_key_str(e) for e in path) or "<root>"


def _shape(leaf: Any, where: str) -> tuple[int, ...]:
    if not hasattr(leaf, "shape"):
        raise ValueError(
            f"{where}: expected an array or jax.ShapeDtypeStruct leaf, got {type(leaf).__name__}."
        )
    return tuple(leaf.shape)


def logical_shardings(
    tree: Any,
    names: Any,
    mesh: AnyMesh,
    *,
    rules: Rules = LOGICAL_AXIS_RULES,
    must_split: Sequence[str] = (),
) -> Any:
    """`NamedSharding` of every leaf of `tree`, from the parallel pytree of logical `names`.

    `names` has the structure of `tree` with each array leaf replaced by a tuple of logical axis
    names (one per array axis; `None` entries replicate that axis) or by `None` (the whole leaf
    replicated). Each tuple goes through `logical_to_spec(names, rules, mesh, shape=leaf.shape)`,
    so a dimension that a rule's mesh axes do not divide falls back to the next rule, then to
    replication (e.g. 2 KV heads on `tensor=4`).

    Args:
      tree: pytree of arrays or `jax.ShapeDtypeStruct`s.
      names: the parallel pytree of logical-name tuples.
      mesh: the (abstract) mesh.
      rules: the rule table; `LOGICAL_AXIS_RULES` (parameters) by default.
      must_split: logical names that must get their first rule's mesh axes (e.g. `("batch",)`
        for activations and caches): a dimension those axes do not divide is an error instead
        of a fallback.

    Returns:
      A pytree of `NamedSharding` with `tree`'s structure.

    Raises:
      ValueError: the two trees differ (the first differing path is named), a tuple's length is
        not the leaf's rank, a name has no rule, or a `must_split` dimension does not divide.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from jax.sharding import AbstractMesh
      >>> mesh = AbstractMesh((2, 4, 2), ("data", "fsdp", "tensor"))
      >>> params = {"w": jax.ShapeDtypeStruct((16, 64), jnp.float32),
      ...           "b": jax.ShapeDtypeStruct((64,), jnp.float32)}
      >>> out = logical_shardings(params, {"w": ("embed", "mlp"), "b": ("mlp",)}, mesh)
      >>> tuple(out["w"].spec), tuple(out["b"].spec)
      (('fsdp', 'tensor'), ('tensor',))
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    name_leaves = jax.tree_util.tree_flatten_with_path(names, is_leaf=_is_names)[0]
    value_paths = [path_str(p) for p, _ in leaves]
    name_paths = [path_str(p) for p, _ in name_leaves]
    if value_paths != name_paths:
        differ = next(
            (f"'{a}' vs '{b}'" for a, b in zip(value_paths, name_paths, strict=False) if a != b),
            f"{len(value_paths)} leaves vs {len(name_paths)} name tuples",
        )
        raise ValueError(
            f"logical_shardings: `names` must mirror `tree` leaf for leaf; first difference: "
            f"{differ}."
        )
    out = []
    for (path, leaf), (_, leaf_names) in zip(leaves, name_leaves, strict=True):
        where = f"logical_shardings: leaf '{path_str(path)}'"
        shape = _shape(leaf, where)
        if leaf_names is None:
            out.append(NamedSharding(mesh, PartitionSpec()))
            continue
        if not _is_names(leaf_names) or len(leaf_names) != len(shape):
            raise ValueError(
                f"{where} of shape {shape} needs one logical name per axis, got {leaf_names!r}."
            )
        try:
            spec = logical_to_spec(leaf_names, rules, mesh, shape=shape)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        _check_split(where, shape, leaf_names, must_split, rules, mesh, spec)
        out.append(NamedSharding(mesh, spec))
    return jax.tree_util.tree_unflatten(treedef, out)


def _check_split(
    where: str,
    shape: tuple[int, ...],
    names: Sequence[str | None],
    must_split: Sequence[str],
    rules: Rules,
    mesh: AnyMesh,
    spec: PartitionSpec,
) -> None:
    def as_axes(entry: Any) -> tuple[str, ...]:
        return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)

    for dim, name in enumerate(names):
        if name is None or name not in must_split:
            continue
        axes = as_axes(logical_to_spec((name,), rules, mesh)[0])
        split = math.prod(mesh.shape[a] for a in axes)
        if shape[dim] % split:
            raise ValueError(
                f"{where}: axis {dim} ('{name}') has size {shape[dim]}, which does not split "
                f"over the mesh axes {axes} ({split} ways); use a multiple of {split}."
            )
        got = as_axes(spec[dim])
        if got != axes:  # an earlier axis of the leaf took those mesh axes under these rules
            raise ValueError(
                f"{where}: axis {dim} ('{name}') must be split over the mesh axes {axes}, but "
                f"the rules gave it {got or 'no mesh axis'} (spec {tuple(spec)}): another "
                "axis of the leaf takes some of them; change the rules."
            )


def _batch_axes(rules: Rules, mesh: AnyMesh) -> tuple[str, ...]:
    """The mesh axes of the first `batch` rule (what a full batch is split over)."""
    spec = logical_to_spec(("batch",), rules, mesh)
    entry = spec[0]
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def batch_shardings(batch: Any, mesh: AnyMesh, *, rules: Rules = ACTIVATION_AXIS_RULES) -> Any:
    """Shardings that split the leading (`batch`) axis of every leaf; other axes replicated.

    With `ACTIVATION_AXIS_RULES` the rows go over `("data", "fsdp")`, so each device holds
    `N / (data · fsdp)` rows and the `tensor` axis holds replicas. Scalar leaves are replicated.

    Args:
      batch: pytree of arrays or `jax.ShapeDtypeStruct`s, each `[N, ...]` (same `N` or not).
      mesh: the (abstract) mesh.
      rules: the rule table whose `batch` entry names the mesh axes.

    Raises:
      ValueError: a leaf's leading dimension is not divisible by the product of the batch mesh
        axes (the leaf path, its size and the mesh sizes are named). Nothing is silently
        replicated.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from jax.sharding import AbstractMesh
      >>> mesh = AbstractMesh((2, 4, 2), ("data", "fsdp", "tensor"))
      >>> batch = {"tokens": jax.ShapeDtypeStruct((16, 7), jnp.int32),
      ...          "rewards": jax.ShapeDtypeStruct((16,), jnp.float32)}
      >>> {k: tuple(s.spec) for k, s in batch_shardings(batch, mesh).items()}
      {'rewards': (('data', 'fsdp'),), 'tokens': (('data', 'fsdp'), None)}
    """
    axes = _batch_axes(rules, mesh)
    split = math.prod(mesh.shape[a] for a in axes)
    spec_entry = None if not axes else (axes[0] if len(axes) == 1 else axes)

    def one(path: Any, leaf: Any) -> NamedSharding:
        shape = _shape(leaf, f"batch_shardings: leaf '{path_str(path)}'")
        if not shape:
            return NamedSharding(mesh, PartitionSpec())
        if shape[0] % split:
            raise ValueError(
                f"batch_shardings: leaf '{path_str(path)}' has {shape[0]} rows, which do not "
                f"split over the batch mesh axes {axes} (sizes "
                f"{[mesh.shape[a] for a in axes]}, product {split}); use a multiple of {split}."
            )
        return NamedSharding(mesh, PartitionSpec(spec_entry, *([None] * (len(shape) - 1))))

    return jax.tree_util.tree_map_with_path(one, batch)


def _path_keys(path: Sequence[Any]) -> tuple[str, ...]:
    return tuple(_key_str(e) for e in path)


def optimizer_shardings(opt_state: Any, params: Any, param_shardings: Any, mesh: AnyMesh) -> Any:
    """Shardings of an optimizer state derived from the parameters' shardings, without optax.

    A state leaf mirrors a parameter when the parameter's full tree path is a suffix of the
    leaf's path and the shapes are equal. optax states hold such copies of the parameter tree
    (Adam's `mu` / `nu` under `ScaleByAdamState`, accumulated gradients in `MultiStepsState`),
    so the moments are sharded exactly like their weights and the update needs no resharding.
    When several parameters match, the longest path wins. Every other leaf is replicated:
    scalars (step counts, injected hyperparameters), and arrays under a parameter's path with
    another shape (Adafactor's factored row/column statistics, `O(rows + cols)` in size).
    `check_replication` reports any large leaf that ends up replicated this way.

    Args:
      opt_state: the optimizer state (arrays or `jax.ShapeDtypeStruct`s), e.g.
        `jax.eval_shape(tx.init, params)`.
      params: the parameter pytree the state was initialised from.
      param_shardings: `NamedSharding`s with `params`' structure (e.g. `logical_shardings`).
      mesh: the mesh of the replicated leaves.

    Returns:
      A pytree of `NamedSharding` with `opt_state`'s structure.

    Raises:
      ValueError: `param_shardings` does not mirror `params`.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
      >>> mesh = AbstractMesh((1, 4, 2), ("data", "fsdp", "tensor"))
      >>> params = {"w": jnp.zeros((8, 6))}
      >>> shardings = {"w": NamedSharding(mesh, P("fsdp", "tensor"))}
      >>> state = ({"count": jnp.zeros((), jnp.int32), "mu": {"w": jnp.zeros((8, 6))}},)
      >>> out = optimizer_shardings(state, params, shardings, mesh)
      >>> tuple(out[0]["mu"]["w"].spec), tuple(out[0]["count"].spec)
      (('fsdp', 'tensor'), ())
    """
    param_leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    sharding_leaves = jax.tree_util.tree_flatten_with_path(param_shardings)[0]
    if [path_str(p) for p, _ in param_leaves] != [path_str(p) for p, _ in sharding_leaves]:
        raise ValueError(
            "optimizer_shardings: `param_shardings` must mirror `params` leaf for leaf "
            f"({len(param_leaves)} parameters, {len(sharding_leaves)} shardings)."
        )
    by_path: dict[tuple[str, ...], tuple[tuple[int, ...], Any]] = {}
    for (path, leaf), (_, sharding) in zip(param_leaves, sharding_leaves, strict=True):
        by_path[_path_keys(path)] = (tuple(np.shape(leaf)), sharding)
    replicated = NamedSharding(mesh, PartitionSpec())

    def one(path: Any, leaf: Any) -> Any:
        keys = _path_keys(path)
        shape = tuple(np.shape(leaf))
        if shape:
            for start in range(len(keys)):  # longest suffix first
                match = by_path.get(keys[start:])
                if match is not None:
                    return match[1] if match[0] == shape else replicated
        return replicated

    return jax.tree_util.tree_map_with_path(one, opt_state)
