"""Shaping of step, token and turn rewards (ALGORITHMS.md §10.7 and the §11 multi-turn row).

Conventions: per-step rewards are `[N,M]` with `step_mask[N,M]` (steps from
`losses.segment_reduce`), per-token rewards `[N,T]` with `mask[N,T]`; potentials live on the
`T + 1` boundaries between tokens, `phi[N,T+1]`. Entries that no valid step or token uses are
replaced with 0 before any arithmetic, so NaN/inf there never reach a value; outputs are 0 outside
the mask. Reward functions run under stop-gradient (§0.6). Every output is float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_concrete_range, check_valid_range
from losses._rewards import check_number, check_shape, flags, real_array, sg, zero_outside


def _steps(r: ArrayLike, step_mask: ArrayLike, *, where: str) -> tuple[Array, Array]:
    x = real_array(r, "r", where=where, rank=2)
    m = flags(step_mask, x.shape, "step_mask", where=where)
    return zero_outside(x, m), m


def clip_process_rewards(r: ArrayLike, step_mask: ArrayLike, *, eta: float) -> Array:
    """Clip mechanism for process rewards: `min(r − η, 0)` on valid steps (ALGORITHMS.md §10.7).

    Every step reward is ≤ 0, so a trajectory's cumulative process reward is bounded above and the
    policy cannot farm it by adding steps (the reward-hacking mode of summed PRM rewards).

    Source: "On Designing Effective RL Reward at Training Time for LLM Reasoning" (seed paper;
    reconstructed — verify against the paper). No peer.

    Args:
      r: `[N,M]` process rewards of the steps.
      step_mask: `[N,M]` {0,1} valid steps.
      eta: threshold η (a step reward above η earns 0).

    Returns:
      `[N,M]` float32 rewards ≤ 0, 0 on masked steps, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[0.75, 0.25, jnp.nan]])
      >>> clip_process_rewards(r, jnp.array([[1, 1, 0]]), eta=0.5).tolist()
      [[0.0, -0.25, 0.0]]
    """
    where = "clip_process_rewards"
    x, m = _steps(r, step_mask, where=where)
    check_number(eta, "eta", where=where)
    return sg(zero_outside(jnp.minimum(x - eta, 0.0), m))


def delta_process_rewards(r: ArrayLike, step_mask: ArrayLike) -> Array:
    """Delta mechanism for process rewards (ALGORITHMS.md §10.7).

        d_k = r_k − r_next(k)     valid steps with a later valid step (next(k): the next one)
        d_k = r_k                 the last valid step

    The return-to-go from step `k` is `Σ_{j≥k} d_j = r_k`: each step is credited with its own PRM
    score, and the total telescopes to the first valid step's reward, so adding steps cannot raise
    it.

    Source: "On Designing Effective RL Reward at Training Time for LLM Reasoning" (seed paper;
    reconstructed — verify against the paper). No peer.

    Args:
      r: `[N,M]` process rewards of the steps.
      step_mask: `[N,M]` {0,1} valid steps (holes allowed: differences skip them).

    Returns:
      `[N,M]` float32 rewards, 0 on masked steps, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> delta_process_rewards(jnp.array([[0.5, 0.75, 0.25]]), jnp.ones((1, 3))).tolist()
      [[-0.25, 0.5, 0.25]]
    """
    where = "delta_process_rewards"
    x, m = _steps(r, step_mask, where=where)
    M = x.shape[-1]
    position = jnp.where(m, jnp.arange(M, dtype=jnp.int32), M)
    at_or_after = jax.lax.cummin(position, axis=1, reverse=True)
    pad = jnp.full_like(at_or_after[:, :1], M)  # keeps the sharding of the rows
    after = jnp.concatenate([at_or_after[:, 1:], pad], axis=1)
    has_next = after < M
    following = jnp.take_along_axis(x, jnp.minimum(after, M - 1), axis=1)
    return sg(zero_outside(x - jnp.where(has_next, following, 0.0), m))


def potential_shaped_rewards(
    r: ArrayLike, phi: ArrayLike, mask: ArrayLike, *, gamma: float = 1.0
) -> Array:
    """Potential-based shaping of token rewards: `r_t + γ·φ_{t+1} − φ_t` (ALGORITHMS.md §10.7).

    `φ_t` is the potential of the state before token `t` (`φ_0`: the prompt) and `φ_{t+1}` after
    it. Shaping of this form leaves the optimal policy unchanged; with `γ = 1` a row's shaping
    telescopes to `φ_end − φ_0`, so set the potential of the terminal state to 0 (or any constant)
    for exact invariance. Boundary `j` is read when token `j − 1` or token `j` is valid; other
    boundaries are ignored.

    Source: Ng, Harada & Russell, "Policy Invariance Under Reward Transformations: Theory and
    Application to Reward Shaping" (ICML 1999). No peer.

    Args:
      r: `[N,T]` token rewards.
      phi: `[N,T+1]` potentials on the boundaries between tokens.
      mask: `[N,T]` {0,1} completion mask.
      gamma: discount γ in [0, 1] (may be traced).

    Returns:
      `[N,T]` float32 shaped rewards, 0 outside the mask, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[0.0, 0.0, 1.0]]); phi = jnp.array([[0.5, 0.25, 0.75, 0.0]])
      >>> potential_shaped_rewards(r, phi, jnp.ones((1, 3))).tolist()
      [[-0.25, 0.5, 0.25]]
    """
    where = "potential_shaped_rewards"
    x = real_array(r, "r", where=where, rank=2)
    m = flags(mask, x.shape, "mask", where=where)
    p = real_array(phi, "phi", where=where, rank=2)
    N, T = x.shape
    check_shape(p, (N, T + 1), "phi", where=where)
    check_number(gamma, "gamma", where=where, low=0.0, high=1.0)
    pad = jnp.zeros_like(m[:, :1])  # keeps the sharding of the rows
    used = jnp.concatenate([m, pad], axis=1) | jnp.concatenate([pad, m], axis=1)
    p = zero_outside(p, used)
    shaped = zero_outside(x, m) + gamma * p[:, 1:] - p[:, :-1]
    return sg(zero_outside(shaped, m))


def turn_decay_rewards(
    turn: ArrayLike, solved: ArrayLike, n_rep: ArrayLike, *, gamma: float, lam: float
) -> Array:
    """Multi-turn reward decaying with the turn of success, minus a repetition penalty (§11).

        r = [solved]·γ^turn − λ·n_rep

    `turn` is the 0-based index of the turn in which the task was solved (the last turn for an
    unsolved trajectory; it does not matter then), so solving at the first attempt earns 1; each
    answer repeated from an earlier turn costs λ.

    Source: UFO, "A Simple "Try Again" Can Elicit Multi-Turn LLM Reasoning" (seed paper); the
    0-based exponent and the linear repetition penalty are (reconstructed — verify against the
    paper). No peer.

    Args:
      turn: `[N]` turn index (integer or float).
      solved: `[N]` bool / {0,1}.
      n_rep: `[N]` number of repeated answers.
      gamma: decay per turn, in [0, 1].
      lam: penalty per repeated answer (>= 0).

    Returns:
      `[N]` float32 rewards, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = turn_decay_rewards(
      ...     jnp.array([0, 2, 3]), jnp.array([1, 1, 0]), jnp.array([0, 1, 2]), gamma=0.5, lam=0.125
      ... )
      >>> r.tolist()
      [1.0, 0.125, -0.25]
    """
    where = "turn_decay_rewards"
    k = real_array(turn, "turn", where=where, rank=1)
    ok = flags(solved, k.shape, "solved", where=where)
    rep = real_array(n_rep, "n_rep", where=where)
    check_shape(rep, k.shape, "n_rep", where=where)
    check_valid_range(k, ok, "turn", where=where, low=0)  # 0-based: γ^turn never exceeds 1
    check_concrete_range(rep, "n_rep", where=where, low=0)
    check_number(gamma, "gamma", where=where, low=0.0, high=1.0)
    check_number(lam, "lam", where=where, low=0.0)
    success = jnp.where(ok, jnp.power(jnp.asarray(gamma, k.dtype), zero_outside(k, ok)), 0.0)
    return sg(success - lam * rep)
