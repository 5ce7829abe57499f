"""Token-level DPO: implicit token rewards and token-guided DPO (ALGORITHMS.md §8.8, §8.10).

A DPO-trained policy defines a reward for every token, `β·(lp − ref)`, whose sum over a response is
the sequence implicit reward `β·lr` of `dpo_loss` ("From r to Q*"). `dpo_token_rewards` returns
them (for RTO's PPO reward, OPRL and the implicit PRM); `tgdpo_loss` uses such rewards of a
previously trained model to weight each token's log-ratio inside the DPO margin.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_finite,
    check_floating,
    check_positive,
    check_rank,
    check_real,
)
from losses._policy import zero_outside
from losses._preference import (
    batch_mean,
    pair_mean,
    pair_valid,
    pair_weights_array,
    reward_metrics,
)


def _per_row(value: Any, name: str, N: int, *, where: str) -> Array:
    """A scalar or `[N]` hyperparameter as an `[N,1]` column (stop-gradient)."""
    check_real(value, name, where=where)
    x = jax.lax.stop_gradient(as_float32(value))
    if x.ndim == 0:
        return jnp.broadcast_to(x, (N, 1))
    if x.shape != (N,):
        raise ValueError(f"{where}: `{name}` must be a scalar or have shape ({N},), got {x.shape}.")
    return x[:, None]


def _token_inputs(
    a: Any, b: Any, mask: Any, names: tuple[str, str, str], *, where: str
) -> tuple[Array, Array, Array]:
    """Validate two `[N,T]` float arrays and their mask; float32, zero outside the mask."""
    check_rank(a, 2, names[0], where=where)
    check_floating(a, names[0], where=where)
    check_floating(b, names[1], where=where)
    if jnp.shape(b) != jnp.shape(a):
        raise ValueError(
            f"{where}: `{names[1]}` must have the shape of `{names[0]}` {jnp.shape(a)}, "
            f"got {jnp.shape(b)}."
        )
    m = as_mask(mask, jnp.shape(a), names[2], where=where)
    return zero_outside(as_float32(a), m > 0), zero_outside(as_float32(b), m > 0), m


def dpo_token_rewards(
    logp: ArrayLike,
    ref_logp: ArrayLike,
    mask: ArrayLike,
    *,
    beta: float | ArrayLike = 0.1,
) -> Array:
    """Token-level implicit rewards of a DPO policy: `β·(lp − ref)·m` (ALGORITHMS.md §8.8).

        r_nt = β_n·(lp_nt − ref_nt)·m_nt,      Σ_t r_nt = β_n·lr_n  (the sequence implicit reward)

    A DPO-trained language model is a token-level soft Q-function; these per-token rewards
    telescope to the reward that `dpo_loss` compares. Masked entries are replaced by 0 before the
    difference, so NaN/inf in padding never leaks. Differentiable w.r.t. both inputs: wrap the
    result in `jax.lax.stop_gradient` to use it as rewards (RTO, TGDPO, OPRL).

    Source: "From r to Q*: Your Language Model is Secretly a Q-Function" (arXiv 2404.12358). Used
    by RTO ("DPO Meets PPO: Reinforced Token Optimization for RLHF", arXiv 2404.18922) with
    `losses.kl_penalized_rewards`, and by the implicit PRM (`implicit_process_rewards`).

    Args:
      logp: `[N,T]` token log-probs of the DPO policy.
      ref_logp: `[N,T]` token log-probs of its reference.
      mask: `[N,T]` {0,1} completion tokens.
      beta: `β > 0`, scalar or `[N]`.

    Returns:
      `[N,T]` float32 rewards, 0 outside the mask.

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-1.0, -2.0, jnp.nan]]); ref = jnp.array([[-1.5, -1.0, 0.0]])
      >>> dpo_token_rewards(lp, ref, jnp.array([[1, 1, 0]]), beta=0.5).tolist()
      [[0.25, -0.5, 0.0]]
    """
    where = "dpo_token_rewards"
    check_positive(beta, "beta", where=where)
    lp, ref, m = _token_inputs(logp, ref_logp, mask, ("logp", "ref_logp", "mask"), where=where)
    b = _per_row(beta, "beta", lp.shape[0], where=where)
    return zero_outside(b * (lp - ref), m > 0)


def tgdpo_loss(
    chosen_token_lr: ArrayLike,
    chosen_mask: ArrayLike,
    rejected_token_lr: ArrayLike,
    rejected_mask: ArrayLike,
    chosen_token_rewards: ArrayLike,
    rejected_token_rewards: ArrayLike,
    *,
    beta: float = 0.1,
    alpha: float,
    valid: ArrayLike | None = None,
    pair_weights: ArrayLike | None = None,
    num_pairs: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """TGDPO: DPO whose per-token β is guided by token rewards (ALGORITHMS.md §8.10).

        h_c  = Σ_t β·(1 + α·r̂_c,t)·lr_c,t·m_c,t
        h_r  = Σ_t β·(1 − α·r̂_r,t)·lr_r,t·m_r,t
        loss = mean_i −logσ(h_c,i − h_r,i)

    `lr_t = lp_t − ref_t` are the token log-ratios of the policy being trained and `r̂` the
    token rewards of a previously trained DPO model (`dpo_token_rewards`, no gradient): tokens
    the guide finds good in the chosen response (and bad in the rejected one) may deviate more
    from the reference. α = 0 is `dpo_loss(loss_type="sigmoid")` on the sequence sums.

    (reconstructed — verify against the paper): the exact token-reward guidance function of the
    paper (here `1 ± α·r̂`) and any normalisation of `r̂` (here none: pass normalised rewards if
    wanted) are our assumptions; `alpha` is required because no default is recorded.

    Source: "TGDPO: Harnessing Token-Level Reward Guidance for Enhancing Direct Preference
    Optimization" (arXiv 2506.14574). No peer.

    Args:
      chosen_token_lr: `[N,T_c]` token log-ratios `lp − ref` of the chosen responses
        (differentiable).
      chosen_mask: `[N,T_c]` {0,1}.
      rejected_token_lr: `[N,T_r]` token log-ratios of the rejected responses.
      rejected_mask: `[N,T_r]` {0,1}.
      chosen_token_rewards: `[N,T_c]` guide token rewards `r̂_c` (no gradient).
      rejected_token_rewards: `[N,T_r]` guide token rewards `r̂_r` (no gradient).
      beta: `β > 0`.
      alpha: guidance strength `α` (required).
      valid: optional `[N]` {0,1}; invalid pairs are ignored.
      pair_weights: optional `[N]` non-negative weights (stop-gradient).
      num_pairs: global count of valid pairs; None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar; `pref/reward_chosen` (mean `β·Σ lr_c`),
      `pref/reward_rejected`, `pref/margin`, `pref/accuracy` (`mean[Σ lr_c > Σ lr_r]`) of the
      unguided implicit rewards, and `pref/guided_margin` (mean `h_c − h_r`).

    Examples:
      >>> import jax.numpy as jnp
      >>> lr_c = jnp.array([[0.5, 0.5]]); lr_r = jnp.array([[-0.5, -0.5]]); m = jnp.ones((1, 2))
      >>> r0 = jnp.zeros((1, 2))
      >>> loss, _ = tgdpo_loss(lr_c, m, lr_r, m, r0, r0, beta=0.1, alpha=1.0)
      >>> round(float(loss), 6)  # r̂ = 0: DPO with Δ = 2
      0.598139
    """
    where = "tgdpo_loss"
    check_positive(beta, "beta", where=where)
    if jnp.ndim(beta) or jnp.ndim(alpha):
        raise ValueError(f"{where}: `beta` and `alpha` must be scalars.")
    check_real(alpha, "alpha", where=where)
    check_finite(alpha, "alpha", where=where)
    lr_c, rw_c, _ = _token_inputs(
        chosen_token_lr,
        chosen_token_rewards,
        chosen_mask,
        ("chosen_token_lr", "chosen_token_rewards", "chosen_mask"),
        where=where,
    )
    lr_r, rw_r, _ = _token_inputs(
        rejected_token_lr,
        rejected_token_rewards,
        rejected_mask,
        ("rejected_token_lr", "rejected_token_rewards", "rejected_mask"),
        where=where,
    )
    N = lr_c.shape[0]
    if lr_r.shape[0] != N:
        raise ValueError(
            f"{where}: `rejected_token_lr` must have N = {N} rows like `chosen_token_lr`, "
            f"got shape {lr_r.shape}."
        )
    v = pair_valid(valid, (N,), where=where)
    rows = v[:, None] > 0  # invalid pairs: their tokens are replaced by 0 as well
    lr_c, lr_r = zero_outside(lr_c, rows), zero_outside(lr_r, rows)
    rw_c = jax.lax.stop_gradient(zero_outside(rw_c, rows))
    rw_r = jax.lax.stop_gradient(zero_outside(rw_r, rows))
    b = jax.lax.stop_gradient(as_float32(beta))
    a = jax.lax.stop_gradient(as_float32(alpha))
    h_c = jnp.sum(b * (1.0 + a * rw_c) * lr_c, axis=1)
    h_r = jnp.sum(b * (1.0 - a * rw_r) * lr_r, axis=1)
    pw = pair_weights_array(pair_weights, v, where=where)
    loss = pair_mean(-jax.nn.log_sigmoid(h_c - h_r), pw, num_pairs, v, where=where)
    seq_c, seq_r = jnp.sum(lr_c, axis=1), jnp.sum(lr_r, axis=1)
    metrics = reward_metrics(b * seq_c, b * seq_r, v)
    metrics["pref/guided_margin"] = jax.lax.stop_gradient(batch_mean(h_c - h_r, v))
    return loss, metrics
