"""Unpaired (binary-feedback) preference losses: KTO and BCO (ALGORITHMS.md §8.5, §8.6).

Desirable ("chosen", `[N_D]`) and undesirable ("rejected", `[N_U]`) examples need not come in
pairs: the two sides have their own lengths and their own optional validity masks
(`chosen_valid`, `rejected_valid`). Inputs are sequence log-prob sums of the policy and of the
frozen reference; `lr = π − ref` is the implicit reward divided by β. The reference point /
reward shift (`kl` for KTO, `delta` for BCO) is computed outside the loss
(`kto_reference_point`, `losses.running_moments_update`) and carries no gradient.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_choice, check_positive, check_rank, global_count
from losses._policy import stop_gradient_metrics
from losses._preference import (
    batch_mean,
    check_scalar,
    pair_array,
    pair_valid,
)

KTO_LOSS_TYPES: tuple[str, ...] = ("kto", "apo_zero_unpaired")


def _check_scalar_beta(beta: Any, *, where: str) -> None:
    check_positive(beta, "beta", where=where)
    if jnp.ndim(beta) != 0:
        raise ValueError(
            f"{where}: `beta` must be a scalar (the two sides are unpaired), got shape "
            f"{jnp.shape(beta)}."
        )


def _side_counts(v_d: Array, v_u: Array) -> dict[str, Array]:
    """Each side's valid examples, the weights of its mean metric (`count/<metric>`)."""
    return {
        "count/pref/reward_chosen": jnp.sum(v_d).astype(jnp.float32),
        "count/pref/reward_rejected": jnp.sum(v_u).astype(jnp.float32),
    }


def _side(logp: Any, ref_logp: Any, valid: Any, side: str, *, where: str) -> tuple[Array, Array]:
    """One side (desirable `side="chosen"` or undesirable `"rejected"`, which names the
    arguments in errors): `(lr, v)` with `lr = π − sg(ref)`, zero off-valid."""
    check_rank(logp, 1, f"{side}_logp", where=where)
    v = pair_valid(valid, jnp.shape(logp), where=where, name=f"{side}_valid")
    pi = pair_array(logp, f"{side}_logp", v, where=where)
    ref = pair_array(ref_logp, f"ref_{side}_logp", v, where=where, differentiable=False)
    return pi - ref, v


def kto_reference_point(
    kl_logp: ArrayLike,
    kl_ref_logp: ArrayLike,
    *,
    valid: ArrayLike | None = None,
) -> Array:
    """KTO's reference point `z = sg(max(mean(kl_logp − kl_ref_logp), 0))` (ALGORITHMS.md §8.5).

    A batch estimate of `KL(π ‖ π_ref)` from mismatched pairs: each prompt with another example's
    completion (TRL pairs each prompt with the previous example's completion), scored by the
    policy (`kl_logp`) and the reference (`kl_ref_logp`). The mean runs over the valid entries
    of the whole (global, under `jax.jit` on sharded inputs) batch and is clamped at 0; the
    result carries no gradient.

    Source: "KTO: Model Alignment as Prospect Theoretic Optimization" (arXiv 2402.01306). Peer:
    TRL `KTOTrainer` (its `KL` estimate, gathered across processes).

    Args:
      kl_logp: `[M]` policy log-prob sums of the mismatched (prompt, completion) pairs.
      kl_ref_logp: `[M]` reference log-prob sums of the same pairs.
      valid: optional `[M]` {0,1}; invalid entries are ignored.

    Returns:
      A float32 scalar `z ≥ 0` under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(kto_reference_point(jnp.array([-5.0, -7.0]), jnp.array([-5.5, -7.3]))), 6)
      0.4
      >>> float(kto_reference_point(jnp.array([-5.0]), jnp.array([-4.0])))  # clamped at 0
      0.0
    """
    where = "kto_reference_point"
    check_rank(kl_logp, 1, "kl_logp", where=where)
    v = pair_valid(valid, jnp.shape(kl_logp), where=where)
    lp = pair_array(kl_logp, "kl_logp", v, where=where)
    ref = pair_array(kl_ref_logp, "kl_ref_logp", v, where=where)
    return jax.lax.stop_gradient(jnp.maximum(batch_mean(lp - ref, v), 0.0))


def kto_loss(
    chosen_logp: ArrayLike,
    rejected_logp: ArrayLike,
    ref_chosen_logp: ArrayLike,
    ref_rejected_logp: ArrayLike,
    *,
    kl: ArrayLike | None,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    loss_type: str = "kto",
    chosen_valid: ArrayLike | None = None,
    rejected_valid: ArrayLike | None = None,
    num_examples: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Kahneman–Tversky Optimization on unpaired desirable/undesirable examples (§8.5).

    With `lr = π − ref` and the reference point `z = kl` (from `kto_reference_point`, no
    gradient):

        kto:                desirable  λ_D·(1 − σ(β(lr − z)))     undesirable  λ_U·(1 − σ(β(z − lr)))
        apo_zero_unpaired:  desirable  λ_D·(1 − σ(β·lr))          undesirable  λ_U·σ(β·lr)
        loss = (Σ_desirable + Σ_undesirable) / D,   D = num_examples or #valid examples (N_D + N_U)

    The value function is bounded and saturates away from `z`: examples already far on the right
    side of the reference point stop pulling. The paper recommends
    `λ_D·n_D / (λ_U·n_U) ∈ [1, 4/3]` (not enforced: the counts may be traced).
    `apo_zero_unpaired` ("Anchored Preference Optimization", arXiv 2408.06266) does not read `kl`:
    pass `kl=None` or a value, which is then only reported as `pref/kl`.

    Source: "KTO: Model Alignment as Prospect Theoretic Optimization" (arXiv 2402.01306). Peer:
    TRL `KTOConfig(loss_type="kto" | "apo_zero_unpaired", beta, desirable_weight,
    undesirable_weight)`.

    Args:
      chosen_logp: `[N_D]` policy log-prob sums of the desirable examples (differentiable).
      rejected_logp: `[N_U]` policy log-prob sums of the undesirable examples.
      ref_chosen_logp: `[N_D]` reference log-prob sums of the desirable examples.
      ref_rejected_logp: `[N_U]` reference log-prob sums of the undesirable examples.
      kl: the scalar reference point `z` (required for "kto"; may be None for
        "apo_zero_unpaired").
      beta: `β > 0`.
      desirable_weight: `λ_D ≥ 0`.
      undesirable_weight: `λ_U ≥ 0`.
      loss_type: "kto" or "apo_zero_unpaired".
      chosen_valid: optional `[N_D]` {0,1}; invalid desirable examples are ignored.
      rejected_valid: optional `[N_U]` {0,1}; invalid undesirable examples are ignored.
      num_examples: global count `D` of valid examples of both kinds; None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar; `pref/reward_chosen` (mean `β·lr` of the desirable
      examples), `pref/reward_rejected` (undesirable), `pref/margin` (their difference),
      `pref/accuracy` (fraction of examples on their side of the reference point:
      `lr > z` for desirable, `lr < z` for undesirable; `z = 0` for apo_zero_unpaired), `pref/kl`,
      and `count/pref/reward_chosen`, `count/pref/reward_rejected` (each side's valid
      examples: the weights that reduce the per-side means exactly over micro-batches).

    Examples:
      >>> import jax.numpy as jnp
      >>> lr_d, lr_u = jnp.array([0.5, 0.2]), jnp.array([-0.3])
      >>> loss, m = kto_loss(lr_d, lr_u, jnp.zeros(2), jnp.zeros(1), kl=0.1)
      >>> round(float(loss), 6), float(m["pref/accuracy"])
      (0.492501, 1.0)
    """
    where = "kto_loss"
    check_choice(loss_type, KTO_LOSS_TYPES, "loss_type", where=where)
    _check_scalar_beta(beta, where=where)
    check_positive(desirable_weight, "desirable_weight", where=where, allow_zero=True)
    check_positive(undesirable_weight, "undesirable_weight", where=where, allow_zero=True)
    lr_d, v_d = _side(chosen_logp, ref_chosen_logp, chosen_valid, "chosen", where=where)
    lr_u, v_u = _side(rejected_logp, ref_rejected_logp, rejected_valid, "rejected", where=where)
    if kl is None:
        if loss_type == "kto":
            raise ValueError(
                f"{where}: loss_type='kto' needs the reference point `kl` (from "
                "`kto_reference_point`), got None."
            )
        z = jnp.zeros((), jnp.float32)
    else:
        z = jax.lax.stop_gradient(check_scalar(kl, "kl", where=where))
    if loss_type == "kto":
        loss_d = 1.0 - jax.nn.sigmoid(beta * (lr_d - z))
        loss_u = 1.0 - jax.nn.sigmoid(beta * (z - lr_u))
        point = z
    else:
        loss_d = 1.0 - jax.nn.sigmoid(beta * lr_d)
        loss_u = jax.nn.sigmoid(beta * lr_u)
        point = jnp.zeros((), jnp.float32)
    total = desirable_weight * jnp.sum(jnp.where(v_d > 0, loss_d, 0.0)) + undesirable_weight * (
        jnp.sum(jnp.where(v_u > 0, loss_u, 0.0))
    )
    count = jnp.sum(v_d) + jnp.sum(v_u)
    den = (
        jnp.maximum(count, 1.0)
        if num_examples is None
        else global_count(num_examples, jnp.maximum(count, 1.0), "num_examples", where=where)
    )
    reward_d, reward_u = batch_mean(beta * lr_d, v_d), batch_mean(beta * lr_u, v_u)
    right_side = jnp.sum(jnp.where(v_d > 0, lr_d > point, False)) + jnp.sum(
        jnp.where(v_u > 0, lr_u < point, False)
    )
    metrics = {
        "pref/reward_chosen": reward_d,
        "pref/reward_rejected": reward_u,
        "pref/margin": reward_d - reward_u,
        "pref/accuracy": right_side / jnp.maximum(count, 1.0),
        "pref/kl": z,
        **_side_counts(v_d, v_u),
    }
    return total / den, stop_gradient_metrics(metrics)


def bco_loss(
    chosen_logp: ArrayLike,
    rejected_logp: ArrayLike,
    ref_chosen_logp: ArrayLike,
    ref_rejected_logp: ArrayLike,
    *,
    beta: float = 0.1,
    delta: float | ArrayLike = 0.0,
    chosen_valid: ArrayLike | None = None,
    rejected_valid: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Binary Classifier Optimization: logistic loss on shifted implicit rewards (§8.6).

        loss = mean_D −logσ(β·lr_c − δ) + mean_U −logσ(−(β·lr_r − δ))

    Desirable examples are classified as positive and undesirable ones as negative by the
    implicit reward `β·lr` shifted by the reward baseline `δ` (no gradient). With paired
    examples (`N_D = N_U`, all valid) this is ALGORITHMS.md's
    `mean_i(−logσ(β lr_c,i − δ) − logσ(−(β lr_r,i − δ)))`, and `δ = 0` gives
    `dpo_loss(loss_type="bco_pair")`. `δ` is the running mean of all rewards `β·lr` seen so far:
    keep it with `losses.running_moments_update(state, concat(β·lr_c, β·lr_r))` and pass
    `state.mean`. Updating the state with the current batch *before* the loss, as TRL does, is
    (reconstructed — verify against the paper) our assumption of the paper's order. The paper's
    UDM density-ratio weights (for unmatched prompt distributions) are out of scope.

    Source: "Binary Classifier Optimization for Large Language Model Alignment"
    (arXiv 2404.04656). Peers: TRL experimental `BCOTrainer` (running-mean δ), TRL
    `DPOConfig(loss_type="bco_pair")`.

    Args:
      chosen_logp: `[N_D]` policy log-prob sums of the desirable examples (differentiable).
      rejected_logp: `[N_U]` policy log-prob sums of the undesirable examples.
      ref_chosen_logp: `[N_D]` reference log-prob sums of the desirable examples.
      ref_rejected_logp: `[N_U]` reference log-prob sums of the undesirable examples.
      beta: `β > 0`.
      delta: the reward shift `δ` (scalar, no gradient).
      chosen_valid: optional `[N_D]` {0,1}.
      rejected_valid: optional `[N_U]` {0,1}.

    Returns:
      `(loss, metrics)`: a float32 scalar; `pref/reward_chosen`, `pref/reward_rejected` (mean
      `β·lr` per side), `pref/margin`, `pref/accuracy` (fraction classified correctly:
      `β·lr > δ` for desirable, `< δ` for undesirable), `pref/delta`, and the per-side counts
      `count/pref/reward_chosen`, `count/pref/reward_rejected` (as `kto_loss`).

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, m = bco_loss(jnp.array([1.0]), jnp.array([-1.0]), jnp.zeros(1), jnp.zeros(1))
      >>> round(float(loss), 6), float(m["pref/accuracy"])
      (1.288793, 1.0)
    """
    where = "bco_loss"
    _check_scalar_beta(beta, where=where)
    lr_d, v_d = _side(chosen_logp, ref_chosen_logp, chosen_valid, "chosen", where=where)
    lr_u, v_u = _side(rejected_logp, ref_rejected_logp, rejected_valid, "rejected", where=where)
    d = jax.lax.stop_gradient(check_scalar(delta, "delta", where=where))
    x_d, x_u = beta * lr_d - d, beta * lr_u - d
    loss = batch_mean(-jax.nn.log_sigmoid(x_d), v_d) + batch_mean(-jax.nn.log_sigmoid(-x_u), v_u)
    reward_d, reward_u = batch_mean(beta * lr_d, v_d), batch_mean(beta * lr_u, v_u)
    right = jnp.sum(jnp.where(v_d > 0, x_d > 0, False)) + jnp.sum(
        jnp.where(v_u > 0, x_u < 0, False)
    )
    metrics = {
        "pref/reward_chosen": reward_d,
        "pref/reward_rejected": reward_u,
        "pref/margin": reward_d - reward_u,
        "pref/accuracy": right / jnp.maximum(jnp.sum(v_d) + jnp.sum(v_u), 1.0),
        "pref/delta": d,
        **_side_counts(v_d, v_u),
    }
    return loss, stop_gradient_metrics(metrics)
