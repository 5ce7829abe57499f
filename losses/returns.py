"""Token-level returns and advantages: discounted returns, GAE, REINFORCE++, ReMax, min-form credit.

Conventions (ALGORITHMS.md §4.0, §4.8-§4.13):

* Per-token inputs are `[N,T]` (or `[N,M]` step layouts) with rewards placed where they are earned,
  e.g. the sequence score on the last valid token plus a per-token KL penalty
  (`kl_penalized_rewards`, §3.3).
* `mask[N,T]` is {0,1}; masked entries of every per-token input are replaced by 0 with
  `where(mask > 0, x, 0)` before any arithmetic, so NaN/inf outside the mask never reach a value.
  Outputs are 0 outside the mask.
* Recursions over time are reverse `jax.lax.scan`s over `T` (a reverse cumulative min for the
  min-form), never Python loops; the carry is `[N]`, so the batch axis can be sharded.
* Estimators run under stop-gradient (§0.6): every output here is `jax.lax.stop_gradient`-ed.
  Returns are regression targets and advantages are weights, so neither carries a gradient.
* `gamma` is a scalar (Python or traced) or a per-token discount `[N,T]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_choice,
    check_concrete_range,
    check_rank,
    check_real,
    check_same_shape,
    check_valid_range,
)
from losses.advantages import group_advantages
from losses.layout import broadcast_to_tokens
from losses.masked import masked_whiten

EpsMode = Literal["add", "max", "std"]


# --------------------------------------------------------------------------------------------------
# validation and scan plumbing
# --------------------------------------------------------------------------------------------------


def _token_input(x: Any, name: str, *, where: str) -> Array:
    """Validate a `[N,T]` real array and upcast it to float32 (float64 is kept)."""
    check_rank(x, 2, name, where=where)
    check_real(x, name, where=where)
    return as_float32(x)


def _check_unit_interval(value: Any, name: str, *, where: str) -> None:
    """Raise if a concrete scalar (a Python number or a 0-d array) lies outside [0, 1] or is
    NaN. Traced values are not checked, nor per-token arrays here (`_discount` checks a
    per-token `gamma` on its valid entries: the padding may hold anything)."""
    if isinstance(value, int | float) and not 0.0 <= value <= 1.0:  # NaN included
        raise ValueError(f"{where}: `{name}` must lie in [0, 1], got {value!r}.")
    if not isinstance(value, bool) and jnp.ndim(value) == 0:
        check_concrete_range(value, name, where=where, low=0.0, high=1.0)


def _discount(gamma: Any, like: Array, valid: Array, *, where: str) -> Array:
    """Validate `gamma` (a scalar or shaped like `like`; a concrete per-token array in [0, 1] on
    the `valid` entries); return it with `like`'s shape and dtype."""
    if isinstance(gamma, bool):
        raise ValueError(f"{where}: `gamma` must be a number or an array, got {gamma!r}.")
    _check_unit_interval(gamma, "gamma", where=where)
    check_real(gamma, "gamma", where=where)
    if jnp.ndim(gamma) not in (0, like.ndim) or (
        jnp.ndim(gamma) == like.ndim and jnp.shape(gamma) != like.shape
    ):
        raise ValueError(
            f"{where}: `gamma` must be a scalar or a per-token array of shape {like.shape}, "
            f"got shape {jnp.shape(gamma)}."
        )
    if jnp.ndim(gamma) == like.ndim:  # padding may hold anything
        check_valid_range(gamma, valid, "gamma", where=where, low=0.0, high=1.0)
    # `zeros_like(like) + gamma` keeps the sharding of `like` (the carry of the scan must match).
    return jnp.zeros_like(like) + jnp.asarray(gamma).astype(like.dtype)


def _reverse_scan(step: Callable[..., Any], init: Any, *xs: Array) -> Array:
    """Run `step` from `t = T−1` down to 0 over `[N,T]` inputs; returns the outputs as `[N,T]`."""
    xs_tn = tuple(jnp.swapaxes(x, 0, 1) for x in xs)
    _, ys = jax.lax.scan(step, init, xs_tn, reverse=True)
    return jnp.swapaxes(ys, 0, 1)


def _masked_discounted_sum(r: Array, gamma: Array, valid: Array, *, masked_carry: bool) -> Array:
    """`R' = r_t + γ_t·R`, carried across masked positions (or reset to 0 there); `R'·m` out.

    `r` and `gamma` must already be 0 outside `valid`.
    """

    def step(carry: Array, x: tuple[Array, Array, Array]) -> tuple[Array, Array]:
        r_t, g_t, v_t = x
        new = r_t + g_t * carry
        fallback = carry if masked_carry else jnp.zeros_like(carry)
        return jnp.where(v_t, new, fallback), new

    out = _reverse_scan(step, jnp.zeros_like(r[:, 0]), r, gamma, valid)
    return jnp.where(valid, out, 0.0)


def _zero(x: Array, valid: Array) -> Array:
    return jnp.where(valid, x, jnp.zeros((), x.dtype))


# --------------------------------------------------------------------------------------------------
# public estimators
# --------------------------------------------------------------------------------------------------


def discounted_returns(
    rewards: ArrayLike,
    mask: ArrayLike,
    *,
    gamma: float | ArrayLike = 1.0,
) -> Array:
    """Discounted reward-to-go over the valid positions (ALGORITHMS.md §4.12).

    Reverse scan with the carry updated only on valid positions (masked observation tokens of a
    multi-turn rollout are skipped, the return flows across them):

        G = 0;  for t = T−1 … 0:  G' = r_t + γ_t·G;  G ← G' if m_t else G;  ret_t = G'·m_t

    With `γ = 1` this is the masked reverse cumulative sum `Σ_{u≥t} r_u m_u`. It equals the
    advantages of `gae(rewards, zeros, mask, gamma=γ, lam=1)` and the returns that REINFORCE++
    whitens (`reinforce_pp_advantages`). The default `γ = 1` is the LLM-RL convention (verl,
    OpenRLHF, TRL): the episode is a single response and the reward sits on its last token.

    Args:
      rewards: `[N,T]` per-token rewards (typically `kl_penalized_rewards`, §3.3); also `[N,M]`
        step layouts.
      mask: `[N,T]` {0,1} valid positions.
      gamma: discount, a scalar or a per-token `[N,T]` array (`γ_t` discounts the return that
        follows position `t`; values at masked positions are unused).

    Returns:
      `[N,T]` float32 returns, 0 outside the mask, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[0.0, 1.0, 0.0, 2.0]]); m = jnp.array([[1, 1, 0, 1]])
      >>> discounted_returns(r, m).tolist()
      [[3.0, 3.0, 0.0, 2.0]]
      >>> [round(v, 4) for v in discounted_returns(r, m, gamma=0.5)[0].tolist()]
      [1.0, 2.0, 0.0, 2.0]
    """
    where = "discounted_returns"
    r = _token_input(rewards, "rewards", where=where)
    valid = as_mask(mask, r.shape, where=where) > 0
    gam = _zero(_discount(gamma, r, valid, where=where), valid)
    out = _masked_discounted_sum(_zero(r, valid), gam, valid, masked_carry=True)
    return jax.lax.stop_gradient(out)


def gae(
    rewards: ArrayLike,
    values: ArrayLike,
    mask: ArrayLike,
    *,
    gamma: float | ArrayLike = 1.0,
    lam: float | ArrayLike = 1.0,
    skip_masked: bool = True,
) -> tuple[Array, Array]:
    """Generalized Advantage Estimation over tokens (ALGORITHMS.md §4.11).

        skip_masked=True:   carry (nv, g) = (0, 0);  for t = T−1 … 0:
            δ = r_t + γ_t·nv − V_t;   g' = δ + γ_t·λ·g;   if m_t: (nv, g) ← (V_t, g');   adv_t = g
        skip_masked=False:  r ← r·m, V ← V·m, nv = V_{t+1} (0 beyond T), the standard recursion
            δ_t = r_t + γ_t·V_{t+1} − V_t;   adv_t = δ_t + γ_t·λ·adv_{t+1}
        returns = (adv + V)·m ;   advantages·m are NOT whitened

    `skip_masked=True` lets values and advantages flow across masked observation tokens of
    multi-turn rollouts (the masked positions are skipped as if absent); `False` treats them as
    zero-reward, zero-value steps. The two agree when every row's mask is a prefix. Per-token
    `gamma[N,T]` gives intra-action backups (POAD/BAD: `γ_t = 1` inside a multi-token action).
    In the skipping mode `γ` at masked positions is unused; in the standard mode it is used as
    given (it discounts across the masked step), so it must be finite there.

    Sources: "High-Dimensional Continuous Control Using Generalized Advantage Estimation"
    (arXiv 1506.02438); "Proximal Policy Optimization Algorithms" (arXiv 1707.06347).
    Peers (each followed by whitening, which callers apply with `masked_whiten`): verl `gae`
    (= defaults, then `masked_whiten`); OpenRLHF `gae` (`skip_masked=False`, then
    `masked_whiten(ddof=0, eps_mode="max")`); TRL PPO (`lam=0.95, skip_masked=False`); Tunix.
    Defaults `γ = λ = 1` are verl's (OpenRLHF's CLI and TRL PPO default to `λ = 0.95`, `γ = 1`):
    with a terminal reward, `λ = 1` gives the unbiased Monte-Carlo advantage `ret − V`.

    Args:
      rewards: `[N,T]` per-token rewards (score on the last valid token plus KL terms, §3.3).
      values: `[N,T]` critic values `V_t` (no gradient flows through the outputs).
      mask: `[N,T]` {0,1} valid positions.
      gamma: discount, a scalar or a per-token `[N,T]` array.
      lam: GAE λ in [0, 1] (scalar).
      skip_masked: skip masked positions (True, verl) or treat them as zero steps (False,
        OpenRLHF/TRL).

    Returns:
      `(advantages, returns)`, both `[N,T]` float32, 0 outside the mask, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[0.0, 0.0, 1.0]]); v = jnp.array([[0.5, 0.6, 0.7]])
      >>> adv, ret = gae(r, v, jnp.ones((1, 3)), lam=0.95)
      >>> [round(a, 5) for a in adv[0].tolist()], [round(x, 5) for x in ret[0].tolist()]
      ([0.46575, 0.385, 0.3], [0.96575, 0.985, 1.0])
    """
    where = "gae"
    check_choice(skip_masked, (True, False), "skip_masked", where=where)
    _check_unit_interval(lam, "lam", where=where)
    check_real(lam, "lam", where=where)
    if jnp.ndim(lam) != 0:
        raise ValueError(f"{where}: `lam` must be a scalar, got shape {jnp.shape(lam)}.")
    r = _token_input(rewards, "rewards", where=where)
    check_same_shape(r, "rewards", where, values=values)
    v = _token_input(values, "values", where=where)
    if v.dtype != r.dtype:
        r, v = (x.astype(jnp.result_type(r, v)) for x in (r, v))
    valid = as_mask(mask, r.shape, where=where) > 0
    lam_ = jnp.asarray(lam).astype(r.dtype)
    gam = _discount(gamma, r, valid, where=where)
    r, v = _zero(r, valid), _zero(v, valid)
    if skip_masked:
        gam = _zero(gam, valid)
        carry_on = valid
    else:
        carry_on = jnp.ones_like(valid)

    def step(
        carry: tuple[Array, Array], x: tuple[Array, Array, Array, Array]
    ) -> tuple[tuple[Array, Array], Array]:
        next_value, last = carry
        r_t, v_t, g_t, on_t = x
        delta = r_t + g_t * next_value - v_t
        new = delta + g_t * lam_ * last
        next_value = jnp.where(on_t, v_t, next_value)
        last = jnp.where(on_t, new, last)
        return (next_value, last), last

    init = (jnp.zeros_like(r[:, 0]), jnp.zeros_like(r[:, 0]))
    adv = _zero(_reverse_scan(step, init, r, v, gam, carry_on), valid)
    returns = _zero(adv + v, valid)
    return jax.lax.stop_gradient(adv), jax.lax.stop_gradient(returns)


def reinforce_pp_advantages(
    rewards: ArrayLike,
    mask: ArrayLike,
    *,
    gamma: float | ArrayLike = 1.0,
    masked_carry: bool = True,
    whiten_ddof: int = 1,
    whiten_eps: float = 1e-8,
    whiten_eps_mode: EpsMode = "add",
) -> Array:
    """REINFORCE++ advantages: discounted returns whitened over the batch (ALGORITHMS.md §4.8).

        R = 0;  for t = T−1 … 0:  R' = r_t + γ_t·R;   ret_t = R'·m_t
                R ← m_t·R' + (1 − m_t)·R      masked_carry=True  (carry across masked tokens)
                R ← m_t·R'                    masked_carry=False (reset at masked tokens)
        A = masked_whiten(ret, m, ddof=whiten_ddof, eps=whiten_eps, eps_mode=whiten_eps_mode)·m

    The statistics are over all valid tokens of the batch (no per-prompt baseline; the KL penalty
    lives in the rewards, §3.3). With trailing-only padding both carry modes agree.

    Source: "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models"
    (arXiv 2501.03262). Peers: verl `reinforce_plus_plus` (= defaults; it carries `R` across
    masked tokens, before 2026 it reset: `masked_carry=False`); OpenRLHF `reinforce`
    (`whiten_ddof=0, whiten_eps_mode="max"`). Defaults follow verl (unbiased variance, eps added
    to the variance).

    Args:
      rewards: `[N,T]` per-token rewards, normally `kl_penalized_rewards` (§3.3).
      mask: `[N,T]` {0,1} valid tokens.
      gamma: discount, a scalar or a per-token `[N,T]` array.
      masked_carry: carry the return across masked tokens (True) or reset it there (False).
      whiten_ddof: ddof of the whitening variance (0 or 1).
      whiten_eps: epsilon of the whitening.
      whiten_eps_mode: placement of `whiten_eps` ("add", "max" or "std", see `masked_whiten`).

    Returns:
      `[N,T]` float32 advantages, 0 outside the mask, under stop-gradient.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> r = jnp.array([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]])
      >>> m = jnp.array([[1, 1, 1], [1, 1, 0]])
      >>> adv = jax.jit(reinforce_pp_advantages)(r, m)
      >>> [[round(a, 4) for a in row] for row in adv.tolist()]
      [[0.7303, 0.7303, 0.7303], [-1.0954, -1.0954, 0.0]]
    """
    where = "reinforce_pp_advantages"
    check_choice(masked_carry, (True, False), "masked_carry", where=where)
    _check_whiten_options(whiten_ddof, whiten_eps_mode, where=where)
    r = _token_input(rewards, "rewards", where=where)
    valid = as_mask(mask, r.shape, where=where) > 0
    gam = _zero(_discount(gamma, r, valid, where=where), valid)
    ret = _masked_discounted_sum(_zero(r, valid), gam, valid, masked_carry=masked_carry)
    adv = masked_whiten(ret, valid, ddof=whiten_ddof, eps=whiten_eps, eps_mode=whiten_eps_mode)
    return jax.lax.stop_gradient(_zero(adv, valid))


def reinforce_pp_baseline_advantages(
    rewards: ArrayLike,
    mask: ArrayLike,
    *,
    valid: ArrayLike | None = None,
    singleton: Literal["zero", "raw"] = "zero",
    whiten_ddof: int = 1,
    whiten_eps: float = 1e-8,
    whiten_eps_mode: EpsMode = "add",
) -> Array:
    """REINFORCE++ with a group baseline, whitened over tokens (ALGORITHMS.md §4.9).

        b = s − μ_b   (= group_advantages(s, scale="none", valid=valid, singleton=singleton))
        A = masked_whiten(broadcast_to_tokens(b, m), m, ddof, eps, eps_mode)·m

    The whitening statistics run over all valid tokens of the batch, so long sequences weigh
    more than short ones. Samples with `valid = False` get advantage 0 and are excluded from the
    whitening statistics as well (§4.0: unscorable samples leave every statistic).

    Source: "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models"
    (arXiv 2501.03262), baseline variant. Peers: verl `reinforce_plus_plus_baseline`
    (`singleton="raw"`); OpenRLHF `reinforce_baseline`, which puts `b` on the last token through
    `kl_penalized_rewards` and calls `reinforce_pp_advantages(gamma=1, whiten_ddof=0,
    whiten_eps_mode="max")`: without KL that is `whiten_ddof=0, whiten_eps_mode="max"` here.
    Defaults follow verl's whitening (unbiased variance, eps added) and TRL/Tunix's singleton
    groups (advantage 0).

    Args:
      rewards: `[B,G]` sequence scores `s` (groups are contiguous rows `n = b·G + g`).
      mask: `[N,T]` {0,1} completion tokens, `N = B·G`.
      valid: optional `[B,G]` bool, False for unscorable samples.
      singleton: groups with fewer than two valid samples: "zero" (advantage 0) or "raw"
        (verl's loop estimators: `b = s`).
      whiten_ddof: ddof of the token-level whitening variance (0 or 1).
      whiten_eps: epsilon of the whitening.
      whiten_eps_mode: placement of `whiten_eps` ("add", "max" or "std").

    Returns:
      `[N,T]` float32 advantages, 0 outside the mask, under stop-gradient.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> s = jnp.array([[1.0, 0.0, 0.0, 0.75, 0.5]])
      >>> m = jnp.arange(6)[None, :] < jnp.array([2, 5, 3, 4, 6])[:, None]
      >>> adv = jax.jit(reinforce_pp_baseline_advantages)(s, m)
      >>> [round(float(a), 4) for a in adv[:, 0]]
      [1.6378, -1.0919, -1.0919, 0.9554, 0.273]
    """
    where = "reinforce_pp_baseline_advantages"
    check_choice(singleton, ("zero", "raw"), "singleton", where=where)
    _check_whiten_options(whiten_ddof, whiten_eps_mode, where=where)
    check_rank(rewards, 2, "rewards", where=where)
    check_real(rewards, "rewards", where=where)
    check_rank(mask, 2, "mask", where=where)
    B, G = jnp.shape(rewards)
    N = jnp.shape(mask)[0]
    if B * G != N:
        raise ValueError(
            f"{where}: `mask` must have N = B·G = {B * G} rows for `rewards` of shape {(B, G)}, "
            f"got mask shape {jnp.shape(mask)}."
        )
    check_same_shape(rewards, "rewards", where, valid=valid)
    m = as_mask(mask, jnp.shape(mask), where=where)
    if valid is not None:
        m = broadcast_to_tokens(jnp.asarray(valid) > 0, m)  # m·valid_n: invalid rows leave
    baseline = group_advantages(as_float32(rewards), scale="none", valid=valid, singleton=singleton)
    per_token = broadcast_to_tokens(baseline, m)
    adv = masked_whiten(per_token, m, ddof=whiten_ddof, eps=whiten_eps, eps_mode=whiten_eps_mode)
    return jax.lax.stop_gradient(_zero(adv, m > 0))


def remax_advantages(rewards: ArrayLike, baseline: ArrayLike, mask: ArrayLike) -> Array:
    """ReMax advantages: reward-to-go minus the greedy response's reward (ALGORITHMS.md §4.10).

        ret_t = Σ_{u≥t} r_u m_u ;   A = (ret − b_n)·m      (no discount, no whitening)

    `b_n` is the reward of the greedy (argmax-decoded) response to the prompt of row `n`, which
    makes the estimator unbiased with a low variance. With the outcome reward `s` on the last valid
    token, every valid token gets `s − b`.

    Source: "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
    Large Language Models" (arXiv 2310.10505). Peer: verl `remax` (same formula).

    Args:
      rewards: `[N,T]` per-token rewards (§3.3).
      baseline: `[N]` greedy-response rewards `b_n` (one per row).
      mask: `[N,T]` {0,1} valid tokens.

    Returns:
      `[N,T]` float32 advantages, 0 outside the mask, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[0.0, 0.0, 1.0], [0.0, 0.3, 0.0]])
      >>> m = jnp.array([[1, 1, 1], [1, 1, 0]])
      >>> adv = remax_advantages(r, jnp.array([0.5, 0.5]), m)
      >>> [[round(a, 4) for a in row] for row in adv.tolist()]
      [[0.5, 0.5, 0.5], [-0.2, -0.2, 0.0]]
    """
    where = "remax_advantages"
    r = _token_input(rewards, "rewards", where=where)
    check_rank(baseline, 1, "baseline", where=where)
    check_real(baseline, "baseline", where=where)
    if jnp.shape(baseline) != r.shape[:1]:
        raise ValueError(
            f"{where}: `baseline` must hold one value per row of `rewards` ({r.shape[0]},), "
            f"got shape {jnp.shape(baseline)}."
        )
    valid = as_mask(mask, r.shape, where=where) > 0
    ones = _zero(jnp.ones_like(r), valid)
    ret = _masked_discounted_sum(_zero(r, valid), ones, valid, masked_carry=True)
    b = as_float32(baseline).astype(r.dtype)
    return jax.lax.stop_gradient(_zero(ret - b[:, None], valid))


def min_form_returns(
    step_rewards: ArrayLike,
    mask: ArrayLike,
    *,
    completion_mask: ArrayLike | None = None,
) -> Array:
    """Min-form credit assignment for process rewards (PURE, ALGORITHMS.md §4.13).

        ret_t = min{ r_k : k ≥ t, mask_k = 1 }   (0 if no rewarded position follows t)
        out   = ret · completion_mask             (default: positions up to the last rewarded one)

    computed as a reverse cumulative minimum (`lax.cummin`, XLA's associative scan of `minimum`)
    over `where(mask, r, +inf)`. The sum form (`discounted_returns` with `γ = 1`) lets a policy
    farm many mildly positive steps; the min form values a prefix by its worst future step, so
    `min r ≤ ret ≤ max r`, `ret` is non-decreasing in `t`, and a constant reward `c` gives `c`
    everywhere however many steps there are.

    Source: "Stop Summation: Min-Form Credit Assignment Is All Process Reward Model Needs for
    Reasoning" (PURE, arXiv 2504.15275). No peer. (reconstructed — verify against the paper): the
    combination with outcome rewards/baselines, and whether the paper realises min-form by
    re-weighting the step rewards before a sum, are our reconstruction; this function returns the
    plain min over future step rewards.

    Args:
      step_rewards: `[N,T]` step rewards on step-end tokens, or an `[N,M]` step layout.
      mask: same shape, {0,1}: the positions that carry a step reward.
      completion_mask: same shape, {0,1}: where the output is kept; None: every position up to and
        including the last rewarded one.

    Returns:
      Float32 array of the input's shape, 0 outside `completion_mask` and after the last rewarded
      position, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[0.9, 0.2, 0.7, 0.5]])
      >>> [round(x, 4) for x in min_form_returns(r, jnp.ones((1, 4)))[0].tolist()]
      [0.2, 0.2, 0.5, 0.5]
    """
    where = "min_form_returns"
    r = _token_input(step_rewards, "step_rewards", where=where)
    rewarded = as_mask(mask, r.shape, where=where) > 0
    # reverse cumulative min / max: the associative-scan primitives of XLA (one op each)
    future_min = jax.lax.cummin(jnp.where(rewarded, r, jnp.inf), axis=1, reverse=True)
    any_ahead = jax.lax.cummax(rewarded.astype(r.dtype), axis=1, reverse=True) > 0
    keep = any_ahead
    if completion_mask is not None:
        keep = keep & (as_mask(completion_mask, r.shape, "completion_mask", where=where) > 0)
    return jax.lax.stop_gradient(_zero(future_min, keep))


def _check_whiten_options(ddof: Any, eps_mode: Any, *, where: str) -> None:
    check_choice(ddof, (0, 1), "whiten_ddof", where=where)
    check_choice(eps_mode, ("add", "max", "std"), "whiten_eps_mode", where=where)
