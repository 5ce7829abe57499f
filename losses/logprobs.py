"""Log-probs, entropies and other full-vocabulary statistics of logits (ALGORITHMS.md §0.3, §0.4, §2).

Conventions:

* Alignment (§0.3): the logit at absolute position `s` predicts the token at `s+1`. With prompt
  length `P`, completion token `t` is `tokens[:, P+t]` and its log-prob uses `logits[:, P+t−1]`:
  `token_logprobs(completion_logits(logits, P, T), tokens[:, P:P+T])`.
* Temperature (§0.4): every function works on `z' = float32(z)/τ` with the *sampling* temperature
  `τ`; a mismatch biases every ratio and the KL.
* Numerics (§0.6): logits of any float dtype (bf16 included) are upcast to float32 chunk by chunk;
  outputs are float32.
* Memory: the functions that take `chunk_size` split the sequence axis `T` into chunks of
  `chunk_size` positions and process one `[N, chunk_size, V]` slice at a time inside
  `jax.lax.map`, under `jax.checkpoint`, so neither the forward nor the backward pass holds a
  float32 `[N,T,V]` copy (the backward pass recomputes each chunk's softmax). The batch axis `N`
  is never split, so inputs sharded along `N` stay sharded. `T` need not be a multiple of
  `chunk_size`: the last chunk starts at `T − chunk_size` (it overlaps the previous one) and only
  its new positions are kept, so the logits are never padded or copied. `None` (or a chunk at
  least `T` long) computes everything in one piece.
* Masks (optional here): with `mask[N,T]`, logits outside the mask are replaced by 0 inside each
  chunk before any arithmetic, so NaN/inf there reaches neither values nor gradients, and the
  output is 0 there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_choice,
    check_floating,
    check_positive,
    check_rank,
)

# --------------------------------------------------------------------------------------------------
# plumbing: validation, chunking over the sequence axis, the shifted logits of one chunk
# --------------------------------------------------------------------------------------------------


def _check_logits(logits: Any, name: str, *, where: str) -> Array:
    """Validate `[N,T,V]` floating logits (kept in their own dtype; chunks are upcast)."""
    check_rank(logits, 3, name, where=where)
    check_floating(logits, name, where=where)
    return jnp.asarray(logits)


def _check_chunk_size(chunk_size: Any, *, where: str) -> None:
    if chunk_size is None:
        return
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int | np.integer):
        raise ValueError(
            f"{where}: `chunk_size` must be a positive Python int or None, got {chunk_size!r}."
        )
    if chunk_size < 1:
        raise ValueError(f"{where}: `chunk_size` must be >= 1 (or None), got {chunk_size!r}.")


def _optional_mask(mask: Any, shape: tuple[int, ...], *, where: str) -> Array | None:
    return None if mask is None else as_mask(mask, shape, where=where)


def _map_over_positions(
    fn: Callable[..., Array], arrays: tuple[Array, ...], chunk_size: int | None
) -> Array:
    """Apply `fn` to chunks of the sequence axis of `[N,T,...]` arrays and join the `[N,c]` results.

    `fn(*chunks)` receives every array sliced to `[N, c, ...]` along axis 1 and returns `[N, c]`.
    Chunks run sequentially in `jax.lax.map` under `jax.checkpoint`, so at most one chunk's
    intermediates (e.g. a float32 softmax) are alive at a time, in both the forward and the
    backward pass. The last chunk of a `T` that `chunk_size` does not divide starts at
    `T − chunk_size`; only its positions not covered by the previous chunk are kept (so each
    position's gradient flows from exactly one chunk).
    """
    T = arrays[0].shape[1]
    if chunk_size is None or chunk_size >= T:
        return fn(*arrays)
    c = int(chunk_size)
    K = -(-T // c)  # number of chunks
    starts = np.minimum(np.arange(K) * c, T - c).astype(np.int32)

    def body(start: Array) -> Array:
        chunks = [jax.lax.dynamic_slice_in_dim(a, start, c, axis=1) for a in arrays]
        # The barrier keeps XLA from hoisting the float32 upcast of the whole array out of the
        # loop (convert∘slice → slice∘convert), which would materialise a float32 [N,T,V] copy.
        return fn(*jax.lax.optimization_barrier(chunks))

    outs = jax.lax.map(jax.checkpoint(body, prevent_cse=False), jnp.asarray(starts))  # [K,N,c]
    N = outs.shape[1]
    head = jnp.moveaxis(outs[:-1], 0, 1).reshape(N, (K - 1) * c)  # positions [0, (K−1)c)
    tail = outs[-1][:, (K - 1) * c - (T - c) :]  # positions [(K−1)c, T)
    return jnp.concatenate([head, tail], axis=1)


def _check_temperature(temperature: Any, where: str) -> None:
    """The sampling temperature: one number (a scalar array too, traced or not), > 0."""
    if jnp.ndim(temperature) != 0:
        raise ValueError(
            f"{where}: `temperature` must be a scalar (the sampling temperature of every row), "
            f"got shape {jnp.shape(temperature)}."
        )
    check_positive(temperature, "temperature", where=where)


def _scaled(z: Array, temperature: Any, m: Array | None) -> Array:
    """`float32(z)/τ`, zeroed outside the mask first, shifted by its (stop-gradient) row max.

    Every statistic computed here is invariant to a constant shift of the logits of a position,
    so the shift changes neither values nor gradients; it keeps `LSE` in `[0, log V]` and the
    float32 cancellations small. Positions whose logits are all `−inf` are not shifted.
    """
    z = as_float32(z)
    if m is not None:
        z = jnp.where(m[..., None] > 0, z, jnp.zeros((), z.dtype))
    z = z / jnp.asarray(temperature, z.dtype)
    top = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    return z - jnp.where(jnp.isfinite(top), top, 0.0)


def _pick(zs: Array, y: Array) -> Array:
    """`zs[..., y]` along the last (vocabulary) axis, keepdims; `y` holds ids in `[0, V)`.

    Vocabulary-parallel logits (`V` split over explicit mesh axes, as `jax.typeof(zs)` shows
    them, e.g. `float32[8@(data,fsdp),5,16@tensor]`) cannot be gathered along `V` without an
    ambiguous result sharding. They are picked by a one-hot masked sum instead: each device
    selects from its own slice and the partial sums are all-reduced (Megatron's
    vocabulary-parallel cross entropy), with no gather of the logits. The sum adds exact zeros,
    so value and gradient (the one-hot) equal `take_along_axis`, which every other layout uses.
    """
    spec = jax.typeof(zs).sharding.spec
    if len(spec) == zs.ndim and spec[-1] is not None:
        hit = jnp.arange(zs.shape[-1], dtype=y.dtype) == y[..., None]
        return jnp.sum(jnp.where(hit, zs, jnp.zeros((), zs.dtype)), axis=-1, keepdims=True)
    return jnp.take_along_axis(zs, y[..., None], axis=-1)


def _lse(zs: Array) -> Array:
    """`log Σ_v exp(zs_v)` of shifted logits (max ≤ 0), keepdims."""
    return jnp.log(jnp.sum(jnp.exp(zs), axis=-1, keepdims=True))


def _masked_output(x: Array, m: Array | None) -> Array:
    return x if m is None else jnp.where(m > 0, x, 0.0)


# --------------------------------------------------------------------------------------------------
# alignment
# --------------------------------------------------------------------------------------------------


def completion_logits(logits: ArrayLike, P: int, T: int) -> Array:
    """The logits that predict the `T` completion tokens: `logits[:, P−1 : P−1+T]` (§0.3).

    The logit at absolute position `s` predicts the token at `s+1`, so completion token `t`
    (absolute position `P+t`) is scored by the logits at `P+t−1`; the matching targets are
    `tokens[:, P : P+T]`. Prompts are left-padded to the common length `P`. Off-by-one errors
    here are the most common bug class in the peers' trackers (TRL, verl, OpenRLHF and Tunix all
    implement this shift).

    Args:
      logits: `[N,S,V]` logits of the whole sequence (any float dtype; returned as is, not upcast).
      P: static prompt length, `P >= 1`.
      T: static completion length, `T >= 1` and `P − 1 + T <= S`.

    Returns:
      `[N,T,V]`, the same dtype as `logits`.

    Examples:
      >>> import jax.numpy as jnp
      >>> completion_logits(jnp.zeros((2, 7, 5)), 3, 4).shape
      (2, 4, 5)
    """
    where = "completion_logits"
    logits = _check_logits(logits, "logits", where=where)
    for name, value in (("P", P), ("T", T)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"{where}: `{name}` must be a static Python int, got {value!r}.")
    if P < 1:
        raise ValueError(
            f"{where}: `P` must be >= 1 (the first completion token is predicted by "
            f"the logits at P−1), got {P}."
        )
    if T < 1:
        raise ValueError(f"{where}: `T` must be >= 1, got {T}.")
    S = logits.shape[1]
    if P - 1 + T > S:
        raise ValueError(
            f"{where}: `P − 1 + T` must be <= S = {S} (the sequence axis of `logits`), got "
            f"P={P}, T={T} (P − 1 + T = {P - 1 + T})."
        )
    return logits[:, P - 1 : P - 1 + T]


# --------------------------------------------------------------------------------------------------
# log-probs and entropies
# --------------------------------------------------------------------------------------------------


def token_logprobs(
    logits: ArrayLike,
    targets: ArrayLike,
    *,
    temperature: float | ArrayLike = 1.0,
    chunk_size: int | None = None,
    mask: ArrayLike | None = None,
) -> Array:
    """Log-probability of each target token: `log_softmax(float32(z)/τ)[y]` (ALGORITHMS.md §2.1).

        z' = float32(z)/τ ;  lp = z'[y] − LSE(z') ;  ∂lp/∂z = (onehot(y) − softmax(z'))/τ

    Peers: TRL `selective_log_softmax`, verl `logprobs_from_logits`, OpenRLHF `log_probs_from_logits`
    (all divide by the sampling temperature first). Align the logits with `completion_logits`.

    Args:
      logits: `[N,T,V]`, already aligned with `targets` (any float dtype; upcast per chunk).
      targets: `[N,T]` integer token ids. Ids outside `[0, V)` (e.g. an ignore index −100 in
        padding) give NaN: such positions must be masked, which `mask` here and every `losses`
        function do before any arithmetic.
      temperature: the sampling temperature `τ` (default 1.0: sampling without scaling).
      chunk_size: positions of the `T` axis per chunk; each chunk holds one float32
        `[N, chunk_size, V]` slice (see the module docstring). None: one chunk.
      mask: optional `[N,T]` {0,1}; logits outside it are ignored and the output is 0 there.

    Returns:
      `[N,T]` float32 log-probs (≤ 0).

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = token_logprobs(jnp.log(jnp.array([[[0.25, 0.75]]])), jnp.array([[1]]))
      >>> round(float(lp[0, 0]), 4)
      -0.2877
    """
    where = "token_logprobs"
    logits = _check_logits(logits, "logits", where=where)
    targets = jnp.asarray(targets)
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        raise ValueError(f"{where}: `targets` must be an integer array, got dtype {targets.dtype}.")
    if targets.shape != logits.shape[:2]:
        raise ValueError(
            f"{where}: `targets` must have shape {logits.shape[:2]} (the first two axes of "
            f"`logits` {logits.shape}), got {targets.shape}."
        )
    _check_temperature(temperature, where)
    _check_chunk_size(chunk_size, where=where)
    m = _optional_mask(mask, targets.shape, where=where)
    V = logits.shape[2]

    def chunk(z: Array, y: Array, mc: Array | None = None) -> Array:
        zs = _scaled(z, temperature, mc)
        in_range = (y >= 0) & (y < V)
        picked = _pick(zs, jnp.clip(y, 0, V - 1))
        lp = (picked - _lse(zs))[..., 0]
        lp = jnp.where(in_range, lp, jnp.nan)
        return _masked_output(lp, mc)

    arrays = (logits, targets) if m is None else (logits, targets, m)
    return _map_over_positions(chunk, arrays, chunk_size)


def entropy_from_logits(
    logits: ArrayLike,
    *,
    temperature: float | ArrayLike = 1.0,
    chunk_size: int | None = None,
    mask: ArrayLike | None = None,
) -> Array:
    """Entropy of the next-token distribution: `H = LSE(z') − Σ_v softmax(z')_v z'_v` (§2.2).

    `z' = float32(z)/τ`. DESIGN.md lists no temperature keyword; we add it because the entropy
    must use the sampling `τ` (§0.4). Logits of `−inf` (a masked vocabulary entry) contribute 0.
    An entropy bonus is `−c_H·aggregate(H, mask, mode)` with the policy loss's mode (default
    `c_H = 0` as in verl and TRL); masks derived from the entropy should use `sg(H)`.

    Args:
      logits: `[N,T,V]` (any float dtype; upcast per chunk).
      temperature: the sampling temperature `τ`.
      chunk_size: positions of the `T` axis per chunk (see the module docstring). None: one chunk.
      mask: optional `[N,T]` {0,1}; logits outside it are ignored and the output is 0 there.

    Returns:
      `[N,T]` float32 entropies in `[0, log V]`.

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(entropy_from_logits(jnp.zeros((1, 1, 4)))[0, 0]), 4)  # log 4
      1.3863
    """
    where = "entropy_from_logits"
    logits = _check_logits(logits, "logits", where=where)
    _check_temperature(temperature, where)
    _check_chunk_size(chunk_size, where=where)
    m = _optional_mask(mask, logits.shape[:2], where=where)

    def chunk(z: Array, mc: Array | None = None) -> Array:
        zs = _scaled(z, temperature, mc)
        lse = _lse(zs)
        p = jnp.exp(zs - lse)
        finite_zs = jnp.where(p > 0, zs, 0.0)  # p·z' = 0 where p = 0 (z' = −inf)
        h = lse[..., 0] - jnp.sum(p * finite_zs, axis=-1)
        return _masked_output(h, mc)

    return _map_over_positions(chunk, (logits,) if m is None else (logits, m), chunk_size)


def log_sum_pi_squared(
    logits: ArrayLike,
    *,
    temperature: float | ArrayLike = 1.0,
    chunk_size: int | None = None,
    mask: ArrayLike | None = None,
) -> Array:
    """Log of the collision probability of the next token: `log Σ_v π_v² = LSE(2z') − 2·LSE(z')`.

    ALGORITHMS.md §2.3, with `z' = float32(z)/τ`. Used by the optimal token baseline (§4.14) and
    by WPO-style weights (§8.1). It lies in `[−log V, 0]`: `−log V` for a uniform distribution,
    0 for a one-hot one.

    Args:
      logits: `[N,T,V]` (any float dtype).
      temperature: the sampling temperature `τ`.
      chunk_size: positions of the `T` axis per chunk (see the module docstring). None: one chunk.
      mask: optional `[N,T]` {0,1}; logits outside it are ignored and the output is 0 there.

    Returns:
      `[N,T]` float32.

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(log_sum_pi_squared(jnp.zeros((1, 1, 4)))[0, 0]), 4)  # −log 4
      -1.3863
    """
    where = "log_sum_pi_squared"
    logits = _check_logits(logits, "logits", where=where)
    _check_temperature(temperature, where)
    _check_chunk_size(chunk_size, where=where)
    m = _optional_mask(mask, logits.shape[:2], where=where)

    def chunk(z: Array, mc: Array | None = None) -> Array:
        zs = _scaled(z, temperature, mc)
        return _masked_output((_lse(2.0 * zs) - 2.0 * _lse(zs))[..., 0], mc)

    return _map_over_positions(chunk, (logits,) if m is None else (logits, m), chunk_size)


def self_certainty(
    logits: ArrayLike,
    mask: ArrayLike,
    *,
    temperature: float | ArrayLike = 1.0,
    chunk_size: int | None = None,
) -> Array:
    """Self-certainty of each sequence: masked mean over `t` of `KL(U ‖ p_t)` (ALGORITHMS.md §2.4).

        KL(U ‖ p_t) = −log V − (1/V)·Σ_v log p_t(v) = LSE(z'_t) − mean_v(z'_t) − log V

    with `z' = float32(z)/τ` and `U` uniform over the `V` entries. Source: "Scalable Best-of-N
    Selection for Large Language Models via Self-Certainty" (arXiv 2502.18581). It is ≥ 0, 0 for
    uniform predictions and grows with confidence; a `−inf` logit makes it `+inf`.

    Args:
      logits: `[N,T,V]` (any float dtype).
      mask: `[N,T]` {0,1}; logits outside it never reach the value or the gradient.
      temperature: the sampling temperature `τ`.
      chunk_size: positions of the `T` axis per chunk (see the module docstring). None: one chunk.

    Returns:
      `[N]` float32; 0 for a row without valid tokens.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.log(jnp.array([[[0.5, 0.5], [0.9, 0.1]]]))
      >>> [round(float(v), 4) for v in self_certainty(logits, jnp.array([[1, 0]]))]
      [0.0]
    """
    where = "self_certainty"
    logits = _check_logits(logits, "logits", where=where)
    m = as_mask(mask, logits.shape[:2], where=where)
    _check_temperature(temperature, where)
    _check_chunk_size(chunk_size, where=where)
    log_v = float(np.log(logits.shape[2]))

    def chunk(z: Array, mc: Array) -> Array:
        zs = _scaled(z, temperature, mc)
        kl = _lse(zs)[..., 0] - jnp.mean(zs, axis=-1) - log_v
        return _masked_output(kl, mc)

    per_token = _map_over_positions(chunk, (logits, m), chunk_size)
    return jnp.sum(per_token, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)


def sequence_logprob(
    token_logp: ArrayLike,
    mask: ArrayLike,
    *,
    reduce: Literal["sum", "mean"] = "sum",
) -> Array:
    """Log-probability of each sequence from its token log-probs (ALGORITHMS.md §2.5).

        "sum":  Σ_t lp_t·m_t                    (log π(y|x); preference losses use it by default)
        "mean": Σ_t lp_t·m_t / max(Σ_t m_t, 1)  (length-averaged, e.g. SimPO and ORPO inputs)

    Masked entries are replaced by 0 before the sum, so NaN/inf in padding never leaks.

    Args:
      token_logp: `[N,T]` token log-probs.
      mask: `[N,T]` {0,1}.
      reduce: "sum" or "mean".

    Returns:
      `[N]` float32; 0 for a row without valid tokens.

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-1.0, -2.0, jnp.nan]]); m = jnp.array([[1, 1, 0]])
      >>> float(sequence_logprob(lp, m)[0]), float(sequence_logprob(lp, m, reduce="mean")[0])
      (-3.0, -1.5)
    """
    where = "sequence_logprob"
    check_choice(reduce, ("sum", "mean"), "reduce", where=where)
    check_rank(token_logp, 2, "token_logp", where=where)
    check_floating(token_logp, "token_logp", where=where)
    lp = as_float32(token_logp)
    m = as_mask(mask, lp.shape, where=where)
    total = jnp.sum(jnp.where(m > 0, lp, jnp.zeros((), lp.dtype)), axis=1)
    if reduce == "sum":
        return total
    return total / jnp.maximum(jnp.sum(m, axis=1), 1.0)


def _full_kl_chunk(logits_p: Array, logits_q: Array, temperature: Any, m: Array | None) -> Array:
    """`Σ_v p_v (log p_v − log q_v)` for one chunk `[N,c,V]` (used by `losses.kl.full_kl`)."""
    zp = _scaled(logits_p, temperature, m)
    zq = _scaled(logits_q, temperature, m)
    log_p = zp - _lse(zp)
    log_q = zq - _lse(zq)
    p = jnp.exp(log_p)
    diff = jnp.where(p > 0, log_p - log_q, 0.0)  # 0·(−inf − x) terms contribute 0
    return _masked_output(jnp.sum(p * diff, axis=-1), m)
