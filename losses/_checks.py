"""Input validation shared by every function of `losses`.

Every check runs at trace time on static information (rank, shape, dtype, Python option values) and
raises `ValueError` with a message that names the argument, what was expected and what was received.
Nothing here inspects traced values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jax.sharding import PartitionSpec


def check_rank(x: Any, rank: int | Sequence[int], name: str, *, where: str) -> None:
    """Raise if `x` does not have one of the allowed ranks."""
    ranks = (rank,) if isinstance(rank, int) else tuple(rank)
    ndim = jnp.ndim(x)
    if ndim not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ValueError(
            f"{where}: `{name}` must have rank {want}, got rank {ndim} with shape {jnp.shape(x)}."
        )


def check_same_shape(reference: Any, reference_name: str, where: str, **others: Any) -> None:
    """Raise if any array in `others` (that is not None) differs in shape from `reference`."""
    ref_shape = jnp.shape(reference)
    for name, value in others.items():
        if value is None:
            continue
        if jnp.shape(value) != ref_shape:
            raise ValueError(
                f"{where}: `{name}` must have the shape of `{reference_name}` {ref_shape}, "
                f"got {jnp.shape(value)}."
            )


def check_floating(x: Any, name: str, *, where: str) -> None:
    """Raise if `x` is not a floating-point array (log-probs, advantages, rewards...)."""
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{where}: `{name}` must be a floating-point array, got dtype {dtype}.")


def check_choice(value: Any, allowed: Iterable[Any], name: str, *, where: str) -> None:
    """Raise if a static option is not one of `allowed`."""
    allowed = tuple(allowed)
    if value not in allowed:
        options = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{where}: `{name}` must be one of {options}, got {value!r}.")


def check_positive(value: Any, name: str, *, where: str, allow_zero: bool = False) -> None:
    """Raise if a static (Python) number is not positive. Traced values are not checked."""
    if isinstance(value, int | float) and (value < 0 or (value == 0 and not allow_zero)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{where}: `{name}` must be {bound}, got {value!r}.")


def as_float32(x: Any) -> Array:
    """Upcast to float32 (log-probs, ratios, advantages and loss sums are float32)."""
    x = jnp.asarray(x)
    if x.dtype == jnp.float64:
        return x
    return x.astype(jnp.float32)


def as_mask(mask: Any, like_shape: tuple[int, ...], name: str = "mask", *, where: str) -> Array:
    """Validate a {0,1} mask (bool or numeric) of shape `like_shape` and return it as float32."""
    mask = jnp.asarray(mask)
    if mask.shape != tuple(like_shape):
        raise ValueError(
            f"{where}: `{name}` must have shape {tuple(like_shape)}, got {mask.shape}."
        )
    if not (jnp.issubdtype(mask.dtype, jnp.bool_) or jnp.issubdtype(mask.dtype, jnp.number)):
        raise ValueError(f"{where}: `{name}` must be boolean or numeric, got dtype {mask.dtype}.")
    return (mask > 0).astype(jnp.float32)


def check_real(x: Any, name: str, *, where: str) -> None:
    """Raise unless `x` is a real numeric array (bool, integer or floating; upcast to float32)."""
    dtype = jnp.result_type(x)
    if not (
        jnp.issubdtype(dtype, jnp.floating)
        or jnp.issubdtype(dtype, jnp.integer)
        or jnp.issubdtype(dtype, jnp.bool_)
    ):
        raise ValueError(f"{where}: `{name}` must be a real numeric array, got dtype {dtype}.")


def replicated(x: Array) -> Array:
    """Gather `x` if its type is sharded over explicit mesh axes (a sort needs the whole axis).

    Under `jax.jit` without explicit axes (or on one device) this is a no-op: the compiler inserts
    whatever gather the sort needs.
    """
    spec = jax.typeof(x).sharding.spec
    if any(axis is not None for axis in spec):
        x = jax.sharding.reshard(x, PartitionSpec(*([None] * x.ndim)))
    return x
