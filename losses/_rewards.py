"""Validation and masking helpers shared by the reward-shaping modules (ALGORITHMS.md §10, §11).

Every check runs at trace time on static information and raises `ValueError` naming the argument,
what was expected and what was received. Reward functions run under stop-gradient (§0.6): their
outputs carry no gradient to any input.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array

from losses._checks import as_float32, as_mask, check_rank, check_real

sg = jax.lax.stop_gradient


def real_array(
    x: Any, name: str, *, where: str, rank: int | tuple[int, ...] | None = None
) -> Array:
    """Validate a real (bool, integer or floating) array and upcast it to float32."""
    if rank is not None:
        check_rank(x, rank, name, where=where)
    check_real(x, name, where=where)
    return as_float32(x)


def flags(
    x: Any, shape: tuple[int, ...], name: str, *, where: str, like: str | None = None
) -> Array:
    """Validate a bool / {0,1} array of `shape` and return it as bool (`x > 0`).

    `like` names the argument whose shape `x` must have, for the error message.
    """
    check_shape(x, shape, name, where=where, like=like)
    return as_mask(x, shape, name, where=where) > 0


def optional_flags(
    x: Any, shape: tuple[int, ...], name: str, *, where: str, like: str | None = None
) -> Array:
    """`flags(x)`, or all True when `x` is None."""
    if x is None:
        return jnp.ones(shape, jnp.bool_)
    return flags(x, shape, name, where=where, like=like)


def check_shape(
    x: Any, shape: tuple[int, ...], name: str, *, where: str, like: str | None = None
) -> None:
    """Raise unless `x` has exactly `shape` (`like`: the argument that shape comes from)."""
    if jnp.shape(x) != tuple(shape):
        want = f"the shape of `{like}` {tuple(shape)}" if like else f"shape {tuple(shape)}"
        raise ValueError(f"{where}: `{name}` must have {want}, got {jnp.shape(x)}.")


def check_integer(x: Any, name: str, *, where: str) -> None:
    """Raise unless `x` is an integer array (ids, labels)."""
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"{where}: `{name}` must be an integer array, got dtype {dtype}.")


def check_number(
    value: Any,
    name: str,
    *,
    where: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> None:
    """Raise if a static number lies outside `[low, high]` (`(low, high]` with `low_open`).

    Arrays (traced or not) must be scalars; their values are not inspected. Booleans, strings and
    NaN raise.
    """
    if isinstance(value, bool | str):
        raise ValueError(f"{where}: `{name}` must be a number, got {value!r}.")
    if isinstance(value, numbers.Real):
        value = float(value)
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and value > high
        if too_low or too_high or value != value:
            lo = "" if low is None else (f"> {low}" if low_open else f">= {low}")
            hi = "" if high is None else f"<= {high}"
            bounds = " and ".join(b for b in (lo, hi) if b) or "a number"
            raise ValueError(f"{where}: `{name}` must be {bounds}, got {value!r}.")
        return
    if not hasattr(value, "shape"):
        raise ValueError(f"{where}: `{name}` must be a number, got {value!r}.")
    if jnp.ndim(value) != 0:
        raise ValueError(f"{where}: `{name}` must be a scalar, got shape {jnp.shape(value)}.")


def zero_outside(x: Array, valid: Array) -> Array:
    """`where(valid, x, 0)`: the first operation on any masked input."""
    return jnp.where(valid, x, jnp.zeros((), x.dtype))
