"""Which rollouts of a group to train on: max-variance down-sampling (D³S, PODS) and the best/worst
pair of PF-PPO (ALGORITHMS.md §5.16, §11).

Both return `bool[B,G]` selections over contiguous groups (row `n = b·G + g`). A selection enters
a policy loss either as part of the loss `mask` (the unselected rollouts leave the loss and its
normalisers: down-sampling proper, `mask * jnp.repeat(keep.reshape(-1), ...)`) or through
`token_weights` (the normalisers still count them, ALGORITHMS.md §0.5); broadcast it to tokens with
`losses.broadcast_to_tokens(keep, mask)`. Selections carry no gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import as_float32, as_mask, check_rank, check_real

# Two candidate subsets whose population variances agree to this relative tolerance are a tie (the
# smaller `j` wins): mathematically equal variances (binary rewards, mirrored advantages) differ
# by float32 rounding only, which must not decide the choice.
_TIE_RTOL = 1e-5


def _candidate_subsets(G: int, k: int) -> np.ndarray:
    """`bool[k+1, G]`: candidate `j` takes the `j` largest and `k − j` smallest sorted positions."""
    pos = np.arange(G)[None, :]
    j = np.arange(k + 1)[:, None]
    return (pos < k - j) | (pos >= G - j)


def rollout_downsample_mask(advantages: ArrayLike, *, k: int) -> Array:
    """Keep the `k` rollouts of each group whose advantages have the largest variance (§5.16).

    With the group's advantages sorted ascending (ties by index, a stable sort), candidate `j`
    (`j = 0 … k`) is the subset of the `j` largest and the `k − j` smallest values. The function
    keeps the candidate with the largest population variance `mean((a − mean a)²)`; ties (within a
    relative 1e-5, so that float32 rounding of mathematically equal variances cannot decide) go to
    the smallest `j`. A maximum-variance `k`-subset always has this form (proved in PODS), so the
    result is optimal over all `C(G, k)` subsets at `O(G log G + k·G)` cost.

    Sources: "Learning More with Less: A Dynamic Dual-Level Down-Sampling Framework for Efficient
    Policy Optimization" (D³S, arXiv 2509.22115; sample level, which selects by the variance of
    advantages); "Not All Rollouts are Useful: Down-Sampling Rollouts in LLM Reinforcement
    Learning" (PODS, arXiv 2504.13818; max-variance down-sampling of rewards and its `j`-largest /
    `(k−j)`-smallest structure). No peer. Pass rewards instead of advantages for PODS's rule (for
    group-standardised advantages the two select the same subsets). Whether advantages are
    recomputed on the kept subset is the caller's choice (ALGORITHMS.md does not fix it); the
    schedule of `k` (D³S starts aggressive and relaxes) lives in the trainer.

    Args:
      advantages: `[B,G]` per-rollout advantages (or rewards); real-valued.
      k: static number of rollouts to keep per group, `1 <= k <= G`.

    Returns:
      `bool[B,G]` with exactly `k` True entries per group.

    Examples:
      >>> import jax.numpy as jnp
      >>> a = jnp.array([[0.9, -0.2, 0.1, -1.0, 0.3]])
      >>> rollout_downsample_mask(a, k=2).tolist()
      [[True, False, False, True, False]]
      >>> rollout_downsample_mask(a, k=3).tolist()
      [[True, False, False, True, True]]
    """
    where = "rollout_downsample_mask"
    check_rank(advantages, 2, "advantages", where=where)
    check_real(advantages, "advantages", where=where)
    G = jnp.shape(advantages)[1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= G:
        raise ValueError(
            f"{where}: `k` must be a static Python int with 1 <= k <= G={G}, got {k!r}."
        )
    a = jax.lax.stop_gradient(as_float32(advantages))
    order = jnp.argsort(a, axis=-1, stable=True)
    ranked = jnp.take_along_axis(a, order, axis=-1)  # [B,G] ascending
    subsets = jnp.asarray(_candidate_subsets(G, k), jnp.float32)  # [k+1, G]
    mean = jnp.einsum("bg,jg->bj", ranked, subsets) / k
    centred = (ranked[:, None, :] - mean[:, :, None]) * subsets[None]
    var = jnp.sum(centred**2, axis=-1) / k  # [B, k+1]
    best = jnp.max(var, axis=-1, keepdims=True)
    is_best = var >= best - _TIE_RTOL * jnp.abs(best)
    choice = jnp.argmax(is_best, axis=-1)  # first (smallest j) among the ties
    # the chosen row of `subsets` via a one-hot product (a gather would need an explicit sharding)
    chosen = (jnp.arange(k + 1)[None, :] == choice[:, None]).astype(jnp.float32)  # [B, k+1]
    keep_ranked = jnp.einsum("bj,jg->bg", chosen, subsets) > 0  # [B,G] in sorted order
    inverse = jnp.argsort(order, axis=-1)
    return jnp.take_along_axis(keep_ranked, inverse, axis=-1)


def best_worst_mask(rewards: ArrayLike, *, valid: ArrayLike | None = None) -> Array:
    """Select the best and the worst rollout of each group (PF-PPO's "best-worst" filter, §11).

        keep_bg = valid_bg · ([g = argmax_valid s_b] ∨ [g = argmin_valid s_b])

    Ties go to the first index, so a group whose valid rewards are all equal keeps one rollout
    (argmax = argmin), and a group with a single valid rollout keeps it; a group without valid
    rollouts keeps none. Invalid rewards are ignored (NaN there is harmless).

    Source: "Policy Filtration in RLHF to Fine-Tune LLM for Code Generation" (PF-PPO,
    arXiv 2409.06957): of the filtration strategies studied, keeping the best and the worst
    response per prompt is one of those that raise the reward model's reliability. The tie rule is
    our choice (reconstructed — verify against the paper). No peer.

    Args:
      rewards: `[B,G]` sequence rewards.
      valid: optional `[B,G]` bool; invalid rollouts are never selected.

    Returns:
      `bool[B,G]`, at most two True entries per group.

    Examples:
      >>> import jax.numpy as jnp
      >>> best_worst_mask(jnp.array([[0.2, 0.9, 0.1, 0.5], [1.0, 1.0, 1.0, 1.0]])).tolist()
      [[False, True, True, False], [True, False, False, False]]
    """
    where = "best_worst_mask"
    check_rank(rewards, 2, "rewards", where=where)
    check_real(rewards, "rewards", where=where)
    shape = jnp.shape(rewards)
    s = jax.lax.stop_gradient(as_float32(rewards))
    v = jnp.ones(shape, bool) if valid is None else as_mask(valid, shape, "valid", where=where) > 0
    best = jnp.argmax(jnp.where(v, s, -jnp.inf), axis=-1)
    worst = jnp.argmin(jnp.where(v, s, jnp.inf), axis=-1)
    g = jnp.arange(shape[1])[None, :]
    keep = (g == best[:, None]) | (g == worst[:, None])
    return keep & v & jnp.any(v, axis=-1, keepdims=True)
