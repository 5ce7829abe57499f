"""`check_replication`: fail when too much of the parameter memory stays replicated.

A rule that does not divide a dimension falls back to replication (`sharding.rules`), which is
right for a 2-head KV projection on `tensor=4` but disastrous for an embedding that silently
lands whole on every device. MaxText guards against this with a "sufficiently sharded" check;
this is ours.

Definition. Let the weight-sharding axes be `fsdp` and `tensor` (the `data` axis holds
intentional replicas), `W` the product of their sizes, and for parameter `i` with `b_i` bytes
let `s_i` be the number of distinct shards its sharding cuts it into. Perfectly sharded, it
would cost `b_i / W` bytes per device; it costs `b_i / s_i`. The replicated fraction is the
share of the memory that sharding could have removed but did not:

    replicated_fraction = Σ_i b_i · max(0, 1/s_i − 1/W)  /  Σ_i b_i · (1 − 1/W)

It is 0 when every parameter is split `W` ways, 1 when everything is replicated, and 0 by
definition when `W = 1` (nothing to shard over).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding

from sharding.trees import path_str


class ReplicationReport(NamedTuple):
    """Result of `check_replication`.

    Examples:
      >>> ReplicationReport(fraction=0.0, excess_bytes_per_device=0, total_bytes=64, worst=()).fraction
      0.0
    """

    fraction: float  # replicated_fraction of the module docstring
    excess_bytes_per_device: int  # Σ b_i · max(0, 1/s_i − 1/W): bytes over perfect sharding
    total_bytes: int  # Σ b_i, all parameters, unsharded
    worst: tuple[str, ...]  # the largest offenders, one description each


def _human(num_bytes: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= size:
            return f"{num_bytes / size:.3g} {unit}"
    return f"{num_bytes:.0f} B"


def _shard_count(shape: tuple[int, ...], sharding: Any) -> int:
    shard_shape = sharding.shard_shape(shape)
    full, part = math.prod(shape), math.prod(shard_shape)
    return max(full // part, 1) if part else 1


def check_replication(
    params: Any,
    shardings: Any = None,
    *,
    max_replicated_fraction: float = 0.02,
    axes: Sequence[str] = ("fsdp", "tensor"),
    top: int = 5,
) -> ReplicationReport:
    """Raise if more than `max_replicated_fraction` of the parameter bytes stay replicated.

    See the module docstring for the definition. The default tolerance, 2%, is MaxText's: norm
    scales and biases are allowed to stay whole, embeddings and projections are not.

    Args:
      params: pytree of arrays or `jax.ShapeDtypeStruct`s (their `dtype` gives the bytes).
      shardings: parallel pytree of `NamedSharding`s; default: each leaf's own `.sharding`.
      max_replicated_fraction: tolerance in [0, 1].
      axes: the mesh axes parameters are meant to be split over.
      top: how many of the largest replicated tensors the error message lists.

    Returns:
      A `ReplicationReport` (also when the check passes, for logging).

    Raises:
      ValueError: the fraction exceeds the tolerance (the message lists the biggest replicated
        tensors with their shapes, specs and the bytes they waste per device), or the inputs
        are malformed (a tolerance outside [0, 1], a sharding that is not a `NamedSharding`,
        `axes` the mesh lacks, trees that do not mirror each other).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec as P
      >>> mesh = AbstractMesh((1, 4, 1), ("data", "fsdp", "tensor"))
      >>> params = {"embed": jax.ShapeDtypeStruct((1024, 64), jnp.float32),
      ...           "norm": jax.ShapeDtypeStruct((64,), jnp.float32)}
      >>> good = {"embed": NamedSharding(mesh, P("fsdp")), "norm": NamedSharding(mesh, P())}
      >>> round(check_replication(params, good).fraction, 4)
      0.001
      >>> bad = {"embed": NamedSharding(mesh, P()), "norm": NamedSharding(mesh, P())}
      >>> check_replication(params, bad)
      Traceback (most recent call last):
      ...
      ValueError: check_replication: 100.0% of the parameter bytes ...
    """
    if not 0.0 <= max_replicated_fraction <= 1.0:
        raise ValueError(
            f"check_replication: max_replicated_fraction must be in [0, 1], got "
            f"{max_replicated_fraction!r}."
        )
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    if shardings is None:
        sharding_leaves = [getattr(leaf, "sharding", None) for _, leaf in leaves]
    else:
        flat = jax.tree_util.tree_flatten_with_path(shardings)[0]
        if [path_str(p) for p, _ in flat] != [path_str(p) for p, _ in leaves]:
            raise ValueError(
                f"check_replication: `shardings` must mirror `params` leaf for leaf "
                f"({len(flat)} shardings for {len(leaves)} parameters)."
            )
        sharding_leaves = [s for _, s in flat]

    weight_shards = None
    rows = []  # (wasted bytes per device × W, description)
    wasted = total = 0.0
    for (path, leaf), sharding in zip(leaves, sharding_leaves, strict=True):
        name = path_str(path)
        if not isinstance(sharding, NamedSharding):
            raise ValueError(
                f"check_replication: parameter '{name}' has sharding {sharding!r}; expected a "
                "NamedSharding (pass `shardings=` for abstract parameters)."
            )
        if weight_shards is None:
            missing = [a for a in axes if a not in sharding.mesh.shape]
            if missing:
                raise ValueError(
                    f"check_replication: axes {missing} are not in the mesh "
                    f"{tuple(sharding.mesh.axis_names)}."
                )
            weight_shards = math.prod(sharding.mesh.shape[a] for a in axes)
        shape = tuple(leaf.shape)
        size = math.prod(shape) * np.dtype(leaf.dtype).itemsize
        shards = _shard_count(shape, sharding)
        excess = size * max(0.0, 1.0 / shards - 1.0 / weight_shards)
        total += size
        wasted += excess
        if excess > 0:
            rows.append(
                (
                    excess,
                    f"{name} {shape} {np.dtype(leaf.dtype).name} spec={tuple(sharding.spec)}: "
                    f"{_human(excess)}/device over perfect sharding",
                )
            )
    if weight_shards is None or weight_shards == 1 or total == 0:
        return ReplicationReport(0.0, 0, int(total), ())
    fraction = wasted / (total * (1.0 - 1.0 / weight_shards))
    rows.sort(key=lambda r: -r[0])
    worst = tuple(desc for _, desc in rows[:top])
    report = ReplicationReport(fraction, round(wasted), int(total), worst)
    if fraction > max_replicated_fraction:
        listing = "\n  ".join(worst)
        raise ValueError(
            f"check_replication: {100 * fraction:.1f}% of the parameter bytes that "
            f"{'×'.join(axes)} = {weight_shards} devices could split stay replicated "
            f"(tolerance {100 * max_replicated_fraction:.1f}%). Largest replicated "
            f"tensors:\n  {listing}\nCheck the rule table and that the mesh axis sizes divide "
            "these dimensions."
        )
    return report
