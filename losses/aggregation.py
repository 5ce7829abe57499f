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
"""

from __future__ import annotations

from typing import Literal

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import as_float32, as_mask, check_choice, check_rank

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
    """
    where = "aggregate"
    check_choice(mode, AGG_MODES, "mode", where=where)
    check_rank(per_token, 2, "per_token", where=where)
    per_token = as_float32(per_token)
    m = as_mask(mask, per_token.shape, where=where)
    valid = m > 0
    row_sums = jnp.sum(jnp.where(valid, per_token, 0.0), axis=1)  # S_n   [N]
    lengths = jnp.sum(m, axis=1)  # L_n   [N]

    def seq_denominator() -> Array:
        if num_seqs is not None:
            return jnp.asarray(num_seqs, jnp.float32)
        return jnp.maximum(jnp.sum((lengths > 0).astype(jnp.float32)), 1.0)

    if mode == "token_mean":
        num = jnp.sum(row_sums)
        den = (
            jnp.asarray(num_tokens, jnp.float32)
            if num_tokens is not None
            else jnp.maximum(jnp.sum(lengths), 1.0)
        )
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
        num = jnp.sum(row_sums)
        den = seq_denominator() * jnp.asarray(length, jnp.float32)
    if return_parts:
        return num, den
    return num / den
