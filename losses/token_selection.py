"""Which tokens to train on: D³S token down-sampling, GTPO conflict tokens and CAPO's rejection of
unstable tokens (ALGORITHMS.md §5.16, §11).

Each function returns a `bool` selection with no gradient. Selections that must not change a
policy loss's normaliser enter it through `token_weights` (booleans are accepted there); see
ALGORITHMS.md §0.5. Statistics over tokens (quantiles, order statistics) run over all valid
tokens of the global batch: an input sharded with explicit axes is gathered before the sort.
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
    check_floating,
    check_rank,
    check_real,
    check_same_shape,
    replicated,
)
from losses._position import snapped_position
from losses.entropy_mask import high_entropy_mask


def _check_fraction(value: Any, name: str, *, where: str, allow_zero: bool) -> None:
    """A static fraction must lie in (0, 1] (or [0, 1]); a traced one must be a scalar."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: `{name}` must be a number, got {value!r}.")
    if isinstance(value, int | float):
        low_ok = value >= 0.0 if allow_zero else value > 0.0
        if not (low_ok and value <= 1.0):
            interval = "[0, 1]" if allow_zero else "(0, 1]"
            raise ValueError(f"{where}: `{name}` must be in {interval}, got {value!r}.")
    elif jnp.ndim(value) != 0:
        raise ValueError(f"{where}: `{name}` must be a scalar, got shape {jnp.shape(value)}.")


def token_downsample_mask(
    advantages: ArrayLike,
    entropy: ArrayLike,
    mask: ArrayLike,
    *,
    keep_frac: Any,
    threshold: Any = None,
) -> Array:
    """Keep the valid tokens with the largest `|A|·H` (D³S token level, ALGORITHMS.md §5.16).

        score = |sg(A)|·sg(H)
        q     = quantile(score[valid], 1 − keep_frac)     (linear interpolation, as §5.15)
        keep  = (score ≥ q) ∧ m                          (threshold given: q = threshold)

    The quantile rule is the one of `high_entropy_mask` (which this function calls on the score),
    so with `n` distinct valid scores exactly `floor(1 + keep_frac·(n − 1))` tokens are kept, and
    `keep_frac = 1` keeps every valid token. The selection depends on `A` only through `|A|`: a
    token matters when the policy is uncertain there *and* its advantage is large. Tokens with
    `A = 0` (e.g. of zero-variance groups) have score 0 and are kept only if the quantile is 0.

    Source: "Learning More with Less: A Dynamic Dual-Level Down-Sampling Framework for Efficient
    Policy Optimization" (D³S, arXiv 2509.22115), token level. The schedule of `keep_frac`
    (aggressive early, relaxed later) lives in the trainer (reconstructed — verify against the
    paper: the quantile rule and the use of the global batch are our choices). No peer.

    Args:
      advantages: `[N,T]` per-token advantages (broadcast sequence advantages with
        `losses.broadcast_to_tokens`).
      entropy: `[N,T]` per-token policy entropies (`losses.entropy_from_logits`).
      mask: `[N,T]` {0,1}.
      keep_frac: fraction of valid tokens to keep, in (0, 1]; may be traced.
      threshold: optional precomputed score threshold (overrides `keep_frac`; sharded pipelines).

    Returns:
      `bool[N,T]`, False outside the mask.

    Examples:
      >>> import jax.numpy as jnp
      >>> A = jnp.array([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])
      >>> H = jnp.array([[0.1, 0.5, 2.0], [0.3, 0.2, 9.0]])
      >>> token_downsample_mask(A, H, jnp.ones((2, 3)), keep_frac=0.4).tolist()
      [[False, True, True], [True, False, False]]
    """
    where = "token_downsample_mask"
    check_rank(advantages, 2, "advantages", where=where)
    check_floating(advantages, "advantages", where=where)
    check_floating(entropy, "entropy", where=where)
    check_same_shape(advantages, "advantages", where, entropy=entropy)
    m = as_mask(mask, jnp.shape(advantages), where=where)
    if threshold is None:
        _check_fraction(keep_frac, "keep_frac", where=where, allow_zero=False)
    valid = m > 0
    a = jnp.where(valid, as_float32(advantages), 0.0)
    h = jnp.where(valid, as_float32(entropy), 0.0)
    score = jax.lax.stop_gradient(jnp.abs(a) * h)
    return high_entropy_mask(score, m, top_quantile=keep_frac, threshold=threshold)


def conflict_token_mask(tokens: ArrayLike, mask: ArrayLike, advantages: ArrayLike) -> Array:
    """GTPO's conflict tokens: the same token at the same position in a rollout of opposite sign.

        conflict_bit = m_bit · ∃ j: m_bjt ∧ y_bjt = y_bit ∧ A_bj·A_bi < 0

    i.e. token `y_bit` also appears at position `t` of another rollout `j` of the same group whose
    advantage has the opposite (strict) sign; rollouts with `A = 0` never conflict. GTPO protects
    these tokens by skipping their negative updates and amplifying their positive ones; with this
    mask that is `sign_weighted_advantages(A_tokens, pos_weight=w, neg_weight=0.0,
    select=conflict)` (the amplification `w > 1` is a recipe choice).

    Source: "GTPO: Trajectory-Based Policy Optimization in Large Language Models"
    (arXiv 2508.03772). The positional comparison follows the paper's definition ("tokens
    appearing in the same position across completions with opposite rewards"); the strict-sign
    rule for `A = 0` and the amplification factor are (reconstructed — verify against the paper).
    GTPO's entropy filter of whole completions is not part of this function. No peer.

    Args:
      tokens: `int[B,G,T]` completion tokens of each group.
      mask: `[B,G,T]` {0,1} valid completion tokens.
      advantages: `[B,G]` sequence advantages (sign per rollout).

    Returns:
      `bool[B,G,T]`, False outside the mask (reshape to `[N,T]` with `losses.from_groups`).

    Examples:
      >>> import jax.numpy as jnp
      >>> y = jnp.array([[[5, 7, 9], [5, 8, 9], [6, 7, 9]]])
      >>> A = jnp.array([[1.0, -1.0, 0.0]])
      >>> conflict_token_mask(y, jnp.ones((1, 3, 3)), A).astype(int).tolist()
      [[[1, 0, 1], [1, 0, 1], [0, 0, 0]]]
    """
    where = "conflict_token_mask"
    check_rank(tokens, 3, "tokens", where=where)
    if not jnp.issubdtype(jnp.result_type(tokens), jnp.integer):
        raise ValueError(
            f"{where}: `tokens` must be an integer array, got dtype {jnp.result_type(tokens)}."
        )
    shape = jnp.shape(tokens)
    valid = as_mask(mask, shape, where=where) > 0
    check_rank(advantages, 2, "advantages", where=where)
    check_real(advantages, "advantages", where=where)
    if jnp.shape(advantages) != shape[:2]:
        raise ValueError(
            f"{where}: `advantages` must have shape [B,G] = {shape[:2]} like `tokens` {shape}, "
            f"got {jnp.shape(advantages)}."
        )
    y = jnp.asarray(tokens)
    a = jax.lax.stop_gradient(as_float32(advantages))
    pos, neg = a > 0, a < 0  # [B,G]
    # same[b, i, j, t]: rollout j has the token of rollout i at position t (both valid)
    same = (y[:, :, None, :] == y[:, None, :, :]) & valid[:, None, :, :]
    meets_neg = jnp.any(same & neg[:, None, :, None], axis=2)
    meets_pos = jnp.any(same & pos[:, None, :, None], axis=2)
    conflict = (pos[:, :, None] & meets_neg) | (neg[:, :, None] & meets_pos)
    return conflict & valid


def token_rejection_mask(score: ArrayLike, mask: ArrayLike, *, max_reject: Any = 0.08) -> Array:
    """Reject at most a fraction `max_reject` of the valid tokens: those with the largest score.

    With `n` valid tokens and `r = floor(max_reject·n)`:

        q    = the (n − r)-th smallest valid score          (an order statistic, no interpolation)
        keep = m ∧ (score ≤ q)

    so exactly the `r` highest-scoring tokens are rejected when the scores are distinct, and fewer
    when scores tie at `q` (tied tokens are kept): the rejected fraction never exceeds
    `max_reject`. `max_reject = 0` keeps every valid token and `max_reject = 1` none. The product
    `max_reject·n` is computed exactly from the integer `n` (`losses/_position.py`), and one
    within rounding of an integer counts as that integer (so `1/3` of 3 tokens is 1). NaN scores on valid tokens rank as the largest and are always rejected (NaN ≤ q
    is false), even beyond `r`; the other tokens are kept as if the NaN scores were +inf. Scores
    outside the mask are ignored.

    Source: "Stabilizing Policy Gradients for Sample-Efficient Reinforcement Learning in LLM
    Reasoning" (CAPO, curvature-aware policy optimization, arXiv 2510.00819), which masks the
    tokens whose curvature-based score predicts an unstable update and reports rejecting fewer than
    8 % of tokens (hence the default). The score itself (CAPO's last-layer curvature model) is
    computed by the training stack. Dropping the top fraction by an order statistic over the
    global batch is (reconstructed — verify against the paper). No peer. Apply through
    `token_weights` (or the loss mask).

    Args:
      score: `[N,T]` per-token instability score (larger = less stable).
      mask: `[N,T]` {0,1}.
      max_reject: largest fraction of valid tokens to reject, in [0, 1]; may be traced.

    Returns:
      `bool[N,T]`: True for kept tokens, False for rejected and invalid ones.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.array([[0.1, 5.0, 0.3, 0.2, 0.4], [0.6, 0.9, 3.0, 0.5, 0.7]])
      >>> token_rejection_mask(s, jnp.ones((2, 5)), max_reject=0.2).astype(int).tolist()
      [[1, 0, 1, 1, 1], [1, 1, 0, 1, 1]]
    """
    where = "token_rejection_mask"
    check_rank(score, 2, "score", where=where)
    check_floating(score, "score", where=where)
    m = as_mask(mask, jnp.shape(score), where=where)
    _check_fraction(max_reject, "max_reject", where=where, allow_zero=True)
    valid = m > 0
    s = jax.lax.stop_gradient(jnp.where(valid, as_float32(score), 0.0))
    n = jnp.sum(valid.astype(jnp.int32))
    rejected, _ = snapped_position(n, max_reject)  # floor(n·max_reject), exact
    # NaN scores sort as +inf (as the largest: rejected first), so q is never NaN
    ordered = jnp.sort(replicated(jnp.where(valid & ~jnp.isnan(s), s, jnp.inf).reshape(-1)))
    kept = n - rejected
    index = jnp.clip(kept - 1, 0, ordered.shape[0] - 1)
    return valid & (s <= ordered[index]) & (kept > 0)
