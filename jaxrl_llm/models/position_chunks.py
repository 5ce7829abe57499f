"""Map a function over blocks of positions, one block at a time, recomputed in the backward pass.

`map_position_chunks(fn, arrays, chunk)` applies `fn` to `[N, C, ...]` slices of `[N, S, ...]`
arrays (`C = chunk` consecutive positions) inside `jax.lax.map` under `jax.checkpoint`, and
joins the `[N, C, ...]` outputs back into `[N, S, ...]`. The forward pass holds one block's
intermediates at a time and the backward pass recomputes them block by block, so memory that
`fn` would spend per position pair or per vocabulary entry grows with `C`, not `S`. Used by
the chunked log-probs over the vocabulary (`train.logprobs`) and the query-chunked attention
(`layers.chunked_attend`).

The last block of an `S` that `C` does not divide starts at `S − C` and keeps only its new
positions, so every position's output and gradient come from exactly one block (no padding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def map_position_chunks(
    fn: Callable[..., Any], arrays: tuple[jax.Array, ...], chunk: int | None
) -> Any:
    """`fn(*arrays)` computed `chunk` positions (axis 1) at a time; see the module docstring.

    Args:
      fn: maps `[N, C, ...]` slices of `arrays` to a pytree of `[N, C, ...]` arrays; it must
        treat positions independently (row `s` of its output depends on row `s` of its inputs
        and on whatever it closes over).
      arrays: `[N, S, ...]` arrays sharing `N` and `S`.
      chunk: positions per block; None or `>= S` calls `fn(*arrays)` once.

    Returns:
      The pytree of `[N, S, ...]` outputs.

    Examples:
      >>> x = jnp.arange(10.0).reshape(2, 5)
      >>> map_position_chunks(lambda a: a * 2, (x,), 2)
      Array([[ 0.,  2.,  4.,  6.,  8.],
             [10., 12., 14., 16., 18.]], dtype=float32)
    """
    S = arrays[0].shape[1]
    if chunk is None or chunk >= S:
        return fn(*arrays)
    K = -(-S // chunk)
    starts = np.minimum(np.arange(K) * chunk, S - chunk).astype(np.int32)

    def body(start: jax.Array) -> Any:
        return fn(*(jax.lax.dynamic_slice_in_dim(a, start, chunk, axis=1) for a in arrays))

    outs = jax.lax.map(jax.checkpoint(body, prevent_cse=False), jnp.asarray(starts))

    def join(out: jax.Array) -> jax.Array:  # [K, N, C, ...] -> [N, S, ...]
        N, rest = out.shape[1], out.shape[3:]
        head = jnp.moveaxis(out[:-1], 0, 1).reshape(N, (K - 1) * chunk, *rest)
        tail = out[-1][:, (K - 1) * chunk - (S - chunk) :]
        return jnp.concatenate([head, tail], axis=1)

    return jax.tree.map(join, outs)
