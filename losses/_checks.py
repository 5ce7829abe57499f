"""Input validation shared by every function of `losses`.

Every check runs at trace time on static information (rank, shape, dtype, Python option values) and
raises `ValueError` with a message that names the argument, what was expected and what was received.
Traced values are never inspected; the value checks (`check_concrete_range`, `global_count`) look
only at concrete inputs (an eager call), and pass traced ones through.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import PartitionSpec


def check_rank(x: Any, rank: int | Sequence[int], name: str, *, where: str) -> None:
    """Raise if `x` does not have one of the allowed ranks."""
    ranks = (rank,) if isinstance(rank, int) else tuple(rank)
    if isinstance(x, list | tuple):  # JAX takes no nested lists: name the argument
        raise ValueError(
            f"{where}: `{name}` must be an array (jax or numpy), got {type(x).__name__}."
        )
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


def _dtype(x: Any, name: str, where: str) -> Any:
    """The dtype of an array argument; a ValueError naming it for a non-array (a nested list)."""
    try:
        return jnp.result_type(x)
    except TypeError:
        raise ValueError(
            f"{where}: `{name}` must be an array (jax or numpy), got {type(x).__name__}."
        ) from None


def check_floating(x: Any, name: str, *, where: str) -> None:
    """Raise if `x` is not a floating-point array (log-probs, advantages, rewards...)."""
    dtype = _dtype(x, name, where)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{where}: `{name}` must be a floating-point array, got dtype {dtype}.")


def check_choice(value: Any, allowed: Iterable[Any], name: str, *, where: str) -> None:
    """Raise if a static option is not one of `allowed`."""
    allowed = tuple(allowed)
    if value not in allowed:
        options = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{where}: `{name}` must be one of {options}, got {value!r}.")


def check_positive(value: Any, name: str, *, where: str, allow_zero: bool = False) -> None:
    """Raise if a concrete number (or any value of a concrete array) is not positive, or is NaN
    (which would pass every comparison). Traced values are not checked."""
    values = concrete(value)
    if values is None or values.dtype.kind not in "biuf" or values.size == 0:
        return
    bad = ~(values >= 0) if allow_zero else ~(values > 0)
    if bad.any():
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{where}: `{name}` must be {bound}, got {value!r}.")


def check_above(value: Any, bound: float, name: str, *, where: str, none_ok: str = "") -> None:
    """Raise if a concrete number (or any value of a concrete array) is not `> bound` (NaN
    included). Traced values are not checked; `none_ok` names what None means in the message."""
    values = concrete(value)
    if values is None or values.dtype.kind not in "biuf" or values.size == 0:
        return
    if (~(values > bound)).any():
        alt = f" (or None: {none_ok})" if none_ok else ""
        raise ValueError(f"{where}: `{name}` must be > {bound:g}{alt}, got {value!r}.")


def as_float32(x: Any) -> Array:
    """Upcast to float32 (log-probs, ratios, advantages and loss sums are float32)."""
    x = jnp.asarray(x)
    if x.dtype == jnp.float64:
        return x
    return x.astype(jnp.float32)


def as_mask(mask: Any, like_shape: tuple[int, ...], name: str = "mask", *, where: str) -> Array:
    """Validate a {0,1} mask (bool or real numeric) of shape `like_shape` and return it as
    float32."""
    try:
        mask = jnp.asarray(mask)
    except TypeError:  # strings, objects: name the argument rather than JAX's internals
        kind = getattr(mask, "dtype", type(mask).__name__)
        raise ValueError(
            f"{where}: `{name}` must be boolean or real numeric, got {kind}."
        ) from None
    if mask.shape != tuple(like_shape):
        raise ValueError(
            f"{where}: `{name}` must have shape {tuple(like_shape)}, got {mask.shape}."
        )
    if jnp.issubdtype(mask.dtype, jnp.complexfloating) or not (
        jnp.issubdtype(mask.dtype, jnp.bool_) or jnp.issubdtype(mask.dtype, jnp.number)
    ):
        raise ValueError(
            f"{where}: `{name}` must be boolean or real numeric, got dtype {mask.dtype}."
        )
    return (mask > 0).astype(jnp.float32)


def concrete(x: Any) -> np.ndarray | None:
    """`x` as a NumPy array when its values are known (not traced), else None."""
    if x is None or isinstance(x, jax.core.Tracer):
        return None
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return None
    return np.asarray(x)


def check_finite(x: Any, name: str, *, where: str) -> None:
    """Raise if a concrete number or array holds NaN or ±inf (traced `x`: not checked)."""
    values = concrete(x)
    if values is None or values.size == 0 or values.dtype.kind not in "biuf":
        return
    if not np.isfinite(values).all():
        raise ValueError(f"{where}: `{name}` must be finite, got {x!r}.")


def check_concrete_range(
    x: Any, name: str, *, where: str, low: float | None = None, high: float | None = None
) -> None:
    """Raise if a concrete `x` has a value outside `[low, high]` or a NaN (traced `x`: not
    checked)."""
    values = concrete(x)
    if values is None or values.size == 0 or values.dtype.kind not in "biuf":
        return  # traced, empty or not a number (the dtype checks name that)
    if values.dtype.kind == "f" and np.isnan(values).any():
        raise ValueError(f"{where}: `{name}` must not be NaN, got {x!r}.")
    smallest, largest = values.min(), values.max()
    if (low is not None and smallest < low) or (high is not None and largest > high):
        bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise ValueError(
            f"{where}: `{name}` must lie in {bounds}, got values from {smallest} to {largest}."
        )


def check_valid_range(
    x: Any,
    valid: Any,
    name: str,
    *,
    where: str,
    low: float | None = None,
    high: float | None = None,
) -> None:
    """`check_concrete_range` on the entries of `x` where `valid > 0` (an invalid entry may hold
    anything, e.g. −1 padding); `valid` None: every entry. Traced `x` or `valid`: not checked."""
    known = concrete(x)
    if known is None:
        return
    if valid is not None:
        known_valid = concrete(valid)
        if known_valid is None or known_valid.shape != known.shape:
            return
        known = known[known_valid > 0]
    check_concrete_range(known, name, where=where, low=low, high=high)


def global_count(value: Any, fallback: Array, name: str, *, where: str) -> Array:
    """A global count (`num_tokens`, `num_seqs`) as a float32 denominator. ALGORITHMS.md §1.5
    reads it as `count or fallback` (the local `max(count, 1)`): a count of 0 — a global batch
    with no valid token — falls back, so such a batch gives 0, not NaN. A concrete count must be
    a finite number ≥ 0 (ValueError otherwise); a traced one ≤ 0 falls back too (never a sign
    flip)."""
    values = concrete(value)
    if values is not None and (values.size != 1 or not np.isfinite(values).all() or values < 0):
        raise ValueError(f"{where}: `{name}` must be a finite number >= 0, got {value!r}.")
    count = jnp.asarray(value, jnp.float32)
    return jnp.where(count <= 0, fallback, count)


def check_real(x: Any, name: str, *, where: str) -> None:
    """Raise unless `x` is a real numeric array (bool, integer or floating; upcast to float32)."""
    dtype = _dtype(x, name, where)
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
