"""Building preference pairs and their weights (ALGORITHMS.md §8.1 utilities, §11).

* `best_worst_pairs` — the highest- and lowest-scored sample of each group as a (chosen, rejected)
  pair (DNO, RLHF Workflow, iterative DPO on scored samples).
* `rank_consistency` — CREAM's agreement of two rankings of a group, mapped to `[0, 1]`; its
  complement is a per-pair `label_smoothing` of `dpo_loss`.
* `wpo_weights` — WPO's per-sequence weights for off-policy preference data (`pair_weights`).
* `ld_sequence_logprob` — LD-DPO's length-desensitised sequence log-probs.

Everything here is data preparation: outputs carry no gradient except `ld_sequence_logprob`,
which is a differentiable replacement for the sequence log-prob sums.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import as_float32, as_mask, check_floating, check_rank, check_real
from losses._policy import zero_outside
from losses._preference import check_unit_interval


def _group_inputs(scores: Any, valid: Any, name: str, *, where: str) -> tuple[Array, Array]:
    check_rank(scores, 2, name, where=where)
    check_real(scores, name, where=where)
    shape = jnp.shape(scores)
    v = jnp.ones(shape, bool) if valid is None else as_mask(valid, shape, "valid", where=where) > 0
    return zero_outside(as_float32(scores), v), v


def best_worst_pairs(
    scores: ArrayLike,
    *,
    min_margin: float = 0.0,
    valid: ArrayLike | None = None,
) -> tuple[Array, Array, Array]:
    """Chosen = best, rejected = worst sample of each group (ALGORITHMS.md §11).

        chosen_b   = argmax_g s_bg,   rejected_b = argmin_g s_bg        (over valid samples)
        keep_b     = max_g s_bg − min_g s_bg > min_margin

    Ties go to the first sample in group order. Groups whose spread does not exceed
    `min_margin` (in particular constant-score groups, and groups with fewer than two valid
    samples) get `keep = False`: pass `keep` as the `valid` of the preference loss. Indices are
    within the group; the flat row of `[N = B·G]` arrays is `b·G + g`.

    Sources: "Direct Nash Optimization: Teaching Language Models to Self-Improve with General
    Preferences" (DNO, arXiv 2404.03715); "RLHF Workflow: From Reward Modeling to Online RLHF"
    (arXiv 2405.07863); VeriPrefer, Temporal SR, iTool, CodeUltraFeedback (seed papers).

    Args:
      scores: `[B,G]` scores (rewards, judge scores) of the G samples of each prompt.
      min_margin: static threshold `≥ 0` on the best-minus-worst score.
      valid: optional `[B,G]` {0,1}; invalid samples are never picked.

    Returns:
      `(chosen[B], rejected[B], keep[B])`: int32 group indices and a bool mask (no gradient).

    Examples:
      >>> import jax.numpy as jnp
      >>> c, r, keep = best_worst_pairs(jnp.array([[0.2, 0.9, 0.1], [0.5, 0.5, 0.5]]))
      >>> c.tolist(), r.tolist(), keep.tolist()
      ([1, 0], [2, 0], [True, False])
    """
    where = "best_worst_pairs"
    if isinstance(min_margin, bool) or not isinstance(min_margin, int | float) or min_margin < 0:
        raise ValueError(f"{where}: `min_margin` must be a Python number >= 0, got {min_margin!r}.")
    s, v = _group_inputs(scores, valid, "scores", where=where)
    s = jax.lax.stop_gradient(s)
    chosen = jnp.argmax(jnp.where(v, s, -jnp.inf), axis=1).astype(jnp.int32)
    rejected = jnp.argmin(jnp.where(v, s, jnp.inf), axis=1).astype(jnp.int32)
    best = jnp.take_along_axis(s, chosen[:, None], axis=1)[:, 0]
    worst = jnp.take_along_axis(s, rejected[:, None], axis=1)[:, 0]
    enough = jnp.sum(v, axis=1) >= 2
    keep = enough & (best - worst > min_margin)
    return chosen, rejected, keep


def rank_consistency(
    scores_a: ArrayLike,
    scores_b: ArrayLike,
    *,
    valid: ArrayLike | None = None,
) -> Array:
    """CREAM's ranking consistency: Kendall's τ of two score vectors mapped to `[0, 1]` (§11).

        τ_b = Σ_{i<j} sign(a_bi − a_bj)·sign(b_bi − b_bj) / (n_b(n_b − 1)/2)   (over valid samples)
        c_b = (τ_b + 1)/2

    `a`, `b` are two scorings of the same G responses (CREAM: the current and the previous
    iteration's self-reward model). `c = 1` means identical rankings, `c = 0` reversed ones; use
    `label_smoothing = 1 − c` in `dpo_loss` so that pairs whose ranking is unreliable are trained
    towards the uninformative label ½. Ties count as neither concordant nor discordant (τ-a).
    Groups with fewer than two valid samples get `c = 1` (no smoothing).

    (reconstructed — verify against the paper): ALGORITHMS.md §11 marks the Kendall τ → [0, 1]
    mapping `(τ + 1)/2` and its per-prompt use as our reconstruction (the paper may average the
    consistency over the dataset); τ-a (no tie correction) is an assumption.

    Source: "CREAM: Consistency Regularized Self-Rewarding Language Models" (arXiv 2410.12735).

    Args:
      scores_a: `[B,G]` first scoring.
      scores_b: `[B,G]` second scoring.
      valid: optional `[B,G]` {0,1}; invalid samples are left out of every pair.

    Returns:
      `[B]` float32 consistencies in `[0, 1]` (no gradient).

    Examples:
      >>> import jax.numpy as jnp
      >>> a = jnp.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
      >>> b = jnp.array([[0.1, 0.2, 0.3], [0.3, 0.1, 0.2]])
      >>> [round(x, 6) for x in rank_consistency(a, b).tolist()]
      [1.0, 0.333333]
    """
    where = "rank_consistency"
    a, v = _group_inputs(scores_a, valid, "scores_a", where=where)
    check_real(scores_b, "scores_b", where=where)
    if jnp.shape(scores_b) != a.shape:
        raise ValueError(
            f"{where}: `scores_b` must have the shape of `scores_a` {a.shape}, "
            f"got {jnp.shape(scores_b)}."
        )
    b = zero_outside(as_float32(scores_b), v)
    G = a.shape[1]
    upper = jnp.triu(jnp.ones((G, G), bool), k=1)
    both = v[:, :, None] & v[:, None, :] & upper[None]
    sa = jnp.sign(a[:, :, None] - a[:, None, :])
    sb = jnp.sign(b[:, :, None] - b[:, None, :])
    agreement = jnp.sum(jnp.where(both, sa * sb, 0.0), axis=(1, 2))
    pairs = jnp.sum(both.astype(jnp.float32), axis=(1, 2))
    tau = jnp.where(pairs > 0, agreement / jnp.maximum(pairs, 1.0), 1.0)
    return jax.lax.stop_gradient(0.5 * (tau + 1.0))


def wpo_weights(
    token_logp: ArrayLike,
    log_sum_pi_sq: ArrayLike,
    mask: ArrayLike,
) -> Array:
    """WPO's per-sequence weights for off-policy preference data (ALGORITHMS.md §8.1).

        w_n = exp( Σ_t sg(lp_nt − log Σ_v π_nt(v)²)·m_nt / max(Σ_t m_nt, 1) )

    `log Σ_v π²` (from `losses.log_sum_pi_squared(logits)`) is the log-probability that two
    samples from the policy's next-token distribution coincide; the weight is the geometric mean,
    over the response, of how likely the policy is to produce each observed token relative to
    that. Preference pairs the current policy would plausibly generate get weight near 1 or more,
    off-policy ones less. The pair weight is `w_chosen·w_rejected`, passed as `pair_weights`; TRL
    and the WPO code clamp that product at 1 (`jnp.minimum(w_c·w_r, 1.0)`). Rows without valid
    tokens get weight 1.

    Source: "WPO: Enhancing RLHF with Weighted Preference Optimization" (arXiv 2406.11827). Peer:
    TRL `DPOConfig(use_weighting=True)`.

    Args:
      token_logp: `[N,T]` policy log-probs of the response tokens.
      log_sum_pi_sq: `[N,T]` `log Σ_v π(v)²` at the same positions.
      mask: `[N,T]` {0,1} response tokens.

    Returns:
      `[N]` float32 positive weights under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.log(jnp.array([[0.5, 0.25]])); lsq = jnp.log(jnp.array([[0.5, 0.5]]))
      >>> round(float(wpo_weights(lp, lsq, jnp.ones((1, 2)))[0]), 6)  # exp(mean(log[1, ½]))
      0.707107
    """
    where = "wpo_weights"
    check_rank(token_logp, 2, "token_logp", where=where)
    check_floating(token_logp, "token_logp", where=where)
    check_floating(log_sum_pi_sq, "log_sum_pi_sq", where=where)
    shape = jnp.shape(token_logp)
    if jnp.shape(log_sum_pi_sq) != shape:
        raise ValueError(
            f"{where}: `log_sum_pi_sq` must have the shape of `token_logp` {shape}, "
            f"got {jnp.shape(log_sum_pi_sq)}."
        )
    m = as_mask(mask, shape, where=where)
    diff = zero_outside(as_float32(token_logp), m > 0) - zero_outside(
        as_float32(log_sum_pi_sq), m > 0
    )
    mean = jnp.sum(diff, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
    return jax.lax.stop_gradient(jnp.exp(mean))


def ld_sequence_logprob(
    chosen_token_logp: ArrayLike,
    chosen_mask: ArrayLike,
    rejected_token_logp: ArrayLike,
    rejected_mask: ArrayLike,
    *,
    alpha: float,
) -> tuple[Array, Array]:
    """LD-DPO's length-desensitised sequence log-probs of a pair (ALGORITHMS.md §8.1).

        ℓ_p = min(ℓ_c, ℓ_r)                                        (the "public" length)
        ld  = Σ_{k ≤ ℓ_p} lp_(k) + α·Σ_{k > ℓ_p} lp_(k)            for chosen and rejected

    where `lp_(k)` is the k-th valid token of the response (positions counted along the mask, so
    holes are skipped). The tokens beyond the shorter response's length are down-weighted by
    `α ∈ [0, 1]`, which removes most of DPO's preference for longer responses; `α = 1` gives the
    plain sums. Apply it to the policy's and the reference's token log-probs alike (same masks)
    and feed the results to `dpo_loss`. Differentiable w.r.t. the token log-probs.

    Source: "Length Desensitization in Directed Preference Optimization" (LD-DPO,
    arXiv 2409.06411). Peer: TRL `DPOConfig(ld_alpha=...)`.

    Args:
      chosen_token_logp: `[N,T_c]` token log-probs of the chosen responses.
      chosen_mask: `[N,T_c]` {0,1}.
      rejected_token_logp: `[N,T_r]` token log-probs of the rejected responses.
      rejected_mask: `[N,T_r]` {0,1}.
      alpha: static weight `α ∈ [0, 1]` of the tokens beyond the public length (required).

    Returns:
      `(ld_chosen[N], ld_rejected[N])`, float32.

    Examples:
      >>> import jax.numpy as jnp
      >>> c = jnp.array([[-1.0, -1.0, -1.0, -1.0]]); r = jnp.array([[-2.0, -2.0]])
      >>> ld_c, ld_r = ld_sequence_logprob(c, jnp.ones((1, 4)), r, jnp.ones((1, 2)), alpha=0.5)
      >>> float(ld_c[0]), float(ld_r[0])
      (-3.0, -4.0)
    """
    where = "ld_sequence_logprob"
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(f"{where}: `alpha` must be a Python number in [0, 1], got {alpha!r}.")
    check_unit_interval(alpha, "alpha", where=where)
    sides = []
    for lp, mask, names in (
        (chosen_token_logp, chosen_mask, ("chosen_token_logp", "chosen_mask")),
        (rejected_token_logp, rejected_mask, ("rejected_token_logp", "rejected_mask")),
    ):
        check_rank(lp, 2, names[0], where=where)
        check_floating(lp, names[0], where=where)
        m = as_mask(mask, jnp.shape(lp), names[1], where=where)
        sides.append((zero_outside(as_float32(lp), m > 0), m))
    (lp_c, m_c), (lp_r, m_r) = sides
    if lp_c.shape[0] != lp_r.shape[0]:
        raise ValueError(
            f"{where}: `rejected_token_logp` must have N = {lp_c.shape[0]} rows like "
            f"`chosen_token_logp`, got shape {lp_r.shape}."
        )
    public = jnp.minimum(jnp.sum(m_c, axis=1), jnp.sum(m_r, axis=1))[:, None]

    def desensitised(lp: Array, m: Array) -> Array:
        ordinal = jnp.cumsum(m, axis=1)  # 1-based position among the valid tokens
        weight = jnp.where(ordinal <= public, 1.0, alpha)
        return jnp.sum(lp * weight, axis=1)

    return desensitised(lp_c, m_c), desensitised(lp_r, m_r)
