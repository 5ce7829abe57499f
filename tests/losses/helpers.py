"""Shared test utilities for `losses`: random masks, NaN planting, float64 NumPy references.

Tolerances follow STYLE.md: float32 results are compared with float64 references at
`rtol=1e-5, atol=1e-6` (1e-4 for long reductions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

RTOL = 1e-5
ATOL = 1e-6


def make_mask(rng: np.random.Generator, N: int, T: int, *, empty_row: bool = True) -> np.ndarray:
    """A float32 {0,1} mask `[N,T]`: random lengths, one hole, an empty row and a full row."""
    lengths = rng.integers(1, T + 1, size=N)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    if N > 1:
        mask[1, :] = 1.0  # a full row
    if N > 2 and T > 2:
        mask[2, 1] = 0.0  # a hole inside a row (multi-turn masks)
    if empty_row:
        mask[0, :] = 0.0  # an empty row
    return mask


def plant_nonfinite(x: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Copy of `x` with NaN, +inf and -inf planted at the entries where `mask == 0`."""
    x = np.array(x, dtype=np.float32, copy=True)
    bad = np.where(np.broadcast_to(mask, x.shape) == 0)
    choices = np.array([np.nan, np.inf, -np.inf], dtype=np.float32)
    x[bad] = choices[rng.integers(0, 3, size=len(bad[0]))]
    return x


def np_aggregate(
    per_token: np.ndarray,
    mask: np.ndarray,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> float:
    """Float64 reference of ALGORITHMS.md §1.5 (written from the formula, not from the code)."""
    m = (np.asarray(mask) > 0).astype(np.float64)
    loss = np.where(m > 0, np.asarray(per_token, np.float64), 0.0)
    row = loss.sum(1)
    length = m.sum(1)
    d_tok = num_tokens if num_tokens is not None else max(m.sum(), 1.0)
    d_seq = num_seqs if num_seqs is not None else max((length > 0).sum(), 1.0)
    c = norm_length if norm_length is not None else per_token.shape[1]
    if mode == "token_mean":
        return row.sum() / d_tok
    if mode == "token_sum":
        return row.sum()
    if mode == "seq_mean_token_sum":
        return row.sum() / d_seq
    if mode == "seq_mean_token_mean":
        return (row / np.maximum(length, 1.0)).sum() / d_seq
    if mode == "seq_mean_token_sum_norm":
        return row.sum() / d_seq / c
    raise ValueError(mode)


def np_agg_weights(mask, mode, **kw):
    """`∂ aggregate(ℓ) / ∂ℓ_nt` (aggregation is linear in ℓ: evaluate it on one-hot inputs)."""
    weights = np.zeros(mask.shape)
    for n, t in np.ndindex(*mask.shape):
        onehot = np.zeros(mask.shape)
        onehot[n, t] = 1.0
        weights[n, t] = np_aggregate(onehot, mask, mode, **kw)
    return weights


def vg(fn, **kw):
    """`value_and_grad` w.r.t. the first argument -> ((loss, metrics), grad); jit the caller."""
    return jax.value_and_grad(lambda x, *rest: fn(x, *rest, **kw), has_aux=True)


def assert_close(actual: Any, expected: Any, *, rtol: float = RTOL, atol: float = ATOL) -> None:
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def assert_nan_safe(
    scalar_fn: Callable[..., Any],
    args: tuple[np.ndarray, ...],
    mask: np.ndarray,
    rng: np.random.Generator,
    *,
    planted: tuple[int, ...] | None = None,
    argnums: int | tuple[int, ...] = 0,
) -> None:
    """NaN/inf planted outside `mask` in `args[planted]` change neither value nor gradient.

    `scalar_fn(*args)` must return a scalar (or `(scalar, aux)`). `planted` lists the indices of
    the args that are `[N,T]` per-token inputs (default: all that have the mask's shape); the
    gradient w.r.t. `argnums` must be finite everywhere and 0 outside the mask.
    """

    def scalar(*a: Any) -> Any:
        out = scalar_fn(*a)
        return out[0] if isinstance(out, tuple) else out

    if planted is None:
        planted = tuple(i for i, a in enumerate(args) if np.shape(a) == np.shape(mask))
    dirty = list(args)
    for i in planted:
        dirty[i] = plant_nonfinite(args[i], mask, rng)
    grad_fn = jax.jit(jax.value_and_grad(scalar, argnums=argnums))
    clean_v, clean_g = grad_fn(*[jnp.asarray(a) for a in args])
    dirty_v, dirty_g = grad_fn(*[jnp.asarray(a) for a in dirty])
    assert np.isfinite(float(dirty_v)), f"value is not finite: {dirty_v}"
    np.testing.assert_allclose(float(dirty_v), float(clean_v), rtol=1e-6, atol=1e-7)
    for cg, dg in zip(jax.tree.leaves(clean_g), jax.tree.leaves(dirty_g), strict=True):
        dg = np.asarray(dg)
        assert np.all(np.isfinite(dg)), "gradient is not finite with NaN/inf planted off-mask"
        np.testing.assert_allclose(dg, np.asarray(cg), rtol=1e-6, atol=1e-7)
        if dg.shape == np.shape(mask):
            assert np.all(dg[np.asarray(mask) == 0] == 0), "gradient leaks outside the mask"


class ShardCase(NamedTuple):
    """One function evaluated on 8 simulated devices (see tests/losses/sharded_runner.py).

    `args` are NumPy arrays whose leading axis is a multiple of 8 (they are sharded along it) or
    scalars/None (replicated); `kwargs` are static Python values.
    """

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
