"""Policy losses for off-policy and offline data: Kimi k1.5 mirror descent, A-LoL, shaped
off-policy members (Critique-GRPO and kin) and AHPO's gated expert NLL (ALGORITHMS.md §11).

All four are `new*` rows of ALGORITHMS.md §11: the formulas are our reconstructions of the papers
(each docstring says what was assumed). Sequence-level losses take sequence log-probs (masked
sums over completion tokens, `losses.sequence_logprob`) and an optional `valid` mask whose
`False` entries are replaced by 0 before any arithmetic.
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
    check_choice,
    check_finite,
    check_floating,
    check_positive,
    check_rank,
    check_real,
    check_same_shape,
    global_count,
)
from losses._policy import (
    clamp_log_ratio,
    prepare_policy_inputs,
    reduce_policy_loss,
    stop_gradient_metrics,
    zero_outside,
)
from losses.aggregation import AGG_MODES, AggMode, aggregate


def _sequence_inputs(
    arrays: dict[str, Any], valid: Any, *, rank: int, where: str, differentiable: str
) -> tuple[dict[str, Array], Array]:
    """Validate same-shape sequence arrays of `rank`; return them float32, zero where invalid.

    Every array except `differentiable` is put under stop-gradient. Returns `(arrays, v)` with
    `v` the float32 {0,1} validity of their shape.
    """
    names = list(arrays)
    first = names[0]
    for name in names:
        check_rank(arrays[name], rank, name, where=where)
        check_real(arrays[name], name, where=where)
    check_floating(arrays[differentiable], differentiable, where=where)
    check_same_shape(arrays[first], first, where, **{n: arrays[n] for n in names[1:]})
    shape = jnp.shape(arrays[first])
    v = (
        jnp.ones(shape, jnp.float32)
        if valid is None
        else as_mask(valid, shape, "valid", where=where)
    )
    out = {}
    for name in names:
        x = zero_outside(as_float32(arrays[name]), v > 0)
        out[name] = x if name == differentiable else jax.lax.stop_gradient(x)
    return out, v


def _seq_denominator(v: Array, num_seqs: Any, where: str) -> Array:
    local = jnp.maximum(jnp.sum(v), 1.0)
    if num_seqs is not None:
        return global_count(num_seqs, local, "num_seqs", where=where)
    return local


def mirror_descent_loss(
    seq_logp: ArrayLike,
    seq_old_logp: ArrayLike,
    rewards: ArrayLike,
    *,
    tau: float,
    valid: ArrayLike | None = None,
    num_seqs: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Kimi k1.5's online mirror-descent loss: a squared regression of the log-ratio (§11).

    Over the valid samples `v` of each group `b` (rows `[B,G]`, `G ≥ 2`):

        r̄_b  = Σ_g v·r / max(Σ_g v, 1)
        e_bg = r_bg − r̄_b − τ·(seq_logp_bg − seq_old_logp_bg)
        loss = Σ v·e² / D,   D = num_seqs or max(Σ v, 1)
        ∂loss/∂seq_logp = −2τ·e·v / D

    The minimiser sets `τ·log(π_θ/π_old)` of each sample to its centred reward: the closed-form
    KL-regularised (strength τ) policy improvement step, fitted by regression on the sampled
    responses instead of by a clipped ratio. At `π_θ = π_old` the gradient is a REINFORCE
    gradient with advantages `2τ·(r − r̄)/D` on the sequence log-probs.

    Assumptions (reconstructed — verify against the paper): the baseline is the group mean of
    the rewards (the paper's `r̄` approximates `τ log Z`), the squared error is averaged over
    the valid samples of the batch, a group with a single valid sample has baseline `r` itself,
    and the paper's extra regulariser terms (if any) are left to the caller. `tau` is required
    (> 0; no default is recorded).

    Source: "Kimi k1.5: Scaling Reinforcement Learning with LLMs" (arXiv 2501.12599). No peer.

    Args:
      seq_logp: `[B,G]` sequence log-probs of the current policy (differentiable).
      seq_old_logp: `[B,G]` sequence log-probs of the sampling policy (no gradient).
      rewards: `[B,G]` scalar rewards (no gradient).
      tau: regularisation strength τ > 0 (required).
      valid: optional `[B,G]` bool; False samples leave the baseline and the mean.
      num_seqs: global count `D` of valid samples (micro-batching); None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/seq_approx_kl` (mean of
      `seq_old_logp − seq_logp`), `policy/residual_abs_mean` (mean `|e|`).

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-3.0, -4.0]]); r = jnp.array([[1.0, 0.0]])
      >>> loss, m = mirror_descent_loss(lp, lp, r, tau=0.5)
      >>> float(loss), float(m["policy/residual_abs_mean"])
      (0.25, 0.5)
    """
    where = "mirror_descent_loss"
    check_positive(tau, "tau", where=where)
    x, v = _sequence_inputs(
        {"seq_logp": seq_logp, "seq_old_logp": seq_old_logp, "rewards": rewards},
        valid,
        rank=2,
        where=where,
        differentiable="seq_logp",
    )
    if jnp.shape(seq_logp)[1] < 2:
        raise ValueError(
            f"{where}: `seq_logp` must be [B,G] with G >= 2 samples per group, got shape "
            f"{jnp.shape(seq_logp)}."
        )
    r = x["rewards"]
    baseline = jnp.sum(r, axis=1, keepdims=True) / jnp.maximum(
        jnp.sum(v, axis=1, keepdims=True), 1.0
    )
    log_ratio = x["seq_logp"] - x["seq_old_logp"]
    residual = jnp.where(v > 0, r - baseline - tau * log_ratio, 0.0)
    den = _seq_denominator(v, num_seqs, where)
    loss = jnp.sum(residual**2) / den
    count = jnp.maximum(jnp.sum(v), 1.0)
    metrics = {
        "policy/seq_approx_kl": jnp.sum(-log_ratio) / count,
        "policy/residual_abs_mean": jnp.sum(jnp.abs(residual)) / count,
    }
    return loss, stop_gradient_metrics(metrics)


def alol_loss(
    seq_logp: ArrayLike,
    ref_seq_logp: ArrayLike,
    rewards: ArrayLike,
    values: ArrayLike,
    *,
    clip: float,
    valid: ArrayLike | None = None,
    log_ratio_clamp: float | None = 20.0,
    num_seqs: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """A-LoL: offline advantage-weighted policy gradient on whole sequences (§11).

    Each sequence is one action. With `A = rewards − values` (no gradient):

        w    = sg(clip(exp(clip(seq_logp − ref_seq_logp, ±log_ratio_clamp)), 1 − ε, 1 + ε))
        loss = −Σ_n v_n·[A_n > 0]·A_n·w_n·seq_logp_n / D,   D = num_seqs or max(Σ v, 1)

    Only positive-advantage data trains the policy (negative-advantage sequences are filtered,
    which makes A-LoL robust to noisy data); the clipped sequence importance weight between the
    policy and the data's reference policy corrects for the offline distribution.

    Assumptions (reconstructed — verify against the paper): the mean runs over all valid
    sequences (filtered ones count in `D` and contribute 0), the importance weight is the
    clipped plain sequence ratio (the paper's variants A-LoL ref-free / seq / KL are not
    offered), `values` come from the reference model's value head. `clip` (ε ≥ 0) is required:
    no default is recorded.

    Source: "Improving Language Models with Advantage-based Offline Policy Gradients" (A-LoL; no
    arXiv id recorded in ALGORITHMS.md). No peer.

    Args:
      seq_logp: `[N]` sequence log-probs of the current policy (differentiable).
      ref_seq_logp: `[N]` sequence log-probs of the reference (data) policy.
      rewards: `[N]` sequence rewards.
      values: `[N]` value estimates of the prompts (the baseline).
      clip: ε ≥ 0, the importance weight is clipped to `[1 − ε, 1 + ε]` (required).
      valid: optional `[N]` bool; False sequences are ignored.
      log_ratio_clamp: bound of |seq_logp − ref_seq_logp| inside `exp` (None: no clamp).
      num_seqs: global count `D` of valid sequences; None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/positive_adv_frac`,
      `policy/is_weight_mean` and `policy/clip_frac` (over sequences with `A > 0`).

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([-2.0, -3.0]); ref = jnp.array([-2.5, -3.0])
      >>> loss, m = alol_loss(lp, ref, jnp.array([1.0, 0.0]), jnp.array([0.5, 0.5]), clip=0.2)
      >>> round(float(loss), 4), float(m["policy/clip_frac"])
      (0.6, 1.0)
    """
    where = "alol_loss"
    check_positive(clip, "clip", where=where, allow_zero=True)
    x, v = _sequence_inputs(
        {"seq_logp": seq_logp, "ref_seq_logp": ref_seq_logp, "rewards": rewards, "values": values},
        valid,
        rank=1,
        where=where,
        differentiable="seq_logp",
    )
    adv = x["rewards"] - x["values"]
    logr = jax.lax.stop_gradient(x["seq_logp"]) - x["ref_seq_logp"]
    ratio = jnp.exp(clamp_log_ratio(logr, log_ratio_clamp, where=where))
    weight = jnp.clip(ratio, 1.0 - clip, 1.0 + clip)
    keep = (v > 0) & (adv > 0)
    per_seq = jnp.where(keep, -adv * weight * x["seq_logp"], 0.0)
    loss = jnp.sum(per_seq) / _seq_denominator(v, num_seqs, where)

    n_keep = jnp.maximum(jnp.sum(keep.astype(jnp.float32)), 1.0)
    metrics = {
        "policy/positive_adv_frac": jnp.sum(keep.astype(jnp.float32))
        / jnp.maximum(jnp.sum(v), 1.0),
        "policy/is_weight_mean": jnp.sum(jnp.where(keep, weight, 0.0)) / n_keep,
        "policy/clip_frac": jnp.sum((keep & (weight != ratio)).astype(jnp.float32)) / n_keep,
    }
    return loss, stop_gradient_metrics(metrics)


def shaped_offpolicy_loss(
    logp: ArrayLike,
    advantages: ArrayLike,
    mask: ArrayLike,
    *,
    gamma: float,
    agg: AggMode = "token_mean",
    is_weights: ArrayLike | None = None,
    token_weights: ArrayLike | None = None,
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """Policy-shaped loss for off-policy group members (refinements, expert/teacher traces) (§11).

    With `π = exp(logp)` (the token probability under the current policy) and advantages `A`
    computed over the joint group (on-policy samples and off-policy members together):

        ℓ = −A·π/(π + γ) ;  loss = aggregate(ℓ · sg(is_weights) · token_weights, mask, agg)
        ∂ℓ/∂logp = −A·γπ/(π + γ)²

    The shaping `f(π) = π/(π + γ)` replaces the importance ratio of a sample the policy did not
    generate (its behaviour probability is unknown or 1): it re-weights the REINFORCE gradient
    by `γπ/(π + γ)²`, which vanishes for tokens the policy already finds certain and is largest
    at `π = γ`, so low-probability expert tokens are learned without the ratio exploding. The
    loss covers the off-policy members only (select them with `mask` or `token_weights`);
    combine it with an on-policy loss (e.g. `ppo_clip_loss`) on the others, with a shared
    `num_tokens` to keep one normaliser.

    Assumptions (reconstructed — verify against the paper): the shaping form and its use for
    every off-policy member follow ALGORITHMS.md §11 (Critique-GRPO; ThinkTuning; ICPO; AMPO
    row). `gamma` is required (> 0; no default is recorded).

    Source: "Critique-GRPO: Advancing LLM Reasoning with Natural Language and Numerical Feedback";
    also "ThinkTuning: Instilling Cognitive Reflections without Distillation", "Think Outside the
    Policy: In-Context Steered Policy Optimization" and "More Than One Teacher: Adaptive
    Multi-Guidance Policy Optimization for Diverse Exploration" (no arXiv ids recorded). No peer.

    Args:
      logp: `[N,T]` log-probs of the current policy on the off-policy tokens (differentiable).
      advantages: `[N,T]` (no gradient).
      mask: `[N,T]` {0,1} tokens that count.
      gamma: shaping constant γ > 0 (required).
      agg: aggregation mode of `losses.aggregate`.
      is_weights: `[N,T]` stop-gradient weights.
      token_weights: `[N,T]` selections that must not change the normaliser.
      num_tokens: global token count for `agg`.
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/shaped_prob_mean` (masked mean of
      `π/(π + γ)`) and `policy/shaping_grad_weight_mean` (masked mean of `γπ/(π + γ)²`).

    Examples:
      >>> import jax.numpy as jnp
      >>> logp = jnp.log(jnp.array([[0.1, 0.9]]))
      >>> loss, m = shaped_offpolicy_loss(logp, jnp.ones((1, 2)), jnp.ones((1, 2)), gamma=0.1)
      >>> round(float(loss), 4), round(float(m["policy/shaping_grad_weight_mean"]), 4)
      (-0.7, 0.17)
    """
    where = "shaped_offpolicy_loss"
    check_positive(gamma, "gamma", where=where)
    inputs = prepare_policy_inputs(logp, None, advantages, mask, where=where)
    prob = jnp.exp(inputs.logp)
    shaped = prob / (prob + gamma)
    per_token = -inputs.advantages * shaped
    loss = reduce_policy_loss(
        per_token,
        inputs,
        agg=agg,
        is_weights=is_weights,
        token_weights=token_weights,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
        where=where,
    )
    count = jnp.maximum(jnp.sum(inputs.mask), 1.0)
    grad_weight = gamma * prob / (prob + gamma) ** 2
    metrics = {
        "policy/shaped_prob_mean": jnp.sum(zero_outside(shaped, inputs.valid)) / count,
        "policy/shaping_grad_weight_mean": jnp.sum(zero_outside(grad_weight, inputs.valid)) / count,
    }
    return loss, stop_gradient_metrics(metrics)


def gated_sft_loss(
    expert_logp: ArrayLike,
    expert_mask: ArrayLike,
    n_correct: ArrayLike,
    *,
    threshold: float = 1,
    coef: float = 1.0,
    agg: AggMode = "token_mean",
    num_tokens: Any = None,
    num_seqs: Any = None,
    norm_length: Any = None,
) -> tuple[Array, dict[str, Array]]:
    """AHPO's gated expert NLL: supervised loss on expert traces of prompts the policy fails (§11).

    Expert rows are grouped by prompt (`E = M/B` contiguous rows per prompt, `M = B·E`):

        gate_b = [n_correct_b < threshold]                       (no gradient)
        loss   = coef·aggregate(−expert_logp · gate, expert_mask, agg)

    i.e. `coef·nll_loss` on the expert traces whose prompt had fewer than `threshold` correct
    samples in its group (`threshold=1`: the whole group failed). Gated-off traces keep their
    place in the normaliser (the gate acts like `token_weights`), so the loss is
    `coef·[gate]·NLL` per prompt averaged over all expert traces. Add it to the RL loss: when
    rewards are sparse the policy learns from the expert; once it solves the prompt the gate
    closes and it explores on its own.

    Assumptions (reconstructed — verify against the paper): the gate per prompt, its threshold
    and the normaliser convention above; `threshold=1` and `coef=1.0` are our defaults (none is
    recorded); `agg="token_mean"` as `nll_loss` (§8.7; `"seq_mean_token_mean"` averages per
    trace instead).

    Source: "MM-HELIX: Boosting Multimodal Long-Chain Reflective Reasoning with Holistic Platform
    and Adaptive Hybrid Policy Optimization" (AHPO; no arXiv id recorded). No peer.

    Args:
      expert_logp: `[M,T]` token log-probs of the expert traces under the policy
        (differentiable), `M = B·E`.
      expert_mask: `[M,T]` {0,1} expert completion tokens that count.
      n_correct: `[B]` number of correct on-policy samples per prompt (no gradient).
      threshold: the gate opens where `n_correct < threshold`.
      coef: weight of the NLL term (≥ 0).
      agg: aggregation mode of `losses.aggregate`.
      num_tokens: global expert-token count for `agg`.
      num_seqs: global expert-trace count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/sft_gate_frac` (fraction of prompts with
      an open gate) and `policy/expert_nll` (ungated token-mean NLL of the expert traces).

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-1.0, -3.0], [-2.0, -2.0]]); m = jnp.ones((2, 2))
      >>> loss, met = gated_sft_loss(lp, m, jnp.array([0, 3]), coef=0.5)
      >>> float(loss), float(met["policy/sft_gate_frac"])
      (0.5, 0.5)
    """
    where = "gated_sft_loss"
    check_choice(agg, AGG_MODES, "agg", where=where)
    check_positive(coef, "coef", where=where, allow_zero=True)
    check_rank(expert_logp, 2, "expert_logp", where=where)
    check_floating(expert_logp, "expert_logp", where=where)
    m = as_mask(expert_mask, jnp.shape(expert_logp), "expert_mask", where=where)
    check_rank(n_correct, 1, "n_correct", where=where)
    check_real(n_correct, "n_correct", where=where)
    rows, b = jnp.shape(expert_logp)[0], jnp.shape(n_correct)[0]
    if b == 0 or rows % b:
        raise ValueError(
            f"{where}: `expert_logp` must have E·B rows (E expert traces per prompt of "
            f"`n_correct` {jnp.shape(n_correct)}), got {rows} rows."
        )
    valid = m > 0
    lp = zero_outside(as_float32(expert_logp), valid)
    check_finite(threshold, "threshold", where=where)  # NaN closed every gate, silently
    gate = jax.lax.stop_gradient(as_float32(n_correct) < threshold)  # [B]
    gate_rows = jnp.broadcast_to(gate[:, None], (b, rows // b)).reshape(-1)[:, None]  # [M,1]
    kw = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_length": norm_length}
    nll = aggregate(-lp * gate_rows, m, mode=agg, **kw)
    count = jnp.maximum(jnp.sum(m), 1.0)
    metrics = {
        "policy/sft_gate_frac": jnp.mean(gate.astype(jnp.float32)),
        "policy/expert_nll": jnp.sum(-lp) / count,
    }
    return coef * nll, stop_gradient_metrics(metrics)
