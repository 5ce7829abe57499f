"""Shared plumbing of the preference losses (ALGORITHMS.md §8.0).

Preference losses take one number per sequence or pair (`[N]` sequence log-prob sums, rewards,
advantages) instead of `[N,T]` token arrays. This module owns the steps they share:

* `pair_valid` / `pair_array` validate rank-1 inputs, upcast them to float32 and replace the
  entries of invalid (padding) pairs by 0 *before* any arithmetic, so NaN/inf there reaches
  neither a value nor a gradient. Reference log-probs and targets go under stop-gradient.
* `per_pair` accepts a hyperparameter as a scalar or one value per pair (MM-RLHF's per-pair β,
  CREAM's per-pair label smoothing).
* `pair_mean` is the loss reduction `Σ_i v_i·w_i·ℓ_i / D` with `D = num_pairs` (the global count
  when a batch is split) or `max(Σ_i v_i, 1)`.
* `reward_metrics` gives the `pref/…` metrics every preference loss reports.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from losses._checks import (
    as_float32,
    as_mask,
    check_floating,
    check_positive,
    check_rank,
    check_real,
    concrete,
    global_count,
)
from losses._policy import stop_gradient_metrics, zero_outside


def pair_valid(valid: Any, shape: tuple[int, ...], *, where: str, name: str = "valid") -> Array:
    """`valid` as float32 {0,1} of `shape`; None means every pair is valid."""
    if valid is None:
        return jnp.ones(shape, jnp.float32)
    return as_mask(valid, shape, name, where=where)


def pair_array(
    x: Any,
    name: str,
    v: Array,
    *,
    where: str,
    differentiable: bool = True,
    floating: bool = True,
) -> Array:
    """Validate a `[N]` array with the shape of `v`; float32, zero where `v = 0` (and `sg`)."""
    check_rank(x, 1, name, where=where)
    if floating:
        check_floating(x, name, where=where)
    else:
        check_real(x, name, where=where)
    if jnp.shape(x) != v.shape:
        raise ValueError(f"{where}: `{name}` must have shape {v.shape}, got {jnp.shape(x)}.")
    out = zero_outside(as_float32(x), v > 0)
    return out if differentiable else jax.lax.stop_gradient(out)


def per_pair(value: Any, name: str, v: Array, *, where: str, differentiable: bool = False) -> Array:
    """A hyperparameter given as a scalar or one value per pair (shape of `v`); 0 where invalid."""
    check_real(value, name, where=where)
    x = as_float32(value)
    if x.ndim and x.shape != v.shape:
        raise ValueError(
            f"{where}: `{name}` must be a scalar or have shape {v.shape} (one value per pair), "
            f"got shape {x.shape}."
        )
    x = zero_outside(jnp.broadcast_to(x, v.shape), v > 0)
    return x if differentiable else jax.lax.stop_gradient(x)


def check_unit_interval(
    value: Any,
    name: str,
    *,
    where: str,
    low_open: bool = False,
    high_open: bool = False,
    high: float = 1.0,
) -> None:
    """Raise if a concrete number (or any value of a concrete array, e.g. CREAM's per-pair label
    smoothing) lies outside `[0, high]` (ends open as asked). Traced values are not checked."""
    values = concrete(value)
    if values is None or values.dtype.kind not in "biuf" or values.size == 0:
        return
    if values.dtype.kind == "f" and np.isnan(values).any():  # NaN fails every comparison below
        raise ValueError(f"{where}: `{name}` must not be NaN, got {value!r}.")
    low_bad = (values <= 0) if low_open else (values < 0)
    high_bad = (values >= high) if high_open else (values > high)
    if low_bad.any() or high_bad.any():
        lo = "(0" if low_open else "[0"
        hi = f"{high:g})" if high_open else f"{high:g}]"
        got = repr(value) if values.ndim == 0 else f"values from {values.min()} to {values.max()}"
        raise ValueError(f"{where}: `{name}` must lie in {lo}, {hi}, got {got}.")


def check_static_number(value: Any, name: str, *, where: str) -> None:
    """Raise unless `value` is a Python int/float (a static choice resolved at trace time)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(
            f"{where}: `{name}` must be a Python number (it is static), got {type(value).__name__}."
        )


def pair_weights_array(w: Any, v: Array, *, where: str) -> Array:
    """Optional `[N]` non-negative pair weights (stop-gradient); None means all ones."""
    if w is None:
        return v
    known, known_v = concrete(w), concrete(v)
    if known is not None and known_v is not None and np.shape(known) == np.shape(known_v):
        # valid pairs only: an invalid (padding) pair's weight may be anything, NaN included
        check_positive(known[known_v > 0], "pair_weights", where=where, allow_zero=True)
    return v * pair_array(w, "pair_weights", v, where=where, differentiable=False, floating=False)


def pair_denominator(v: Array, num_pairs: Any, *, where: str) -> Array:
    """`num_pairs` (global count) or `max(Σ v, 1)`; a count of 0 falls back to the local one
    (ALGORITHMS.md §1.5), a negative or non-finite concrete count raises."""
    local = jnp.maximum(jnp.sum(v), 1.0)
    if num_pairs is None:
        return local
    return global_count(num_pairs, local, "num_pairs", where=where)


def pair_mean(
    per_pair_loss: Array, weights: Array, num_pairs: Any, v: Array, *, where: str
) -> Array:
    """`Σ_i weights_i·ℓ_i / D` with `ℓ` read only where `weights ≠ 0`."""
    terms = jnp.where(weights != 0, per_pair_loss * weights, 0.0)
    return jnp.sum(terms) / pair_denominator(v, num_pairs, where=where)


def batch_mean(x: Array, v: Array) -> Array:
    """Metric mean over this batch's valid pairs: `Σ v·x / max(Σ v, 1)`."""
    return jnp.sum(jnp.where(v > 0, x, 0.0)) / jnp.maximum(jnp.sum(v), 1.0)


def reward_metrics(reward_c: Array, reward_r: Array, v: Array) -> dict[str, Array]:
    """`pref/reward_chosen`, `pref/reward_rejected`, `pref/margin`, `pref/accuracy` (valid pairs).

    `accuracy = mean[reward_c > reward_r]`; all four are float32 scalars under stop-gradient.
    """
    return stop_gradient_metrics(
        {
            "pref/reward_chosen": batch_mean(reward_c, v),
            "pref/reward_rejected": batch_mean(reward_r, v),
            "pref/margin": batch_mean(reward_c - reward_r, v),
            "pref/accuracy": batch_mean((reward_c > reward_r).astype(jnp.float32), v),
        }
    )


def check_scalar(x: Any, name: str, *, where: str) -> Array:
    """Validate a real scalar (e.g. a loss value passed in); return it as float32."""
    check_real(x, name, where=where)
    if jnp.ndim(x) != 0:
        raise ValueError(f"{where}: `{name}` must be a scalar, got shape {jnp.shape(x)}.")
    return as_float32(x)
