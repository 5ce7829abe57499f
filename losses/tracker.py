"""A persistent per-prompt Beta value tracker and its baseline advantages (single-stream SPO,
ALGORITHMS.md §11).

Group estimators need `G` samples of a prompt in the same batch; a single-stream method samples one
response per prompt and takes its baseline from a tracker that persists across steps. The state is
a NamedTuple pytree `BetaTrackerState(alpha[P], beta[P])` over a static number `P` of prompts,
carried in the train state like the KL coefficient: `init_beta_tracker` creates it,
`tracker_advantages` reads the baseline `α/(α + β)` of each sampled prompt *before* the update,
and `beta_tracker_update` folds in the batch's rewards. Both are pure and jittable; prompt ids are
integer indices in `[0, P)` (rows with other ids are ignored, since traced ids cannot be checked).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.sharding import PartitionSpec
from jaxtyping import ArrayLike

from losses._checks import as_float32, as_mask, check_positive, check_rank, check_real
from losses.advantages import _explicit_mesh
from losses.masked import masked_whiten


class BetaTrackerState(NamedTuple):
    """Per-prompt Beta posterior of the success probability: `p ~ Beta(alpha, beta)`.

    A pytree (it travels through `jax.jit`, `lax.scan` and checkpoints); the tracked success
    probability of prompt `p` is `alpha[p] / (alpha[p] + beta[p])`.

    Examples:
      >>> import jax.numpy as jnp
      >>> state = BetaTrackerState(alpha=jnp.array([3.0, 1.0]), beta=jnp.array([1.0, 1.0]))
      >>> (state.alpha / (state.alpha + state.beta)).tolist()
      [0.75, 0.5]
    """

    alpha: Array  # [P] float32, pseudo-count of successes
    beta: Array  # [P] float32, pseudo-count of failures


def init_beta_tracker(num_prompts: int, *, alpha: Any = 1.0, beta: Any = 1.0) -> BetaTrackerState:
    """A tracker for `num_prompts` prompts with prior `Beta(alpha, beta)` (default uniform).

    Pass per-prompt arrays `[P]` to start from offline estimates, e.g. `alpha = n0·p̂`,
    `beta = n0·(1 − p̂)` from `n0` samples of the initial policy (SPO initialises its tracker from
    such an offline pass; the choice of `n0` is the recipe's).

    Args:
      num_prompts: static number of prompts `P` (> 0).
      alpha: prior successes, scalar or `[P]` (> 0 when static).
      beta: prior failures, scalar or `[P]` (> 0 when static).

    Returns:
      `BetaTrackerState` with float32 `[P]` fields.

    Examples:
      >>> state = init_beta_tracker(3, alpha=2.0, beta=6.0)
      >>> state.alpha.tolist(), state.beta.tolist()
      ([2.0, 2.0, 2.0], [6.0, 6.0, 6.0])
    """
    where = "init_beta_tracker"
    if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
        raise ValueError(
            f"{where}: `num_prompts` must be a positive Python int, got {num_prompts!r}."
        )
    fields = []
    for name, value in (("alpha", alpha), ("beta", beta)):
        check_real(value, name, where=where)
        check_positive(value, name, where=where)
        if jnp.ndim(value) not in (0, 1) or (
            jnp.ndim(value) == 1 and jnp.shape(value) != (num_prompts,)
        ):
            raise ValueError(
                f"{where}: `{name}` must be a scalar or have shape [P] = ({num_prompts},), "
                f"got shape {jnp.shape(value)}."
            )
        fields.append(jnp.broadcast_to(jnp.asarray(value, jnp.float32), (num_prompts,)))
    return BetaTrackerState(*fields)


def _check_state(state: Any, *, where: str) -> int:
    if not isinstance(state, BetaTrackerState):
        raise ValueError(
            f"{where}: `state` must be a BetaTrackerState (see init_beta_tracker), "
            f"got {type(state).__name__}."
        )
    check_rank(state.alpha, 1, "state.alpha", where=where)
    if jnp.shape(state.beta) != jnp.shape(state.alpha):
        raise ValueError(
            f"{where}: `state.beta` must have the shape of `state.alpha` "
            f"{jnp.shape(state.alpha)}, got {jnp.shape(state.beta)}."
        )
    return jnp.shape(state.alpha)[0]


def _prompt_ids(prompt_ids: Any, num_prompts: int, *, where: str) -> tuple[Array, Array]:
    """Validate `prompt_ids[N]`; return `(ids, in_range)` with out-of-range ids replaced by 0."""
    check_rank(prompt_ids, 1, "prompt_ids", where=where)
    if not jnp.issubdtype(jnp.result_type(prompt_ids), jnp.integer):
        raise ValueError(
            f"{where}: `prompt_ids` must be an integer array, got dtype "
            f"{jnp.result_type(prompt_ids)}."
        )
    ids = jnp.asarray(prompt_ids)
    in_range = (ids >= 0) & (ids < num_prompts)
    return jnp.where(in_range, ids, 0), in_range


def _batch_inputs(
    prompt_ids: Any, rewards: Any, valid: Any, num_prompts: int, *, where: str
) -> tuple[Array, Array, Array]:
    """Validate `prompt_ids[N]`, `rewards[N]`, `valid[N]`; return `(ids, r, v)`.

    Rows with an id outside `[0, P)` are marked invalid and get the safe id 0; `r` is float32,
    zero on invalid rows, under stop-gradient; `v` is bool.
    """
    ids, v = _prompt_ids(prompt_ids, num_prompts, where=where)
    check_rank(rewards, 1, "rewards", where=where)
    check_real(rewards, "rewards", where=where)
    if jnp.shape(rewards) != jnp.shape(ids):
        raise ValueError(
            f"{where}: `rewards` must have the shape of `prompt_ids` {jnp.shape(ids)}, "
            f"got {jnp.shape(rewards)}."
        )
    if valid is not None:
        v = v & (as_mask(valid, jnp.shape(ids), "valid", where=where) > 0)
    r = jax.lax.stop_gradient(jnp.where(v, as_float32(rewards), 0.0))
    return ids, r, v


def _per_prompt_sum(x: Array, ids: Array, num_prompts: int) -> Array:
    """`Σ_n x_n [id_n = p]` as `[P]` (replicated under an explicit mesh)."""
    out_sharding = PartitionSpec() if _explicit_mesh() else None
    return jax.ops.segment_sum(x, ids, num_segments=num_prompts, out_sharding=out_sharding)


def _like(x: Array, reference: Array) -> Array:
    """`x` resharded like `reference` under an explicit mesh (the state may be sharded over P)."""
    if _explicit_mesh():
        return jax.sharding.reshard(x, jax.typeof(reference).sharding.spec)
    return x


def _gather(values: Array, ids: Array) -> Array:
    """`values[ids]` keeping the sharding of `ids` under an explicit mesh."""
    if _explicit_mesh():
        values = jax.sharding.reshard(values, PartitionSpec(None))
        return values.at[ids].get(out_sharding=jax.typeof(ids).sharding.spec)
    return values[ids]


def tracker_baseline(state: BetaTrackerState, prompt_ids: ArrayLike) -> Array:
    """The tracked success probability `α/(α + β)` of each row's prompt: `[N]`.

    Rows with an id outside `[0, P)` get 0.

    Args:
      state: the tracker.
      prompt_ids: `int[N]` prompt index of each row.

    Returns:
      `[N]` float32 baselines under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> state = BetaTrackerState(jnp.array([1.0, 3.0]), jnp.array([3.0, 1.0]))
      >>> tracker_baseline(state, jnp.array([1, 0, 1])).tolist()
      [0.75, 0.25, 0.75]
    """
    where = "tracker_baseline"
    P = _check_state(state, where=where)
    ids, v = _prompt_ids(prompt_ids, P, where=where)
    alpha = as_float32(state.alpha)
    total = alpha + as_float32(state.beta)
    mean = alpha / jnp.where(total > 0, total, 1.0)
    return jax.lax.stop_gradient(jnp.where(v, _gather(mean, ids), 0.0))


def beta_tracker_update(
    state: BetaTrackerState,
    prompt_ids: ArrayLike,
    rewards: ArrayLike,
    *,
    discount: Any,
    valid: ArrayLike | None = None,
) -> BetaTrackerState:
    """Fold a batch of rewards into the per-prompt Beta tracker (single-stream SPO, §11).

    For every prompt `p` that occurs in the batch (valid rows only), with `ρ` the discount:

        α_p ← ρ_p·α_p + Σ_{n: id_n = p} r_n
        β_p ← ρ_p·β_p + Σ_{n: id_n = p} (1 − r_n)

    Prompts not in the batch keep their state (no discount: the evidence about a prompt ages only
    when it is revisited). Rewards are success indicators or probabilities in [0, 1] (not checked
    when traced). `ρ = 1` accumulates counts (a stationary posterior); smaller `ρ` forgets faster.

    Source: "Single-stream Policy Optimization" (SPO, arXiv 2509.13232), whose KL-adaptive tracker
    discounts each prompt's pseudo-counts by a factor that shrinks with the policy's KL drift since
    the prompt was last seen (`ρ = 2^{−D/D_half}`, clipped). The caller computes that discount
    (scalar or per prompt); discounting once per step for repeated ids is
    (reconstructed — verify against the paper). Peer: verl's SPO recipe (`recipe/spo`).

    Args:
      state: the tracker (`init_beta_tracker`).
      prompt_ids: `int[N]` prompt index of each row, in `[0, P)`.
      rewards: `[N]` rewards in [0, 1].
      discount: `ρ` in [0, 1], a scalar or `[P]` per prompt (may be traced).
      valid: optional `[N]` bool; invalid rows do not update the tracker.

    Returns:
      The updated `BetaTrackerState` (float32 `[P]` fields).

    Examples:
      >>> import jax.numpy as jnp
      >>> state = init_beta_tracker(2)
      >>> state = beta_tracker_update(state, jnp.array([0, 0, 1]), jnp.array([1.0, 1.0, 0.0]), discount=0.5)
      >>> state.alpha.tolist(), state.beta.tolist()
      ([2.5, 0.5], [0.5, 1.5])
    """
    where = "beta_tracker_update"
    P = _check_state(state, where=where)
    check_real(discount, "discount", where=where)
    if isinstance(discount, bool) or (
        isinstance(discount, int | float) and not 0.0 <= discount <= 1.0
    ):
        raise ValueError(f"{where}: `discount` must be in [0, 1], got {discount!r}.")
    if jnp.ndim(discount) != 0 and jnp.shape(discount) != (P,):
        raise ValueError(
            f"{where}: `discount` must be a scalar or have shape [P] = ({P},), "
            f"got {jnp.shape(discount)}."
        )
    ids, r, v = _batch_inputs(prompt_ids, rewards, valid, P, where=where)
    alpha = as_float32(state.alpha)
    beta = as_float32(state.beta)
    weight = v.astype(jnp.float32)
    hits = _like(_per_prompt_sum(weight, ids, P), alpha)
    successes = _like(_per_prompt_sum(r, ids, P), alpha)
    failures = _like(_per_prompt_sum(weight - r, ids, P), alpha)
    rho = jax.lax.stop_gradient(as_float32(discount))
    if rho.ndim:
        rho = _like(rho, alpha)
    seen = hits > 0
    return BetaTrackerState(
        alpha=jax.lax.stop_gradient(jnp.where(seen, rho * alpha + successes, alpha)),
        beta=jax.lax.stop_gradient(jnp.where(seen, rho * beta + failures, beta)),
    )


def tracker_advantages(
    state: BetaTrackerState,
    prompt_ids: ArrayLike,
    rewards: ArrayLike,
    *,
    valid: ArrayLike | None = None,
    normalize: bool = True,
    ddof: int = 1,
    eps: float = 1e-8,
) -> Array:
    """Single-stream advantages: reward minus the tracked baseline, whitened over the batch (§11).

        b_n = α_{id_n} / (α_{id_n} + β_{id_n})           (state *before* this batch's update)
        A   = masked_whiten(r − b, valid, ddof, eps)     (normalize=True; else r − b)

    Call it before `beta_tracker_update`, so that a sample's own reward is not in its baseline.
    The whitening runs over all valid rows of the (global) batch, replacing GRPO's per-group
    statistics ("global advantage normalisation"); invalid rows and rows with an id outside
    `[0, P)` get 0. Broadcast to tokens with `losses.broadcast_to_tokens`.

    Source: "Single-stream Policy Optimization" (SPO, arXiv 2509.13232). Using `masked_whiten`'s
    defaults (ddof 1, eps 1e-8 added to the variance) for the global normalisation is
    (reconstructed — verify against the paper). Peer: verl's SPO recipe (`recipe/spo`).

    Args:
      state: the tracker.
      prompt_ids: `int[N]` prompt index of each row.
      rewards: `[N]` rewards.
      valid: optional `[N]` bool.
      normalize: whiten over the batch (True) or return `r − b`.
      ddof: delta degrees of freedom of the batch variance.
      eps: added to the batch variance.

    Returns:
      `[N]` float32 advantages under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> state = BetaTrackerState(jnp.array([3.0, 1.0]), jnp.array([1.0, 3.0]))
      >>> a = tracker_advantages(state, jnp.array([0, 1, 1]), jnp.array([1.0, 1.0, 0.0]), normalize=False)
      >>> a.tolist()
      [0.25, 0.75, -0.25]
    """
    where = "tracker_advantages"
    P = _check_state(state, where=where)
    if not isinstance(normalize, bool):
        raise ValueError(f"{where}: `normalize` must be a bool, got {normalize!r}.")
    check_positive(eps, "eps", where=where, allow_zero=True)
    ids, r, v = _batch_inputs(prompt_ids, rewards, valid, P, where=where)
    baseline = tracker_baseline(state, jnp.where(v, ids, -1))
    centred = jnp.where(v, r - baseline, 0.0)
    if normalize:
        centred = masked_whiten(centred, v, ddof=ddof, eps=eps)
    return jax.lax.stop_gradient(centred)
