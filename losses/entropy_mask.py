"""High-entropy ("forking") token selection (ALGORITHMS.md §5.15)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_concrete_range,
    check_finite,
    check_floating,
    check_positive,
    check_rank,
)
from losses._position import order_statistics


def masked_quantile(x: Array, valid: Array, q: Any) -> Array:
    """Linear-interpolation quantile (NumPy/PyTorch default) of `x[valid]` with static shapes.

    Invalid entries are sorted to the end as `+inf`; the quantile sits at the (traced) position
    `(n − 1)·q` among the `n` valid values, computed exactly from the integer `n − 1` and the bits
    of `q` (`losses/_position.py`: a float32 product near 10⁶ would be off by up to 1/16); a
    position within rounding of an integer is that integer (for a traced float32 `q`, within
    its own rounding: `(n − 1)·q·2⁻²³`). Returns `+inf` when nothing is valid. An array
    sharded with explicit axes is gathered (replicated) before the sort, so the quantile is global.

    Args:
      x: any shape (float32).
      valid: bool of the shape of `x`.
      q: quantile level in [0, 1]; may be traced.

    Returns:
      A float32 scalar, equal to `np.quantile(x[valid], q)` (method "linear").

    Examples:
      >>> import jax.numpy as jnp
      >>> x = jnp.array([0.1, 2.0, 0.5, 1.0, 3.0, 0.2, 9.0])
      >>> float(masked_quantile(x, x < 5.0, 0.8))
      2.0
    """
    a, b, frac, n = order_statistics(x, valid, q, where="masked_quantile")
    value = a + frac * (b - a)
    # frac = 0 (an exact position) must give exactly `a`, even when b is the +inf padding
    value = jnp.where(frac > 0, value, a)
    return jnp.where(n > 0, value, jnp.inf)


def high_entropy_mask(
    entropy: ArrayLike,
    mask: ArrayLike,
    *,
    top_quantile: Any = 0.2,
    threshold: Any = None,
) -> Array:
    """Select the top-`ρ` highest-entropy valid tokens of the batch (ALGORITHMS.md §5.15).

        q    = quantile(sg(H)[valid], 1 − ρ)     (linear interpolation, NumPy/PyTorch default)
        keep = (H ≥ q) ∧ m                       (threshold given: q = threshold)

    The quantile is over all valid tokens of the (global) batch; on sharded inputs under `jax.jit`
    it is global, and a precomputed `threshold` can replace it. With linear interpolation exactly
    `floor(1 + ρ·(n − 1))` of `n` distinct values are kept (the token at the quantile counts), so
    the kept fraction is at least `ρ` for the default `ρ = 0.2` (for some other `ρ` and `n` it can
    fall just below `ρ`). The selection depends only on the ranks of `H`, so it is invariant under
    strictly increasing transforms. `ρ = 1` keeps every valid token.

    Apply the result through a policy loss's `token_weights` (booleans are accepted there),
    so the normaliser still counts every valid token. Source: "Beyond the 80/20 Rule: High-Entropy
    Minority Tokens Drive Effective Reinforcement Learning for LLM Reasoning" (arXiv 2506.01939);
    default ρ = 0.2 from the paper. Peer: TRL `top_entropy_quantile` (default 1.0 = off; quantile
    over entropies gathered from all ranks).

    Args:
      entropy: `[N,T]` per-token entropies (no gradient flows through the selection).
      mask: `[N,T]` {0,1}.
      top_quantile: ρ in (0, 1], the fraction of valid tokens to keep; may be traced.
      threshold: optional precomputed entropy threshold (overrides `top_quantile`).

    Returns:
      `bool[N,T]`, False outside the mask (and everywhere when nothing is valid).

    Examples:
      >>> import jax.numpy as jnp
      >>> H = jnp.array([[0.1, 2.0, 0.5], [1.0, 3.0, 0.2]])
      >>> high_entropy_mask(H, jnp.ones((2, 3))).tolist()
      [[False, True, False], [False, True, False]]
    """
    where = "high_entropy_mask"
    check_rank(entropy, 2, "entropy", where=where)
    check_floating(entropy, "entropy", where=where)
    m = as_mask(mask, jnp.shape(entropy), where=where)
    valid = m > 0
    h = jax.lax.stop_gradient(jnp.where(valid, as_float32(entropy), 0.0))
    if threshold is not None:
        check_finite(threshold, "threshold", where=where)  # NaN kept no token, silently
        q = jnp.asarray(threshold, jnp.float32)
        if q.ndim != 0:
            raise ValueError(f"{where}: `threshold` must be a scalar, got shape {q.shape}.")
    else:
        if isinstance(top_quantile, bool) or (
            isinstance(top_quantile, int | float) and not 0.0 < top_quantile <= 1.0
        ):
            raise ValueError(f"{where}: `top_quantile` must be in (0, 1], got {top_quantile!r}.")
        if jnp.ndim(top_quantile) != 0:
            raise ValueError(
                f"{where}: `top_quantile` must be a scalar, got shape {jnp.shape(top_quantile)}."
            )
        check_positive(top_quantile, "top_quantile", where=where)  # concrete arrays too
        check_concrete_range(top_quantile, "top_quantile", where=where, high=1.0)
        level = (
            1.0 - top_quantile  # in Python float64 when static
            if isinstance(top_quantile, int | float)
            else 1.0 - jnp.asarray(top_quantile, jnp.float32)
        )
        a, b, frac, _ = order_statistics(h, valid, level, where=where)
        q = jnp.where(frac > 0, b, a)  # h ≥ quantile, without its float32 interpolation
    return valid & (h >= q)
