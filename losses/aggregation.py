"""Loss aggregation: how a per-token loss `[N,T]` becomes a scalar (ALGORITHMS.md §1.5).

With `S_n = Σ_t ℓ_nt m_nt`, `L_n = Σ_t m_nt`, `valid_n = [L_n > 0]`,
`D_tok = num_tokens or max(Σ m, 1)`, `D_seq = num_seqs or max(Σ_n valid_n, 1)`, `C = norm_length or T`:

| mode                      | value                                      | peers                         |
|---------------------------|--------------------------------------------|-------------------------------|
| `token_mean`              | `Σ_n S_n / D_tok`                          | DAPO, verl default, TRL dapo  |
| `token_sum`               | `Σ_n S_n`                                  |                               |
| `seq_mean_token_sum`      | `Σ_n S_n / D_seq`                          | TRL luspo                     |
| `seq_mean_token_mean`     | `Σ_n valid_n·S_n/max(L_n,1) / D_seq`       | GRPO, TRL grpo                |
| `seq_mean_token_sum_norm` | `Σ_n S_n / D_seq / C`                      | Dr.GRPO, Tunix                |

`num_tokens` / `num_seqs` are the *global* counts of the whole batch when it is split into
micro-batches or across devices: the loss of a batch then equals the sum of its parts' losses.

Packed rows (several sequences per row, `segment_ids[N,T]`: 0 outside any sequence, `k ≥ 1` the
row's `k`-th sequence) take `n` over the (row, segment) pairs instead of the rows, so a packed
batch aggregates exactly as the same sequences one per row (TRL's padding-free packing).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_choice,
    check_positive,
    check_rank,
    global_count,
)
from losses.segments import segment_reduce

AggMode = Literal[
    "token_mean",
    "token_sum",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
]
AGG_MODES: tuple[str, ...] = (
    "token_mean",
    "token_sum",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
)


def aggregate(
    per_token: ArrayLike,
    mask: ArrayLike,
    *,
    mode: AggMode = "token_mean",
    num_tokens: ArrayLike | None = None,
    num_seqs: ArrayLike | None = None,
    norm_length: ArrayLike | None = None,
    segment_ids: ArrayLike | None = None,
    return_parts: bool = False,
) -> Array | tuple[Array, Array]:
    """Reduce a per-token loss `[N,T]` to a scalar under one of five conventions.

    See the module docstring for the table of modes. Source of `seq_mean_token_sum_norm`:
    "Understanding R1-Zero-Like Training: A Critical Perspective" (Dr.GRPO, arXiv 2503.20783);
    `token_mean`: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
    (arXiv 2503.14476); `seq_mean_token_mean`: GRPO, "DeepSeekMath" (arXiv 2402.03300).

    Args:
      per_token: `[N,T]` per-token loss (any float dtype; summed in float32).
      mask: `[N,T]` {0,1}; entries outside it never reach the value or the gradient.
      mode: one of the five modes above.
      num_tokens: global token count (micro-batching / multi-device); None: this batch's mask sum.
      num_seqs: global sequence count; None: rows of this batch with at least one valid token.
      norm_length: the constant `C` of `seq_mean_token_sum_norm`; None: `T`.
      segment_ids: `[N,T]` int, rows that hold several packed sequences: 0 outside any (never
        counted, whatever the mask), `1 … T` the sequences of a row (ids above `T` are an
        error when the ids are concrete, and are not counted when they are traced). Give
        `seq_mean_token_sum_norm` its `norm_length` then: `T` is the packed row's length. `S_n`, `L_n` and the
        sequence count are then per (row, segment). None: one sequence per row.
      return_parts: return `(numerator, denominator)` instead of their ratio, so that
        accumulation can sum both before dividing. The denominator is `D_seq·C` for
        `seq_mean_token_sum_norm` and 1 for `token_sum`.

    Returns:
      A float32 scalar, or `(numerator, denominator)` if `return_parts`.

    Examples:
      >>> import jax.numpy as jnp
      >>> l = jnp.array([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
      >>> m = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0]])
      >>> [float(aggregate(l, m, mode=k)) for k in AGG_MODES]
      [2.5, 10.0, 3.0, 5.0, 1.25]
      >>> packed = jnp.array([[1.0, 2.0, 3.0, 4.0]])  # the two rows above in one row
      >>> float(aggregate(packed, jnp.ones((1, 4)), mode="seq_mean_token_mean",
      ...                 segment_ids=jnp.array([[1, 1, 1, 2]])))
      3.0
    """
    where = "aggregate"
    check_choice(mode, AGG_MODES, "mode", where=where)
    check_rank(per_token, 2, "per_token", where=where)
    per_token = as_float32(per_token)
    m = as_mask(mask, per_token.shape, where=where)
    row_sums, lengths = _sequence_sums(per_token, m, segment_ids, where)  # S_n, L_n

    def seq_denominator() -> Array:
        local = jnp.maximum(jnp.sum((lengths > 0).astype(jnp.float32)), 1.0)
        if num_seqs is not None:
            return global_count(num_seqs, local, "num_seqs", where=where)
        return local

    if mode == "token_mean":
        num = jnp.sum(row_sums)
        den = jnp.maximum(jnp.sum(lengths), 1.0)
        if num_tokens is not None:
            den = global_count(num_tokens, den, "num_tokens", where=where)
    elif mode == "token_sum":
        num = jnp.sum(row_sums)
        den = jnp.ones((), jnp.float32)
    elif mode == "seq_mean_token_sum":
        num = jnp.sum(row_sums)
        den = seq_denominator()
    elif mode == "seq_mean_token_mean":
        num = jnp.sum(row_sums / jnp.maximum(lengths, 1.0))
        den = seq_denominator()
    else:  # seq_mean_token_sum_norm
        length = per_token.shape[1] if norm_length is None else norm_length
        check_positive(length, "norm_length", where=where)
        num = jnp.sum(row_sums)
        den = seq_denominator() * jnp.asarray(length, jnp.float32)
    if return_parts:
        return num, den
    return num / den


def sequence_sums(
    per_token: ArrayLike, mask: ArrayLike, *, segment_ids: ArrayLike | None = None
) -> tuple[Array, Array]:
    """`(S, L)`: the masked sum `S_n = Σ_t ℓ_nt m_nt` and the token count `L_n = Σ_t m_nt` of
    every sequence, the `n` of `aggregate`'s formulas.

    Args:
      per_token: `[N,T]` per-token values (summed in float32).
      mask: `[N,T]` {0,1}.
      segment_ids: `[N,T]` int ids of packed rows (`aggregate`); None: one sequence per row.

    Returns:
      Two float32 arrays, `[N]` (one sequence per row), or `[N,T]` with packed rows (entry
      `[n, k − 1]` is segment `k` of row `n`; unused entries are 0).

    Examples:
      >>> import jax.numpy as jnp
      >>> s, l = sequence_sums(jnp.array([[1.0, 2.0, 3.0]]), jnp.ones((1, 3)),
      ...                      segment_ids=jnp.array([[1, 1, 2]]))
      >>> s.tolist(), l.tolist()
      ([[3.0, 3.0, 0.0]], [[2.0, 1.0, 0.0]])
    """
    where = "sequence_sums"
    check_rank(per_token, 2, "per_token", where=where)
    per_token = as_float32(per_token)
    m = as_mask(mask, per_token.shape, where=where)
    return _sequence_sums(per_token, m, segment_ids, where)


def _sequence_sums(
    per_token: Array, m: Array, segment_ids: ArrayLike | None, where: str
) -> tuple[Array, Array]:
    if segment_ids is None:
        return jnp.sum(jnp.where(m > 0, per_token, 0.0), axis=1), jnp.sum(m, axis=1)
    return _segment_sums(per_token, m, segment_ids, where)


def _segment_sums(
    per_token: Array, m: Array, segment_ids: ArrayLike, where: str
) -> tuple[Array, Array]:
    """`(S, L)`, each `[N,T]`: the masked loss sum and token count of every (row, segment)."""
    segment_ids = jnp.asarray(segment_ids)
    if segment_ids.shape != per_token.shape or not jnp.issubdtype(segment_ids.dtype, jnp.integer):
        raise ValueError(
            f"{where}: `segment_ids` must be integer ids with the shape of `per_token` "
            f"{per_token.shape}, got {segment_ids.dtype}{segment_ids.shape}."
        )
    T = per_token.shape[1]
    if not isinstance(segment_ids, jax.core.Tracer) and segment_ids.size:
        low, high = int(segment_ids.min()), int(segment_ids.max())
        if low < 0 or high > T:
            raise ValueError(
                f"{where}: `segment_ids` must lie in 0 … T = {T} (0: outside any sequence), got "
                f"values in {low} … {high}."
            )
    ids = segment_ids.astype(jnp.int32) - 1  # segment k is bucket k − 1; padding none
    sums, _ = segment_reduce(per_token, ids, m, num_segments=T)
    lengths, _ = segment_reduce(m, ids, m, num_segments=T)
    return sums, lengths
