"""Building blocks of the decoder: RMSNorm, rotary embeddings, GQA attention, gated MLP.

Conventions (shape letters of DESIGN.md, plus H query heads, K key/value heads, Hd head
dimension, F MLP width, T key length):

- Every parameter is an `nnx.Param` whose `out_sharding` metadata holds its logical axis names
  (`embed`, `mlp`, `heads`, `kv_heads`, `head_dim`, `vocab`, `norm`); `sharding.rules` maps them
  to mesh axes. Eager sharding is off: the model never touches a mesh.
- Parameters are stored in `param_dtype` and cast to the compute `dtype` where they are used.
  Norm statistics, rotary, attention logits and the softmax run in float32.
- Under a mesh (`jax.set_mesh`) weights are read through `_sharded_ops.compute_weight` (FSDP
  shards gathered, tensor-parallel axes kept split) and the ops whose result layout is
  ambiguous under Explicit axes name it: activations are `[N, S, ...]` with `N` over the batch
  axes, query / KV heads and the MLP width over `tensor` (`sharding.ACTIVATION_AXIS_RULES`);
  the output projections all-reduce their `tensor` partial sums into `[N, S, D]`.
- Projection kernels are stored input-axis first: q `[D, H, Hd]`, k/v `[D, K, Hd]`,
  o `[H, Hd, D]`, gate/up `[D, F]`, down `[F, D]`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models._sharded_ops import (
    Names,
    compute_weight,
    dense,
    einsum,
    own_names,
    plain_layout,
    reshape,
    unsharded,
)
from jaxrl_llm.models.config import ModelConfig, RopeConfig
from jaxrl_llm.models.position_chunks import map_position_chunks
from sharding import shard

Array = jax.Array
_INIT_STD = 0.02  # the families' `initializer_range`


@functools.partial(jax.jit, static_argnums=1)
def _scaled_normal(key: Array, size: int) -> Array:
    """`_INIT_STD · normal(key, (size,))`, float32, as one compiled program per size.

    `make_param` draws flat and reshapes: the same values as a draw of the shape (threefry
    numbers the elements in row-major order), but XLA:CPU compiles the 1-D draw 2-4× faster
    than a 3-D or 4-D one, and parameters of one size share the program. The barrier keeps XLA
    from folding the scale into the draw: the values are bit-identical to the eager
    `_INIT_STD * jax.random.normal(key, shape)`.
    """
    return _INIT_STD * jax.lax.optimization_barrier(jax.random.normal(key, (size,), jnp.float32))


def make_param(
    key: Array, shape: tuple[int, ...], names: tuple[str | None, ...], param_dtype: Any, init: str
) -> nnx.Param:
    """An `nnx.Param` with logical axis names; `init` is "normal" (std 0.02), "zeros" or "ones"."""
    if init == "normal":
        value = _scaled_normal(key, math.prod(shape)).reshape(shape)
    elif init == "zeros":
        value = jnp.zeros(shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        raise ValueError(f"make_param: unknown init {init!r} (normal, zeros, ones).")
    return nnx.Param(value.astype(param_dtype), out_sharding=names, eager_sharding=False)


class RMSNorm(nnx.Module):
    """Root-mean-square norm over the last axis: `y = x / sqrt(mean(x²) + eps) · scale`.

    With `plus_one` (Gemma) the scale is `1 + w` and `w` starts at zero; the product is taken in
    float32 before the cast. Otherwise (Llama, Qwen) the normalised value is cast to the input
    dtype first and then multiplied by `w`, as the reference implementations do.

    Examples:
      >>> norm = RMSNorm(4, eps=1e-6, plus_one=False, rngs=nnx.Rngs(0))
      >>> norm(jnp.array([[1.0, -1.0, 1.0, -1.0]]))
      Array([[ 1., -1.,  1., -1.]], dtype=float32)
    """

    def __init__(
        self,
        dim: int,
        *,
        eps: float,
        plus_one: bool,
        names: tuple[str, ...] = ("norm",),
        param_dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        init = "zeros" if plus_one else "ones"
        self.scale = make_param(rngs.params(), (dim,), names, param_dtype, init)
        self.eps = eps
        self.plus_one = plus_one

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        scale = compute_weight(self.scale)
        if self.plus_one:
            return (normed * (1.0 + scale.astype(jnp.float32))).astype(x.dtype)
        return scale.astype(x.dtype) * normed.astype(x.dtype)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> np.ndarray:
    """Inverse frequencies `[Hd/2]` (float32) of `rope`, with its scaling applied.

    Examples:
      >>> rope_inv_freq(RopeConfig(theta=10000.0), 4)
      array([1.  , 0.01], dtype=float32)
    """
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    inv_freq = 1.0 / rope.theta**exponents
    if rope.kind == "linear":
        inv_freq = inv_freq / rope.factor
    elif rope.kind == "llama3":
        old_len = rope.original_max_position_embeddings
        wavelen = 2 * np.pi / inv_freq
        low_freq_wavelen = old_len / rope.low_freq_factor
        high_freq_wavelen = old_len / rope.high_freq_factor
        smooth = (old_len / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        interpolated = (1 - smooth) * inv_freq / rope.factor + smooth * inv_freq
        inv_freq = np.where(
            wavelen > low_freq_wavelen,
            inv_freq / rope.factor,
            np.where(wavelen < high_freq_wavelen, inv_freq, interpolated),
        )
    return inv_freq.astype(np.float32)


def rope_angles(positions: Array, inv_freq: np.ndarray) -> tuple[Array, Array]:
    """`(sin, cos)`, each `[N, S, Hd/2]` float32, of `positions[N, S]` times `inv_freq`."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
    return jnp.sin(angles), jnp.cos(angles)


def apply_rope(x: Array, sin: Array, cos: Array) -> Array:
    """Rotate `x[N, S, heads, Hd]` by the angles (rotate-half layout: pairs `(i, i + Hd/2)`).

    Examples:
      >>> x = jnp.array([[[[1.0, 0.0]]]])  # one head, Hd=2
      >>> sin, cos = rope_angles(jnp.array([[0]]), np.array([1.0], np.float32))
      >>> apply_rope(x, sin, cos)
      Array([[[[1., 0.]]]], dtype=float32)
    """
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    sin, cos = sin[:, :, None, :], cos[:, :, None, :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def attend(
    q: Array, k: Array, v: Array, mask: Array, *, scale: float, softcap: float | None
) -> Array:
    """Grouped-query softmax attention.

    Args:
      q: queries `[N, S, H, Hd]`.
      k: keys `[N, T, K, Hd]`, with `H` a multiple of `K` (query head `h` reads kv head
        `h // (H // K)`).
      v: values `[N, T, K, Hd]`.
      mask: `[N, S, T]` bool, True where query `s` may attend to key `t`.
      scale: multiplier of `q·k`.
      softcap: if set, logits become `softcap · tanh(logits / softcap)` (Gemma 2).

    Returns:
      `[N, S, H, Hd]` in `q`'s dtype. Logits and softmax are float32; a fully masked row
      (padding) attends uniformly instead of producing NaN.

    Layout: without a mesh, or on a mesh of one device (`plain_layout`), the heads lead: the
    `G` queries of a KV head are one `[G·S, Hd]` matrix against that head's `[T, Hd]` keys and
    values, so both products are batched 2-D matmuls over `(N, K)` that XLA:CPU runs without
    transposing copies of the `[N, K, G·S, T]` probabilities (the token-major einsums of the
    mesh path made the small benchmark model's attention forward ≈ 3× slower on CPU; with the
    2-D projections of `dense`, the runner's one-device update step went from 0.69 to 0.48 s).

    Sharding: the query heads are grouped as `[N, S, K, G, Hd]` with `K` laid out like the KV
    heads: split over `tensor` when it divides `K` (each device attends with its own KV heads),
    else whole (the query heads are gathered and attention runs replicated over `tensor`).
    """
    N, S, H, Hd = q.shape
    K = k.shape[2]
    plain = plain_layout()
    G, T = H // K, k.shape[1]
    if plain:
        q, k, v, mask = unsharded(q, k, v, mask)
        qg = jnp.transpose(q.reshape(N, S, K, G, Hd), (0, 2, 3, 1, 4)).reshape(N, K, G * S, Hd)
        k, v = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))  # [N, K, T, Hd]
        logits = jnp.einsum("nkqh,nkth->nkqt", qg, k, preferred_element_type=jnp.float32)
        logits = logits.reshape(N, K, G, S, T)
    else:
        qg = reshape(q, (N, S, K, G, Hd), ("batch", "length", "kv_heads", None, "head_dim"))
        logits = jnp.einsum("nskgh,ntkh->nkgst", qg, k, preferred_element_type=jnp.float32)
    logits = logits * scale
    if softcap is not None:
        logits = softcap * jnp.tanh(logits / softcap)
    logits = jnp.where(mask[:, None, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    if plain:
        out = jnp.einsum("nkqt,nkth->nkqh", probs.reshape(N, K, G * S, T), v)
        out = jnp.transpose(out.reshape(N, K, G, S, Hd), (0, 3, 1, 2, 4)).reshape(N, S, H, Hd)
        return shard(out, ("batch", "length", "heads", "head_dim"))
    out = jnp.einsum("nkgst,ntkh->nskgh", probs, v)
    return reshape(out, (N, S, H, Hd), ("batch", "length", "heads", "head_dim"))


def fused_attention_kernel(dtype: Any) -> str:
    """The `implementation` of `jax.nn.dot_product_attention` that `fused_attend` asks for:
    cuDNN's fused flash-attention kernel on NVIDIA GPUs for bfloat16 / float16 inputs (the
    dtypes it takes), XLA's composition of the same math everywhere else.

    Examples:
      >>> fused_attention_kernel(jnp.float32)
      'xla'
    """
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    return "cudnn" if jax.default_backend() == "gpu" and half else "xla"


def fused_attend(
    q: Array, k: Array, v: Array, lengths: Array, *, scale: float, softcap: float | None
) -> Array:
    """Causal grouped-query attention of rows whose first `lengths[n]` tokens are real, through
    `jax.nn.dot_product_attention` (`fused_attention_kernel`: cuDNN's flash attention on GPUs).

    Query `s < lengths[n]` of row `n` reads keys `t <= s`; the query rows past the length
    (padding) return no useful value. The kernel keeps the `[N, H, S, T]` logits on chip, so
    memory stays linear in `S` (`Decoder(fused_attention=True)` brings each row's real tokens
    to the front first).

    Args:
      q: queries `[N, S, H, Hd]`.
      k, v: keys and values `[N, S, K, Hd]`, `H` a multiple of `K`.
      lengths: `[N]` int32, real tokens per row (a prefix of the row).
      scale: multiplier of `q·k`.
      softcap: must be None (the fused kernels have no logit soft-capping).

    Returns:
      `[N, S, H, Hd]` in `q`'s dtype.

    Examples:
      >>> q, k = jnp.ones((1, 3, 2, 4)), jnp.ones((1, 3, 1, 4))
      >>> v = jnp.arange(12.0).reshape(1, 3, 1, 4)
      >>> out = fused_attend(q, k, v, jnp.array([3]), scale=0.5, softcap=None)
      >>> mask = jnp.tril(jnp.ones((3, 3), bool))[None]
      >>> bool(jnp.allclose(out, attend(q, k, v, mask, scale=0.5, softcap=None)))
      True
    """
    if softcap is not None:
        raise ValueError("fused_attend: the fused kernels have no logit soft-capping (softcap).")
    lengths = lengths.astype(jnp.int32)
    if plain_layout():  # (a one-device mesh's typed arrays, as in `attend`)
        q, k, v, lengths = unsharded(q, k, v, lengths)
    out = jax.nn.dot_product_attention(
        q,
        k,
        v,
        scale=scale,
        is_causal=True,
        query_seq_lengths=lengths,
        key_value_seq_lengths=lengths,
        implementation=fused_attention_kernel(q.dtype),
    )
    return shard(out, ("batch", "length", "heads", "head_dim"))


def fused_attention_fits(num_kv_heads: int) -> bool:
    """Whether `fused_attend` can run under the context mesh: no mesh or one device, or a
    `tensor` axis that splits the KV heads (each device then holds whole groups of query
    heads; where the rules replicate the KV heads, the default attention gathers the query
    heads instead).

    Examples:
      >>> fused_attention_fits(2)
      True
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return True
    return num_kv_heads % dict(mesh.shape).get("tensor", 1) == 0


def chunked_attend(
    q: Array,
    k: Array,
    v: Array,
    mask: Array,
    *,
    scale: float,
    softcap: float | None,
    chunk: int,
) -> Array:
    """`attend` over blocks of `chunk` queries, each block recomputed in the backward pass.

    Query-chunked attention (the query blocking of Rabe & Staats 2021, "Self-attention Does
    Not Need O(n²) Memory", arXiv:2112.05682): softmax attention normalises each query's
    row over the keys, so splitting the `S` queries into blocks of `C = chunk` rows and
    attending each block to all `T` keys gives the same outputs row for row. The blocks run
    one after another (`position_chunks.map_position_chunks`: `lax.map` under
    `jax.checkpoint`), so the forward pass holds one block's float32 logits and
    probabilities `[N, H, C, T]` instead of `[N, H, S, T]`, and the backward pass recomputes
    them block by block (≈ one more attention forward) instead of keeping them. The
    `[N, S, T]` boolean mask stays whole (1 byte per pair, against ≥ 8·H bytes of logits and
    probabilities). The last block of an `S` that `C` does not divide overlaps the one before
    it and keeps only its new queries. `S <= chunk` is `attend` itself.

    Args:
      q, k, v, mask, scale, softcap: as `attend` (`q [N, S, H, Hd]`, `k`, `v` `[N, T, K, Hd]`,
        `mask [N, S, T]`).
      chunk: queries per block, an int >= 1.

    Returns:
      `[N, S, H, Hd]`: `attend(q, k, v, mask, ...)` up to float32 rounding.

    Examples:
      >>> q, k = jnp.ones((1, 5, 2, 4)), jnp.ones((1, 5, 1, 4))
      >>> v = jnp.arange(20.0).reshape(1, 5, 1, 4)
      >>> mask = jnp.tril(jnp.ones((5, 5), bool))[None]
      >>> out = chunked_attend(q, k, v, mask, scale=0.5, softcap=None, chunk=2)
      >>> bool(jnp.allclose(out, attend(q, k, v, mask, scale=0.5, softcap=None)))
      True
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunked_attend: `chunk` must be an int >= 1, got {chunk!r}.")

    def block(q_block: Array, mask_block: Array) -> Array:
        return attend(q_block, k, v, mask_block, scale=scale, softcap=softcap)

    return map_position_chunks(block, (q, mask), chunk)


def project(module: nnx.Module, name: str, x: Array, contract: int, names: Names) -> Array:
    """`x · W` for the projection `W = module.<name>` (its first `contract` axes contracted with
    the last ones of `x`), plus its LoRA update `s · (x·A)·B` when `module` has adapters
    `<name>_lora_a` / `<name>_lora_b` (`models.lora`; `s = module.lora_config.scale`), all in the
    module's compute dtype. With a DoRA magnitude `<name>_lora_m` the sum is scaled per output
    feature by `dora_ratio` (`m / ‖W + s·A·B‖`).

    Examples:
      >>> class Proj(nnx.Module):
      ...     def __init__(self):
      ...         self.w = make_param(jax.random.key(0), (3, 2), ("embed", "mlp"), jnp.float32, "ones")
      ...         self.dtype = jnp.float32
      >>> project(Proj(), "w", jnp.ones((1, 1, 3)), 1, ("batch", "length", "mlp")).tolist()
      [[[3.0, 3.0]]]
    """
    out = dense(
        x, compute_weight(getattr(module, name), module.dtype), contract=contract, names=names
    )
    a = getattr(module, f"{name}_lora_a", None)
    if a is None:
        return out
    low = dense(
        x,
        compute_weight(a, module.dtype),
        contract=contract,
        names=(*names[: x.ndim - contract], None),
    )
    b = getattr(module, f"{name}_lora_b")
    scale = module.lora_config.scale
    out = out + scale * dense(low, compute_weight(b, module.dtype), contract=1, names=names)
    magnitude = getattr(module, f"{name}_lora_m", None)
    if magnitude is None:
        return out
    ratio = dora_ratio(getattr(module, name), a, b, magnitude, scale, inputs=contract)
    return out * ratio.astype(out.dtype)


def adapted_weight(weight: nnx.Param, a: nnx.Param, b: nnx.Param, scale: float) -> Array:
    """`W + s·A·B` in float32, laid out like `W` (its logical names), for a LoRA-adapted
    projection (`models.lora`). Leading (layer) axes of stacked parameters are batch axes of the
    product.

    Args:
      weight: `W [*lead, *I, *O]`; `a`: `A [*lead, *I, r]`; `b`: `B [*lead, r, *O]`.
      scale: the LoRA scale `s`.

    Examples:
      >>> w = make_param(jax.random.key(0), (3, 2), ("embed", "mlp"), jnp.float32, "ones")
      >>> a = make_param(jax.random.key(1), (3, 1), ("embed", None), jnp.float32, "ones")
      >>> b = make_param(jax.random.key(2), (1, 2), (None, "mlp"), jnp.float32, "ones")
      >>> adapted_weight(w, a, b, 0.5).tolist()  # 1 + 0.5 · 1 · 1
      [[1.5, 1.5], [1.5, 1.5], [1.5, 1.5]]
    """
    w = compute_weight(weight, jnp.float32)
    a_value, b_value = compute_weight(a, jnp.float32), compute_weight(b, jnp.float32)
    letters = "abcdefghijklmnopqrstuvwxy"
    ins = letters[: a_value.ndim - 1]  # the leading axes, then W's input axes
    outs = letters[a_value.ndim - 1 : w.ndim]
    lead = ins[: b_value.ndim - 1 - len(outs)]
    names = own_names(weight, w.ndim) or (None,) * w.ndim
    delta = einsum(f"{ins}z,{lead}z{outs}->{ins}{outs}", a_value, b_value, names=names)
    return w + scale * delta


def dora_ratio(
    weight: nnx.Param,
    a: nnx.Param,
    b: nnx.Param,
    magnitude: nnx.Param,
    scale: float,
    *,
    inputs: int,
) -> Array:
    """DoRA's per-output-feature factor `m / sg(‖W + s·A·B‖)` (Liu et al., "DoRA:
    Weight-Decomposed Low-Rank Adaptation", arXiv 2402.09353, eq. 5), float32, shaped like `m`.

    The norm is over `W`'s `inputs` input axes (PEFT's row norm of its `[out, in]` weight) and,
    as in the paper's §4.3 and PEFT, a constant for the gradient (`stop_gradient`): only `m`,
    `A` and `B` receive gradients, through `m` and the `(x·A)·B` term. Leading (layer) axes of
    stacked parameters are batch axes. A zero column of `W + s·A·B` gives the factor 0 (its
    output is 0 whatever the factor) instead of `m / 0`.

    Args:
      weight: `W [*lead, *I, *O]`; `a`: `A [*lead, *I, r]`; `b`: `B [*lead, r, *O]`.
      magnitude: `m [*lead, *O]`.
      scale: the LoRA scale `s`.
      inputs: the number of input axes `I`.

    Examples:
      >>> w = make_param(jax.random.key(0), (3, 2), ("embed", "mlp"), jnp.float32, "ones")
      >>> a = make_param(jax.random.key(1), (3, 1), ("embed", None), jnp.float32, "zeros")
      >>> b = make_param(jax.random.key(2), (1, 2), (None, "mlp"), jnp.float32, "zeros")
      >>> m = make_param(jax.random.key(3), (2,), ("mlp",), jnp.float32, "ones")
      >>> dora_ratio(w, a, b, m, 2.0, inputs=1).round(4).tolist()  # 1 / ‖(1, 1, 1)‖
      [0.5774, 0.5774]
    """
    adapted = adapted_weight(weight, a, b, scale)
    return dora_ratio_of(adapted, magnitude, lead=a[...].ndim - inputs - 1, inputs=inputs)


def dora_ratio_of(adapted: Array, magnitude: nnx.Param, *, lead: int, inputs: int) -> Array:
    """`dora_ratio` from an already computed `W + s·A·B [*lead, *I, *O]` (float32), for
    callers that also need the adapted weight (`models.merge_lora`)."""
    norm = jax.lax.stop_gradient(
        jnp.sqrt(jnp.sum(jnp.square(adapted), axis=tuple(range(lead, lead + inputs))))
    )
    m = compute_weight(magnitude, jnp.float32)
    return jnp.where(norm > 0, m / jnp.where(norm > 0, norm, 1.0), 0.0)


class Attention(nnx.Module):
    """Multi-head attention with GQA, optional biases, optional QK-norm and rotary.

    `__call__(x[N,S,D], sin, cos, mask[N,S,T], kv=None)` projects, normalises (QK-norm), rotates,
    and attends. `kv` is an optional `(write, read)` pair: `write(k, v)` stores the new keys and
    values `[N, S, K, Hd]` into a cache and returns the `[N, T, K, Hd]` keys and values to attend
    to (see `cache.py`); without it the keys are this call's own. `attention` replaces `attend`
    (same signature; it receives what `kv` returns): the sampler's one-query decode attention.
    """

    def __init__(self, config: ModelConfig, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs):
        D, H, K, Hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        emb = ("embed",)

        def param(shape, names, init="normal"):
            return make_param(rngs.params(), shape, names, param_dtype, init)

        self.q = param((D, H, Hd), (*emb, "heads", "head_dim"))
        self.k = param((D, K, Hd), (*emb, "kv_heads", "head_dim"))
        self.v = param((D, K, Hd), (*emb, "kv_heads", "head_dim"))
        self.o = param((H, Hd, D), ("heads", "head_dim", *emb))
        if config.qkv_bias:
            self.q_bias = param((H, Hd), ("heads", "head_dim"), "zeros")
            self.k_bias = param((K, Hd), ("kv_heads", "head_dim"), "zeros")
            self.v_bias = param((K, Hd), ("kv_heads", "head_dim"), "zeros")
        if config.o_bias:
            self.o_bias = param((D,), emb, "zeros")
        if config.qk_norm:
            norm = {"eps": config.rms_norm_eps, "plus_one": config.norm_plus_one}
            self.q_norm = RMSNorm(
                Hd, names=("head_dim",), param_dtype=param_dtype, rngs=rngs, **norm
            )
            self.k_norm = RMSNorm(
                Hd, names=("head_dim",), param_dtype=param_dtype, rngs=rngs, **norm
            )
        self.config = config
        self.dtype = dtype

    def _project(self, x: Array, name: str) -> Array:
        heads = "heads" if name == "q" else "kv_heads"
        out = project(self, name, x, contract=1, names=("batch", "length", heads, "head_dim"))
        if self.config.qkv_bias:
            out = out + compute_weight(getattr(self, f"{name}_bias"), self.dtype)
        return out

    def __call__(
        self, x: Array, sin: Array, cos: Array, mask: Array, kv: Any = None, attention: Any = None
    ) -> tuple[Array, Any]:
        cfg = self.config
        q, k, v = self._project(x, "q"), self._project(x, "k"), self._project(x, "v")
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, sin, cos), apply_rope(k, sin, cos)
        written = None
        if kv is not None:
            k, v, written = kv(k, v)
        attention = attend if attention is None else attention
        out = attention(q, k, v, mask, scale=cfg.attention_scale, softcap=cfg.attn_logit_softcap)
        out = project(self, "o", out, contract=2, names=("batch", "length", "embed"))
        if cfg.o_bias:
            out = out + compute_weight(self.o_bias, self.dtype)
        return out, written


_ACT = {
    "silu": jax.nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}


class MLP(nnx.Module):
    """Gated MLP: `down(act(x @ gate) * (x @ up))` (SwiGLU with silu, GeGLU with gelu)."""

    def __init__(self, config: ModelConfig, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs):
        D, F = config.hidden_size, config.intermediate_size
        self.gate = make_param(rngs.params(), (D, F), ("embed", "mlp"), param_dtype, "normal")
        self.up = make_param(rngs.params(), (D, F), ("embed", "mlp"), param_dtype, "normal")
        self.down = make_param(rngs.params(), (F, D), ("mlp", "embed"), param_dtype, "normal")
        self.activation = config.activation
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        """`x[N, S, D]` → `[N, S, D]`; the hidden `[N, S, F]` is split over `tensor`."""
        hidden = ("batch", "length", "mlp")
        gate = project(self, "gate", x, contract=1, names=hidden)
        up = project(self, "up", x, contract=1, names=hidden)
        return project(
            self, "down", _ACT[self.activation](gate) * up, 1, ("batch", "length", "embed")
        )


class Block(nnx.Module):
    """One decoder layer: pre-norm attention and MLP with residual adds.

    Llama/Qwen/Gemma: `h = x + attn(attn_norm(x))`, `y = h + mlp(mlp_norm(h))`. With
    `sandwich_norm` (Gemma 2/3) each sub-layer's output is normalised again
    (`attn_post_norm`, `mlp_post_norm`) before the residual add.
    """

    def __init__(self, config: ModelConfig, *, dtype: Any, param_dtype: Any, rngs: nnx.Rngs):
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        norm = {
            "eps": config.rms_norm_eps,
            "plus_one": config.norm_plus_one,
            "param_dtype": param_dtype,
            "rngs": rngs,
        }
        D = config.hidden_size
        self.attn_norm = RMSNorm(D, **norm)
        self.attn = Attention(config, **kw)
        self.mlp_norm = RMSNorm(D, **norm)
        self.mlp = MLP(config, **kw)
        if config.sandwich_norm:
            self.attn_post_norm = RMSNorm(D, **norm)
            self.mlp_post_norm = RMSNorm(D, **norm)
        self.sandwich = config.sandwich_norm

    def __call__(
        self, x: Array, sin: Array, cos: Array, mask: Array, kv: Any = None, attention: Any = None
    ) -> tuple[Array, Any]:
        h, written = self.attn(self.attn_norm(x), sin, cos, mask, kv, attention)
        if self.sandwich:
            h = self.attn_post_norm(h)
        x = x + h
        h = self.mlp(self.mlp_norm(x))
        if self.sandwich:
            h = self.mlp_post_norm(h)
        return x + h, written
