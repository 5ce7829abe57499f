"""`m · q` for an integer count `m` and a level `q`, split into its whole and fractional parts.

The quantile of `n` values sits at position `(n − 1)·q`, and a rejected count is `floor(n·q)`.
In float32 a product near 10⁶ is only known to 1/16, so a fractional part of 0.2 can come out
as 0.19 or 0.25 and be taken for an integer (or the other way round). Here the product is
computed exactly: `m` (int32) is cut into three 11-bit pieces and `q` into four 12-bit pieces,
each piece product has at most 23 significant bits and is exact in float32, and the whole parts
are summed as integers while the fractional parts are summed with their carries moved to the
integer sum (each addition then rounds below 2⁻²⁴). A static `q` (a Python or NumPy float) is
cut in float64, so the position is that of NumPy's float64 level up to q's 48th bit; a traced
`q` is float32.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from losses._checks import check_concrete_range, replicated

Array = jax.Array

_M_BITS = 11  # m = m0 + m1·2¹¹ + m2·2²², each piece < 2¹¹ (m2 < 2⁹ for an int32 m ≥ 0)
_Q_BITS = 12  # q = q1 + q2 + q3 + q4, q_j a multiple of 2^(−12 j) below 2^(−12 (j − 1))


def _static_pieces(q: float) -> list[float]:
    pieces, rest = [], float(q)
    for j in range(1, 5):
        scale = 2.0 ** (_Q_BITS * j)
        piece = math.floor(rest * scale) / scale  # exact in float64
        pieces.append(piece)
        rest -= piece
    return pieces


def _traced_pieces(q: Array) -> list[Array]:
    pieces, rest = [], jnp.asarray(q, jnp.float32)
    for j in range(1, 5):
        scale = jnp.float32(2.0 ** (_Q_BITS * j))
        piece = jnp.floor(rest * scale) / scale  # exact: a power-of-two scaling of an integer
        pieces.append(piece)
        rest = rest - piece
    return pieces


def scaled_position(m: Array, q: Any) -> tuple[Array, Array]:
    """`(whole, frac)` with `whole + frac = m·q` (int32 `[]`, float32 `[]` in [0, 1)).

    Exact up to float32 rounding of the fractional sum (below 1e-6) and, for a static `q`, its
    bits beyond the 48th (`m · 2⁻⁴⁸`). `m` is a non-negative int32 scalar, `q` in [0, 1].
    """
    m = jnp.asarray(m, jnp.int32)
    is_static = isinstance(q, int | float | np.floating | np.integer)
    q_pieces = _static_pieces(float(q)) if is_static else _traced_pieces(q)
    mask = (1 << _M_BITS) - 1
    m_pieces = [
        ((m >> (_M_BITS * i)) & mask).astype(jnp.float32) * jnp.float32(2.0 ** (_M_BITS * i))
        for i in range(3)
    ]
    whole = jnp.zeros((), jnp.int32)
    frac = jnp.zeros((), jnp.float32)
    for m_piece in m_pieces:
        for q_piece in q_pieces:
            product = m_piece * jnp.asarray(q_piece, jnp.float32)  # exact: ≤ 23 significant bits
            floor = jnp.floor(product)
            frac = frac + (product - floor)
            carry = jnp.floor(frac)
            frac = frac - carry
            whole = whole + floor.astype(jnp.int32) + carry.astype(jnp.int32)
    return whole, frac


def snapped_position(m: Array, q: Any) -> tuple[Array, Array]:
    """`scaled_position(m, q)` with a fractional part within rounding of 0 or 1 taken as an
    integer: within 1e-6 + m·q·2⁻⁴⁶ for a static `q`; for a traced float32 `q`, whose own rounding
    moves the product by up to m·q·2⁻²⁴, within 1e-6 + m·q·2⁻²³."""
    whole, frac = scaled_position(m, q)
    is_static = isinstance(q, int | float | np.floating | np.integer)
    approx = whole.astype(jnp.float32) + frac
    tolerance = 1e-6 + approx * (2.0**-46 if is_static else 2.0**-23)
    up = (frac > 0.5) & (frac >= 1.0 - tolerance)
    down = (frac <= 0.5) & (frac <= tolerance)
    whole = jnp.where(up, whole + 1, whole)
    frac = jnp.where(up | down, jnp.float32(0.0), frac)
    return whole, frac


def order_statistics(x: Array, valid: Array, q: Any, *, where: str) -> tuple:
    """`(a, b, frac, n)`: the valid values at positions `floor((n − 1)·q)` and the next one,
    the fractional part of the position, and the count `n` of valid values (the quantile of
    `losses.masked_quantile` is `a + frac·(b − a)`).

    A comparison with the quantile `t = a + frac·(b − a)` needs no interpolation, which float32
    rounds (to `a` or `b` when they are neighbouring floats): no valid value lies strictly between
    `a` and `b`, so `x ≥ t` keeps `x ≥ b` when `frac > 0` (else `x ≥ a`), and `x ≤ t` keeps
    `x ≤ a`.
    """
    if jnp.shape(valid) != jnp.shape(x):  # jnp.where would broadcast them into a wrong sample
        raise ValueError(
            f"{where}: `valid` must have the shape of `x` {jnp.shape(x)}, got {jnp.shape(valid)}."
        )
    check_concrete_range(q, "q", where=where, low=0.0, high=1.0)
    valid = jnp.asarray(valid) > 0  # a {0, 1} mask of any dtype counts as the bool one
    flat = replicated(jnp.where(valid, x, jnp.inf).reshape(-1))
    ordered = jnp.sort(flat)
    n = jnp.sum(valid.astype(jnp.int32))
    lo_i, frac = snapped_position(jnp.maximum(n - 1, 0), q)
    hi_i = jnp.minimum(lo_i + 1, jnp.maximum(n - 1, 0))
    return ordered[lo_i], ordered[hi_i], frac, n
