"""Layout helpers: groups `[N] ↔ [B,G]` and sequence values broadcast to tokens.

Groups are contiguous: row `n = b·G + g` (ALGORITHMS.md §0.1).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import as_float32


def to_groups(x: ArrayLike, G: int) -> Array:
    """Reshape `[N, ...]` to `[B, G, ...]` with `N = B·G` (contiguous groups).

    Examples:
      >>> import jax.numpy as jnp
      >>> to_groups(jnp.arange(6), 3).tolist()
      [[0, 1, 2], [3, 4, 5]]
    """
    x = jnp.asarray(x)
    if not isinstance(G, int) or G < 1:
        raise ValueError(f"to_groups: `G` must be a positive Python int, got {G!r}.")
    if x.ndim == 0 or x.shape[0] % G:
        raise ValueError(
            f"to_groups: the leading axis of `x` (shape {x.shape}) must be a multiple of G={G}."
        )
    return x.reshape((x.shape[0] // G, G, *x.shape[1:]))


def from_groups(x: ArrayLike) -> Array:
    """Reshape `[B, G, ...]` to `[N, ...]` (inverse of `to_groups`).

    Examples:
      >>> import jax.numpy as jnp
      >>> from_groups(jnp.zeros((2, 3, 5))).shape
      (6, 5)
    """
    x = jnp.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"from_groups: `x` must have rank >= 2 ([B,G,...]), got shape {x.shape}.")
    return x.reshape((x.shape[0] * x.shape[1], *x.shape[2:]))


def broadcast_to_tokens(values: ArrayLike, mask: ArrayLike) -> Array:
    """Broadcast one value per sequence to its valid tokens: `A[n,t] = a[n]·m[n,t]`.

    Args:
      values: `[N]` or `[B,G]` (flattened to `[N]` with contiguous groups).
      mask: `[N,T]`.

    Returns:
      `[N,T]` float32, 0 outside the mask.

    Examples:
      >>> import jax.numpy as jnp
      >>> broadcast_to_tokens(jnp.array([2.0, -1.0]), jnp.array([[1, 1, 0], [1, 0, 0]])).tolist()
      [[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]]
    """
    values = as_float32(values)
    mask = jnp.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"broadcast_to_tokens: `mask` must be [N,T], got shape {mask.shape}.")
    if values.ndim == 2:
        values = values.reshape(-1)
    if values.shape != (mask.shape[0],):
        raise ValueError(
            f"broadcast_to_tokens: `values` must hold one value per row of `mask` "
            f"({mask.shape[0]}), got shape {values.shape}."
        )
    valid = mask > 0
    return jnp.where(valid, values[:, None], 0.0)
