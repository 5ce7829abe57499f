"""Pairwise policy gradients on whole sequences: P3O, REFUEL/REBEL regression, CoPG (§11).

Each pair is two responses `a`, `b` to one prompt; sequences are single actions scored by their
log-prob sums (`losses.sequence_logprob`). All three are `new*` rows of ALGORITHMS.md §11: the
formulas are our reconstructions and each docstring says what was assumed. Conventions as in
the other preference losses: `[N]` (or `[B,2]`) inputs, an optional `valid` mask whose invalid
entries are replaced by 0 before any arithmetic, loss `Σ v·ℓ / D` with
`D = num_pairs or max(Σ v, 1)`, `policy/…` metrics under stop-gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    check_floating,
    check_positive,
    check_rank,
    check_real,
)
from losses._policy import clamp_log_ratio, stop_gradient_metrics, zero_outside
from losses._preference import batch_mean, pair_array, pair_mean, pair_valid


def pairwise_ppo_loss(
    seq_logp: ArrayLike,
    seq_old_logp: ArrayLike,
    rewards: ArrayLike,
    *,
    clip: float,
    valid: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_pairs: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """P3O: PPO's clipped surrogate on sequence ratios with a pairwise (relative) advantage.

    For pair `b` with responses 1, 2 (columns of `[B,2]`):

        A_b1 = r_b1 − r_b2,  A_b2 = −A_b1                          (relative feedback)
        ρ_bj = exp(clip(seq_logp_bj − seq_old_logp_bj, ±log_ratio_clamp))
        ℓ_bj = −min(ρ_bj·A_bj, clip(ρ_bj, 1 − ε, 1 + ε)·A_bj)
        loss = Σ_b v_b·½(ℓ_b1 + ℓ_b2) / D

    At `π = π_old` the gradient is `−½(r_1 − r_2)(∇log π(y_1) − ∇log π(y_2))/D`: the pairwise
    policy gradient, invariant to any reward shift that is common to the pair (the paper's
    motivation: a comparison-trained reward is only defined up to a per-prompt constant).

    (reconstructed — verify against the paper): ALGORITHMS.md §11 specifies only "the clipped
    surrogate of r₁ − r₂ on sequence ratios". The ½ (one half per response of the pair), the
    clipping of each response's ratio separately (the paper's "separate" clipping; its joint
    clipping of the ratio product is not offered) and the KL term being left to the caller
    (`losses.kl_penalized_scores` on the rewards) are assumptions. `clip` is required.

    Source: "Pairwise Proximal Policy Optimization: Harnessing Relative Feedback for LLM
    Alignment" (P3O, arXiv 2310.00212). No peer.

    Args:
      seq_logp: `[B,2]` sequence log-probs of the current policy (differentiable).
      seq_old_logp: `[B,2]` sequence log-probs of the sampling policy (no gradient).
      rewards: `[B,2]` rewards of the two responses (no gradient).
      clip: ε ≥ 0 of the ratio clip (required).
      valid: optional `[B]` {0,1}; invalid pairs are ignored.
      log_ratio_clamp: bound of |seq_logp − seq_old_logp| inside `exp` (None: no clamp).
      num_pairs: global count `D` of valid pairs; None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar; `policy/clip_frac` (fraction of responses whose
      clipped branch is active), `policy/seq_approx_kl` (mean `seq_old_logp − seq_logp`),
      `policy/reward_gap_abs` (mean `|r_1 − r_2|`).

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-5.0, -6.0]]); r = jnp.array([[1.0, 0.0]])
      >>> loss, m = pairwise_ppo_loss(lp, lp, r, clip=0.2)
      >>> float(loss), float(m["policy/clip_frac"])
      (0.0, 0.0)
    """
    where = "pairwise_ppo_loss"
    check_positive(clip, "clip", where=where, allow_zero=True)
    check_rank(seq_logp, 2, "seq_logp", where=where)
    check_floating(seq_logp, "seq_logp", where=where)
    shape = jnp.shape(seq_logp)
    if shape[1] != 2:
        raise ValueError(f"{where}: `seq_logp` must have shape [B,2] (pairs), got {shape}.")
    for name, x in (("seq_old_logp", seq_old_logp), ("rewards", rewards)):
        check_real(x, name, where=where)
        if jnp.shape(x) != shape:
            raise ValueError(f"{where}: `{name}` must have shape {shape}, got {jnp.shape(x)}.")
    v = pair_valid(valid, shape[:1], where=where)
    rows = v[:, None] > 0
    lp = zero_outside(as_float32(seq_logp), rows)
    old = jax.lax.stop_gradient(zero_outside(as_float32(seq_old_logp), rows))
    r = jax.lax.stop_gradient(zero_outside(as_float32(rewards), rows))
    gap = r[:, 0] - r[:, 1]
    adv = jnp.stack([gap, -gap], axis=1)
    logr = lp - old
    ratio = jnp.exp(clamp_log_ratio(logr, log_ratio_clamp, where=where))
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - clip, 1.0 + clip)
    per_pair = 0.5 * jnp.sum(jnp.maximum(unclipped, clipped), axis=1)
    loss = pair_mean(per_pair, v, num_pairs, v, where=where)
    clip_hits = jnp.sum(jnp.where(rows, clipped > unclipped, False), axis=1).astype(jnp.float32)
    metrics = {
        "policy/clip_frac": batch_mean(clip_hits / 2.0, v),
        "policy/seq_approx_kl": batch_mean(-jnp.sum(logr, axis=1) / 2.0, v),
        "policy/reward_gap_abs": batch_mean(jnp.abs(gap), v),
    }
    return loss, stop_gradient_metrics(metrics)


def relative_regression_loss(
    lr_a: ArrayLike,
    lr_b: ArrayLike,
    q_a: ArrayLike,
    q_b: ArrayLike,
    *,
    eta: float,
    valid: ArrayLike | None = None,
    num_pairs: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """REFUEL / REBEL: regress the log-ratio gap of two responses on their value gap (§11).

        e_i  = (lr_a,i − lr_b,i)/η − (q_a,i − q_b,i)
        loss = mean_i e_i²

    `lr = Σ_t (lp − old_lp)·m` is the sequence log-ratio of the policy against the policy that
    generated the data, and `q` the (relative) future value of each response — the return of the
    rest of the conversation in REFUEL (multi-turn), the reward in REBEL (single turn). The
    minimiser sets `log π(a)/π_old(a) − log π(b)/π_old(b) = η·(q_a − q_b)`: a natural-policy-gradient
    step of size η, fitted by regression without a critic.

    (reconstructed — verify against the paper): ALGORITHMS.md §11 gives the formula as a
    reconstruction; the plain mean over pairs and the absence of a default for η are assumptions.

    Sources: "Regressing the Relative Future: Efficient Policy Optimization for Multi-turn RLHF"
    (REFUEL, arXiv 2410.04612); "REBEL: Reinforcement Learning via Regressing Relative Rewards"
    (arXiv 2404.16767). No peer.

    Args:
      lr_a: `[N]` sequence log-ratios of the first responses (differentiable).
      lr_b: `[N]` sequence log-ratios of the second responses (differentiable).
      q_a: `[N]` values (returns) of the first responses (no gradient).
      q_b: `[N]` values of the second responses (no gradient).
      eta: step size `η > 0` (required).
      valid: optional `[N]` {0,1}; invalid pairs are ignored.
      num_pairs: global count of valid pairs; None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar; `policy/residual_abs_mean` (mean `|e|`),
      `policy/log_ratio_gap` (mean `lr_a − lr_b`).

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, m = relative_regression_loss(jnp.array([0.2]), jnp.array([-0.2]),
      ...                                    jnp.array([1.0]), jnp.array([0.0]), eta=0.4)
      >>> float(loss)
      0.0
    """
    where = "relative_regression_loss"
    check_positive(eta, "eta", where=where)
    check_rank(lr_a, 1, "lr_a", where=where)
    v = pair_valid(valid, jnp.shape(lr_a), where=where)
    a = pair_array(lr_a, "lr_a", v, where=where)
    b = pair_array(lr_b, "lr_b", v, where=where)
    qa = pair_array(q_a, "q_a", v, where=where, differentiable=False, floating=False)
    qb = pair_array(q_b, "q_b", v, where=where, differentiable=False, floating=False)
    e = (a - b) / eta - (qa - qb)
    loss = pair_mean(e**2, v, num_pairs, v, where=where)
    metrics = {
        "policy/residual_abs_mean": batch_mean(jnp.abs(e), v),
        "policy/log_ratio_gap": batch_mean(a - b, v),
    }
    return loss, stop_gradient_metrics(metrics)


def contrastive_pg_loss(
    seq_logp_a: ArrayLike,
    seq_logp_b: ArrayLike,
    ref_seq_logp_a: ArrayLike,
    ref_seq_logp_b: ArrayLike,
    rewards_a: ArrayLike,
    rewards_b: ArrayLike,
    *,
    beta: float,
    valid: ArrayLike | None = None,
    num_pairs: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """CoPG: contrastive off-policy policy gradient on pairs of responses (ALGORITHMS.md §11).

        R_β(y) = r(y) − β·(log π(y) − log π_ref(y))          (regularised reward)
        ΔR_i   = R_β(a_i) − R_β(b_i)
        loss   = −mean_i sg(ΔR_i)·(log π(a_i) − log π(b_i))
        −∇loss = mean_i ΔR_i·(∇log π(a_i) − ∇log π(b_i))      (the CoPG update direction)

    Each response is the other's baseline, so no importance weights are needed even when the
    pairs come from another policy (offline data). For β > 0 the gradient equals that of the
    squared loss `mean ΔR²/(2β)`, whose minimiser is the KL-regularised optimum
    `π ∝ π_ref·exp(r/β)` (IPO is the special case of preference rewards); β = 0 is a plain
    contrastive REINFORCE. The loss *value* is a surrogate (its gradient is the point).

    (reconstructed — verify against the paper): ALGORITHMS.md §11 states only the gradient; the
    surrogate form, the mean over pairs and the absence of a default β are assumptions.

    Source: "Contrastive Policy Gradient: Aligning LLMs on sequence-level scores in a
    supervised-friendly fashion" (CoPG, arXiv 2406.19185). No peer.

    Args:
      seq_logp_a: `[N]` policy sequence log-probs of the first responses (differentiable).
      seq_logp_b: `[N]` policy sequence log-probs of the second responses (differentiable).
      ref_seq_logp_a: `[N]` reference sequence log-probs of the first responses.
      ref_seq_logp_b: `[N]` reference sequence log-probs of the second responses.
      rewards_a: `[N]` rewards of the first responses (no gradient).
      rewards_b: `[N]` rewards of the second responses (no gradient).
      beta: KL strength `β ≥ 0` (required).
      valid: optional `[N]` {0,1}; invalid pairs are ignored.
      num_pairs: global count of valid pairs; None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar; `policy/reward_gap` (mean `r_a − r_b`),
      `policy/regularized_reward_gap` (mean `ΔR`), `policy/regression_residual` (mean `ΔR²/2`).

    Examples:
      >>> import jax.numpy as jnp
      >>> lp_a, lp_b = jnp.array([-4.0]), jnp.array([-6.0])
      >>> loss, m = contrastive_pg_loss(lp_a, lp_b, lp_a, lp_b, jnp.array([1.0]),
      ...                               jnp.array([0.0]), beta=0.1)
      >>> float(loss), float(m["policy/regularized_reward_gap"])
      (-2.0, 1.0)
    """
    where = "contrastive_pg_loss"
    check_positive(beta, "beta", where=where, allow_zero=True)
    check_rank(seq_logp_a, 1, "seq_logp_a", where=where)
    v = pair_valid(valid, jnp.shape(seq_logp_a), where=where)
    lp_a = pair_array(seq_logp_a, "seq_logp_a", v, where=where)
    lp_b = pair_array(seq_logp_b, "seq_logp_b", v, where=where)
    ref_a = pair_array(ref_seq_logp_a, "ref_seq_logp_a", v, where=where, differentiable=False)
    ref_b = pair_array(ref_seq_logp_b, "ref_seq_logp_b", v, where=where, differentiable=False)
    r_a = pair_array(rewards_a, "rewards_a", v, where=where, differentiable=False, floating=False)
    r_b = pair_array(rewards_b, "rewards_b", v, where=where, differentiable=False, floating=False)
    b = jax.lax.stop_gradient(as_float32(beta))
    if b.ndim:
        raise ValueError(f"{where}: `beta` must be a scalar, got shape {b.shape}.")
    gap = (r_a - b * (lp_a - ref_a)) - (r_b - b * (lp_b - ref_b))
    loss = pair_mean(-jax.lax.stop_gradient(gap) * (lp_a - lp_b), v, num_pairs, v, where=where)
    metrics = {
        "policy/reward_gap": batch_mean(r_a - r_b, v),
        "policy/regularized_reward_gap": batch_mean(gap, v),
        "policy/regression_residual": batch_mean(0.5 * gap**2, v),
    }
    return loss, stop_gradient_metrics(metrics)
