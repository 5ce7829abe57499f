"""Shared plumbing of the policy losses (ALGORITHMS.md §5.0).

Every policy loss takes `(logp, old_logp, advantages, mask)` of shape `[N,T]` plus keywords, builds
a per-token loss `ℓ[N,T]`, multiplies it by `sg(is_weights)·token_weights`, and reduces it with
`aggregate`. This module owns the steps they share, so the clip math of each loss is written once:

* `prepare_policy_inputs` validates shapes/dtypes, upcasts to float32 and zeroes masked entries
  before any arithmetic (NaN/inf outside the mask never leaks). `old_logp=None` means
  `sg(logp)`: one on-policy iteration, ratio ≡ 1 with gradient `∇logp`.
* `log_ratio` returns `logr = logp − old_logp` and `r = exp(clip(logr, ±log_ratio_clamp))`;
  with `log_ratio_clamp=None`, `r = exp(min(logr, 80))`: finite where float32's `exp` would
  overflow (at 88.7), so the gradient of a clipped or capped ratio is 0 there, not NaN.
* `reduce_policy_loss` applies the weights and the aggregation.
* `ratio_metrics` gives `policy/approx_kl`, `policy/ratio_mean`, `policy/ratio_max`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from losses._checks import (
    as_float32,
    as_mask,
    check_choice,
    check_floating,
    check_positive,
    check_rank,
    check_same_shape,
)
from losses.aggregation import AGG_MODES, aggregate


class PolicyInputs(NamedTuple):
    """Validated float32 policy-loss inputs, all `[N,T]`, zero outside the mask."""

    logp: Array
    old_logp: Array
    advantages: Array
    mask: Array  # float32 {0,1}
    valid: Array  # bool


def zero_outside(x: Array, valid: Array) -> Array:
    """`where(valid, x, 0)`: the first operation on any per-token input."""
    return jnp.where(valid, x, jnp.zeros((), x.dtype))


def prepare_policy_inputs(
    logp: Any,
    old_logp: Any,
    advantages: Any,
    mask: Any,
    *,
    where: str,
) -> PolicyInputs:
    """Validate and upcast the four standard policy-loss inputs (see module docstring)."""
    check_rank(logp, 2, "logp", where=where)
    check_floating(logp, "logp", where=where)
    check_floating(advantages, "advantages", where=where)
    if jnp.ndim(advantages) == 1:
        raise ValueError(
            f"{where}: `advantages` must be per token [N,T] like `logp` {jnp.shape(logp)}, got "
            f"shape {jnp.shape(advantages)}; broadcast sequence advantages with "
            "`losses.broadcast_to_tokens(advantages, mask)`."
        )
    check_same_shape(logp, "logp", where, old_logp=old_logp, advantages=advantages)
    if old_logp is not None:
        check_floating(old_logp, "old_logp", where=where)
    m = as_mask(mask, jnp.shape(logp), where=where)
    valid = m > 0
    lp = zero_outside(as_float32(logp), valid)
    old = lp if old_logp is None else zero_outside(as_float32(old_logp), valid)
    old = jax.lax.stop_gradient(old)
    adv = jax.lax.stop_gradient(zero_outside(as_float32(advantages), valid))
    return PolicyInputs(lp, old, adv, m, valid)


def log_ratio(
    inputs: PolicyInputs, log_ratio_clamp: float | None, *, where: str
) -> tuple[Array, Array]:
    """`(logr, r)` with `logr = logp − old_logp` and `r = exp(clip(logr, ±c))` (0/1 off-mask).

    The clamp (verl and OpenRLHF use ±20; TRL none) changes values and zeroes the gradient only
    where `|logr| > c`; a concrete `c` must be > 0 (a negative one forced every ratio to e^c).
    """
    logr = inputs.logp - inputs.old_logp
    clamped = clamp_log_ratio(logr, log_ratio_clamp, where=where)
    ratio = jnp.where(inputs.valid, jnp.exp(clamped), 0.0)
    return logr, ratio


# float32's exp overflows past 88.7: with no clamp, an exponent is still bounded above here
# (e^80 ≈ 5.5e34), so that a branch that `where` / `min` / a clamp discards never has an
# infinite derivative (0 · inf = NaN in the gradient); the peers' ratio is inf there
EXP_SAFE_MAX = 80.0


def clamp_log_ratio(logr: Array, log_ratio_clamp: Any, *, where: str) -> Array:
    """`clip(logr, ±c)`; a concrete `c` must be > 0, not NaN (ValueError). `c` None: no clamp,
    but `logr` is bounded above at `EXP_SAFE_MAX` = 80, where `exp` is still finite."""
    if log_ratio_clamp is None:
        return jnp.minimum(logr, EXP_SAFE_MAX)
    check_positive(log_ratio_clamp, "log_ratio_clamp", where=where)
    return jnp.clip(logr, -log_ratio_clamp, log_ratio_clamp)


def prepare_weights(
    w: Any, name: str, inputs: PolicyInputs, where: str, stop_gradient: bool
) -> Array:
    """Validate a `[N,T]` weight array like `logp`, upcast, zero it off-mask (and `sg` it).

    Boolean selections (e.g. `high_entropy_mask`) are accepted and become {0, 1}.
    """
    if not jnp.issubdtype(jnp.result_type(w), jnp.bool_):
        check_floating(w, name, where=where)
    check_same_shape(inputs.logp, "logp", where, **{name: w})
    w = zero_outside(as_float32(w), inputs.valid)
    return jax.lax.stop_gradient(w) if stop_gradient else w


def apply_token_weights(
    per_token: Array,
    inputs: PolicyInputs,
    *,
    is_weights: Any = None,
    token_weights: Any = None,
    where: str,
) -> Array:
    """`ℓ · sg(is_weights) · token_weights`, zero outside the mask."""
    out = zero_outside(per_token, inputs.valid)
    if is_weights is not None:
        out = out * prepare_weights(is_weights, "is_weights", inputs, where, stop_gradient=True)
    if token_weights is not None:
        out = out * prepare_weights(
            token_weights, "token_weights", inputs, where, stop_gradient=True
        )
    return out


def reduce_policy_loss(
    per_token: Array,
    inputs: PolicyInputs,
    *,
    agg: str,
    is_weights: Any = None,
    token_weights: Any = None,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
    where: str,
) -> Array:
    """Apply the weights and `aggregate` with the loss's mode and global normalisers."""
    check_choice(agg, AGG_MODES, "agg", where=where)
    weighted = apply_token_weights(
        per_token, inputs, is_weights=is_weights, token_weights=token_weights, where=where
    )
    return aggregate(
        weighted,
        inputs.mask,
        mode=agg,  # type: ignore[arg-type]
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )


def masked_fraction(condition: Array, inputs: PolicyInputs) -> Array:
    """Fraction of valid tokens where `condition` holds (a metric; no gradient)."""
    hits = jnp.sum(jnp.where(inputs.valid & condition, 1.0, 0.0))
    return hits / jnp.maximum(jnp.sum(inputs.mask), 1.0)


def masked_max(x: Array, inputs: PolicyInputs) -> Array:
    """Max over valid tokens (0 if none are valid)."""
    best = jnp.max(jnp.where(inputs.valid, x, -jnp.inf))
    return jnp.where(jnp.any(inputs.valid), best, 0.0)


def ratio_metrics(logr: Array, ratio: Array, inputs: PolicyInputs) -> dict[str, Array]:
    """`policy/approx_kl = masked_mean(−logr)`, `policy/ratio_mean`, `policy/ratio_max`."""
    count = jnp.maximum(jnp.sum(inputs.mask), 1.0)
    metrics = {
        "policy/approx_kl": jnp.sum(zero_outside(-logr, inputs.valid)) / count,
        "policy/ratio_mean": jnp.sum(zero_outside(ratio, inputs.valid)) / count,
        "policy/ratio_max": masked_max(ratio, inputs),
    }
    return stop_gradient_metrics(metrics)


def stop_gradient_metrics(metrics: dict[str, Array]) -> dict[str, Array]:
    """Metrics never carry gradients and are float32 scalars."""
    return {k: jax.lax.stop_gradient(jnp.asarray(v, jnp.float32)) for k, v in metrics.items()}


@jax.custom_jvp
def inclusive_clip(x: Array, low: Any, high: Any) -> Array:
    """`clip(x, low, high)` whose gradient is 1 on the bounds too (torch's `clamp`).

    `jnp.clip` halves the gradient at a bound (a tie of its `max` / `min`), so with a zero clip
    (ratio ≡ 1 on a bound) PPO's gradient was 0.625× REINFORCE's instead of equal to it. The
    value is `jnp.clip`'s, computed by the same operations; only the tangent differs.
    """
    return jnp.clip(x, low, high)


@inclusive_clip.defjvp
def _inclusive_clip_jvp(primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    x, low, high = primals
    inside = (x >= low) & (x <= high)
    return jnp.clip(x, low, high), jnp.where(inside, tangents[0], jnp.zeros_like(tangents[0]))


def clip_terms(adv: Array, ratio: Array, clip_low: Any, clip_high: Any) -> tuple[Array, Array]:
    """PPO's two branches `(ℓ1, ℓ2) = (−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))` (§5.1)."""
    return -adv * ratio, -adv * inclusive_clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
