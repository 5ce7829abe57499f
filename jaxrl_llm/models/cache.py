"""KV cache for incremental decoding: fixed buffers plus per-row bookkeeping, a pytree.

Layout (T = `max_len` slots):

- `k`: `[L, N, K, T, Hd]` and `v`: `[L, N, K, Hd, T]` in the compute dtype. Layer-major so the
  decoder's `lax.scan` over layers slices one buffer per step. Heads come before slots, and
  the values are stored slot-minor, because these are the layouts in which the two attention
  matmuls (`q·kᵀ` and `p·v`) read the cache without a transposing copy: on XLA:CPU that copy of
  the whole cache, once per layer and decode step, cost up to a third of the sampler's time.
  The layers see `[N, T, K, Hd]` views (transposes that XLA folds into the matmuls).
- `positions`: `[N, T]` int32, the rotary position of the token held in each slot, or `-1` for
  an empty slot or a padding token. Attention reads only slots with `positions >= 0`, so a
  left-padded prompt can be written as is.
- `lengths`: `[N]` int32, the number of slots written in each row; the next call writes its
  `S` tokens to slots `lengths[n] .. lengths[n] + S - 1` of row `n`. A scalar `[]` int32
  (`KVCache.init(..., shared_length=True)`) says that every row has written the same number of
  slots, as in a left-padded batch decoded in lockstep (the sampler): each call then writes all
  rows with one `dynamic_update_slice` instead of one per row.

One call of `Decoder.decode` writes S new tokens (S = P for a prefill, 1 per decode step) and
attends to every valid slot at or before its own (`slot_k <= slot_q`), within the layer's sliding
window measured in positions. Shapes never change, so the decode loop compiles once; the caller
sizes `max_len` to hold prompt and completion (writes past the end are clamped by XLA and would
overwrite the last slot; `Decoder.decode` checks this when `lengths` is concrete).
The logical axes of the buffers are `CACHE_KEY_AXES` and `CACHE_VALUE_AXES`
(`KVCache.logical_axes` gives them for a whole cache), for `sharding.logical_to_spec`;
`shard_cache` lays a cache out by them on the context mesh (rows over the batch axes, KV heads
over `tensor` when it divides them), which `Decoder.decode` does on entry.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models.config import ModelConfig
from sharding import shard

Array = jax.Array

CACHE_KEY_AXES = ("layers", "batch", "kv_heads", "cache_seq", "head_dim")
CACHE_VALUE_AXES = ("layers", "batch", "kv_heads", "head_dim", "cache_seq")


class KVCache(NamedTuple):
    """Preallocated keys `[L, N, K, T, Hd]`, values `[L, N, K, Hd, T]`, positions, lengths.

    Examples:
      >>> from jaxrl_llm.models import ModelConfig
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> cache = KVCache.init(cfg, batch=3, max_len=5)
      >>> cache.k.shape, cache.v.shape, cache.positions.shape, cache.lengths.tolist()
      ((2, 3, 1, 5, 4), (2, 3, 1, 4, 5), (3, 5), [0, 0, 0])
    """

    k: Array  # [L, N, K, T, Hd]
    v: Array  # [L, N, K, Hd, T]
    positions: Array  # [N, T] int32, -1 = empty or padding
    lengths: Array  # [N] int32, slots written per row ([] int32: the same for every row)

    @classmethod
    def init(
        cls,
        config: ModelConfig,
        *,
        batch: int,
        max_len: int,
        dtype: Any = jnp.float32,
        shared_length: bool = False,
    ) -> KVCache:
        """An empty cache for `batch` rows of up to `max_len` tokens each.

        `shared_length=True` keeps one scalar length for all rows (lockstep decoding of a
        left-padded batch): writes become a single `dynamic_update_slice`.
        """
        L, K, Hd = config.num_layers, config.num_kv_heads, config.head_dim
        return cls(
            k=jnp.zeros((L, batch, K, max_len, Hd), dtype),
            v=jnp.zeros((L, batch, K, Hd, max_len), dtype),
            positions=jnp.full((batch, max_len), -1, jnp.int32),
            lengths=jnp.zeros(() if shared_length else (batch,), jnp.int32),
        )

    def logical_axes(self) -> KVCache:
        """The logical axis names of each field, as a `KVCache` of tuples (for sharding).

        `lengths` is `("batch",)`, or `()` for a shared scalar length.
        """
        return KVCache(
            k=CACHE_KEY_AXES,
            v=CACHE_VALUE_AXES,
            positions=("batch", "cache_seq"),
            lengths=("batch",) if len(self.lengths.shape) == 1 else (),
        )

    @property
    def max_len(self) -> int:
        """Number of slots per row (T)."""
        return self.positions.shape[1]


def shard_cache(cache: KVCache) -> KVCache:
    """Lay `cache` out by its logical axes on the context mesh (unchanged without a mesh).

    Each field follows `KVCache.logical_axes()` under `sharding.ACTIVATION_AXIS_RULES`: rows
    over the batch axes (`data`, `fsdp`), KV heads over `tensor` when it divides them (else
    whole on every device of a tensor group). A cache created inside a jitted function has no
    sharding of its own (replicated under Explicit axes); this pins it, so the new keys and
    values, which the projections produce in this layout, are written in place. A cache that
    is already laid out passes through unchanged.

    Examples:
      >>> from jaxrl_llm.models import ModelConfig
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> shard_cache(KVCache.init(cfg, batch=2, max_len=3)).k.shape  # no mesh: unchanged
      (2, 2, 1, 3, 4)
    """
    return KVCache(
        *(
            shard(x, names) if names else x  # a shared scalar length stays as it is
            for x, names in zip(cache, cache.logical_axes(), strict=True)
        )
    )


def write_rows(buffer: Array, new: Array, starts: Array, *, axis: int = 1) -> Array:
    """Write `new` into `buffer[N, ...]` at slot `starts[n]` of each row `n` along `axis`.

    `buffer` and `new` agree on every axis but the slot axis `axis` (T in `buffer`, S in `new`).
    A scalar `starts` writes every row at the same slot with one `dynamic_update_slice`.

    Examples:
      >>> write_rows(jnp.zeros((2, 4)), jnp.ones((2, 2)), jnp.array([0, 1]))
      Array([[1., 1., 0., 0.],
             [0., 1., 1., 0.]], dtype=float32)
      >>> write_rows(jnp.zeros((2, 4)), jnp.ones((2, 1)), jnp.array(2))
      Array([[0., 0., 1., 0.],
             [0., 0., 1., 0.]], dtype=float32)
    """
    if jnp.ndim(starts) == 0:
        index = tuple(starts if d == axis else 0 for d in range(buffer.ndim))
        return jax.lax.dynamic_update_slice(buffer, new.astype(buffer.dtype), index)

    def one_row(row: Array, values: Array, start: Array) -> Array:
        index = tuple(start if d == axis - 1 else 0 for d in range(row.ndim))
        return jax.lax.dynamic_update_slice(row, values.astype(row.dtype), index)

    return jax.vmap(one_row)(buffer, new, starts)


def advance(cache: KVCache, positions: Array, valid: Array) -> KVCache:
    """Record S new tokens (`positions[N, S]`, `valid[N, S]` bool) in the bookkeeping arrays.

    Slot positions become `positions` where `valid`, else `-1`; `lengths` grows by S. The k/v
    buffers are written by the layers (`write_rows`) during the same call.
    """
    slot_positions = jnp.where(valid, positions, -1).astype(jnp.int32)
    return cache._replace(
        positions=write_rows(cache.positions, slot_positions, cache.lengths),
        lengths=cache.lengths + positions.shape[1],
    )


def cached_attention_mask(
    before: KVCache, after: KVCache, q_positions: Array, window: int | None
) -> Array:
    """`[N, S, T]` bool: query `s` of row `n` may read slot `t`.

    Query `s` sits in slot `before.lengths[n] + s`; it reads slots `t <= ` that slot holding a
    valid token (`after.positions >= 0`), and with a `window`, only those with
    `q_position - k_position < window`.
    """
    N, S = q_positions.shape
    q_slot = jnp.broadcast_to(before.lengths, (N,))[:, None] + jnp.arange(S)[None, :]  # [N, S]
    k_slot = jnp.arange(after.max_len)  # [T]
    k_pos = after.positions  # [N, T]
    mask = (k_slot[None, None, :] <= q_slot[:, :, None]) & (k_pos[:, None, :] >= 0)
    if window is not None:
        mask &= q_positions[:, :, None] - k_pos[:, None, :] < window
    return mask


def full_attention_mask(
    segment_ids: Array, positions: Array, window: int | None, roles: Array | None = None
) -> Array:
    """`[N, S, S]` bool causal mask of a batch without cache.

    Query `s` reads key `t <= s` of the same segment; segment 0 is padding and is never read.
    With a `window`, only keys with `positions[s] - positions[t] < window`. With `roles`
    (`[N, S]` int, prefix-shared segments such as a preference pair's prompt, chosen and
    rejected completion in one segment), a query also skips the keys of another role than its
    own, except role 0 (the shared prefix), which every role reads.

    Examples:
      >>> full_attention_mask(jnp.array([[1, 1, 2]]), jnp.array([[0, 1, 0]]), None).astype(int)
      Array([[[1, 0, 0],
              [1, 1, 0],
              [0, 0, 1]]], dtype=int32)
      >>> full_attention_mask(jnp.array([[1, 1, 1]]), jnp.array([[0, 1, 1]]), None,
      ...                     roles=jnp.array([[0, 1, 2]])).astype(int)  # 2 skips 1
      Array([[[1, 0, 0],
              [1, 1, 0],
              [1, 0, 1]]], dtype=int32)
    """
    S = segment_ids.shape[1]
    causal = jnp.tril(jnp.ones((S, S), bool))[None]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    mask = causal & same & (segment_ids[:, None, :] != 0)
    if roles is not None:
        mask &= (roles[:, None, :] == 0) | (roles[:, :, None] == roles[:, None, :])
    if window is not None:
        mask &= positions[:, :, None] - positions[:, None, :] < window
    return mask


def positions_from_mask(attention_mask: Array) -> Array:
    """Rotary positions `[N, S]` int32 of a padded batch: `0, 1, ...` over each row's real tokens.

    Padding before the first real token gets position 0 (it is never attended to), so left- and
    right-padded rows give their real tokens the positions of the unpadded sequence.

    Examples:
      >>> positions_from_mask(jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]]))
      Array([[0, 0, 0, 1, 2],
             [0, 1, 2, 2, 2]], dtype=int32)
    """
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def positions_from_segments(segment_ids: Array) -> Array:
    """Rotary positions `[N, S]` int32 of packed rows: `0, 1, ...` from the start of each run of
    one segment id (`segment_ids`: 0 = padding, which gets position 0; each packed sequence is
    one contiguous run).

    Examples:
      >>> positions_from_segments(jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 0, 2, 2, 2]]))
      Array([[0, 1, 2, 0, 1, 0],
             [0, 1, 0, 0, 1, 2]], dtype=int32)
    """
    segment_ids = jnp.asarray(segment_ids)
    index = jnp.broadcast_to(jnp.arange(segment_ids.shape[-1], dtype=jnp.int32), segment_ids.shape)
    previous = jnp.pad(segment_ids[..., :-1], [(0, 0)] * (segment_ids.ndim - 1) + [(1, 0)])
    starts = jnp.where(segment_ids != previous, index, 0)
    run_start = jax.lax.cummax(starts, axis=segment_ids.ndim - 1)
    return jnp.where(segment_ids > 0, index - run_start, 0).astype(jnp.int32)
