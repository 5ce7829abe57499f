"""One decode step of a `Decoder` (one new token per row), laid out for the sampler's loop.

`Decoder.decode_hidden` serves any number of new tokens with a `KVCache` and runs the stacked
layers with a `lax.scan` that slices each layer's cache out of the stacked buffers and stacks
the written ones back: for one token per row that is a copy of the whole cache in every step.
The sampler's loop uses this step instead. It computes the same function of the same weights
(the same `Block` modules run it); what differs is how the work is laid out:

- `DecodeCache`: one key buffer `[N, K, Hd, T]` and one value buffer `[N, K, T, Hd]` per
  layer, and one shared length (rows advance in lockstep). A step writes its new key and
  value of layer `l` into layer `l`'s buffers in place (one `dynamic_update_slice` each, at
  slot `length`) and attention reads those buffers: no copy of the cache. (Stacked
  `[L, ...]` buffers, written at `[l]` and read at `[l]`, made XLA copy the whole stack once
  per layer.)
- `decode_attention`: the one-query attention as elementwise multiplies and reductions,
  `logits[n,k,g,t] = Σ_h q[n,k,g,h]·k[n,k,h,t]` and `out[n,k,g,h] = Σ_t p[n,k,g,t]·v[n,k,t,h]`.
  With `G = H / K` query rows per KV head, the matmul form is a batch of `N·K` products of
  `G × Hd` by `Hd × T`, tiny matrices that XLA:CPU runs far below its matmul rate. Both sums
  run over the second-minor axis of their buffer, so the minor axis (`T` for the keys, `Hd`
  for the values) is the vectorised one; summing over the minor axis instead (keys stored
  `[N, K, T, Hd]`) made the `q·k` reduction 2-3× slower.
- `DecodeLayers`: the layer weights. With at most `layer_unroll` layers they are sliced out of
  the stacked parameters once, before the decode loop (`decode_layers`), and the layers run
  as a Python loop; XLA:CPU otherwise copies each weight matrix out of the stack in every
  iteration of the loop. Deeper models scan over the stacked weights, `layer_unroll` layers
  per iteration, with the per-layer buffers stacked for the scan and split after it (one copy
  of the cache per step, as in `Decoder.decode_hidden`).

The float32 sums run in a different order than the matmuls of `Decoder.decode_hidden`, so
log-probs agree to float32 rounding (tested against a fresh forward pass), not bit for bit.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models._sharded_ops import reshape
from jaxrl_llm.models.cache import KVCache, cached_attention_mask
from jaxrl_llm.models.decoder import Decoder
from jaxrl_llm.models.layers import rope_angles, rope_inv_freq
from sharding import shard

Array = jax.Array

DECODE_KEY_AXES = ("batch", "kv_heads", "head_dim", "cache_seq")
"""Logical axes of each layer's key buffer in a `DecodeCache` (`[N, K, Hd, T]`)."""
DECODE_VALUE_AXES = ("batch", "kv_heads", "cache_seq", "head_dim")
"""Logical axes of each layer's value buffer in a `DecodeCache` (`[N, K, T, Hd]`)."""


class DecodeCache(NamedTuple):
    """The decode loop's KV cache: per-layer keys `[N, K, Hd, T]`, values `[N, K, T, Hd]`.

    `positions[n, t]` is the rotary position of the token in slot `t` of row `n`, `-1` for an
    empty slot or a padding token (never read); `length` is the number of slots written, the
    same for every row.

    Examples:
      >>> from jaxrl_llm.models import ModelConfig
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> cache = decode_cache(KVCache.init(cfg, batch=8, max_len=7, shared_length=True))
      >>> len(cache.k), cache.k[0].shape, cache.v[1].shape, cache.positions.shape
      (2, (8, 1, 4, 7), (8, 1, 7, 4), (8, 7))
    """

    k: tuple[Array, ...]  # L × [N, K, Hd, T]
    v: tuple[Array, ...]  # L × [N, K, T, Hd]
    positions: Array  # [N, T] int32
    length: Array  # [] int32


def shard_decode_cache(cache: DecodeCache) -> DecodeCache:
    """Lay the buffers out by their logical axes on the context mesh (unchanged without one)."""
    return DecodeCache(
        k=tuple(shard(x, DECODE_KEY_AXES) for x in cache.k),
        v=tuple(shard(x, DECODE_VALUE_AXES) for x in cache.v),
        positions=shard(cache.positions, ("batch", "cache_seq")),
        length=cache.length,
    )


def decode_cache(cache: KVCache) -> DecodeCache:
    """The `DecodeCache` holding what a shared-length `KVCache` holds (slot and head axes swapped).

    Raises:
      ValueError: `cache` has one length per row.

    Examples:
      >>> from jaxrl_llm.models import ModelConfig
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> cache = decode_cache(KVCache.init(cfg, batch=2, max_len=3, shared_length=True))
      >>> len(cache.k), cache.k[0].shape, cache.v[0].shape, cache.length.shape
      (2, (2, 1, 4, 3), (2, 1, 3, 4), ())
    """
    if cache.lengths.ndim:
        raise ValueError(
            "decode_cache: `cache` must have one shared length "
            f"(KVCache.init(..., shared_length=True)), got lengths of shape {cache.lengths.shape}."
        )
    L = cache.k.shape[0]
    k = tuple(jnp.swapaxes(cache.k[i], -1, -2) for i in range(L))  # [N, K, T, Hd] -> [N, K, Hd, T]
    v = tuple(jnp.swapaxes(cache.v[i], -1, -2) for i in range(L))  # [N, K, Hd, T] -> [N, K, T, Hd]
    return shard_decode_cache(DecodeCache(k, v, cache.positions, cache.lengths))


def grow_decode_cache(cache: DecodeCache, max_len: int) -> DecodeCache:
    """`cache` with empty slots appended up to `max_len` (positions -1: never read)."""
    extra = max_len - cache.positions.shape[1]
    if extra < 0:
        raise ValueError(
            f"grow_decode_cache: max_len={max_len} < the cache's {cache.positions.shape[1]} slots."
        )
    return shard_decode_cache(
        DecodeCache(
            k=tuple(jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, extra))) for x in cache.k),
            v=tuple(jnp.pad(x, ((0, 0), (0, 0), (0, extra), (0, 0))) for x in cache.v),
            positions=jnp.pad(cache.positions, ((0, 0), (0, extra)), constant_values=-1),
            length=cache.length,
        )
    )


def decode_attention(
    q: Array, k: Array, v: Array, mask: Array, *, scale: float, softcap: float | None
) -> Array:
    """Grouped-query attention of one new token per row over a layer's cached keys and values.

    `softmax(scale · q·kᵀ)·v` over the slots `mask` allows, written as multiply-reduces in
    float32 (see the module docstring); the same function as `models.layers.attend`.

    Args:
      q: queries `[N, 1, H, Hd]`.
      k: cached keys `[N, K, Hd, T]` (query head `h` reads kv head `h // (H // K)`).
      v: cached values `[N, K, T, Hd]`.
      mask: `[N, 1, T]` bool, True where the query may read slot `t`.
      scale: multiplier of `q·k`.
      softcap: if set, logits become `softcap · tanh(logits / softcap)`.

    Returns:
      `[N, 1, H, Hd]` in `q`'s dtype; a fully masked row attends uniformly (no NaN).

    Examples:
      >>> q = jnp.ones((1, 1, 2, 2))
      >>> k = jnp.array([[[[1.0, 0.0], [0.0, 0.0]]]])  # N=1, K=1, Hd=2, T=2 slots
      >>> v = jnp.array([[[[1.0, 2.0], [3.0, 4.0]]]])
      >>> decode_attention(q, k, v, jnp.array([[[True, False]]]), scale=1.0, softcap=None)
      Array([[[[1., 2.],
               [1., 2.]]]], dtype=float32)
    """
    N, S, H, Hd = q.shape
    K = k.shape[1]
    if S != 1:
        raise ValueError(f"decode_attention: one query per row expected, got q of shape {q.shape}.")
    qg = reshape(q, (N, K, H // K, Hd), ("batch", "kv_heads", None, "head_dim"))
    f32 = jnp.float32
    logits = jnp.sum(qg.astype(f32)[..., None] * k.astype(f32)[:, :, None], axis=-2)
    logits = logits * scale  # [N, K, G, T]
    if softcap is not None:
        logits = softcap * jnp.tanh(logits / softcap)
    logits = jnp.where(mask[:, :, None, :], logits, jnp.finfo(f32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    out = jnp.sum(probs[..., None] * v.astype(f32)[:, :, None], axis=-2)  # [N, K, G, Hd]
    out = out.astype(q.dtype)
    return reshape(out, (N, 1, H, Hd), ("batch", "length", "heads", "head_dim"))


def decode_rope(model: Decoder, positions: Array) -> tuple[tuple[Array, Array], ...]:
    """The rotary `(sin, cos)` of `positions[N, S]`, each `[N, S, Hd/2]`, per kind of layer.

    One pair for the full-attention rope, and a second for the sliding layers' rope when the
    model has sliding layers (Gemma 2/3). The sampler computes them for all its decode steps
    before the loop and passes step `t`'s slice to `decode_step`: inside the loop XLA fuses
    the sines and cosines into every layer's rotation, once per head.
    """
    cfg = model.config
    pairs = (rope_angles(positions, rope_inv_freq(cfg.rope, cfg.head_dim)),)
    if any(t == "sliding_attention" for t in cfg.layer_types):
        local = cfg.local_rope or cfg.rope
        pairs += (rope_angles(positions, rope_inv_freq(local, cfg.head_dim)),)
    return pairs


class DecodeLayers(NamedTuple):
    """The decoder layers' weights for `decode_step` (see `decode_layers`)."""

    graphdef: nnx.GraphDef
    per_layer: tuple[nnx.State, ...] | None  # one state per layer (Python loop), or None
    stacked: nnx.State | None  # the stacked state (scan), or None
    unroll: int


def decode_layers(model: Decoder, layer_unroll: int) -> DecodeLayers:
    """Prepare `model`'s layer weights for `decode_step`; call it outside the decode loop.

    With `num_layers <= layer_unroll` every layer's weights are sliced out of the stacked
    parameters here, once (the decode step then runs the layers as a Python loop); otherwise
    the stacked weights are kept and scanned, `layer_unroll` layers per scan iteration.
    """
    if isinstance(layer_unroll, bool) or not isinstance(layer_unroll, int) or layer_unroll < 1:
        raise ValueError(
            f"decode_layers: `layer_unroll` must be an int >= 1, got {layer_unroll!r}."
        )
    graphdef, state = nnx.split(model.layers)
    L = model.config.num_layers
    if layer_unroll >= L:
        per_layer = tuple(jax.tree.map(lambda x, i=i: x[i], state) for i in range(L))
        return DecodeLayers(graphdef, per_layer, None, L)
    return DecodeLayers(graphdef, None, state, layer_unroll)


def decode_step(
    model: Decoder,
    layers: DecodeLayers,
    tokens: Array,
    positions: Array,
    active: Array,
    cache: DecodeCache,
    rope: tuple[tuple[Array, Array], ...] | None = None,
) -> tuple[Array, DecodeCache]:
    """Feed one token per row through the decoder: final-normed hidden states `[N, D]`.

    Args:
      model: the `Decoder` (embedding, final norm, config; its layer weights come from
        `layers`).
      layers: `decode_layers(model, ...)`, computed before the decode loop.
      tokens: `[N]` int token ids.
      positions: `[N]` int rotary positions of the tokens.
      active: `[N]` bool; an inactive row's slot gets position `-1` and is never read.
      cache: the `DecodeCache`; the tokens go to slot `cache.length` of every row.
      rope: `decode_rope(model, positions[:, None])`, precomputed (`[N, 1, Hd/2]` each); None
        computes it here.

    Returns:
      `(hidden [N, D], cache)` with the new keys, values and positions written and
      `length + 1`.
    """
    cfg = model.config
    tokens = shard(tokens[:, None], ("batch", "length"))
    positions = shard(positions[:, None].astype(jnp.int32), ("batch", "length"))
    slot = cache.length.astype(jnp.int32)
    before = KVCache(None, None, cache.positions, slot)  # only positions and length are read
    written = jnp.where(active[:, None], positions, -1)
    after = before._replace(
        positions=jax.lax.dynamic_update_slice(cache.positions, written, (0, slot))
    )
    rope = decode_rope(model, positions) if rope is None else rope
    masks = (cached_attention_mask(before, after, positions, None),)
    sliding = np.array([t == "sliding_attention" for t in cfg.layer_types])
    if sliding.any():
        masks += (cached_attention_mask(before, after, positions, cfg.sliding_window),)
    zero = jnp.zeros((), jnp.int32)

    def layer(x: Array, k_buf: Array, v_buf: Array, state: Any, kind: Any) -> Any:
        if isinstance(kind, int):  # a Python loop: the layer type is known
            (sin, cos), mask = rope[kind], masks[kind]
        else:
            (sin, cos) = jax.tree.map(lambda f, s: jnp.where(kind, s, f), rope[0], rope[-1])
            mask = jnp.where(kind, masks[-1], masks[0])

        def write(k_new: Array, v_new: Array) -> tuple[Array, Array, Any]:
            # [N, 1, K, Hd] -> keys [N, K, Hd, 1], values [N, K, 1, Hd], at slot `length`
            k_new = jnp.transpose(k_new, (0, 2, 3, 1)).astype(k_buf.dtype)
            v_new = jnp.transpose(v_new, (0, 2, 1, 3)).astype(v_buf.dtype)
            k = jax.lax.dynamic_update_slice(k_buf, k_new, (zero, zero, zero, slot))
            v = jax.lax.dynamic_update_slice(v_buf, v_new, (zero, zero, slot, zero))
            return k, v, (k, v)

        block = nnx.merge(layers.graphdef, state)
        return block(x, sin, cos, mask, write, attention=decode_attention)

    x = model._embed(tokens)
    if layers.per_layer is not None:
        k, v = [], []
        for i, state in enumerate(layers.per_layer):
            x, (k_i, v_i) = layer(x, cache.k[i], cache.v[i], state, int(sliding[i]))
            k.append(k_i)
            v.append(v_i)
    else:

        def body(x: Array, xs: Any) -> tuple[Array, Any]:
            state, k_buf, v_buf, kind = xs
            return layer(x, k_buf, v_buf, state, kind)

        xs = (layers.stacked, jnp.stack(cache.k), jnp.stack(cache.v), jnp.asarray(sliding))
        x, (k, v) = jax.lax.scan(body, x, xs, unroll=layers.unroll)
        k, v = list(k), list(v)
    hidden = model.final_norm(x)[:, 0]
    return hidden, shard_decode_cache(
        DecodeCache(k=tuple(k), v=tuple(v), positions=after.positions, length=slot + 1)
    )
