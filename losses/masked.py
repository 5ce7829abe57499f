"""Masked statistics: sums, means, variances and whitening over the valid entries of an array.

Convention (ALGORITHMS.md §0.5, §1.1-1.4): `mask` is {0,1} (bool or numeric). Masked entries are
replaced by 0 with `where(mask > 0, x, 0)` *before* any arithmetic, so NaN or inf outside the mask
changes neither values nor gradients. Every denominator is `max(count, 1)`.
"""

from __future__ import annotations

from typing import Literal

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import as_float32, check_choice, check_positive

Axis = int | tuple[int, ...] | None


def _valid(x: Array, mask: ArrayLike, where: str) -> tuple[Array, Array]:
    x = jnp.asarray(x)
    mask = jnp.asarray(mask)
    try:
        mask = jnp.broadcast_to(mask, x.shape)
    except ValueError:
        raise ValueError(
            f"{where}: `mask` with shape {mask.shape} does not broadcast to `x` with shape {x.shape}."
        ) from None
    valid = mask > 0
    return jnp.where(valid, x, jnp.zeros((), x.dtype)), valid.astype(jnp.float32)


def masked_sum(x: ArrayLike, mask: ArrayLike, axis: Axis = None) -> Array:
    """Sum of the valid entries: `Σ where(m > 0, x, 0)`.

    Args:
      x: any shape.
      mask: {0,1} mask broadcastable to `x`.
      axis: axes to reduce (all if None).

    Returns:
      The sum over `axis`; 0 where nothing is valid.

    Examples:
      >>> import jax.numpy as jnp
      >>> float(masked_sum(jnp.array([1.0, 2.0, jnp.nan]), jnp.array([1, 1, 0])))
      3.0
    """
    xz, _ = _valid(as_float32(x), mask, "masked_sum")
    return jnp.sum(xz, axis=axis)


def masked_count(mask: ArrayLike, axis: Axis = None) -> Array:
    """Number of valid entries (float32): `Σ [m > 0]`.

    Args:
      mask: validity weights of any shape; entries `> 0` count.
      axis: axis or axes to count over; None counts everything.

    Examples:
      >>> import jax.numpy as jnp
      >>> masked_count(jnp.array([[1, 1, 0], [1, 0, 0]]), axis=-1).tolist()
      [2.0, 1.0]
    """
    return jnp.sum((jnp.asarray(mask) > 0).astype(jnp.float32), axis=axis)


def masked_mean(x: ArrayLike, mask: ArrayLike, axis: Axis = None) -> Array:
    """Mean of the valid entries: `Σ x·m / max(Σ m, 1)`.

    Args:
      x: any shape.
      mask: {0,1} mask broadcastable to `x`.
      axis: axes to reduce (all if None).

    Returns:
      The masked mean over `axis`; 0 where nothing is valid (never NaN).

    Examples:
      >>> import jax.numpy as jnp
      >>> float(masked_mean(jnp.array([1.0, 3.0, jnp.inf]), jnp.array([1, 1, 0])))
      2.0
    """
    xz, m = _valid(as_float32(x), mask, "masked_mean")
    return jnp.sum(xz, axis=axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)


def masked_var(x: ArrayLike, mask: ArrayLike, *, ddof: int = 1, axis: Axis = None) -> Array:
    """Variance of the valid entries: `Σ m (x − μ)² / max(Σ m − ddof, 1)`.

    `ddof=1` (the default) is the unbiased estimator used by verl, TRL and Tunix; `ddof=0` is the
    population variance (OpenRLHF). Fewer than two valid entries give 0 (verl raises instead, which a
    traced function cannot do).

    Args:
      x: any shape.
      mask: {0,1} mask broadcastable to `x`.
      ddof: delta degrees of freedom (0 or 1).
      axis: axes to reduce (all if None).

    Returns:
      The masked variance over `axis`.

    Examples:
      >>> import jax.numpy as jnp
      >>> float(masked_var(jnp.array([1.0, 2.0, 3.0, 99.0]), jnp.array([1, 1, 1, 0])))
      1.0
    """
    check_choice(ddof, (0, 1), "ddof", where="masked_var")
    xz, m = _valid(as_float32(x), mask, "masked_var")
    count = jnp.sum(m, axis=axis, keepdims=True)
    mean = jnp.sum(xz, axis=axis, keepdims=True) / jnp.maximum(count, 1.0)
    sq = jnp.where(m > 0, (xz - mean) ** 2, 0.0)
    var = jnp.sum(sq, axis=axis, keepdims=True) / jnp.maximum(count - ddof, 1.0)
    if axis is None:
        return var.reshape(())
    return jnp.squeeze(var, axis=axis)


def masked_whiten(
    x: ArrayLike,
    mask: ArrayLike,
    *,
    shift_mean: bool = True,
    ddof: int = 1,
    eps: float = 1e-8,
    eps_mode: Literal["add", "max", "std"] = "add",
    axis: Axis = None,
) -> Array:
    """Standardise the valid entries to zero mean and unit variance.

    Formula (ALGORITHMS.md §1.4), with `μ = masked_mean(x)`, `v = masked_var(x, ddof)`:

        s = rsqrt(v + eps)          eps_mode="add"  (verl, TRL PPO, Tunix)
        s = rsqrt(max(v, eps))      eps_mode="max"  (OpenRLHF, with ddof=0)
        s = 1 / (sqrt(v) + eps)     eps_mode="std"  (TRL's batch normalisations)
        y = (x − μ)·s  (+ μ if not shift_mean),  returned times the mask.

    Args:
      x: any shape.
      mask: {0,1} mask broadcastable to `x`.
      shift_mean: if False the mean is added back (only the scale changes).
      ddof: delta degrees of freedom of the variance.
      eps: numerical floor; its placement is `eps_mode`.
      eps_mode: "add", "max" or "std".
      axis: statistics per slice along `axis`; None uses all valid entries of the array.

    Returns:
      Array of the shape of `x`, 0 outside the mask; a slice whose valid entries are all
      equal gives exactly 0 (its mean with `shift_mean=False`), whatever `eps` is.

    Examples:
      >>> import jax.numpy as jnp
      >>> y = masked_whiten(jnp.array([1.0, 2.0, 3.0, jnp.nan]), jnp.array([1, 1, 1, 0]))
      >>> [round(float(v), 4) for v in y]
      [-1.0, 0.0, 1.0, 0.0]
    """
    check_choice(eps_mode, ("add", "max", "std"), "eps_mode", where="masked_whiten")
    check_choice(ddof, (0, 1), "ddof", where="masked_whiten")
    check_positive(eps, "eps", where="masked_whiten", allow_zero=True)
    xz, m = _valid(as_float32(x), mask, "masked_whiten")
    count = jnp.sum(m, axis=axis, keepdims=True)
    mean = jnp.sum(xz, axis=axis, keepdims=True) / jnp.maximum(count, 1.0)
    # equal valid entries (or none) centre to exactly 0: `x − μ` would be float residue, which
    # a small eps scales up to O(1), and eps = 0 to NaN
    hi = jnp.max(jnp.where(m > 0, xz, -jnp.inf), axis=axis, keepdims=True)
    lo = jnp.min(jnp.where(m > 0, xz, jnp.inf), axis=axis, keepdims=True)
    centred = jnp.where((m > 0) & (hi > lo), xz - mean, 0.0)
    var = jnp.sum(centred**2, axis=axis, keepdims=True) / jnp.maximum(count - ddof, 1.0)
    if eps_mode == "add":
        den = jnp.sqrt(var + eps)
    elif eps_mode == "max":
        den = jnp.sqrt(jnp.maximum(var, eps))
    else:
        den = jnp.sqrt(var) + eps
    y = centred / jnp.where(den > 0, den, 1.0)  # den is 0 only where every centred entry is
    if not shift_mean:
        y = y + mean
    return y * m
