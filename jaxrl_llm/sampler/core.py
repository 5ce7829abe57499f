"""The pure, jittable sampler: one prefill over the prompts, then a `lax.while_loop` decode.

`sample_tokens(graphdef, state, prompt_tokens, prompt_mask, key, config=...)` is a pure function
of traced arrays (model weights included) and a static `SamplingConfig`, so it compiles once
per (model architecture, config, prompt shape) and runs unchanged inside another `jax.jit` or
`lax.scan` (a fully compiled RL iteration). Updating the weights never recompiles it.

Program:

1. Prefill: the `B` left-padded prompts `[B, P]` run once through `Decoder.decode_hidden`
   into a `P`-slot cache; only the last column is projected to logits (`[B, V]`).
2. Group broadcast: the prompt cache (`B` rows of `P` slots) is repeated to the `N = B·G` rows,
   padded to `P + T'` slots and put in the decode layout (`decode.DecodeCache`: per-layer
   buffers, keys `[N, K, Hd, T]`, values `[N, K, T, Hd]`) in one fused copy (`T'` = `T`
   rounded up to `steps_per_loop`). Before the loop, the layer weights are sliced out of the
   stacked parameters once (`decode.decode_layers`) and the rotary sines and cosines of every
   decode step are computed (`decode.decode_rope`).
3. Decode: a `while_loop` that stops when every row is done (stop token, stop string
   (`stop_strings.stop_string_hits` on the last tokens), or its own budget) or
   after `T'` steps (with `decode_phases > 1`, one `while_loop` per phase, the cache grown by
   empty slots between phases, `phase_ends`, so that attention reads only the slots that the
   phase can have filled). Each iteration runs `steps_per_loop` steps (a `lax.scan`, unrolled
   unless `unroll_loop_steps` is False);
   a step draws one token per row (`filters.draw_tokens`, by inverse-CDF sampling with the
   uniform `row_uniforms(row_keys)[n, t]`, drawn with `fold_in(row_key[n], t)` before the
   loop), records it, and feeds it through `decode.decode_step` (the decoder's layers on one
   token per row, attention as multiply-reduces over the cache). All rows
   advance in lockstep (the cache has one shared length, so each write is one
   `dynamic_update_slice` per layer buffer, in place); finished rows write `pad_id` with
   attention mask 0, which is never read back.

Sharding: called under `jax.set_mesh(mesh)` (Explicit or Auto axes), every per-row array
(prompts, keys' uniforms, the cache, the decode state, the rollout) is laid out with its rows
over the batch axes (`data`, `fsdp`); the model runs tensor-parallel inside (see `Decoder`). The
next-token logits come out of the LM head split over `tensor` on the vocabulary and are
gathered per step (`[N, V]` rows stay local) so that the draw (argmax, top-k, sort, cumsum)
runs on whole rows. Without a mesh nothing changes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, PartitionSpec

from jaxrl_llm.models._sharded_ops import compute_layout, reshape
from jaxrl_llm.models.cache import KVCache, positions_from_mask, shard_cache
from jaxrl_llm.models.lora import fold_dora_magnitudes, has_lora, merge_lora
from jaxrl_llm.sampler.config import SamplingConfig
from jaxrl_llm.sampler.decode import (
    DecodeCache,
    decode_cache,
    decode_layers,
    decode_rope,
    decode_step,
    grow_decode_cache,
)
from jaxrl_llm.sampler.filters import draw_tokens, row_uniforms
from jaxrl_llm.sampler.rollout import Rollout
from jaxrl_llm.sampler.stop_strings import stop_string_hits
from sharding import ACTIVATION_AXIS_RULES, logical_to_spec, shard

Array = jax.Array


class _DecodeState(NamedTuple):
    step: Array  # [] int32, the completion index written next
    logits: Array  # [N, V] float32, next-token logits
    cache: DecodeCache  # per layer k [N, K, Hd, S], v [N, K, S, Hd] (S <= P + T'); length []
    done: Array  # [N] bool
    lengths: Array  # [N] int32, completion tokens written per row
    tokens: Array  # [N, T'] int32
    logprobs: Array  # [N, T'] float32
    sampling_logprobs: Array  # [N, T'] float32
    recent: Array | None  # [N, W] int32, the last W tokens (stop strings only)
    string_stop: Array | None  # [N] bool, the row completed a stop string (stop strings only)


def _row_keys(key: Any, n: int) -> Array:
    """`[N]` typed keys: one key split into N, or N keys (typed, or raw uint32 `[N, 2]`)."""
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.dtype != jnp.uint32:
            raise ValueError(
                f"sample_tokens: `key` must be a PRNG key (jax.random.key) or raw uint32 key "
                f"data, got dtype {key.dtype}."
            )
        key = jax.random.wrap_key_data(key)
    if key.shape == ():
        return jax.random.split(key, n)
    if key.shape == (n,):
        return key
    raise ValueError(
        f"sample_tokens: `key` must be one key or {n} per-row keys (N = prompts × num_samples), "
        f"got key shape {key.shape}."
    )


def _row_budgets(max_new_tokens: Any, n: int, budget: int) -> Array:
    if max_new_tokens is None:
        return jnp.full((n,), budget, jnp.int32)
    per_row = jnp.asarray(max_new_tokens)
    if per_row.shape != (n,) or not jnp.issubdtype(per_row.dtype, jnp.integer):
        raise ValueError(
            f"sample_tokens: `max_new_tokens` must be None or an integer array [{n}] (one budget "
            f"per row), got {per_row.dtype}{per_row.shape}."
        )
    return jnp.clip(per_row.astype(jnp.int32), 0, budget)


_ROW = ("batch",)
_ROW_TIME = ("batch", None)  # [N, T] / [N, V] arrays: rows split, the second axis whole


def _whole_rows(logits: Array) -> Array:
    """Gather `[N, V]` logits split over `tensor` on V into whole rows (rows stay split)."""
    return shard(logits, _ROW_TIME)


def _row_local(fn: Any, *rows: Array) -> Any:
    """`fn(*rows)` run on each device's own rows: `jax.shard_map` over the batch mesh axes.

    Every array is `[N, ...]`, rows split over the batch axes and whole otherwise. XLA's
    partitioner does not split the batch axis of some row-wise ops (the TopK of top-k): it
    gathers all rows to every device instead. Mapping by hand keeps the draw local (the
    per-shard top-k of STYLE.md §3.13). Without a mesh, or with rows that are not split:
    `fn(*rows)`.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return fn(*rows)
    entry = logical_to_spec(_ROW, ACTIVATION_AXIS_RULES, mesh, shape=rows[0].shape[:1])[0]
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    manual = {
        a for a, t in zip(mesh.axis_names, mesh.axis_types, strict=True) if t == AxisType.Manual
    }
    axes = tuple(a for a in axes if a not in manual)
    if not axes:
        return fn(*rows)
    spec = PartitionSpec(axes)
    return jax.shard_map(fn, in_specs=(spec,) * len(rows), out_specs=spec, axis_names=set(axes))(
        *rows
    )


def repeat_rows(x: Array, repeats: int, axis: int, names: tuple[str | None, ...]) -> Array:
    """`jnp.repeat(x, repeats, axis)` laid out by `names`: row `b` becomes rows `b·G .. b·G+G-1`.

    Written as broadcast + reshape (what `jnp.repeat` does for a static count), so that under
    a mesh the merge of the (batch-split) row axis with the new group axis keeps the rows on
    the devices that hold their prompt: no communication.
    """
    shape = list(x.shape)
    grouped = jnp.broadcast_to(
        jnp.expand_dims(x, axis + 1), (*shape[: axis + 1], repeats, *shape[axis + 1 :])
    )
    shape[axis] *= repeats
    return reshape(grouped, shape, names)


def _check_prompts(prompt_tokens: Any, prompt_mask: Any) -> tuple[Array, Array]:
    tokens, mask = jnp.asarray(prompt_tokens), jnp.asarray(prompt_mask)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(
            f"sample_tokens: `prompt_tokens` must be an integer array [B, P], got "
            f"{tokens.dtype}{tokens.shape}."
        )
    if mask.shape != tokens.shape:
        raise ValueError(
            f"sample_tokens: `prompt_mask` must have the prompts' shape {tokens.shape}, "
            f"got {mask.shape}."
        )
    check_left_padded(prompt_mask)
    return tokens.astype(jnp.int32), mask.astype(bool)


def check_left_padded(prompt_mask: Any) -> None:
    """Raise unless every row of a concrete `prompt_mask [B, P]` reads `0 … 0 1 … 1` with at
    least one 1 (a left-padded, non-empty prompt). A traced mask is not checked (under `jit` the
    caller's layout stands: `jit_sample_tokens` checks before it traces), nor a global one
    that other processes hold parts of."""
    if isinstance(prompt_mask, jax.core.Tracer) or (
        isinstance(prompt_mask, jax.Array) and not prompt_mask.is_fully_addressable
    ):  # another process holds part of a global mask: each checks its own rows before
        return
    rows = np.asarray(prompt_mask).astype(np.int8)
    if rows.ndim != 2:
        return  # `_check_prompts` names the shape
    left_padded = (rows[:, -1] == 1) & (np.diff(rows, axis=1) >= 0).all(axis=1)
    if rows.size and not left_padded.all():
        bad = int(np.flatnonzero(~left_padded)[0])
        raise ValueError(
            f"sample_tokens: prompt {bad} is not left-padded: its mask must read 0 … 0 1 … 1 "
            f"and end in column P − 1, got {rows[bad].tolist()} (`left_pad` builds such "
            "rows; `generate` pads for you)."
        )


def broadcast_cache(cache: KVCache, num_samples: int, max_len: int) -> KVCache:
    """Repeat each row of a prefilled cache `num_samples` times and pad it to `max_len` slots.

    Rows come out prompt-major (`b·G + g`); new slots are empty (`positions = -1`). XLA fuses the
    repeat and the pad into one write of each buffer.

    Examples:
      >>> from jaxrl_llm.models import ModelConfig
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> cache = KVCache.init(cfg, batch=2, max_len=3, shared_length=True)
      >>> out = broadcast_cache(cache, 4, 7)
      >>> out.k.shape, out.positions.shape, out.lengths.shape
      ((2, 8, 1, 7, 4), (8, 7), ())
    """
    extra = max_len - cache.max_len
    if extra < 0:
        raise ValueError(f"broadcast_cache: max_len={max_len} < the cache's {cache.max_len} slots.")

    def grow(x: Array, names: tuple[str, ...], fill: Any) -> Array:
        x = repeat_rows(x, num_samples, names.index("batch"), names)
        pad = [(0, 0)] * x.ndim
        pad[names.index("cache_seq")] = (0, extra)
        return jnp.pad(x, pad, constant_values=fill)

    axes = cache.logical_axes()
    lengths = cache.lengths
    if lengths.ndim:
        lengths = repeat_rows(lengths, num_samples, 0, axes.lengths)
    return KVCache(
        k=grow(cache.k, axes.k, 0),
        v=grow(cache.v, axes.v, 0),
        positions=grow(cache.positions, axes.positions, -1),
        lengths=lengths,
    )


def phase_ends(steps: int, steps_per_loop: int, phases: int) -> tuple[int, ...]:
    """The last step (exclusive) of each decode phase: `phases` near-equal multiples of U.

    Phase `j` runs the steps before `ends[j]` with a cache of `P + ends[j]` slots, so its
    attention reads no more slots than it can need. Fewer phases come out when there are
    fewer loop iterations than phases.

    Examples:
      >>> phase_ends(128, 4, 4), phase_ends(8, 4, 3), phase_ends(12, 4, 1)
      ((32, 64, 96, 128), (4, 8), (12,))
    """
    iterations = steps // steps_per_loop
    ends = {steps_per_loop * max(1, round(iterations * (j + 1) / phases)) for j in range(phases)}
    return tuple(sorted(ends))


def _is_stop(tokens: Array, stop_tokens: tuple[int, ...]) -> Array:
    if not stop_tokens:
        return jnp.zeros(tokens.shape, bool)
    return jnp.any(tokens[..., None] == jnp.asarray(stop_tokens, jnp.int32), axis=-1)


def sample_tokens(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_tokens: Array,
    prompt_mask: Array,
    key: Array,
    *,
    config: SamplingConfig,
    max_new_tokens: Array | None = None,
) -> Rollout:
    """Sample `G = config.num_samples` completions for each of `B` left-padded prompts.

    Pure and jittable: `graphdef` and `config` are static, everything else is traced (weights
    included). Row `n = b·G + g` draws completion token `t` with the uniform of
    `fold_in(row_key[n], t)`, so its tokens depend only on its key, its prompt and the
    weights: a group run equals `G` single-prompt runs with the same row keys.

    Args:
      graphdef: the `nnx.split` graph of a `Decoder`.
      state: the matching `nnx.State` (traced: new weights do not recompile).
      prompt_tokens: `[B, P]` int, left-padded (every prompt ends in column `P - 1`).
      prompt_mask: `[B, P]` bool/int, 1 on real prompt tokens; every row needs at least one.
        Outside `jit` a mask that is not left-padded (0 … 0 1 … 1) is refused.
      key: one PRNG key (split into `N = B·G` row keys) or `[N]` per-row keys.
      config: the static `SamplingConfig` (budget `T`, filters, `G`, stop tokens, loop shape).
      max_new_tokens: optional `[N]` int per-row budgets, clipped to `[0, T]`.

    Returns:
      A `Rollout` with `tokens [N, P + T]`, `completion_* [N, T]`, float32 log-probs,
      `lengths [N]` and `truncated [N]`.

    Examples:
      >>> from jaxrl_llm.models import Decoder, ModelConfig
      >>> cfg = ModelConfig(family="qwen3", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> graphdef, state = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)))
      >>> config = SamplingConfig(max_new_tokens=5, num_samples=3, stop_tokens=(2,))
      >>> prompts, mask = jnp.array([[0, 4, 5], [6, 7, 8]]), jnp.array([[0, 1, 1], [1, 1, 1]])
      >>> rollout = jax.jit(sample_tokens, static_argnames=("graphdef", "config"))(
      ...     graphdef, state, prompts, mask, jax.random.key(0), config=config)
      >>> rollout.tokens.shape, rollout.completion_mask.shape, rollout.truncated.shape
      ((6, 8), (6, 5), (6,))
    """
    tokens_in, mask = _check_prompts(prompt_tokens, prompt_mask)
    table = config.stop_table
    if config.stop_strings and table is None:
        raise ValueError(
            "sample_tokens: `stop_strings` need their matcher, built from the tokenizer: pass "
            "`with_stop_strings(config, tokenizer)` (sample_texts and the runner do)."
        )
    tokens_in, mask = shard(tokens_in, _ROW_TIME), shard(mask, _ROW_TIME)
    if config.gather_weights:
        state = compute_layout(state)  # gather FSDP shards once, not in every decode step
    model = nnx.merge(graphdef, state)
    if config.merge_lora and config.gather_weights and has_lora(model):
        model = merge_lora(model)  # adapters folded once per call: decoding runs the plain model
    else:
        model = fold_dora_magnitudes(model)  # at least DoRA's norms once per call
    B, P = tokens_in.shape
    G, T, U = config.num_samples, config.max_new_tokens, config.steps_per_loop
    N, T_loop = B * G, -(-T // U) * U
    row_keys = shard(_row_keys(key, N), _ROW)  # each device draws its own rows' uniforms
    uniforms = None if config.greedy else row_uniforms(row_keys, T_loop)  # [N, T'] in (0, 1]
    budgets = shard(_row_budgets(max_new_tokens, N, T), _ROW)

    cache = shard_cache(model.init_cache(batch=B, max_len=P, shared_length=True))
    hidden, cache = model.decode_hidden(
        tokens_in,
        positions_from_mask(mask),
        cache,
        attention_mask=mask,
        layer_unroll=config.layer_unroll,
    )
    first_logits = _whole_rows(model.logits(hidden[:, -1]))  # [B, V] float32
    prompt_lengths = repeat_rows(jnp.sum(mask, axis=1, dtype=jnp.int32), G, 0, _ROW)  # [N]
    layers = decode_layers(model, config.layer_unroll)  # per-layer weights sliced once
    steps = prompt_lengths[:, None] + jnp.arange(T_loop, dtype=jnp.int32)[None]  # [N, T']
    rope_table = decode_rope(model, steps)  # (sin, cos) [N, T', Hd/2] of every decode step

    def one_step(s: _DecodeState, _: None) -> tuple[_DecodeState, None]:
        def draw_rows(logits: Array, *u: Array) -> Any:
            return draw_tokens(
                logits,
                u[0] if u else None,
                temperature=config.temperature,
                top_k=config.top_k,
                top_p=config.top_p,
                min_p=config.min_p,
            )

        if uniforms is None:
            draw = _row_local(draw_rows, s.logits)
        else:
            u = jax.lax.dynamic_index_in_dim(uniforms, s.step, 1, False)
            draw = _row_local(draw_rows, s.logits, u)
        active = ~s.done
        token = jnp.where(active, draw.tokens, config.pad_id)
        lengths = s.lengths + active.astype(jnp.int32)
        done = s.done | (active & _is_stop(token, config.stop_tokens)) | (lengths >= budgets)
        recent, string_stop = s.recent, s.string_stop
        if table is not None:
            recent = jnp.concatenate([s.recent[:, 1:], token[:, None]], axis=1)
            string_stop = s.string_stop | (active & stop_string_hits(table, recent, lengths))
            done = done | string_stop
        rope = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, s.step, 1, 1), rope_table)
        hidden, cache = decode_step(
            model, layers, token, prompt_lengths + s.step, active, s.cache, rope
        )

        def record(buffer: Array, values: Array) -> Array:
            return jax.lax.dynamic_update_slice(buffer, values[:, None], (0, s.step))

        return _DecodeState(
            step=s.step + 1,
            logits=_whole_rows(model.logits(hidden)),
            cache=cache,
            done=done,
            lengths=lengths,
            tokens=record(s.tokens, token),
            logprobs=record(s.logprobs, jnp.where(active, draw.logprobs, 0.0)),
            sampling_logprobs=record(
                s.sampling_logprobs, jnp.where(active, draw.sampling_logprobs, 0.0)
            ),
            recent=recent,
            string_stop=string_stop,
        ), None

    def body(s: _DecodeState) -> _DecodeState:
        return jax.lax.scan(
            one_step, s, None, length=U, unroll=U if config.unroll_loop_steps else 1
        )[0]

    ends = phase_ends(T_loop, U, config.resolved_decode_phases)  # the cache grows at each end
    start = _DecodeState(
        step=jnp.zeros((), jnp.int32),
        logits=repeat_rows(first_logits, G, 0, _ROW_TIME),
        cache=decode_cache(broadcast_cache(cache, G, P + ends[0]), layers.per_layer is None),
        done=budgets <= 0,
        lengths=shard(jnp.zeros((N,), jnp.int32), _ROW),
        tokens=shard(jnp.full((N, T_loop), config.pad_id, jnp.int32), _ROW_TIME),
        logprobs=shard(jnp.zeros((N, T_loop), jnp.float32), _ROW_TIME),
        sampling_logprobs=shard(jnp.zeros((N, T_loop), jnp.float32), _ROW_TIME),
        recent=None if table is None else shard(jnp.zeros((N, table.window), jnp.int32), _ROW_TIME),
        string_stop=None if table is None else shard(jnp.zeros((N,), bool), _ROW),
    )
    final = start  # one while_loop per phase; the cache grows between them
    for j, end in enumerate(ends):
        if j:
            final = final._replace(cache=grow_decode_cache(final.cache, P + end))
        final = jax.lax.while_loop(
            lambda s, end=end: (s.step < end) & ~jnp.all(s.done), body, final
        )

    completion = final.tokens[:, :T]
    completion_mask = jnp.arange(T)[None, :] < final.lengths[:, None]
    last = jnp.take_along_axis(completion, jnp.maximum(final.lengths - 1, 0)[:, None], axis=1)
    stopped = (final.lengths > 0) & _is_stop(last[:, 0], config.stop_tokens)
    if table is not None:
        stopped = stopped | final.string_stop
    return Rollout(
        tokens=jnp.concatenate([repeat_rows(tokens_in, G, 0, _ROW_TIME), completion], axis=1),
        prompt_mask=repeat_rows(mask, G, 0, _ROW_TIME),
        completion_tokens=completion,
        completion_mask=completion_mask,
        logprobs=final.logprobs[:, :T],
        sampling_logprobs=final.sampling_logprobs[:, :T],
        lengths=final.lengths,
        truncated=~stopped,
    )
