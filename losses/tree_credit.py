"""Credit from the prefix tree of a group of responses: prefix values and TEMPO advantages.

The `G` responses to one prompt form a tree: two responses share a node as long as their prefixes
agree. The value of a node is the mean reward of the responses through it, so every token gets a
Monte-Carlo value without a critic, and the change of value along a response (a TD error) is
non-zero only at branch points (ALGORITHMS.md §4.16).

Layout: `tokens[B,G,T]` (groups are contiguous rows `n = b·G + g` of the `[N,T]` batch), rewards
`[B,G]`. Comparing all pairs of responses costs `O(G²T)` per prompt; `prefix_tree_values` scans
over chunks of `chunk_size` positions so that memory stays `O(B·G²·chunk_size)`.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_choice,
    check_finite,
    check_positive,
    check_rank,
    check_real,
)
from losses.advantages import group_advantages
from losses.segments import _check_integer, _previous_valid_index, _zero_outside

_sg = jax.lax.stop_gradient


def _group_rewards(rewards: Any, B: int, G: int, *, where: str) -> Array:
    check_rank(rewards, 2, "rewards", where=where)
    check_real(rewards, "rewards", where=where)
    if jnp.shape(rewards) != (B, G):
        raise ValueError(
            f"{where}: `rewards` must have shape (B, G) = {(B, G)}, got {jnp.shape(rewards)}."
        )
    return _sg(as_float32(rewards))


def _grouped_mask(mask: Any, B: int, G: int, T: int, *, where: str) -> Array:
    """Accept `mask[B,G,T]` or `mask[N,T]` (N = B·G); return a bool `[B,G,T]`."""
    if jnp.shape(mask) == (B * G, T):
        mask = jnp.asarray(mask).reshape(B, G, T)
    return as_mask(mask, (B, G, T), where=where) > 0


def prefix_tree_values(
    tokens: ArrayLike,
    mask: ArrayLike,
    rewards: ArrayLike,
    *,
    chunk_size: int | None = 256,
) -> Array:
    """Monte-Carlo value of every prefix from the group's prefix tree (ALGORITHMS.md §4.16).

        match_ij,t = Π_{u≤t} [y_iu = y_ju]·[m_iu = m_ju]    (i and j share the prefix up to t)
        V_it       = Σ_j match_ij,t s_j / Σ_j match_ij,t     (j = i always matches)

    `V_it` is the mean reward of the responses of the group that agree with response `i` on
    positions `0..t`; at a position reached by no other response it is `s_i`. Tokens are compared
    at every position, masked ones included (observation tokens of multi-turn rollouts are part
    of the state), and a position valid in one response but not in the other is a mismatch. For
    trailing padding this is the formula of ALGORITHMS.md (`Π_u [y_iu = y_ju]·m_ju`) on every
    valid position; the treatment of masked positions inside a response is our assumption.
    With binary rewards `V` is also the token-level value target of TVM.

    Source: "Exploiting Tree Structure for Credit Assignment in RL Training of LLMs" (P2T/TEMPO,
    arXiv 2509.18314). No peer.

    Args:
      tokens: `int[B,G,T]` response tokens.
      mask: `[B,G,T]` (or `[N,T]`) {0,1} valid tokens.
      rewards: `[B,G]` sequence rewards `s`.
      chunk_size: positions compared per scan step (memory `O(B·G²·chunk_size)`); None: all `T`
        at once.

    Returns:
      `[B,G,T]` float32 values, 0 outside the mask, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> y = jnp.array([[[1, 2, 3], [1, 2, 4], [1, 5, 6]]])     # a b c / a b d / a e f
      >>> V = prefix_tree_values(y, jnp.ones((1, 3, 3)), jnp.array([[1.0, 0.0, 1.0]]))
      >>> [[round(v, 4) for v in row] for row in V[0].tolist()]
      [[0.6667, 0.5, 1.0], [0.6667, 0.5, 0.0], [0.6667, 1.0, 1.0]]
    """
    where = "prefix_tree_values"
    check_rank(tokens, 3, "tokens", where=where)
    _check_integer(tokens, "tokens", where=where)
    B, G, T = jnp.shape(tokens)
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ValueError(
            f"{where}: `chunk_size` must be a positive Python int or None, got {chunk_size!r}."
        )
    s = _group_rewards(rewards, B, G, where=where)
    valid = _grouped_mask(mask, B, G, T, where=where)
    c = T if chunk_size is None else min(chunk_size, T)
    n_chunks = -(-T // c)
    pad = n_chunks * c - T
    y = jnp.pad(jnp.asarray(tokens), ((0, 0), (0, 0), (0, pad)))
    m = jnp.pad(valid, ((0, 0), (0, 0), (0, pad)))
    # [n_chunks, B, G, c]: the scan runs over chunks of positions
    y = jnp.moveaxis(y.reshape(B, G, n_chunks, c), 2, 0)
    m = jnp.moveaxis(m.reshape(B, G, n_chunks, c), 2, 0)

    def chunk(carry: Array, xs: tuple[Array, Array]) -> tuple[Array, Array]:
        yc, mc = xs
        same = (yc[:, :, None, :] == yc[:, None, :, :]) & (mc[:, :, None, :] == mc[:, None, :, :])
        run = jax.lax.cummin(same.astype(jnp.int32), axis=3) > 0  # prefix agreement in the chunk
        match = run & carry[..., None]  # [B,G,G,c]
        w = match.astype(s.dtype)
        values = jnp.einsum("bijc,bj->bic", w, s) / jnp.sum(w, axis=2)
        return match[..., -1], values

    zero = jnp.zeros_like(s)
    init = (zero[:, :, None] + zero[:, None, :]) == 0  # all True, sharded like the rewards
    _, values = jax.lax.scan(chunk, init, (y, m))  # [n_chunks, B, G, c]
    values = jnp.moveaxis(values, 0, 2).reshape(B, G, n_chunks * c)[..., :T]
    return _sg(_zero_outside(values, valid))


def tempo_advantages(
    values: ArrayLike,
    rewards: ArrayLike,
    mask: ArrayLike,
    *,
    td_weight: float = 1.0,
    base: Literal["group", "batch", "none"] = "group",
    eps: float = 1e-6,
    ddof: int = 1,
) -> Array:
    """TEMPO: group advantage plus the TD error of the prefix-tree values (ALGORITHMS.md §4.16).

        TD_it = (V_it − V_i,prev(t))·m_it      prev(t) = the previous valid position; V_i,−1 = μ_b
        A_it  = (a_i + w·TD_it)·m_it           a = group_advantages(s, scale=base, eps, ddof)

    with `V` from `prefix_tree_values` and `μ_b` the mean reward of the group. The TD term is
    non-zero only where the set of responses sharing the prefix changes (branch points), so TEMPO
    equals GRPO on every other token; identical responses give `TD ≡ 0`, and along a response
    `Σ_t TD_it = V_i,last − μ_b` (`= s_i − μ_b` when identical responses share a reward). The
    previous *valid* position is used so that masked (tool) tokens inside a response do not break
    the telescoping sum. The weighting and normalisation of the TD term (`w·TD` added to the
    normalised group advantage, unnormalised) are (reconstructed — verify against the paper).

    Source: "Exploiting Tree Structure for Credit Assignment in RL Training of LLMs" (P2T/TEMPO,
    arXiv 2509.18314). No peer.

    Args:
      values: `[B,G,T]` (or `[N,T]`) prefix values from `prefix_tree_values`.
      rewards: `[B,G]` sequence rewards `s`, `G >= 2`.
      mask: `[B,G,T]` (or `[N,T]`) {0,1} valid tokens.
      td_weight: `w` (scalar, may be traced).
      base: scale of the group advantage: "group" (GRPO), "batch" or "none" (Dr.GRPO).
      eps: added to the std of the group advantage.
      ddof: delta degrees of freedom of that std.

    Returns:
      `[N,T]` float32 advantages (`N = B·G`), 0 outside the mask, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> y = jnp.array([[[1, 2, 3], [1, 2, 4], [1, 5, 6]]]); m = jnp.ones((1, 3, 3))
      >>> s = jnp.array([[1.0, 0.0, 1.0]])
      >>> V = prefix_tree_values(y, m, s)
      >>> A = tempo_advantages(V, s, m, base="none")        # a = s − μ = [1/3, −2/3, 1/3]
      >>> [[round(a, 4) for a in row] for row in A.tolist()]
      [[0.3333, 0.1667, 0.8333], [-0.6667, -0.8333, -1.1667], [0.3333, 0.6667, 0.3333]]
    """
    where = "tempo_advantages"
    check_choice(base, ("group", "batch", "none"), "base", where=where)
    check_choice(ddof, (0, 1), "ddof", where=where)
    check_positive(eps, "eps", where=where, allow_zero=True)
    check_real(td_weight, "td_weight", where=where)
    check_finite(td_weight, "td_weight", where=where)
    if jnp.ndim(td_weight) != 0:
        raise ValueError(
            f"{where}: `td_weight` must be a scalar, got shape {jnp.shape(td_weight)}."
        )
    check_rank(values, (2, 3), "values", where=where)
    check_real(values, "values", where=where)
    check_rank(rewards, 2, "rewards", where=where)
    B, G = jnp.shape(rewards)
    shape = jnp.shape(values)
    N, T = B * G, shape[-1]
    if shape not in ((B, G, T), (N, T)):
        raise ValueError(
            f"{where}: `values` must have shape (B, G, T) or (N, T) with (B, G) = {(B, G)} from "
            f"`rewards`, got {shape}."
        )
    s = _group_rewards(rewards, B, G, where=where)
    valid = _grouped_mask(mask, B, G, T, where=where).reshape(N, T)
    V = _zero_outside(_sg(as_float32(values)).reshape(N, T), valid)
    mu = (jnp.zeros_like(s) + jnp.mean(s, axis=1, keepdims=True)).reshape(N)  # μ_b per row
    prev = _previous_valid_index(valid)
    v_prev = jnp.take_along_axis(V, jnp.maximum(prev, 0), axis=1)
    v_prev = jnp.where(prev >= 0, v_prev, mu[:, None])
    td = _zero_outside(V - v_prev, valid)
    a = group_advantages(s, scale=base, eps=eps, ddof=ddof).reshape(N)
    w = jnp.asarray(td_weight).astype(V.dtype)
    return _sg(_zero_outside(a[:, None] + w * td, valid))
