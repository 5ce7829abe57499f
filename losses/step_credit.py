"""Step- and turn-level credit: advantages and rewards on an `[N,M]` step layout.

Conventions (ALGORITHMS.md §4.15, §4.17, §11):

* A step layout holds one value per step (reasoning step, tool call, dialogue turn) of each row:
  `x[N,M]` with `step_mask[N,M]` (1 = the step exists). Values at steps are produced from tokens
  with `segment_reduce` and returned to tokens with `segment_broadcast` (`losses.segments`).
* Boundary values `V[N,M+1]` are values of the states *between* steps: `V_0` the prompt, `V_k` the
  state after step `k`, `V_M` the final outcome. Boundary `j` is used when step `j−1` or step `j`
  is valid; every other entry is replaced by 0 before any arithmetic (NaN/inf there never leaks).
* Everything here is an estimator or a reward function and runs under stop-gradient (§0.6).
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
    check_positive,
    check_rank,
    check_real,
    replicated,
)
from losses.advantages import group_advantages
from losses.returns import min_form_returns
from losses.segments import (
    SEGMENT_OPS,
    _check_integer,
    _check_num_segments,
    _zero_outside,
    segment_broadcast,
    segment_reduce,
)

_sg = jax.lax.stop_gradient


# --------------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------------


def _step_values(x: Any, name: str, *, where: str) -> Array:
    check_rank(x, 2, name, where=where)
    check_real(x, name, where=where)
    return as_float32(x)


def _boundary_differences(
    values: Any, step_mask: Any, *, where: str, name: str, mask_name: str = "step_mask"
) -> Array:
    """`d_k = V_{k+1} − V_k` on valid steps, 0 elsewhere (see the module docstring)."""
    V = _step_values(values, name, where=where)
    N, M1 = V.shape
    if M1 < 2:
        raise ValueError(
            f"{where}: `{name}` must have M + 1 >= 2 boundary values per row ([N,M+1]), "
            f"got shape {V.shape}."
        )
    valid = as_mask(step_mask, (N, M1 - 1), mask_name, where=where) > 0
    pad = jnp.zeros_like(valid[:, :1])  # keeps the sharding of the rows
    used = jnp.concatenate([valid, pad], axis=1) | jnp.concatenate([pad, valid], axis=1)
    Vz = _zero_outside(V, used)
    return _sg(_zero_outside(Vz[:, 1:] - Vz[:, :-1], valid))


# --------------------------------------------------------------------------------------------------
# step advantages from boundary values (SPO-chain, PAV, DAPO-step) and information gain (IGPO, RLP)
# --------------------------------------------------------------------------------------------------


def step_advantages(boundary_values: ArrayLike, step_mask: ArrayLike) -> Array:
    """Advantage of each step as the change of value it causes (ALGORITHMS.md §4.15).

        A_k = V_{k+1} − V_k        on valid steps (0 elsewhere)

    `V_0` is the value of the prompt (e.g. the group mean reward), `V_M` the final outcome, and
    `V_k` at an inner boundary a Monte-Carlo mean over continuations sampled from the prefix that
    ends after step `k` (the sampler's job). Over a row whose valid steps are `0..K−1` the
    advantages telescope: `Σ_k A_k = V_K − V_0`. Broadcast to tokens with `segment_broadcast`.

    Sources: "Segment Policy Optimization" (SPO-chain, arXiv 2505.23564); PAV, "Rewarding Progress:
    Scaling Automated Process Verifiers for LLM Reasoning" (arXiv 2410.08146); "Direct Advantage
    Policy Optimization" (arXiv 2412.18279); "RL on Incorrect Synthetic Data Scales the Efficiency
    of LLM Math Reasoning by Eight-Fold" (arXiv 2406.14532). No peer.

    Args:
      boundary_values: `[N,M+1]` values of the states between steps.
      step_mask: `[N,M]` {0,1} valid steps.

    Returns:
      `[N,M]` float32 step advantages, 0 on masked steps, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> V = jnp.array([[0.5, 0.75, 0.25, 1.0]])
      >>> step_advantages(V, jnp.ones((1, 3))).tolist()
      [[0.25, -0.5, 0.75]]
    """
    return _boundary_differences(
        boundary_values, step_mask, where="step_advantages", name="boundary_values"
    )


def information_gain_rewards(p: ArrayLike, mask: ArrayLike) -> Array:
    """Turn rewards as the gain in the probability of the gold answer (IGPO; ALGORITHMS.md §11).

        r_k = p_{k+1} − p_k         on valid turns (0 elsewhere)

    `p_k` is the policy's probability of the ground-truth answer after `k` turns (`p_0`: from the
    prompt alone). Passing log-probabilities gives RLP's information gain of a chain of thought:
    `lp(next ∣ ctx, cot) − lp(next ∣ ctx)` with `p = [lp(next ∣ ctx), lp(next ∣ ctx, cot)]`.
    Same arithmetic as `step_advantages`; the sum over turns telescopes to `p_K − p_0`.

    Sources: IGPO (information-gain turn rewards; seed paper); RLP (reinforcement learning
    pre-training, information gain of a thought; seed paper). No peer.

    Args:
      p: `[N,M+1]` probabilities (or log-probabilities) of the gold answer at each boundary.
      mask: `[N,M]` {0,1} valid turns.

    Returns:
      `[N,M]` float32 turn rewards, 0 on masked turns, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = information_gain_rewards(jnp.array([[0.25, 0.5, 0.375]]), jnp.ones((1, 2)))
      >>> r.tolist()
      [[0.25, -0.125]]
    """
    return _boundary_differences(
        p, mask, where="information_gain_rewards", name="p", mask_name="mask"
    )


# --------------------------------------------------------------------------------------------------
# sibling and anchor-state advantages (SPO-tree, BranchGRPO, GiGPO)
# --------------------------------------------------------------------------------------------------


def sibling_advantages(
    child_values: ArrayLike,
    valid: ArrayLike | None = None,
    *,
    scale: Literal["none", "group"] = "none",
    eps: float = 1e-6,
    ddof: int = 1,
) -> Array:
    """Advantage of each child of a tree node relative to its siblings (ALGORITHMS.md §4.15).

        a_c = v_c − mean_{valid c'} v_{c'}                         scale="none"
        a_c = (v_c − mean) / (std_{valid c'}(v, ddof) + eps)       scale="group"

    over the last axis (the `C` children of one node). This is `group_advantages` with children in
    place of samples: nodes whose valid children all have the same value, or that have fewer
    than two valid children, give 0; invalid children give 0. `v_c` is a child's Monte-Carlo value
    (mean reward of the rollouts below it).

    Sources: "Segment Policy Optimization" (SPO-tree, arXiv 2505.23564); BranchGRPO (depth-wise
    tree advantages; seed paper). No peer.

    Args:
      child_values: `[..., C]` values of the children of each node, `C >= 2`.
      valid: optional `[..., C]` bool; False children leave the statistics and get 0.
      scale: "none" (centre only) or "group" (also divide by the siblings' std + eps).
      eps: added to the std (>= 0).
      ddof: delta degrees of freedom of the std (0 or 1).

    Returns:
      `[..., C]` float32 advantages under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> sibling_advantages(jnp.array([[1.0, 0.5, 0.0], [0.25, 0.75, 0.5]])).tolist()
      [[0.5, 0.0, -0.5], [-0.25, 0.25, 0.0]]
    """
    where = "sibling_advantages"
    check_choice(scale, ("none", "group"), "scale", where=where)
    check_choice(ddof, (0, 1), "ddof", where=where)
    check_positive(eps, "eps", where=where, allow_zero=True)
    check_real(child_values, "child_values", where=where)
    shape = jnp.shape(child_values)
    if len(shape) == 0:
        raise ValueError(f"{where}: `child_values` must have rank >= 1 ([..., C]), got a scalar.")
    if shape[-1] < 2:
        raise ValueError(
            f"{where}: nodes need C >= 2 children (last axis of `child_values`), got shape {shape}."
        )
    flat_valid = None
    if valid is not None:
        flat_valid = (as_mask(valid, shape, "valid", where=where) > 0).reshape(-1, shape[-1])
    flat = jnp.asarray(child_values).reshape(-1, shape[-1])
    adv = group_advantages(flat, scale=scale, eps=eps, ddof=ddof, valid=flat_valid)
    return adv.reshape(shape)


def anchor_state_advantages(
    step_returns: ArrayLike,
    state_ids: ArrayLike,
    step_mask: ArrayLike,
    *,
    G: int,
    scale: Literal["group", "none"] = "group",
    eps: float = 1e-6,
    ddof: int = 1,
) -> Array:
    """GiGPO step-level advantages: steps grouped by the environment state they start from.

    ALGORITHMS.md §4.17. Steps `(n, k)` of the `G` trajectories of one prompt `b(n)` (rows
    `b·G … b·G + G − 1`) that share a `state_id` form an anchor-state group, across trajectories
    and across step indices; over its valid members

        A_nk = (R_nk − μ_key) / (σ_key + eps)       scale="group"  (std with `ddof`)
        A_nk = R_nk − μ_key                         scale="none"

    Keys with one member give 0 (no comparison is possible), and so do keys whose returns are
    all equal (exactly 0, whatever `eps`). `state_ids` are environment states hashed to integers
    on the host (equal ids = the same state; hash to int32, since JAX's default integer is
    32-bit); `step_returns` are the discounted returns over the step layout
    (`discounted_returns(step_rewards, step_mask, gamma=γ)`). Cost: `O((G·M)²)` comparisons per
    prompt. The per-paper normalisation is (reconstructed — verify against the paper): we use the
    GRPO statistics (`ddof=1`, eps added to the std).

    Source: "Group-in-Group Policy Optimization for LLM Agent Training" (GiGPO, arXiv
    2505.10978). No peer.

    Args:
      step_returns: `[N,M]` return of each step, `N = B·G`.
      state_ids: `int[N,M]` anchor state of each step.
      step_mask: `[N,M]` {0,1} valid steps.
      G: static group size (trajectories per prompt), `G >= 1` and dividing `N`.
      scale: "group" or "none".
      eps: added to the key std (>= 0).
      ddof: delta degrees of freedom of the std (0 or 1).

    Returns:
      `[N,M]` float32 step advantages, 0 on masked steps, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> R = jnp.array([[1.0, 0.5], [0.0, 0.5]]); ids = jnp.array([[7, 8], [7, 9]])
      >>> anchor_state_advantages(R, ids, jnp.ones((2, 2)), G=2, scale="none").tolist()
      [[0.5, 0.0], [-0.5, 0.0]]
    """
    where = "anchor_state_advantages"
    check_choice(scale, ("group", "none"), "scale", where=where)
    check_choice(ddof, (0, 1), "ddof", where=where)
    check_positive(eps, "eps", where=where, allow_zero=True)
    R = _step_values(step_returns, "step_returns", where=where)
    N, M = R.shape
    if isinstance(G, bool) or not isinstance(G, int) or G < 1 or N % G:
        raise ValueError(
            f"{where}: `G` must be a positive Python int dividing N = {N} (rows of "
            f"`step_returns`), got {G!r}."
        )
    _check_integer(state_ids, "state_ids", where=where)
    if jnp.shape(state_ids) != (N, M):
        raise ValueError(
            f"{where}: `state_ids` must have the shape of `step_returns` {(N, M)}, "
            f"got {jnp.shape(state_ids)}."
        )
    valid = as_mask(step_mask, (N, M), "step_mask", where=where) > 0
    B, K = N // G, G * M
    # [N,M] -> [B,G,M] -> [B,G·M]: split the (possibly sharded) row axis, then merge G and M
    r, v, ids = (
        x.reshape(B, G, M).reshape(B, K)
        for x in (_zero_outside(R, valid), valid, jnp.asarray(state_ids))
    )
    same = (ids[:, :, None] == ids[:, None, :]) & v[:, :, None] & v[:, None, :]  # [B,K,K]
    adv = _keyed_standardise(r, v, same, scale=scale, eps=eps, ddof=ddof)
    return _sg(adv.reshape(B, G, M).reshape(N, M))


def _keyed_standardise(
    r: Array, v: Array, same: Array, *, scale: str, eps: Any, ddof: int
) -> Array:
    """Standardise `r[B,K]` within the groups given by the pairwise relation `same[B,K,K]`."""
    count = jnp.sum(same, axis=2).astype(r.dtype)
    mean = jnp.sum(jnp.where(same, r[:, None, :], 0.0), axis=2) / jnp.maximum(count, 1.0)
    diff = jnp.where(same, r[:, None, :] - mean[:, :, None], 0.0)
    var = jnp.sum(diff**2, axis=2) / jnp.maximum(count - ddof, 1.0)
    hi = jnp.max(jnp.where(same, r[:, None, :], -jnp.inf), axis=2)
    lo = jnp.min(jnp.where(same, r[:, None, :], jnp.inf), axis=2)
    keep = v & (count >= 2) & (hi > lo)
    centred = jnp.where(keep, r - mean, 0.0)
    if scale == "none":
        return centred
    den = jnp.sqrt(var) + eps
    return jnp.where(keep, centred / jnp.where(den > 0, den, 1.0), 0.0)


def dual_level_advantages(
    episode_adv: ArrayLike,
    step_adv: ArrayLike,
    step_mask: ArrayLike,
    *,
    step_weight: float = 1.0,
) -> Array:
    """Episode plus step advantages (GiGPO, OPRL, MatchTIR, ProRAG; ALGORITHMS.md §4.17).

        A_nk = (episode_adv_n + ω·step_adv_nk) · step_mask_nk

    `episode_adv` is the trajectory-level (group) advantage, e.g. `group_advantages` of the
    outcome; `step_adv` the step-level one (`anchor_state_advantages`, or implicit-PRM step
    rewards for OPRL). `ω = 0` gives the episode advantage on every valid step, and with all
    anchor states distinct the step term is 0, which gives the same. Broadcast to tokens with
    `segment_broadcast`. The per-paper weights are (reconstructed — verify against the paper);
    GiGPO uses `ω = 1`.

    Source: "Group-in-Group Policy Optimization for LLM Agent Training" (GiGPO, arXiv
    2505.10978); OPRL, MatchTIR, ProRAG (seed papers). No peer.

    Args:
      episode_adv: `[N]` (or `[B,G]`, flattened) episode advantages.
      step_adv: `[N,M]` step advantages.
      step_mask: `[N,M]` {0,1} valid steps.
      step_weight: ω (scalar, may be traced; >= 0 when static).

    Returns:
      `[N,M]` float32, 0 on masked steps, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> A = dual_level_advantages(jnp.array([1.0, -1.0]), jnp.array([[0.5, -0.5], [0.0, 2.0]]),
      ...                           jnp.array([[1, 1], [1, 0]]), step_weight=0.5)
      >>> A.tolist()
      [[1.25, 0.75], [-1.0, 0.0]]
    """
    where = "dual_level_advantages"
    check_positive(step_weight, "step_weight", where=where, allow_zero=True)
    check_real(step_weight, "step_weight", where=where)
    if jnp.ndim(step_weight) != 0:
        raise ValueError(
            f"{where}: `step_weight` must be a scalar, got shape {jnp.shape(step_weight)}."
        )
    S = _step_values(step_adv, "step_adv", where=where)
    N, M = S.shape
    check_real(episode_adv, "episode_adv", where=where)
    ep = as_float32(episode_adv)
    if ep.ndim == 2:
        ep = ep.reshape(-1)
    if ep.shape != (N,):
        raise ValueError(
            f"{where}: `episode_adv` must hold one value per row of `step_adv` ([N] or [B,G] "
            f"with N = {N}), got shape {jnp.shape(episode_adv)}."
        )
    valid = as_mask(step_mask, (N, M), "step_mask", where=where) > 0
    ep = _zero_outside(ep, jnp.any(valid, axis=1))
    w = jnp.asarray(step_weight).astype(S.dtype)
    return _sg(_zero_outside(ep[:, None] + w * _zero_outside(S, valid), valid))


# --------------------------------------------------------------------------------------------------
# process-reward credit on steps: min-form (PURE) and critique votes (CAPO)
# --------------------------------------------------------------------------------------------------


def step_min_form_returns(
    step_rewards: ArrayLike,
    segment_ids: ArrayLike,
    mask: ArrayLike,
    *,
    num_segments: int,
    reduce: Literal["last", "first", "sum", "mean", "max", "min"] = "last",
) -> Array:
    """PURE's min-form credit on step segments, broadcast to tokens (ALGORITHMS.md §4.13, §4.15).

        r_k   = segment_reduce(step_rewards, seg, m, op=reduce)[k]     (the PRM score of step k)
        ret_k = min{ r_j : j ≥ k, step j valid }                       (`min_form_returns`)
        out_t = ret_{seg_t} · m_t                                       (`segment_broadcast`)

    Every token of step `k` gets the worst step reward from step `k` on. Rewards are read from the
    tokens of each step with `reduce`: "last" takes the value on the step's last valid token
    (where PRM scores are usually placed), "sum" suits scores placed on one token of the step with
    zeros elsewhere. Valid tokens that belong to no segment (id −1) get 0. The combination with
    outcome rewards and baselines is the caller's and (reconstructed — verify against the paper).

    Source: "Stop Summation: Min-Form Credit Assignment Is All Process Reward Model Needs for
    Reasoning" (PURE, arXiv 2504.15275). No peer.

    Args:
      step_rewards: `[N,T]` per-token carrier of the step rewards.
      segment_ids: `int[N,T]` step of each token (e.g. `segment_ids_from_boundaries`).
      mask: `[N,T]` {0,1} valid tokens.
      num_segments: static maximum number of steps `M`.
      reduce: `segment_reduce` op that reads a step's reward from its tokens.

    Returns:
      `[N,T]` float32 token returns, 0 outside the mask, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[0.0, 0.9, 0.0, 0.2, 0.7, 0.0, 0.5]])
      >>> seg = jnp.array([[0, 0, 1, 1, 2, 3, 3]])
      >>> step_min_form_returns(r, seg, jnp.ones((1, 7)), num_segments=4).tolist()
      [[0.2, 0.2, 0.2, 0.2, 0.5, 0.5, 0.5]]
    """
    where = "step_min_form_returns"
    check_choice(reduce, SEGMENT_OPS, "reduce", where=where)
    _check_num_segments(num_segments, where=where)
    rewards = _sg(_step_values(step_rewards, "step_rewards", where=where))
    _check_integer(segment_ids, "segment_ids", where=where)
    if jnp.shape(segment_ids) != rewards.shape:
        raise ValueError(
            f"{where}: `segment_ids` must have the shape of `step_rewards` {rewards.shape}, "
            f"got {jnp.shape(segment_ids)}."
        )
    per_step, present = segment_reduce(
        rewards, segment_ids, mask, num_segments=num_segments, op=reduce
    )
    returns = min_form_returns(per_step, present, completion_mask=present)
    return _sg(segment_broadcast(returns, segment_ids, mask))


def critique_token_rewards(
    outcome: ArrayLike,
    votes: ArrayLike,
    segment_ids: ArrayLike,
    mask: ArrayLike,
    *,
    threshold: float,
    penalty: float,
) -> Array:
    """Token rewards from generative-critique votes on steps (CAPO; ALGORITHMS.md §11).

        flag_k = [Σ_j votes_kj ≥ threshold]                  (K critiques vote on each step k)
        r_t    = (outcome_n − penalty·flag_{seg_t}) · m_t

    Every valid token carries the outcome reward; tokens of a step that at least `threshold` of
    the `K` critiques flag as erroneous also pay `penalty`. Votes are {0,1} (bool, int or float;
    fractional votes add up as expected counts). `threshold = 1` flags a step any critique
    flags, `threshold = K` only unanimous ones (CAPO's intersection vote), `K/2 < threshold` a
    majority. Valid tokens of no segment are never flagged. The vote rule and the penalty are
    (reconstructed — verify against the paper).

    Source: "CAPO: Towards Enhancing LLM Reasoning through Generative Credit Assignment"
    (arXiv 2508.02298). No peer.

    Args:
      outcome: `[N]` outcome reward of each response.
      votes: `[N,M,K]` critique `j`'s verdict that step `k` is wrong (1) or not (0).
      segment_ids: `int[N,T]` step of each token.
      mask: `[N,T]` {0,1} valid tokens.
      threshold: number of votes that flags a step (> 0).
      penalty: reward subtracted on flagged steps (>= 0).

    Returns:
      `[N,T]` float32 token rewards, 0 outside the mask, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> votes = jnp.array([[[1, 1, 0], [0, 0, 1]]])      # step 0: 2 of 3 votes, step 1: 1
      >>> seg = jnp.array([[0, 0, 1, 1]])
      >>> critique_token_rewards(jnp.array([1.0]), votes, seg, jnp.ones((1, 4)),
      ...                        threshold=2, penalty=0.5).tolist()
      [[0.5, 0.5, 1.0, 1.0]]
    """
    where = "critique_token_rewards"
    check_positive(threshold, "threshold", where=where)
    check_positive(penalty, "penalty", where=where, allow_zero=True)
    check_rank(votes, 3, "votes", where=where)
    check_real(votes, "votes", where=where)
    check_rank(outcome, 1, "outcome", where=where)
    check_real(outcome, "outcome", where=where)
    N = jnp.shape(votes)[0]
    if jnp.shape(outcome) != (N,):
        raise ValueError(
            f"{where}: `outcome` must hold one reward per row of `votes` ({N},), "
            f"got shape {jnp.shape(outcome)}."
        )
    check_rank(segment_ids, 2, "segment_ids", where=where)
    if jnp.shape(segment_ids)[0] != N:
        raise ValueError(
            f"{where}: `segment_ids` must have one row per row of `votes` ({N}), "
            f"got shape {jnp.shape(segment_ids)}."
        )
    counts = jnp.sum(as_float32(votes), axis=2)
    flagged = (counts >= threshold).astype(jnp.float32)
    flag_tokens = segment_broadcast(flagged, segment_ids, mask)
    valid = as_mask(mask, jnp.shape(segment_ids), where=where) > 0
    r = _zero_outside(as_float32(outcome), jnp.any(valid, axis=1))
    pen = jnp.asarray(penalty).astype(r.dtype)
    return _sg(_zero_outside(r[:, None] - pen * flag_tokens, valid))


def budget_weighted_returns(rewards: ArrayLike, prior: ArrayLike) -> Array:
    """Expected reward under a prior over thinking budgets (AnytimeReasoner; ALGORITHMS.md §11).

        R_n = Σ_j p_j · r_nj

    `r_nj` is the reward of response `n` when its thinking is truncated at budget `j` (and the
    answer is forced), `p` a prior over the `J` budgets (normally summing to 1; used as given).
    Dense per-budget rewards credit early correct reasoning, not only the final answer.

    Source: AnytimeReasoner (budget-prior returns; seed paper). No peer.

    Args:
      rewards: `[N,J]` reward of each response at each budget.
      prior: `[J]` budget prior.

    Returns:
      `[N]` float32 returns, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
      >>> budget_weighted_returns(r, jnp.array([0.25, 0.25, 0.5])).tolist()
      [0.75, 0.5]
    """
    where = "budget_weighted_returns"
    r = _step_values(rewards, "rewards", where=where)
    check_rank(prior, 1, "prior", where=where)
    check_real(prior, "prior", where=where)
    J = r.shape[1]
    if jnp.shape(prior) != (J,):
        raise ValueError(
            f"{where}: `prior` must have shape (J,) = ({J},) for `rewards` of shape {r.shape}, "
            f"got {jnp.shape(prior)}."
        )
    p = replicated(as_float32(prior)).astype(r.dtype)
    return _sg(jnp.sum(_sg(r) * p[None, :], axis=1))
