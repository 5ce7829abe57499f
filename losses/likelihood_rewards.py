"""Rewards from the policy's own likelihoods, without a verifier (ALGORITHMS.md §11).

* `self_aligned_rewards` (SAR): how much the question makes the response more likely.
* `followup_likelihood_rewards` (FLR): how likely positive versus negative user follow-ups are.
* `reference_probability_rewards` (RLPR): how likely the reference answer is after the reasoning.

Inputs are token log-probabilities computed by one extra forward pass each (`losses.token_logprobs`
on the relevant context) with a `mask[N,T]` of the scored tokens. Masked entries are replaced with
0 before any arithmetic, so NaN/inf there never reach a value. The log-probs come from the policy
being trained, so the rewards are returned under stop-gradient (§0.6): they never leak a gradient
into the policy.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_floating
from losses._rewards import check_shape, flags, real_array, sg, zero_outside


def _token_inputs(x: Any, name: str, *, where: str) -> Array:
    """`[N,T]` log-probs: a floating array (integer "log-probs" are a caller's mistake)."""
    check_floating(x, name, where=where)
    return real_array(x, name, where=where, rank=2)


def _masked_row_mean(x: Array, valid: Array) -> Array:
    count = jnp.sum(valid, axis=-1)
    return jnp.sum(zero_outside(x, valid), axis=-1) / jnp.maximum(count, 1.0)


def self_aligned_rewards(lp_cond: ArrayLike, lp_uncond: ArrayLike, mask: ArrayLike) -> Array:
    """SAR: relative drop in perplexity when the response is conditioned on its question.

        ppl_c = exp(−mean_t lp_cond)      ppl_u = exp(−mean_t lp_uncond)     (masked means)
        r     = (ppl_u − ppl_c)/ppl_u = 1 − exp(mean lp_uncond − mean lp_cond)

    Positive when the question makes the response more likely (the response is *about* the
    question), negative for generic text; bounded above by 1. Computed as `−expm1(·)` for
    accuracy near 0. Rows without a valid token get 0. Combine it with the correctness reward.

    Source: "Self-Aligned Reward: Towards Effective and Efficient Reasoners" (seed paper); the
    perplexities as exponentiated masked-mean log-probs over the response tokens are
    (reconstructed — verify against the paper). No peer.

    Args:
      lp_cond: `[N,T]` log-probs of the response tokens given the question.
      lp_uncond: `[N,T]` log-probs of the same tokens without the question.
      mask: `[N,T]` {0,1} response tokens.

    Returns:
      `[N]` float32 rewards in (−inf, 1), under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> m = jnp.ones((1, 2))
      >>> r = self_aligned_rewards(jnp.array([[-1.0, -1.0]]), jnp.array([[-2.0, -2.0]]), m)
      >>> round(float(r[0]), 6)
      0.632121
    """
    where = "self_aligned_rewards"
    c = _token_inputs(lp_cond, "lp_cond", where=where)
    u = _token_inputs(lp_uncond, "lp_uncond", where=where)
    check_shape(u, c.shape, "lp_uncond", where=where)
    m = flags(mask, c.shape, "mask", where=where)
    gap = _masked_row_mean(u, m) - _masked_row_mean(c, m)
    return sg(-jnp.expm1(gap))


def followup_likelihood_rewards(lp_f: ArrayLike, polarity: ArrayLike) -> Array:
    """FLR: likelihood of positive minus negative follow-up utterances (ALGORITHMS.md §11).

        r_n = mean_{f: polarity_f > 0} lp_f[n,f] − mean_{f: polarity_f < 0} lp_f[n,f]

    `lp_f[n,f]` is the (length-averaged) log-probability of follow-up utterance `f` ("Thanks, that
    helped!" / "That's wrong.") given the dialogue and response `n`. Follow-ups with polarity 0 are
    ignored (their entries may hold anything, NaN included); an empty side contributes 0.

    Source: FLR, "Aligning Language Models Using Follow-up Likelihood as Reward Signal" (seed
    paper); the difference of mean log-probs is (reconstructed — verify against the paper). No peer.

    Args:
      lp_f: `[N,F]` follow-up log-probs.
      polarity: `[F]` numbers: +1 positive, −1 negative, 0 unused (bool is rejected as
        ambiguous).

    Returns:
      `[N]` float32 rewards, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-1.0, -3.0, -2.0], [-4.0, -1.0, -2.0]])
      >>> followup_likelihood_rewards(lp, jnp.array([1, 1, -1])).tolist()
      [0.0, -0.5]
    """
    where = "followup_likelihood_rewards"
    lp = _token_inputs(lp_f, "lp_f", where=where)
    pol = jnp.asarray(polarity)
    if jnp.issubdtype(pol.dtype, jnp.bool_):
        raise ValueError(
            f"{where}: `polarity` must be numeric (+1 positive, −1 negative, 0 unused), got bool."
        )
    pol = real_array(pol, "polarity", where=where)
    check_shape(pol, lp.shape[1:], "polarity", where=where)
    pos = jnp.broadcast_to(pol > 0, lp.shape)
    neg = jnp.broadcast_to(pol < 0, lp.shape)
    return sg(_masked_row_mean(lp, pos) - _masked_row_mean(lp, neg))


def reference_probability_rewards(
    ref_lp: ArrayLike, mask: ArrayLike, base_lp: ArrayLike | None = None
) -> Array:
    """RLPR: mean token probability of the reference answer, debiased and clipped.

        p_n = mean_t exp(ref_lp[n,t])            (masked mean over the reference-answer tokens)
        b_n = mean_t exp(base_lp[n,t])           (the same answer without the reasoning; 0 if None)
        r_n = clip(p_n − b_n, 0, 1)

    `ref_lp` scores the reference answer after the policy's own reasoning; subtracting its
    probability without the reasoning removes what the question alone explains. RLPR also drops
    prompts whose rewards barely vary (`losses.zero_variance_mask(rewards, min_std=…)`).

    Source: "RLPR: Extrapolating RLVR to General Domains without Verifiers" (seed paper); the
    debiasing by a reasoning-free pass and the clip to [0, 1] are (reconstructed — verify against
    the paper). No peer.

    Args:
      ref_lp: `[N,Ta]` log-probs of the reference-answer tokens after the generated reasoning.
      mask: `[N,Ta]` {0,1} reference-answer tokens.
      base_lp: optional `[N,Ta]` log-probs of the same tokens without the reasoning (same mask).

    Returns:
      `[N]` float32 rewards in [0, 1], under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.log(jnp.array([[0.9, 0.7], [0.2, 0.4]]))
      >>> base = jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.5]]))
      >>> [round(x, 6) for x in reference_probability_rewards(lp, jnp.ones((2, 2)), base).tolist()]
      [0.3, 0.0]
    """
    where = "reference_probability_rewards"
    lp = _token_inputs(ref_lp, "ref_lp", where=where)
    m = flags(mask, lp.shape, "mask", where=where)
    p = _masked_row_mean(jnp.exp(zero_outside(lp, m)), m)
    if base_lp is not None:
        base = _token_inputs(base_lp, "base_lp", where=where)
        check_shape(base, lp.shape, "base_lp", where=where)
        p = p - _masked_row_mean(jnp.exp(zero_outside(base, m)), m)
    return sg(jnp.clip(p, 0.0, 1.0))
