"""Several rewards → one advantage per sequence: weighted sum, or decoupled (GDPO).

The reward functions of a config produce `rewards[N, K]` (`score_rewards`, or `K` JAX reward
functions stacked on the last axis), rows prompt-major (`n = b·G + g`). Two ways to turn them
into group-relative advantages `[N]`, both compositions of `losses`:

    "sum"        A = group_advantages(Σ_k w_k r_k)                   (TRL's sum_then_normalize)
    "decoupled"  A = Σ_k w_k · group_advantages(r_k, scale="group")   (GDPO, arXiv 2601.05242)

GDPO normalises each component within its group before summing, so a component with a small
spread is not drowned by one with a large spread ("GDPO: Group reward-Decoupled Normalization
Policy Optimization", arXiv 2601.05242). Any final batch whitening is a separate
`losses.masked_whiten` (ALGORITHMS.md §4.7). Everything here is `jnp` and runs under `jax.jit`.
"""

from __future__ import annotations

from typing import Literal

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from jaxrl_llm.rewards.decode import _is_int
from losses.advantages import gdpo_advantages, group_advantages
from losses.reward_combination import weighted_rewards

CombineMode = Literal["sum", "decoupled"]


def _grouped(rewards: Array, group_size: int, where: str) -> tuple[int, int]:
    if rewards.ndim != 2:
        raise ValueError(f"{where}: `rewards` must be [N, K], got shape {rewards.shape}.")
    n = rewards.shape[0]
    if not _is_int(group_size) or group_size < 2 or n % group_size:
        raise ValueError(
            f"{where}: `group_size` must be an integer >= 2 dividing N = {n}, got {group_size!r}."
        )
    return n // group_size, group_size


def total_reward(rewards: ArrayLike, weights: ArrayLike) -> Array:
    """`Σ_k w_k r_k`: the scalar reward of each sequence, `[N, K]` → `[N]` float32.

    Examples:
      >>> total_reward(jnp.array([[1.0, 1.0], [0.0, 1.0]]), jnp.array([1.0, 0.5])).tolist()
      [1.5, 0.5]
    """
    return weighted_rewards(jnp.asarray(rewards), jnp.asarray(weights, jnp.float32)).rewards


def combined_advantages(
    rewards: ArrayLike,
    weights: ArrayLike,
    *,
    group_size: int,
    mode: CombineMode = "sum",
    valid: ArrayLike | None = None,
    scale: Literal["group", "batch", "none"] = "group",
    eps: float = 1e-6,
    ddof: int = 1,
) -> Array:
    """Group-relative advantages `[N]` from `K` reward components (module docstring).

    Args:
      rewards: `[N, K]` rewards, `N = B·G`, prompt-major rows.
      weights: `[K]` component weights `w_k`.
      group_size: `G` (>= 2).
      mode: `"sum"` (weight, sum, then normalise) or `"decoupled"` (GDPO).
      valid: optional `[N]` bool (e.g. `RewardScores.valid`); invalid rows get 0 and leave
        the group statistics.
      scale: `group_advantages`' `scale` for `"sum"`; `"decoupled"` requires `"group"`.
      eps: added to the std. ddof: of the std.

    Returns:
      `[N]` float32 advantages under stop-gradient.

    Examples:
      >>> r = jnp.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
      >>> w = jnp.ones(2)
      >>> [round(float(a), 4) for a in combined_advantages(r, w, group_size=2)]
      [0.7071, -0.7071, 0.7071, -0.7071]
      >>> [round(float(a), 4) for a in combined_advantages(r, w, group_size=2, mode="decoupled")]
      [1.4142, -1.4142, 0.7071, -0.7071]
    """
    where = "combined_advantages"
    r = jnp.asarray(rewards)
    w = jnp.asarray(weights, jnp.float32)
    B, G = _grouped(r, group_size, where)
    if valid is not None and jnp.shape(valid) != (B * G,):
        raise ValueError(f"{where}: `valid` must have shape ({B * G},), got {jnp.shape(valid)}.")
    v = None if valid is None else jnp.asarray(valid).reshape(B, G)
    if mode == "sum":
        total = total_reward(r, w).reshape(B, G)
        adv = group_advantages(total, scale=scale, eps=eps, ddof=ddof, valid=v)
    elif mode == "decoupled":
        if scale != "group":
            raise ValueError(
                f"{where}: mode='decoupled' (GDPO) normalises each component within its group; "
                f"`scale` must be 'group', got {scale!r}."
            )
        adv = gdpo_advantages(r.reshape(B, G, -1), weights=w, eps=eps, ddof=ddof, valid=v)
    else:
        raise ValueError(f"{where}: `mode` must be 'sum' or 'decoupled', got {mode!r}.")
    return adv.reshape(B * G)
