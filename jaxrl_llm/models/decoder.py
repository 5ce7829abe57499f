"""`Decoder`: the Flax NNX decoder-only LM shared by every supported family.

The layers are stacked (`nnx.vmap` at construction; every layer parameter has a leading
`layers` axis) and run with one `jax.lax.scan`, so compile time does not grow with depth.
Per-layer differences (Gemma 2/3 sliding-window layers, Gemma 3's second rope) are scanned
inputs, not Python branches.

Entry points (N rows, S tokens; `positions[N, S]` are rotary positions, `0..` per sequence):

- `model(tokens, positions, attention_mask=..., segment_ids=...)` → float32 logits `[N, S, V]`.
- `model.hidden_states(...)` → final-normed hidden states `[N, S, D]` and `model.logits(h)`:
  a caller can project and reduce chunk by chunk without materialising `[N, S, V]`.
- `model.decode(tokens, positions, cache, attention_mask=...)` → `(logits, cache)`: prefill and
  token-by-token decoding with a `KVCache`.

Masking: `attention_mask[N, S]` (1 = real token) or `segment_ids[N, S]` (packed sequences; 0 =
padding). Keys of padding get attention weight exactly 0; padding queries produce finite values
that callers mask out. Padding slots must still hold token ids of the vocabulary (`pad_id`):
an id outside it embeds as NaN, which a 0 weight does not remove (0·NaN is NaN). Dtype policy: parameters live in `param_dtype`, activations in `dtype`, logits are
float32. `remat` ("none", "full", "dots") rematerialises each layer in the backward pass; the
default "dots" keeps the layer's matmul outputs and recomputes its elementwise work, which is
also the fastest choice on XLA:CPU (see `Decoder`).

Sharding: the model names logical axes only. Called under `jax.set_mesh(mesh)` (Explicit or
Auto axes), the inputs and activations are laid out with their rows over the batch axes
(`data`, `fsdp`), weights are gathered from their FSDP shards for compute and stay split over
`tensor` on heads / MLP / vocabulary, and logits come out `[N, S, V]` with `V` over `tensor`
(see docs/scaling.md, "How activations are sharded"). Without a mesh nothing changes.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models import cache as kv_cache
from jaxrl_llm.models._sharded_ops import (
    compute_weight,
    einsum,
    plain_layout,
    take_rows,
    unsharded,
)
from jaxrl_llm.models.config import ModelConfig
from jaxrl_llm.models.layers import (
    Block,
    RMSNorm,
    attend,
    chunked_attend,
    fused_attend,
    fused_attention_fits,
    make_param,
    rope_angles,
    rope_inv_freq,
)
from sharding import shard

Array = jax.Array
Remat = Literal["none", "full", "dots"]
_REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _stacked_blocks(config: ModelConfig, dtype: Any, param_dtype: Any, rngs: nnx.Rngs) -> Block:
    @nnx.split_rngs(splits=config.num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make(rngs: nnx.Rngs) -> Block:
        return Block(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    return make(rngs)


_ROWS = ("batch", "length")


def _rows(x: Array | None) -> Array | None:
    """Lay a per-token input `[N, S]` out by rows over the batch mesh axes (if any)."""
    return None if x is None else shard(x, _ROWS)


def _layer_inputs(angles: Any, masks: Any, is_sliding: Array, mixed: bool) -> tuple[Any, Array]:
    """One layer's `(sin, cos)` and mask from `Decoder._per_layer_inputs`' outputs."""
    if not mixed:
        return angles, masks

    def pick(full: Array, local: Array) -> Array:
        return jnp.where(is_sliding, local, full)

    return jax.tree.map(pick, *angles), jax.tree.map(pick, *masks)


class _TokenBlocks(NamedTuple):
    """The token layout of `Decoder.shared_prompt_hidden_states`: the prompt tokens
    `[B, P, ...]` and the completion tokens `[N, T, ...]` as one batch of `[R, TOKEN_BLOCK,
    ...]` blocks (each part padded with zeros to whole blocks), so that the norms,
    projections and MLP of a layer run once over both parts (one kernel each: the compile
    time of `hidden_states`). Padding rows are computed and never read. XLA:CPU runs the
    norms' reductions 3-4× slower on a `[R, 1, D]` layout, hence blocks of several tokens.
    """

    prompt_rows: int  # B
    prompt_length: int  # P
    rows: int  # N
    length: int  # T

    def _blocks(self, x: Array) -> Array:
        flat = x.reshape(-1, *x.shape[2:])
        pad = -flat.shape[0] % TOKEN_BLOCK
        flat = jnp.pad(flat, [(0, pad)] + [(0, 0)] * (flat.ndim - 1))
        return flat.reshape(-1, TOKEN_BLOCK, *flat.shape[1:])

    def join(self, prompt: Any, completion: Any) -> Any:
        """`[B, P, ...]` and `[N, T, ...]` leaves → `[R, TOKEN_BLOCK, ...]`."""

        def one(a: Array, b: Array) -> Array:
            a, b = unsharded(a, b)
            return jnp.concatenate([self._blocks(a), self._blocks(b)], axis=0)

        return jax.tree.map(one, prompt, completion)

    def split(self, x: Array) -> tuple[Array, Array]:
        """`[R, TOKEN_BLOCK, ...]` → the prompt part `[B, P, ...]` and completions `[N, T, ...]`."""
        (x,) = unsharded(x)
        flat = x.reshape(-1, *x.shape[2:])
        prompt_tokens = self.prompt_rows * self.prompt_length
        start = prompt_tokens + (-prompt_tokens % TOKEN_BLOCK)
        prompt = flat[:prompt_tokens].reshape(self.prompt_rows, self.prompt_length, *x.shape[2:])
        completion = flat[start : start + self.rows * self.length]
        return prompt, completion.reshape(self.rows, self.length, *x.shape[2:])


TOKEN_BLOCK = 8
"""Tokens per block of `_TokenBlocks` (4 to 64 ran equally fast on the benchmark models)."""


def _check_attention_chunk(chunk: Any) -> None:
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"Decoder: attention_chunk must be None or an int >= 1, got {chunk!r}.")


def check_fused_attention(config: ModelConfig) -> None:
    """Raise `ValueError` unless `config` suits `Decoder(fused_attention=True)`: plain causal
    attention, no sliding windows and no logit soft-capping.

    Examples:
      >>> cfg = ModelConfig(family="gemma2", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
      ...                   layer_types=("sliding_attention", "full_attention"), sliding_window=4,
      ...                   attn_logit_softcap=50.0)
      >>> check_fused_attention(cfg)
      Traceback (most recent call last):
      ...
      ValueError: Decoder: fused_attention runs plain causal attention; this gemma2 model has sliding-window layers and attention logit soft-capping (use the default attention).
    """
    problems = []
    if any(t == "sliding_attention" for t in config.layer_types):
        problems.append("sliding-window layers")
    if config.attn_logit_softcap is not None:
        problems.append("attention logit soft-capping")
    if problems:
        raise ValueError(
            f"Decoder: fused_attention runs plain causal attention; this {config.family} model "
            f"has {' and '.join(problems)} (use the default attention)."
        )


def _check_inputs(tokens: Array, positions: Array, mask: Array | None, mask_name: str) -> None:
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(
            f"tokens must be an integer array [N, S], got {tokens.dtype}{tokens.shape}."
        )
    if positions.shape != tokens.shape or not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(
            f"positions must be an integer array of the tokens' shape {tokens.shape}, "
            f"got {positions.dtype}{positions.shape}."
        )
    if mask is not None and mask.shape != tokens.shape:
        raise ValueError(
            f"{mask_name} must have the tokens' shape {tokens.shape}, got {mask.shape}."
        )


class Decoder(nnx.Module):
    """Decoder-only transformer LM (Llama / Qwen2 / Qwen3 / Gemma / Gemma 2 / Gemma 3 text).

    Args:
      config: the architecture.
      dtype: compute dtype of activations (e.g. `jnp.bfloat16`).
      param_dtype: storage dtype of parameters (e.g. `jnp.float32` for training).
      remat: per-layer rematerialisation in the backward pass: "dots" (default: save the matmul
        outputs without batch dims, recompute the norms, activations, rotary and attention
        probabilities), "full" (save only the layer input) or "none" (save every residual).
        The layer scan stacks what it saves into `[L, ...]` buffers, which XLA:CPU
        zero-fills and writes slice by slice; saving less is faster there despite the
        recomputation: the small benchmark model's GRPO update step takes ≈ 20–25 % less time
        with "dots" than with "none", and "full" sits in between (docs/performance.md).
      lm_head: False drops the output projection of an untied model (a critic backbone).
      attention_chunk: None (default) attends all queries at once; an int `C` attends them in
        blocks of `C` queries (`layers.chunked_attend`) in every forward of more than `C`
        tokens (the training forwards, a long prompt's prefill), so the float32 attention
        logits and probabilities take `[N, H, C, T]` at a time instead of `[N, H, S, T]` in
        the forward and the backward pass (which recomputes them block by block): memory
        linear in the sequence length instead of quadratic, for ≈ one more attention forward
        in the backward pass (docs/models.md).
      fused_attention: False (default) computes attention as the einsums of `layers.attend`;
        True runs the forwards without a cache over padded rows (`hidden_states` with an
        `attention_mask`) through `jax.nn.dot_product_attention` (`layers.fused_attend`):
        cuDNN's flash-attention kernel on NVIDIA GPUs for bfloat16 / float16 compute, which
        keeps the logits on chip (memory linear in the length, no `attention_chunk` needed),
        XLA's composition of the same math elsewhere. Each row's real tokens are moved to
        the front (a stable per-row permutation, undone at the end), so the kernel's causal
        mask with per-row lengths is the model's mask; the real positions' hidden states
        are the default attention's up to float rounding (tested on the CPU; padding
        positions differ, and are never read), also under sharded meshes whose `tensor` axis
        splits the KV heads (`layers.fused_attention_fits`). Packed rows (`segment_ids`), the
        shared-prompt forward, decoding and meshes that replicate the KV heads keep the
        default attention.
        Models with sliding windows or logit soft-capping (Gemma 2 and 3) refuse it.
      rngs: initialisation keys.

    Examples:
      >>> cfg = ModelConfig(family="qwen3", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> model = Decoder(cfg, rngs=nnx.Rngs(0))
      >>> tokens = jnp.array([[1, 2, 3]])
      >>> model(tokens, jnp.arange(3)[None]).shape
      (1, 3, 11)
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: Any = jnp.float32,
        param_dtype: Any = jnp.float32,
        remat: Remat = "dots",
        lm_head: bool = True,
        attention_chunk: int | None = None,
        fused_attention: bool = False,
        rngs: nnx.Rngs,
    ):
        if remat not in ("none", "full", "dots"):
            raise ValueError(f"Decoder: remat must be 'none', 'full' or 'dots', got {remat!r}.")
        _check_attention_chunk(attention_chunk)
        if not isinstance(fused_attention, bool):
            raise ValueError(f"Decoder: fused_attention must be a bool, got {fused_attention!r}.")
        if fused_attention:
            check_fused_attention(config)
        V, D = config.vocab_size, config.hidden_size
        self.embed = make_param(rngs.params(), (V, D), ("vocab", "embed"), param_dtype, "normal")
        self.layers = _stacked_blocks(config, dtype, param_dtype, rngs)
        self.final_norm = RMSNorm(
            D,
            eps=config.rms_norm_eps,
            plus_one=config.norm_plus_one,
            param_dtype=param_dtype,
            rngs=rngs,
        )
        if lm_head and not config.tie_embeddings:
            self.lm_head = make_param(
                rngs.params(), (D, V), ("embed", "vocab"), param_dtype, "normal"
            )
        self.has_lm_head = lm_head
        self.config = config
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.remat = remat
        self.attention_chunk = attention_chunk
        self.fused_attention = fused_attention

    def _attention(self) -> Any:
        """The attention of the multi-token forwards: `attend`, or in blocks of queries."""
        if self.attention_chunk is None:
            return attend
        return functools.partial(chunked_attend, chunk=self.attention_chunk)

    # ----------------------------------------------------------------------------- public API

    def __call__(
        self,
        tokens: Array,
        positions: Array,
        *,
        attention_mask: Array | None = None,
        segment_ids: Array | None = None,
    ) -> Array:
        """Float32 logits `[N, S, V]` of `tokens[N, S]` (no cache)."""
        hidden = self.hidden_states(
            tokens, positions, attention_mask=attention_mask, segment_ids=segment_ids
        )
        return self.logits(hidden)

    def hidden_states(
        self,
        tokens: Array,
        positions: Array,
        *,
        attention_mask: Array | None = None,
        segment_ids: Array | None = None,
        segment_roles: Array | None = None,
    ) -> Array:
        """Final-normed hidden states `[N, S, D]` in the compute dtype (no cache).

        `segment_roles[N, S]` (with `segment_ids` only) makes each segment prefix-shared: a
        token reads the earlier tokens of its segment whose role is 0 or its own
        (`kv_cache.full_attention_mask`); a preference pair's prompt (0), chosen (1) and
        rejected (2) completion in one segment, each completion after the prompt.
        """
        if attention_mask is not None and segment_ids is not None:
            raise ValueError("pass attention_mask or segment_ids, not both.")
        if segment_roles is not None and segment_ids is None:
            raise ValueError("segment_roles needs segment_ids (the segments they divide).")
        _check_inputs(tokens, positions, segment_ids, "segment_ids")
        _check_inputs(tokens, positions, attention_mask, "attention_mask")
        _check_inputs(tokens, positions, segment_roles, "segment_roles")
        tokens, positions = _rows(tokens), _rows(positions)
        attention_mask, segment_ids = _rows(attention_mask), _rows(segment_ids)
        segment_roles = _rows(segment_roles)
        fused = self.fused_attention and segment_ids is None
        if fused and fused_attention_fits(self.config.num_kv_heads):
            return self._fused_hidden_states(tokens, positions, attention_mask)
        if segment_ids is None:
            segment_ids = (
                jnp.ones(tokens.shape, jnp.int32)
                if attention_mask is None
                else attention_mask.astype(jnp.int32)
            )

        def mask_fn(window: int | None) -> Array:
            return kv_cache.full_attention_mask(segment_ids, positions, window, segment_roles)

        x, _ = self._layers(self._embed(tokens), positions, mask_fn, None)
        return self.final_norm(x)

    def _fused_hidden_states(
        self, tokens: Array, positions: Array, attention_mask: Array | None
    ) -> Array:
        """`hidden_states` with `fused_attend` (`fused_attention`): each row's real tokens
        first, in order (a stable sort on the padding flag), so that causal attention over the
        first `lengths[n]` tokens is the model's mask; the permutation is undone at the end."""
        N, S = tokens.shape
        real = jnp.ones((N, S), bool) if attention_mask is None else attention_mask > 0
        order = jnp.argsort(~real, axis=1, stable=True)  # [N, S]: real tokens first
        lengths = jnp.sum(real, axis=1, dtype=jnp.int32)
        tokens = jnp.take_along_axis(tokens, order, axis=1)
        positions = jnp.take_along_axis(positions, order, axis=1)
        x, _ = self._layers(
            self._embed(tokens), positions, lambda window: lengths, None, attention=fused_attend
        )
        back = jnp.argsort(order, axis=1)  # the inverse permutation
        return self.final_norm(jnp.take_along_axis(x, back[:, :, None], axis=1))

    def shared_prompt_hidden_states(
        self,
        tokens: Array,
        positions: Array,
        *,
        attention_mask: Array | None = None,
        prompt_length: int,
        group_size: int,
    ) -> Array:
        """`hidden_states` of rows that share their prompt in groups, each prompt run once.

        Rows come in groups of `G = group_size` consecutive rows (row `b·G + g`, as the
        sampler lays out `G` samples per prompt) whose first `P = prompt_length` tokens and
        mask entries are the same. Causal attention makes a prompt position's hidden state a
        function of the prompt alone, so every layer runs the `B = N / G` prompts `[B, P]`
        once and the completions `[N, S − P]` against the prompt's keys and values repeated
        `G` times followed by their own (a prefix-shared KV cache inside the training
        forward):

            prompt layer:      x_p[B, P]  attends to k_p, v_p                     (causal)
            completion layer:  x_c[N, S−P] attends to [repeat(k_p, G) ; k_c]      (causal)

        The result is `hidden_states(tokens, positions, attention_mask=...)` with the prompt
        part repeated to `[N, S, D]`, up to float rounding (the matmuls see other row counts);
        gradients flow to the shared prompt from all `G` rows. The norms, projections and MLP
        run once per layer on the `B·P + N·(S − P)` tokens of both parts (instead of `N·S`),
        laid out as blocks of `TOKEN_BLOCK` tokens (`_TokenBlocks`); only attention splits
        them. Only where the model builds the plain program (`plain_layout()`: no mesh or a
        mesh of one device) and `G > 1`; otherwise this is `hidden_states`. The caller
        guarantees the shared prompts (they are not compared: that would cost a pass over
        the tokens).

        Args:
          tokens: `[N, S]` token ids, `N` a multiple of `group_size`.
          positions: `[N, S]` rotary positions.
          attention_mask: `[N, S]` (1 = real token), or None (all real).
          prompt_length: `P`, `1 <= P < S`.
          group_size: `G >= 1`, rows per shared prompt.

        Returns:
          Final-normed hidden states `[N, S, D]` in the compute dtype.

        Examples:
          >>> cfg = ModelConfig(family="qwen3", vocab_size=11, hidden_size=8,
          ...                   intermediate_size=16, num_layers=2, num_heads=2,
          ...                   num_kv_heads=1, head_dim=4)
          >>> model = Decoder(cfg, rngs=nnx.Rngs(0))
          >>> tokens = jnp.array([[1, 2, 3, 4], [1, 2, 5, 6]])  # one prompt [1, 2], G = 2
          >>> positions = jnp.tile(jnp.arange(4), (2, 1))
          >>> shared = model.shared_prompt_hidden_states(tokens, positions, prompt_length=2,
          ...                                            group_size=2)
          >>> bool(jnp.allclose(shared, model.hidden_states(tokens, positions), atol=1e-5))
          True
        """
        _check_inputs(tokens, positions, attention_mask, "attention_mask")
        N, S = tokens.shape
        for name, value, low in (
            ("prompt_length", prompt_length, 1),
            ("group_size", group_size, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"`{name}` must be an int >= {low}, got {value!r}.")
        if prompt_length >= S:
            raise ValueError(
                f"`prompt_length` must be < the {S} tokens per row, got {prompt_length}."
            )
        if N % group_size:
            raise ValueError(
                f"{N} rows do not split into groups of `group_size` = {group_size} rows."
            )
        if group_size == 1 or not plain_layout():
            return self.hidden_states(tokens, positions, attention_mask=attention_mask)
        P, G = prompt_length, group_size
        segments = (
            jnp.ones(tokens.shape, jnp.int32)
            if attention_mask is None
            else attention_mask.astype(jnp.int32)
        )

        full_masks: dict[int | None, Array] = {}  # one [N, S, S] mask per window, both parts

        def rows_of(window: int | None, prompt: bool) -> Array:
            if window not in full_masks:
                full_masks[window] = kv_cache.full_attention_mask(segments, positions, window)
            mask = full_masks[window]
            return mask[::G, :P, :P] if prompt else mask[:, P:]

        x_p, x_c = self._prompt_shared_layers(
            (tokens[::G, :P], positions[::G, :P], functools.partial(rows_of, prompt=True)),
            (tokens[:, P:], positions[:, P:], functools.partial(rows_of, prompt=False)),
            functools.partial(jnp.repeat, repeats=G, axis=0),
        )
        hidden = jnp.concatenate([jnp.repeat(x_p, G, axis=0), x_c], axis=1)
        return shard(hidden, ("batch", "length", "embed"))

    def prompt_indexed_hidden_states(
        self,
        prompt_tokens: Array,
        prompt_positions: Array,
        prompt_mask: Array,
        tokens: Array,
        positions: Array,
        roles: Array,
        prompt_index: Array,
    ) -> tuple[Array, Array]:
        """Hidden states of prompts `[B, P]` and of completion rows `[R, W]` that each read one
        of them: the shared-prompt forward with a prompt index per row instead of `G` rows
        per prompt, so that a row can hold several short completions of the same prompt.

        Completion row `r` attends to the real tokens of prompt `prompt_index[r]`, then to the
        earlier tokens of its own row with its own role (`roles[r, s] = k ≥ 1` for the row's
        `k`-th completion, 0 for empty slots; `kv_cache.full_attention_mask`), at rotary
        `positions` that continue the prompt's:

            prompt layer:      x_p[B, P]  attends to k_p, v_p                       (causal)
            completion layer:  x_c[R, W]  attends to [k_p[prompt_index] ; k_c]      (causal, role)

        Each token sees what it sees in its padded row, so the states equal `hidden_states` of
        the padded rows up to float rounding. Prompts are left-padded (`prompt_mask`), so a
        prompt's last state, which predicts its completions' first tokens, is `x_p[:, P − 1]`.
        The norms, projections and MLP run once per layer on the `B·P + R·W` tokens. Without
        `plain_layout()` (a mesh of several devices) each row runs its prompt itself
        (`hidden_states` with segments and roles): the same states, more work.

        Args:
          prompt_tokens, prompt_positions, prompt_mask: `[B, P]` left-padded prompts, their
            rotary positions and real-token mask.
          tokens, positions, roles: `[R, W]` completion rows.
          prompt_index: `[R]` int, the prompt each row reads.

        Returns:
          Final-normed `(x_p[B, P, D], x_c[R, W, D])` in the compute dtype.

        Examples:
          >>> cfg = ModelConfig(family="qwen3", vocab_size=11, hidden_size=8,
          ...                   intermediate_size=16, num_layers=2, num_heads=2,
          ...                   num_kv_heads=1, head_dim=4)
          >>> model = Decoder(cfg, rngs=nnx.Rngs(0))
          >>> padded = model.hidden_states(jnp.array([[1, 2, 3, 4], [1, 2, 5, 0]]),
          ...                              jnp.array([[0, 1, 2, 3], [0, 1, 2, 0]]),
          ...                              attention_mask=jnp.array([[1, 1, 1, 1], [1, 1, 1, 0]]))
          >>> x_p, x_c = model.prompt_indexed_hidden_states(  # completions 3 4 and 5 in a row
          ...     jnp.array([[1, 2]]), jnp.array([[0, 1]]), jnp.array([[1, 1]]),
          ...     jnp.array([[3, 4, 5]]), jnp.array([[2, 3, 2]]), jnp.array([[1, 1, 2]]),
          ...     jnp.array([0]))
          >>> bool(jnp.allclose(x_c[0, :2], padded[0, 2:], atol=1e-5))
          True
          >>> bool(jnp.allclose(x_c[0, 2], padded[1, 2], atol=1e-5))
          True
        """
        for name, value in (("prompt_positions", prompt_positions), ("prompt_mask", prompt_mask)):
            if value.shape != prompt_tokens.shape:
                raise ValueError(
                    f"`{name}` must have the prompt tokens' shape {prompt_tokens.shape}, got "
                    f"{value.shape}."
                )
        _check_inputs(tokens, positions, roles, "roles")
        R = tokens.shape[0]
        if prompt_index.shape != (R,):
            raise ValueError(f"`prompt_index` must be [R] = [{R}], got {prompt_index.shape}.")
        P = prompt_tokens.shape[1]
        row_prompt = jnp.take(prompt_mask, prompt_index, axis=0).astype(jnp.int32)
        segments = jnp.concatenate([row_prompt, (roles > 0).astype(jnp.int32)], axis=1)
        both_roles = jnp.concatenate([jnp.zeros_like(row_prompt), roles.astype(jnp.int32)], 1)
        both_positions = jnp.concatenate(
            [jnp.take(prompt_positions, prompt_index, axis=0), positions], axis=1
        )
        if not plain_layout():
            rows = jnp.concatenate([jnp.take(prompt_tokens, prompt_index, axis=0), tokens], 1)
            hidden = self.hidden_states(
                rows, both_positions, segment_ids=segments, segment_roles=both_roles
            )
            x_p = self.hidden_states(
                prompt_tokens, prompt_positions, attention_mask=prompt_mask.astype(jnp.int32)
            )
            return x_p, hidden[:, P:]

        def prompt_mask_fn(window: int | None) -> Array:
            real = prompt_mask.astype(jnp.int32)
            return kv_cache.full_attention_mask(real, prompt_positions, window)

        def completion_mask_fn(window: int | None) -> Array:
            mask = kv_cache.full_attention_mask(segments, both_positions, window, both_roles)
            return mask[:, P:]

        return self._prompt_shared_layers(
            (prompt_tokens, prompt_positions, prompt_mask_fn),
            (tokens, positions, completion_mask_fn),
            functools.partial(jnp.take, indices=prompt_index, axis=0),
        )

    def _prompt_shared_layers(
        self, prompts: tuple[Array, Array, Any], rows: tuple[Array, Array, Any], prefix: Any
    ) -> tuple[Array, Array]:
        """The layers over prompts `[B, P]` and the rows that read them `[R, W]`, each part a
        `(tokens, positions, mask_fn)`; `prefix` maps a prompt-part array `[B, P, ...]` to each
        row's prompt `[R, P, ...]`. Final-normed `(x_p, x_c)`."""
        (tokens_p, positions_p, mask_p), (tokens_c, positions_c, mask_c) = prompts, rows
        prompt_in = self._per_layer_inputs(positions_p, mask_p)
        completion_in = self._per_layer_inputs(positions_c, mask_c)
        (B, P), (R, W) = tokens_p.shape, tokens_c.shape
        blocks = _TokenBlocks(prompt_rows=B, prompt_length=P, rows=R, length=W)
        angles = blocks.join(prompt_in[0], completion_in[0])
        masks = jax.tree.map(lambda a, b: (a, b), prompt_in[1], completion_in[1])
        sliding, mixed = prompt_in[2], isinstance(prompt_in[1], tuple)
        graphdef, state = nnx.split(self.layers)
        attention = self._attention()

        def shared_attention(q: Array, k: Array, v: Array, mask: Any, **kw: Any) -> Array:
            # the prompts attend to themselves; each row to its prompt, then to itself
            (q_p, q_c), (k_p, k_c), (v_p, v_c) = blocks.split(q), blocks.split(k), blocks.split(v)

            def after_prompt(shared: Array, own: Array) -> Array:
                return jnp.concatenate([prefix(shared), own], axis=1)

            out_p = attention(q_p, k_p, v_p, mask[0], **kw)
            out_c = attention(q_c, after_prompt(k_p, k_c), after_prompt(v_p, v_c), mask[1], **kw)
            return blocks.join(out_p, out_c)

        def body(x: Array, xs: Any) -> tuple[Array, None]:
            layer_state, is_sliding = xs
            block = nnx.merge(graphdef, layer_state)
            (sin, cos), mask = _layer_inputs(angles, masks, is_sliding, mixed)
            x, _ = block(x, sin, cos, mask, None, attention=shared_attention)
            return x, None

        x = self._embed(blocks.join(tokens_p, tokens_c))
        x, _ = jax.lax.scan(self._remat(body), x, (state, sliding))
        return blocks.split(self.final_norm(x))

    def logits(self, hidden: Array) -> Array:
        """Project hidden states `[..., D]` to float32 logits `[..., V]` (with soft-capping).

        Under a mesh the leading axis is the batch (`[N, D]` or `[N, S, D]`) and `V` is split
        over `tensor`: a vocabulary-parallel projection, no all-gather of the logits.
        """
        if not self.config.tie_embeddings and not self.has_lm_head:
            raise ValueError("this Decoder was built with lm_head=False and has no logits.")
        lead = "abcdefgh"[: hidden.ndim - 1]
        names = (("batch",) + (None,) * (hidden.ndim - 2) if hidden.ndim > 1 else ()) + ("vocab",)
        if self.config.tie_embeddings:
            weight, rhs = compute_weight(self.embed, self.dtype), "vd"
        else:
            weight, rhs = compute_weight(self.lm_head, self.dtype), "dv"
        out = einsum(
            f"{lead}d,{rhs}->{lead}v",
            hidden,
            weight,
            names=names,
            preferred_element_type=jnp.float32,
        )
        cap = self.config.final_logit_softcap
        return out if cap is None else cap * jnp.tanh(out / cap)

    def decode(
        self,
        tokens: Array,
        positions: Array,
        cache: kv_cache.KVCache,
        *,
        attention_mask: Array | None = None,
    ) -> tuple[Array, kv_cache.KVCache]:
        """Run `tokens[N, S]` against `cache`, writing their keys/values after each row's slots.

        Returns float32 logits `[N, S, V]` and the updated cache. `attention_mask[N, S]` marks
        real tokens (padding slots are written but never read). S = prompt length for a
        prefill, 1 for a decode step.
        """
        hidden, cache = self.decode_hidden(tokens, positions, cache, attention_mask=attention_mask)
        return self.logits(hidden), cache

    def decode_hidden(
        self,
        tokens: Array,
        positions: Array,
        cache: kv_cache.KVCache,
        *,
        attention_mask: Array | None = None,
        layer_unroll: int = 1,
    ) -> tuple[Array, kv_cache.KVCache]:
        """`decode` without the output projection: final-normed hidden states `[N, S, D]`.

        A prefill that only needs the next-token logits projects `hidden[:, -1]` with
        `logits`, instead of materialising `[N, S, V]`. `layer_unroll` layers run per
        iteration of the layer scan: a decode step is small, and on CPU the loop's overhead
        is a sizeable part of it (compile time grows with the unroll).
        """
        if isinstance(layer_unroll, bool) or not isinstance(layer_unroll, int) or layer_unroll < 1:
            raise ValueError(f"decode: `layer_unroll` must be an int >= 1, got {layer_unroll!r}.")
        _check_inputs(tokens, positions, attention_mask, "attention_mask")
        tokens, positions, attention_mask = _rows(tokens), _rows(positions), _rows(attention_mask)
        cache = kv_cache.shard_cache(cache)
        S = tokens.shape[1]
        if not isinstance(cache.lengths, jax.core.Tracer):
            longest = int(np.max(np.asarray(cache.lengths))) + S
            if longest > cache.max_len:
                raise ValueError(
                    f"KVCache overflow: writing {S} tokens needs {longest} slots, the cache "
                    f"has max_len={cache.max_len}."
                )
        valid = jnp.ones(tokens.shape, bool) if attention_mask is None else attention_mask > 0
        after = kv_cache.advance(cache, positions, valid)

        def mask_fn(window: int | None) -> Array:
            return kv_cache.cached_attention_mask(cache, after, positions, window)

        x, (k, v) = self._layers(
            self._embed(tokens),
            positions,
            mask_fn,
            (cache.k, cache.v, cache.lengths),
            unroll=min(layer_unroll, self.config.num_layers),
        )
        return self.final_norm(x), after._replace(k=k, v=v)

    def init_cache(
        self, *, batch: int, max_len: int, shared_length: bool = False
    ) -> kv_cache.KVCache:
        """An empty `KVCache` for this model in its compute dtype (see `KVCache.init`)."""
        return kv_cache.KVCache.init(
            self.config,
            batch=batch,
            max_len=max_len,
            dtype=self.dtype,
            shared_length=shared_length,
        )

    # ----------------------------------------------------------------------------- internals

    def _embed(self, tokens: Array) -> Array:
        # gathered in the storage dtype (only N·S rows are cast); under a mesh the table is
        # whole on `embed` and split over `tensor` on `vocab`: a masked local gather whose
        # rows are all-reduced over `tensor`.
        rows = take_rows(compute_weight(self.embed), tokens, ("batch", "length", "embed"))
        x = rows.astype(self.dtype)
        if self.config.embed_scale:
            x = x * jnp.asarray(math.sqrt(self.config.hidden_size), self.dtype)
        return x

    def _per_layer_inputs(self, positions: Array, mask_fn: Any) -> tuple[Any, Any, Array]:
        """Rope angles and masks per layer type, and which layers are sliding (`[L]` bool)."""
        cfg = self.config
        sliding = np.array([t == "sliding_attention" for t in cfg.layer_types])
        full_angles = rope_angles(positions, rope_inv_freq(cfg.rope, cfg.head_dim))
        full_mask = mask_fn(None)
        if not sliding.any():
            return full_angles, full_mask, jnp.asarray(sliding)
        local = cfg.local_rope or cfg.rope
        local_angles = rope_angles(positions, rope_inv_freq(local, cfg.head_dim))
        local_mask = mask_fn(cfg.sliding_window)
        if sliding.all():
            return local_angles, local_mask, jnp.asarray(sliding)
        return (full_angles, local_angles), (full_mask, local_mask), jnp.asarray(sliding)

    def _layers(
        self,
        x: Array,
        positions: Array,
        mask_fn: Any,
        kv: tuple[Array, Array, Array] | None,
        unroll: int = 1,
        attention: Any = None,
    ) -> tuple[Array, Any]:
        """Scan the stacked layers over `x[N, S, D]`; with `kv` also write/read the cache.

        `unroll` layers run per iteration of the scan (`lax.scan(unroll=...)`). `attention`
        replaces the model's (`_attention`); it receives what `mask_fn` returns as its mask.
        """
        angles, masks, sliding = self._per_layer_inputs(positions, mask_fn)
        mixed = isinstance(masks, tuple)
        attention = attention or self._attention()
        graphdef, state = nnx.split(self.layers)
        starts = None if kv is None else kv[2]

        def body(x: Array, xs: Any) -> tuple[Array, Any]:
            layer_state, is_sliding, kv_layer = xs
            block = nnx.merge(graphdef, layer_state)
            (sin, cos), mask = _layer_inputs(angles, masks, is_sliding, mixed)
            write = None
            if kv_layer is not None:

                def write(k_new: Array, v_new: Array) -> tuple[Array, Array, Any]:
                    # buffers: k [N, K, T, Hd], v [N, K, Hd, T] (see cache.py); the new
                    # [N, S, K, Hd] keys/values are written in that layout and attention
                    # reads [N, T, K, Hd] views, transposes that XLA folds into the matmuls.
                    k_new = jnp.transpose(k_new, (0, 2, 1, 3))
                    v_new = jnp.transpose(v_new, (0, 2, 3, 1))
                    k_buf = kv_cache.write_rows(kv_layer[0], k_new, starts, axis=2)
                    v_buf = kv_cache.write_rows(kv_layer[1], v_new, starts, axis=3)
                    k_read = jnp.transpose(k_buf, (0, 2, 1, 3))
                    v_read = jnp.transpose(v_buf, (0, 3, 1, 2))
                    return k_read, v_read, (k_buf, v_buf)

            return block(x, sin, cos, mask, write, attention=attention)

        kv_xs = None if kv is None else (kv[0], kv[1])
        return jax.lax.scan(self._remat(body), x, (state, sliding, kv_xs), unroll=unroll)

    def _remat(self, body: Any) -> Any:
        """The layer scan's body under this model's `remat` policy."""
        if self.remat == "none":
            return body
        return jax.checkpoint(body, policy=_REMAT_POLICIES[self.remat])
