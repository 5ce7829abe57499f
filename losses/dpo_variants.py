"""DPO plus a regulariser, and step-level DPO: NLL, RPO, XPO, Step-APO (ALGORITHMS.md §8.7,
§8.9, §11).

* `nll_loss` — the supervised (negative log-likelihood) term that RPO, CPO, ORPO, MPO and many
  seed papers add to a preference loss.
* `rpo_loss` — `dpo_loss + nll_coef·NLL(chosen)`.
* `xpo_loss` — `dpo_loss + α·mean log π(y_ref)`: an exploration bonus on reference samples.
* `step_apo_loss` — CPL's advantage-weighted step-level DPO.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import as_mask, check_choice, check_floating, check_positive, check_rank
from losses._policy import stop_gradient_metrics, zero_outside
from losses._preference import (
    batch_mean,
    check_scalar,
    pair_array,
    pair_mean,
    pair_valid,
    pair_weights_array,
    reward_metrics,
)
from losses.aggregation import AGG_MODES, AggMode, aggregate
from losses.dpo import dpo_loss


def nll_loss(
    token_logp: ArrayLike,
    mask: ArrayLike,
    *,
    agg: AggMode = "token_mean",
    num_tokens: ArrayLike | None = None,
    num_seqs: ArrayLike | None = None,
    norm_length: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Negative log-likelihood of the masked tokens: `−aggregate(lp, m, mode=agg)` (§8.7).

    The supervised term of RPO, CPO (`cpo_alpha`), ORPO, MPO and the seed papers that train on
    selected spans. `agg="token_mean"` is TRL's (`"sft"` loss type, CPO/ORPO NLL);
    `"seq_mean_token_mean"` is OpenRLHF's `nll_loss_coef` term. Masked entries are replaced by 0
    before any arithmetic. Pass the global `num_tokens`/`num_seqs` when the batch is split.

    Sources: "Provably Mitigating Overoptimization in RLHF: Your SFT Loss is Implicitly an
    Adversarial Regularizer" (arXiv 2405.16436); "Iterative Reasoning Preference Optimization"
    (arXiv 2404.19733).

    Args:
      token_logp: `[N,T]` token log-probs of the sequences to imitate (differentiable).
      mask: `[N,T]` {0,1} tokens that count.
      agg: aggregation mode of `losses.aggregate`.
      num_tokens: global token count for `agg`.
      num_seqs: global sequence count for `agg`.
      norm_length: constant divisor of `seq_mean_token_sum_norm`.

    Returns:
      `(loss, metrics)`: a float32 scalar and `policy/nll` (the loss) and
      `policy/nll_token_mean` (mean `−lp` over this batch's valid tokens, whatever `agg`).

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-1.0, -2.0, jnp.nan]]); m = jnp.array([[1, 1, 0]])
      >>> loss, _ = nll_loss(lp, m)
      >>> float(loss)
      1.5
    """
    where = "nll_loss"
    check_choice(agg, AGG_MODES, "agg", where=where)
    check_rank(token_logp, 2, "token_logp", where=where)
    check_floating(token_logp, "token_logp", where=where)
    m = as_mask(mask, jnp.shape(token_logp), where=where)
    lp = zero_outside(jnp.asarray(token_logp, jnp.float32), m > 0)
    loss = aggregate(
        -lp, m, mode=agg, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )
    metrics = {
        "policy/nll": loss,
        "policy/nll_token_mean": -jnp.sum(lp) / jnp.maximum(jnp.sum(m), 1.0),
    }
    return loss, stop_gradient_metrics(metrics)


def rpo_loss(
    chosen_logp: ArrayLike,
    rejected_logp: ArrayLike,
    ref_chosen_logp: ArrayLike | None,
    ref_rejected_logp: ArrayLike | None,
    chosen_nll: ArrayLike,
    *,
    nll_coef: float = 1.0,
    **dpo_kw: Any,
) -> tuple[Array, dict[str, Array]]:
    """RPO: DPO plus an NLL term on the chosen responses (ALGORITHMS.md §8.7).

        loss = dpo_loss(π_c, π_r, ref_c, ref_r, **dpo_kw) + nll_coef·chosen_nll

    `chosen_nll` is the scalar `nll_loss` over the chosen tokens (computed by the caller so its
    aggregation convention is explicit); the SFT term keeps the chosen likelihood from falling,
    which the paper shows acts as an adversarial regulariser against over-optimisation.
    `nll_coef = 0` is DPO. MPO (InternVL, arXiv 2411.10442) is
    `loss_type=("sigmoid", "bco_pair"), loss_weights=(0.8, 0.2)` with `nll_coef=1.0`.

    Sources: "Provably Mitigating Overoptimization in RLHF: Your SFT Loss is Implicitly an
    Adversarial Regularizer" (arXiv 2405.16436); "Iterative Reasoning Preference Optimization"
    (arXiv 2404.19733). Peers: TRL `DPOConfig(rpo_alpha=...)` / `loss_type=[..., "sft"]`
    (`agg="token_mean"`), OpenRLHF `--nll_loss_coef` (`agg="seq_mean_token_mean"`).

    Args:
      chosen_logp: `[N]` policy log-prob sums of the chosen responses (differentiable).
      rejected_logp: `[N]` policy log-prob sums of the rejected responses.
      ref_chosen_logp: `[N]` reference log-prob sums (None with `reference_free=True`).
      ref_rejected_logp: `[N]` reference log-prob sums (None with `reference_free=True`).
      chosen_nll: scalar NLL of the chosen tokens (from `nll_loss`; differentiable).
      nll_coef: weight of the NLL term (≥ 0).
      **dpo_kw: keywords of `dpo_loss` (beta, loss_type, label_smoothing, ...).

    Returns:
      `(loss, metrics)`: the metrics of `dpo_loss` plus `pref/nll` and `pref/dpo_loss`.

    Examples:
      >>> import jax.numpy as jnp
      >>> pc, pr = jnp.array([-3.0]), jnp.array([-6.0])
      >>> loss, m = rpo_loss(pc, pr, jnp.array([-4.0]), jnp.array([-5.0]), 1.5, nll_coef=0.5)
      >>> round(float(m["pref/dpo_loss"]), 6), round(float(loss), 6)
      (0.598139, 1.348139)
    """
    where = "rpo_loss"
    check_positive(nll_coef, "nll_coef", where=where, allow_zero=True)
    nll = check_scalar(chosen_nll, "chosen_nll", where=where)
    pref, metrics = dpo_loss(
        chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp, **dpo_kw
    )
    metrics = dict(metrics)
    metrics["pref/nll"] = nll
    metrics["pref/dpo_loss"] = pref
    return pref + nll_coef * nll, stop_gradient_metrics(metrics)


def xpo_loss(
    chosen_logp: ArrayLike,
    rejected_logp: ArrayLike,
    ref_chosen_logp: ArrayLike | None,
    ref_rejected_logp: ArrayLike | None,
    ref_sample_logp: ArrayLike,
    *,
    alpha: float = 0.05,
    sample_valid: ArrayLike | None = None,
    **dpo_kw: Any,
) -> tuple[Array, dict[str, Array]]:
    """XPO: DPO plus an exploration bonus on responses sampled from the reference (§8.9).

        loss = dpo_loss(π_c, π_r, ref_c, ref_r, **dpo_kw) + α·mean_j log π(y_j^ref)

    `ref_sample_logp` are the *policy's* log-prob sums of responses sampled from the reference
    model; lowering them pushes the policy away from what the reference already does, which the
    paper shows gives provable exploration (implicit Q*-approximation). α = 0 is DPO.

    Source: "Exploratory Preference Optimization: Harnessing Implicit Q*-Approximation for
    Sample-Efficient RLHF" (arXiv 2405.21046). Peer: TRL `XPOConfig(alpha=...)` (α = 0.05 is its
    default).

    Args:
      chosen_logp: `[N]` policy log-prob sums of the chosen responses (differentiable).
      rejected_logp: `[N]` policy log-prob sums of the rejected responses.
      ref_chosen_logp: `[N]` reference log-prob sums (None with `reference_free=True`).
      ref_rejected_logp: `[N]` reference log-prob sums (None with `reference_free=True`).
      ref_sample_logp: `[M]` policy log-prob sums of reference samples (differentiable).
      alpha: bonus weight `α ≥ 0`.
      sample_valid: optional `[M]` {0,1}; invalid samples are ignored.
      **dpo_kw: keywords of `dpo_loss`.

    Returns:
      `(loss, metrics)`: the metrics of `dpo_loss` plus `pref/ref_sample_logp` (its mean) and
      `pref/dpo_loss`.

    Examples:
      >>> import jax.numpy as jnp
      >>> pc, pr = jnp.array([-3.0]), jnp.array([-6.0])
      >>> rc, rr = jnp.array([-4.0]), jnp.array([-5.0])
      >>> loss, _ = xpo_loss(pc, pr, rc, rr, jnp.array([-10.0, -20.0]), alpha=0.05)
      >>> round(float(loss), 6)
      -0.151861
    """
    where = "xpo_loss"
    check_positive(alpha, "alpha", where=where, allow_zero=True)
    check_rank(ref_sample_logp, 1, "ref_sample_logp", where=where)
    v = pair_valid(sample_valid, jnp.shape(ref_sample_logp), where=where, name="sample_valid")
    samples = pair_array(ref_sample_logp, "ref_sample_logp", v, where=where)
    bonus = batch_mean(samples, v)
    pref, metrics = dpo_loss(
        chosen_logp, rejected_logp, ref_chosen_logp, ref_rejected_logp, **dpo_kw
    )
    metrics = dict(metrics)
    metrics["pref/ref_sample_logp"] = bonus
    metrics["pref/dpo_loss"] = pref
    return pref + alpha * bonus, stop_gradient_metrics(metrics)


def step_apo_loss(
    lr_w: ArrayLike,
    lr_l: ArrayLike,
    a_w: ArrayLike,
    a_l: ArrayLike,
    *,
    beta: float,
    valid: ArrayLike | None = None,
    pair_weights: ArrayLike | None = None,
    num_pairs: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Step-APO: advantage-weighted DPO on (better, worse) reasoning steps (ALGORITHMS.md §11).

        loss = mean_i −logσ(β·(a_w,i·lr_w,i − a_l,i·lr_l,i))

    `lr = Σ_{t ∈ step} (lp − ref)` is the policy/reference log-ratio of a step (e.g. from
    `losses.segment_reduce`), and `a` its advantage estimate from tree search (no gradient).
    Steps with larger advantage gaps get a proportionally stronger push, so the critical plan
    steps dominate. With `a_w = a_l = 1` this is DPO's sigmoid loss on the steps.

    (reconstructed — verify against the paper): ALGORITHMS.md §11 gives the formula as our
    reconstruction; that the advantages multiply the log-ratios (rather than enter as a margin),
    their normalisation (taken as given) and the absence of a required default for β are
    assumptions. `beta` is required.

    Source: "CPL: Critical Plan Step Learning Boosts LLM Generalization in Reasoning Tasks"
    (arXiv 2409.08642). No peer.

    Args:
      lr_w: `[N]` log-ratios of the preferred steps (differentiable).
      lr_l: `[N]` log-ratios of the dispreferred steps (differentiable).
      a_w: `[N]` advantages of the preferred steps (no gradient).
      a_l: `[N]` advantages of the dispreferred steps (no gradient).
      beta: `β > 0` (required).
      valid: optional `[N]` {0,1}; invalid pairs are ignored.
      pair_weights: optional `[N]` non-negative weights (stop-gradient).
      num_pairs: global count of valid pairs; None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar; `pref/reward_chosen` (mean `β·a_w·lr_w`),
      `pref/reward_rejected` (mean `β·a_l·lr_l`), `pref/margin`, `pref/accuracy`
      (`mean[a_w·lr_w > a_l·lr_l]`).

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, m = step_apo_loss(jnp.array([2.0]), jnp.array([-1.0]), jnp.array([0.5]),
      ...                         jnp.array([1.0]), beta=0.5)
      >>> round(float(loss), 6), float(m["pref/accuracy"])
      (0.313262, 1.0)
    """
    where = "step_apo_loss"
    check_positive(beta, "beta", where=where)
    check_rank(lr_w, 1, "lr_w", where=where)
    v = pair_valid(valid, jnp.shape(lr_w), where=where)
    w = pair_array(lr_w, "lr_w", v, where=where)
    l = pair_array(lr_l, "lr_l", v, where=where)
    aw = pair_array(a_w, "a_w", v, where=where, differentiable=False, floating=False)
    al = pair_array(a_l, "a_l", v, where=where, differentiable=False, floating=False)
    b = jax.lax.stop_gradient(jnp.asarray(beta, jnp.float32))
    if b.ndim:
        raise ValueError(f"{where}: `beta` must be a scalar, got shape {b.shape}.")
    reward_w, reward_l = b * aw * w, b * al * l
    pw = pair_weights_array(pair_weights, v, where=where)
    loss = pair_mean(-jax.nn.log_sigmoid(reward_w - reward_l), pw, num_pairs, v, where=where)
    return loss, reward_metrics(reward_w, reward_l, v)
