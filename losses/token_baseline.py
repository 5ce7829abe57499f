"""Optimal token baseline (OTB): a per-position, variance-weighted group baseline (ALGORITHMS.md §4.14).

For the minimum-variance REINFORCE baseline at position `t`, each response of a group is weighted
by the squared norm of its accumulated score function up to `t`. With the logit-gradient proxy
`‖e_y − π‖² = 1 − 2π_y + Σ_v π_v²` (one forward pass: `old_logp` and `log_sum_pi_squared`, §2.3)
that weight is the "realised energy" `W_t = Σ_{u≤t} w_u m_u`, and the baseline is the
`W`-weighted mean of the group's rewards-to-go at `t`.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_choice,
    check_floating,
    check_positive,
    check_real,
)
from losses.segments import _token_values, _zero_outside

_sg = jax.lax.stop_gradient


def _optional_token_input(
    x: Any, name: str, shape: tuple[int, ...], *, where: str, floating: bool = False
) -> Array:
    (check_floating if floating else check_real)(x, name, where=where)
    if jnp.shape(x) != shape:
        raise ValueError(
            f"{where}: `{name}` must have the shape of `rewards` {shape}, got {jnp.shape(x)}."
        )
    return as_float32(x)


def _compact(x: Array, order: Array) -> Array:
    """Row-wise gather `x[n, order[n, k]]` (valid tokens first, in order)."""
    return jnp.take_along_axis(x, order, axis=1)


def _zero_tail(lengths: Array, T: int) -> Array:
    """`[B,G,T]` bool: positions `≥` the second-longest length of the group's unique longest row."""
    longest = jnp.max(lengths, axis=1, keepdims=True)
    is_longest = lengths == longest
    unique = jnp.sum(is_longest, axis=1, keepdims=True) == 1
    second = jnp.max(jnp.where(is_longest, 0, lengths), axis=1, keepdims=True)
    positions = jnp.arange(T)[None, None, :]
    return (is_longest & unique)[..., None] & (positions >= second[..., None])


def optimal_token_baseline_advantages(
    rewards: ArrayLike,
    mask: ArrayLike,
    old_logp: ArrayLike,
    log_sum_pi_sq: ArrayLike,
    *,
    G: int,
    is_weights: ArrayLike | None = None,
    eps: float = 1e-8,
    handle_zero_tail: bool = True,
    positions: Literal["absolute", "valid_ordinal"] = "absolute",
) -> tuple[Array, Array]:
    """Advantages with the optimal token baseline (OTB, ALGORITHMS.md §4.14).

        R_t = Σ_{u≥t} r_u m_u                      (reward-to-go)
        w_t = 1 − 2·exp(old_t) + exp(log_sum_pi_sq_t)      (· ρ_t² with `is_weights` ρ)
        W_t = Σ_{u≤t} w_u m_u                      (realised energy)
        B_t = Σ_i R_it W_it m_it / (Σ_i W_it m_it + eps)     over the G rows of the group, per t
        A   = (R − B)·m ;   returns = R·m

    so `Σ_i W_it m_it A_it = eps·B_t ≈ 0` at every position. Groups with fewer than two valid
    members (rows with a valid token) use `B = 0` (advantage = return). `handle_zero_tail`: if
    the longest row of a group is unique, its baseline is 0 from the second-longest length on
    (there it would be its own return, leaving no signal). `positions="absolute"` aligns the rows
    of a group by position `t`; `positions="valid_ordinal"` aligns the `k`-th valid token of each
    row (multi-turn rollouts whose masks have holes), computes the same baseline per ordinal and
    scatters it back; in that mode the zero tail applies from the second-longest ordinal on.

    Peers: verl `optimal_token_baseline` (= defaults; its `sum_pi_squared` is `exp` of our input,
    `rollout_is_weights` are `is_weights`) and `tir_optimal_token_baseline`
    (`positions="valid_ordinal"`). Paper: not recorded in our sources (verl's documentation of
    "Optimal Token Baseline" links a write-up, unverified here).

    Args:
      rewards: `[N,T]` per-token rewards (outcome on the last valid token, KL terms, …),
        `N = B·G` with contiguous groups.
      mask: `[N,T]` {0,1} valid tokens.
      old_logp: `[N,T]` log-probs of the sampled tokens under the policy that sampled them.
      log_sum_pi_sq: `[N,T]` `log Σ_v π_v²` of the same distributions (`log_sum_pi_squared`).
      G: static group size (`N` must be a multiple of it).
      is_weights: optional `[N,T]` rollout-correction weights `ρ` (e.g. truncated IS).
      eps: added to the denominator of `B` (>= 0).
      handle_zero_tail: zero the baseline of a unique longest row beyond the second-longest.
      positions: "absolute" or "valid_ordinal" (see above).

    Returns:
      `(advantages, returns)`, both `[N,T]` float32, 0 outside the mask, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[0.0, 1.0], [0.0, 0.0]]); m = jnp.ones((2, 2))
      >>> old = jnp.log(jnp.full((2, 2), 0.5)); lsp = jnp.log(jnp.full((2, 2), 0.5))
      >>> adv, ret = optimal_token_baseline_advantages(r, m, old, lsp, G=2)
      >>> [[round(a, 4) for a in row] for row in adv.tolist()], ret.tolist()
      ([[0.5, 0.5], [-0.5, -0.5]], [[1.0, 1.0], [0.0, 0.0]])
    """
    where = "optimal_token_baseline_advantages"
    check_choice(positions, ("absolute", "valid_ordinal"), "positions", where=where)
    check_choice(handle_zero_tail, (True, False), "handle_zero_tail", where=where)
    check_positive(eps, "eps", where=where, allow_zero=True)
    r = _token_values(rewards, "rewards", where=where)
    N, T = r.shape
    if isinstance(G, bool) or not isinstance(G, int) or G < 2 or N % G:
        raise ValueError(
            f"{where}: `G` must be a Python int >= 2 dividing N = {N} (rows of `rewards`), "
            f"got {G!r}."
        )
    old = _optional_token_input(old_logp, "old_logp", r.shape, where=where, floating=True)
    lsp = _optional_token_input(log_sum_pi_sq, "log_sum_pi_sq", r.shape, where=where, floating=True)
    valid = as_mask(mask, r.shape, where=where) > 0
    r, old, lsp = (_sg(_zero_outside(x, valid)) for x in (r, old, lsp))
    w = 1.0 - 2.0 * jnp.exp(old) + jnp.exp(lsp)
    if is_weights is not None:
        rho = _sg(
            _zero_outside(
                _optional_token_input(is_weights, "is_weights", r.shape, where=where), valid
            )
        )
        w = w * rho**2
    returns = _zero_outside(jnp.flip(jnp.cumsum(jnp.flip(r, 1), axis=1), 1), valid)
    energy = jnp.cumsum(_zero_outside(w, valid), axis=1)
    if positions == "valid_ordinal":
        order = jnp.argsort(~valid, axis=1, stable=True)  # valid positions first, in order
        lengths = jnp.sum(valid, axis=1)
        aligned = jnp.arange(T)[None, :] < lengths[:, None]
        R_al, W_al = _compact(returns, order), _compact(energy, order)
    else:
        aligned, R_al, W_al = valid, returns, energy
    baseline = _group_baseline(R_al, W_al, aligned, G, eps=eps, zero_tail=handle_zero_tail)
    if positions == "valid_ordinal":
        ordinal = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
        baseline = jnp.take_along_axis(baseline, ordinal, axis=1)
    adv = _zero_outside(returns - baseline, valid)
    return _sg(adv), _sg(returns)


def _group_baseline(
    R: Array, W: Array, valid: Array, G: int, *, eps: Any, zero_tail: bool
) -> Array:
    """`B_t` per group and position (rows aligned), broadcast back to `[N,T]`."""
    N, T = R.shape
    B = N // G
    Rg, Wg, vg = (x.reshape(B, G, T) for x in (R, W, valid))
    Wm = _zero_outside(Wg, vg)
    num = jnp.sum(Rg * Wm, axis=1, keepdims=True)
    den = jnp.sum(Wm, axis=1, keepdims=True) + eps
    baseline = jnp.broadcast_to(num / jnp.where(den > 0, den, 1.0), (B, G, T))
    lengths = jnp.sum(vg, axis=2)  # [B,G]
    members = jnp.sum(lengths > 0, axis=1)  # [B]
    baseline = jnp.where((members >= 2)[:, None, None], baseline, 0.0)
    if zero_tail:
        baseline = jnp.where(_zero_tail(lengths, T), 0.0, baseline)
    return baseline.reshape(N, T)
