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
  iteration of the loop. Deeper models scan over the stacked weights in groups of `g`
  layers per iteration (`g` the largest divisor of the depth that is at most `layer_unroll`).
  Their cache is then stacked too (`decode_cache(..., stacked=True)`: keys
  `[L, N, K, Hd, T]`, values `[L, N, K, T, Hd]`) and carried through the scan: an iteration
  slices its group's buffers out of the stacks, runs the group's layers on them (each layer
  writing its slot as above) and writes the group back with one `dynamic_update_slice`, so
  every read of the stacks comes before their one write and XLA updates them in place.
  Re-stacking per-layer buffers for the scan (what `Decoder.decode_hidden` does) copied the
  whole cache three times per step, and a write-back after each layer let XLA fuse the next
  layer's read into it and copy the stack; on this CPU a 16-layer model decoded at 6.0-6.4 ms
  per step with the copies and 3.7-3.9 ms without (`layer_unroll=4`; docs/sampler.md).

The float32 sums run in a different order than the matmuls of `Decoder.decode_hidden`, so
log-probs agree to float32 rounding (tested against a fresh forward pass), not bit for bit.
With bfloat16 values the attention probabilities are rounded to bfloat16 before they weight
the values, as in `layers.attend`: kept in float32 they made the sampler's log-probs differ
from the training forward's by a mean 0.0086 nats on a tiny random bfloat16 Qwen3 (0.0047
rounded; 4 seeds, 3 rows of 12 sampled tokens).
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

    `k` and `v` are tuples of one buffer per layer (the layer loop), or one stacked array
    `[L, ...]` each (the layer scan; `decode_cache(..., stacked=True)`). Either way `k[l]` is
    layer `l`'s key buffer and `len(k)` the number of layers.

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

    k: tuple[Array, ...] | Array  # L × [N, K, Hd, T], or [L, N, K, Hd, T]
    v: tuple[Array, ...] | Array  # L × [N, K, T, Hd], or [L, N, K, T, Hd]
    positions: Array  # [N, T] int32
    length: Array  # [] int32


def shard_decode_cache(cache: DecodeCache) -> DecodeCache:
    """Lay the buffers out by their logical axes on the context mesh (unchanged without one)."""

    def lay(buffers: tuple[Array, ...] | Array, axes: tuple[str, ...]) -> Any:
        if isinstance(buffers, tuple):
            return tuple(shard(x, axes) for x in buffers)
        return shard(buffers, ("layers", *axes))

    return DecodeCache(
        k=lay(cache.k, DECODE_KEY_AXES),
        v=lay(cache.v, DECODE_VALUE_AXES),
        positions=shard(cache.positions, ("batch", "cache_seq")),
        length=cache.length,
    )


def decode_cache(cache: KVCache, stacked: bool = False) -> DecodeCache:
    """The `DecodeCache` holding what a shared-length `KVCache` holds (slot and head axes swapped).

    `stacked=True` keeps the layers in one `[L, ...]` array per kind (for the layer scan,
    `decode_layers` with fewer than `num_layers` layers per iteration); False splits them into
    one buffer per layer (for the layer loop).

    Raises:
      ValueError: `cache` has one length per row.

    Examples:
      >>> from jaxrl_llm.models import ModelConfig
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> cache = decode_cache(KVCache.init(cfg, batch=2, max_len=3, shared_length=True))
      >>> len(cache.k), cache.k[0].shape, cache.v[0].shape, cache.length.shape
      (2, (2, 1, 4, 3), (2, 1, 3, 4), ())
      >>> stacked = decode_cache(KVCache.init(cfg, batch=2, max_len=3, shared_length=True), True)
      >>> len(stacked.k), stacked.k.shape, stacked.v[0].shape
      (2, (2, 2, 1, 4, 3), (2, 1, 3, 4))
    """
    if cache.lengths.ndim:
        raise ValueError(
            "decode_cache: `cache` must have one shared length "
            f"(KVCache.init(..., shared_length=True)), got lengths of shape {cache.lengths.shape}."
        )
    k = jnp.swapaxes(cache.k, -1, -2)  # [L, N, K, T, Hd] -> [L, N, K, Hd, T]
    v = jnp.swapaxes(cache.v, -1, -2)  # [L, N, K, Hd, T] -> [L, N, K, T, Hd]
    if not stacked:
        k, v = tuple(k[i] for i in range(k.shape[0])), tuple(v[i] for i in range(v.shape[0]))
    return shard_decode_cache(DecodeCache(k, v, cache.positions, cache.lengths))


def grow_decode_cache(cache: DecodeCache, max_len: int) -> DecodeCache:
    """`cache` with empty slots appended up to `max_len` (positions -1: never read)."""
    extra = max_len - cache.positions.shape[1]
    if extra < 0:
        raise ValueError(
            f"grow_decode_cache: max_len={max_len} < the cache's {cache.positions.shape[1]} slots."
        )

    def pad(x: Array, axis: int) -> Array:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, extra)
        return jnp.pad(x, widths)

    return shard_decode_cache(
        DecodeCache(
            k=jax.tree.map(lambda x: pad(x, -1), cache.k),  # slots are the keys' last axis
            v=jax.tree.map(lambda x: pad(x, -2), cache.v),
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
    # rounded to the values' dtype as `layers.attend` rounds them (a no-op in float32): in
    # bfloat16 the sampler's log-probs then follow the training forward's, not float32 ones
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype).astype(f32)
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
    the stacked weights are kept and scanned in groups of `g` layers per scan iteration, `g`
    the largest divisor of `num_layers` that is at most `layer_unroll` (`DecodeLayers.unroll`).
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
    group = max(d for d in range(1, layer_unroll + 1) if L % d == 0)
    return DecodeLayers(graphdef, None, state, group)


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

    def layer(x: Array, write: Any, state: Any, kind: Any) -> Any:
        if isinstance(kind, int):  # a Python loop: the layer type is known
            (sin, cos), mask = rope[kind], masks[kind]
        else:
            (sin, cos) = jax.tree.map(lambda f, s: jnp.where(kind, s, f), rope[0], rope[-1])
            mask = jnp.where(kind, masks[-1], masks[0])
        block = nnx.merge(layers.graphdef, state)
        return block(x, sin, cos, mask, write, attention=decode_attention)

    def write_layer(k_buf: Array, v_buf: Array) -> Any:
        def write(k_new: Array, v_new: Array) -> tuple[Array, Array, Any]:
            # [N, 1, K, Hd] -> keys [N, K, Hd, 1], values [N, K, 1, Hd], at slot `length`
            k_new = jnp.transpose(k_new, (0, 2, 3, 1)).astype(k_buf.dtype)
            v_new = jnp.transpose(v_new, (0, 2, 1, 3)).astype(v_buf.dtype)
            k = jax.lax.dynamic_update_slice(k_buf, k_new, (zero, zero, zero, slot))
            v = jax.lax.dynamic_update_slice(v_buf, v_new, (zero, zero, slot, zero))
            return k, v, (k, v)

        return write

    x = model._embed(tokens)
    if layers.per_layer is not None:
        if not isinstance(cache.k, tuple):
            raise ValueError(
                "decode_step: the layer loop needs one cache buffer per layer; build the cache "
                "with decode_cache(..., stacked=False)."
            )

        k, v = [], []
        for i, state in enumerate(layers.per_layer):
            write = write_layer(cache.k[i], cache.v[i])
            x, (k_i, v_i) = layer(x, write, state, int(sliding[i]))
            k.append(k_i)
            v.append(v_i)
        k, v = tuple(k), tuple(v)
    else:
        if isinstance(cache.k, tuple):
            raise ValueError(
                "decode_step: the layer scan needs the stacked cache; build it with "
                "decode_cache(..., stacked=True)."
            )

        g = layers.unroll  # layers per scan iteration; divides L

        def body(carry: Any, xs: Any) -> tuple[Any, None]:
            x, k_all, v_all = carry
            states, kinds, first = xs
            # read the group's buffers, run its layers, write them all back in one update:
            # every read of the stacks comes before their one write, so XLA updates them in
            # place (a write-back per layer let XLA fuse the next layer's read into it and
            # copy the stack)
            k_group = jax.lax.dynamic_slice_in_dim(k_all, first, g, 0)
            v_group = jax.lax.dynamic_slice_in_dim(v_all, first, g, 0)
            k_out, v_out = [], []
            for j in range(g):
                state = jax.tree.map(lambda w, j=j: w[j], states)
                x, (k_j, v_j) = layer(x, write_layer(k_group[j], v_group[j]), state, kinds[j])
                k_out.append(k_j)
                v_out.append(v_j)
            k_all = jax.lax.dynamic_update_slice_in_dim(k_all, jnp.stack(k_out), first, 0)
            v_all = jax.lax.dynamic_update_slice_in_dim(v_all, jnp.stack(v_out), first, 0)
            return (x, k_all, v_all), None

        L = len(sliding)
        groups = jax.tree.map(lambda w: w.reshape(L // g, g, *w.shape[1:]), layers.stacked)
        firsts = jnp.arange(0, L, g, dtype=jnp.int32)
        xs = (groups, jnp.asarray(sliding).reshape(L // g, g), firsts)
        (x, k, v), _ = jax.lax.scan(body, (x, cache.k, cache.v), xs)
    hidden = model.final_norm(x)[:, 0]
    return hidden, shard_decode_cache(
        DecodeCache(k=k, v=v, positions=after.positions, length=slot + 1)
    )
