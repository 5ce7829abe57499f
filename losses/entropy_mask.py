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
    replicated,
)


def masked_quantile(x: Array, valid: Array, q: Any) -> Array:
    """Linear-interpolation quantile (NumPy/PyTorch default) of `x[valid]` with static shapes.

    Invalid entries are sorted to the end as `+inf`; the quantile sits at the (traced) position
    `(n − 1)·q` among the `n` valid values, computed in float32 (positions within float32 rounding
    of an integer are taken as that integer). Returns `+inf` when nothing is valid. An array
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
    if jnp.shape(valid) != jnp.shape(x):  # jnp.where would broadcast them into a wrong sample
        raise ValueError(
            f"masked_quantile: `valid` must have the shape of `x` {jnp.shape(x)}, got "
            f"{jnp.shape(valid)}."
        )
    flat = replicated(jnp.where(valid, x, jnp.inf).reshape(-1))
    ordered = jnp.sort(flat)
    n = jnp.sum(valid.astype(jnp.int32))
    pos = jnp.maximum((n - 1).astype(jnp.float32) * jnp.asarray(q, jnp.float32), 0.0)
    # A position that is an integer in exact arithmetic (e.g. (n − 1)·0.8 with n − 1 = 5k) must not
    # land just above it through float32 rounding, or the value at that position would be dropped.
    nearest = jnp.round(pos)
    pos = jnp.where(jnp.abs(pos - nearest) <= 2.5e-7 * jnp.maximum(pos, 1.0), nearest, pos)
    lo = jnp.floor(pos)
    frac = pos - lo
    lo_i = lo.astype(jnp.int32)
    hi_i = jnp.minimum(lo_i + 1, jnp.maximum(n - 1, 0))
    a = ordered[lo_i]
    b = ordered[hi_i]
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
        q = masked_quantile(h, valid, level)
    return valid & (h >= q)
