"""Per-token log-probs, entropies and values of completion tokens, chunked over positions.

For a batch in the layout of `jaxrl_llm.train.batch` (prompt left-padded to `P`, completion
`T`), completion token `t` is scored by the final hidden state at `P + t − 1`:

    h[N,T,D]   = model.hidden_states(tokens, positions, attention_mask)[:, P−1 : P−1+T]
    lp[n,t]    = log_softmax(logits(h[n,t]) / τ)[tokens[n, P+t]]          (losses.token_logprobs)
    H[n,t]     = entropy of softmax(logits(h[n,t]) / τ)                   (losses.entropy_from_logits)
    V[n,t]     = value_head(h[n,t])   or   value_model(...)[:, P−1 : P−1+T]

The vocabulary projection never materialises `[N,S,V]` (nor `[N,T,V]`) logits: positions are
processed `chunk_size` at a time inside `jax.lax.map` under `jax.checkpoint`, so the forward and
the backward pass hold one float32 `[N, chunk_size, V]` slice at a time (the backward pass
recomputes each chunk's logits). The last chunk of a `T` that `chunk_size` does not divide starts
at `T − chunk_size` and keeps only its new positions, so every position's value and gradient come
from exactly one chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import losses
from jaxrl_llm.models import ValueModel, positions_from_mask, positions_from_segments
from jaxrl_llm.models.position_chunks import map_position_chunks
from jaxrl_llm.train.batch import SequenceBatch, check_sequence_batch, prompt_length
from jaxrl_llm.train.group_packing import (
    PackedSequences,
    packed_completion_hidden,
    packed_completion_logprobs,
)
from jaxrl_llm.train.pair_packing import PackedPairs, packed_pair_logprobs


def completion_hidden(model: Any, batch: Any, *, group_size: int = 1) -> jax.Array:
    """Final-normed hidden states `[N,T,D]` that predict the completion tokens (no logits).

    Args:
      model: a `Decoder` (or anything with `hidden_states(tokens, positions, attention_mask=)`;
        packed rows call it with `segment_ids=` instead).
      batch: a batch with `tokens[N,S]`, `attention_mask[N,S]` and `completion_mask[N,T]`;
        packed rows (`segment_ids[N,S]`, `jaxrl_llm.train.batch`) have `P = 1`: their positions
        restart at each sequence and attention stays inside it.
      group_size: `G > 1` when the rows come in groups of `G` consecutive rows with the same
        prompt (the sampler's `G` samples per prompt): each prompt then runs once per layer
        (`Decoder.shared_prompt_hidden_states`; the same states up to float rounding).

    Returns:
      `hidden[:, P−1 : P−1+T]` in the model's compute dtype.

    Examples:
      >>> class Model:  # a Decoder in practice; here h = (position, token)
      ...     def hidden_states(self, tokens, positions, attention_mask):
      ...         return jnp.stack([positions, tokens], -1).astype(jnp.float32)
      >>> b = SequenceBatch(jnp.array([[0, 7, 8, 9, 5]]), jnp.array([[0, 1, 1, 1, 1]]),
      ...                   jnp.ones((1, 2)))
      >>> completion_hidden(Model(), b)[0].tolist()  # P = 3: states at 2, 3 predict 9, 5
      [[1.0, 8.0], [2.0, 9.0]]
    """
    check_sequence_batch(batch, where="completion_hidden")
    T = batch.completion_mask.shape[1]
    P = prompt_length(batch)
    segments = getattr(batch, "segment_ids", None)
    if segments is not None:  # packed rows: P = 1, each sequence from position 0, on its own
        if group_size != 1:
            raise ValueError(
                f"completion_hidden: packed rows (`segment_ids`) share no prompt; group_size "
                f"must be 1, got {group_size}."
            )
        hidden = model.hidden_states(
            batch.tokens, positions_from_segments(segments), segment_ids=segments
        )
        return hidden[:, :T]
    mask = batch.attention_mask.astype(jnp.int32)
    positions = positions_from_mask(mask)
    if group_size == 1:
        hidden = model.hidden_states(batch.tokens, positions, attention_mask=mask)
    else:
        hidden = model.shared_prompt_hidden_states(
            batch.tokens, positions, attention_mask=mask, prompt_length=P, group_size=group_size
        )
    return hidden[:, P - 1 : P - 1 + T]


def chunked_logprobs(
    model: Any,
    hidden: jax.Array,
    targets: jax.Array,
    mask: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool = True,
) -> tuple[jax.Array, jax.Array | None]:
    """Token log-probs (and entropies) of `targets` from hidden states, `chunk_size` positions at a time.

    Args:
      model: a `Decoder`; `model.logits(h)` projects `[..., D]` to float32 `[..., V]`.
      hidden: `[N,T,D]` hidden states aligned with `targets` (see `completion_hidden`).
      targets: `[N,T]` token ids.
      mask: `[N,T]` {0,1}; outputs are 0 outside it and nothing there reaches a gradient.
      temperature: the sampling temperature τ (log-probs of `softmax(z/τ)`).
      chunk_size: positions per chunk (None: all at once).
      with_entropy: also return the per-token entropy.

    Returns:
      `(logp[N,T], entropy[N,T] or None)`, float32.

    Examples:
      >>> class Unembed:  # anything with `logits(h)`; a Decoder in practice
      ...     w = jax.random.normal(jax.random.key(0), (8, 11))
      ...     def logits(self, h):
      ...         return h @ self.w
      >>> h = jax.random.normal(jax.random.key(1), (2, 5, 8))
      >>> y = jnp.ones((2, 5), jnp.int32); m = jnp.ones((2, 5))
      >>> lp, ent = chunked_logprobs(Unembed(), h, y, m, chunk_size=2)
      >>> bool(jnp.allclose(lp, losses.token_logprobs(Unembed().logits(h), y), atol=1e-5))
      True
    """
    where = "chunked_logprobs"
    if hidden.ndim != 3 or targets.shape != hidden.shape[:2] or mask.shape != targets.shape:
        raise ValueError(
            f"{where}: expected hidden [N,T,D], targets [N,T] and mask [N,T], got "
            f"{hidden.shape}, {targets.shape}, {mask.shape}."
        )
    if chunk_size is not None and (isinstance(chunk_size, bool) or chunk_size < 1):
        raise ValueError(
            f"{where}: `chunk_size` must be a positive int or None, got {chunk_size!r}."
        )

    def chunk(h: jax.Array, y: jax.Array, m: jax.Array) -> Any:
        logits = model.logits(h)
        lp = losses.token_logprobs(logits, y, temperature=temperature, mask=m)
        if not with_entropy:
            return lp
        return lp, losses.entropy_from_logits(logits, temperature=temperature, mask=m)

    out = map_position_chunks(chunk, (hidden, targets, mask), chunk_size)
    return out if with_entropy else (out, None)


def completion_logprobs(
    model: Any,
    batch: Any,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool = False,
    group_size: int = 1,
) -> tuple[jax.Array, jax.Array | None, jax.Array]:
    """Forward pass of a policy over a batch: completion log-probs, entropies and hidden states.

    Args:
      model: the policy `Decoder`.
      batch: a `SequenceBatch` (or `RLBatch`).
      temperature: the sampling temperature τ.
      chunk_size: positions per vocabulary chunk.
      with_entropy: also compute the entropy.
      group_size: rows per shared prompt (`completion_hidden`).

    Returns:
      `(logp[N,T], entropy[N,T] or None, hidden[N,T,D])`; the hidden states feed a value head.
      An `RLBatch` with `packed` groups (the update's batch or one of its micro-batches: the
      sequences' rows inside it, `PackedGroups.row`) runs the packed rows instead, the states
      gathered into the padded layout (`packed_completion_hidden`).

    Examples:
      >>> class Model:  # a Decoder in practice
      ...     def hidden_states(self, tokens, positions, attention_mask):
      ...         return jax.nn.one_hot(tokens, 4)
      ...     def logits(self, h):
      ...         return 5.0 * jnp.roll(h, 1, axis=-1)  # favours "next token = current + 1"
      >>> b = SequenceBatch(jnp.array([[1, 2, 3, 0]]), jnp.ones((1, 4)), jnp.array([[1, 1, 0]]))
      >>> lp, _, h = completion_logprobs(Model(), b)
      >>> lp.round(3).tolist()
      [[-0.02, -0.02, 0.0]]
    """
    packed = getattr(batch, "packed", None)
    if packed is not None:
        hidden = packed_completion_hidden(model, packed, in_micro_batch=True)
    else:
        hidden = completion_hidden(model, batch, group_size=group_size)
    P = prompt_length(batch)
    targets = batch.tokens[:, P:]
    mask = (batch.completion_mask > 0).astype(jnp.float32)
    logp, entropy = chunked_logprobs(
        model,
        hidden,
        targets,
        mask,
        temperature=temperature,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
    )
    return logp, entropy, hidden


def critic_values(
    value_model: Any,
    batch: Any,
    *,
    hidden: jax.Array | None = None,
    group_size: int = 1,
    packed: Any = None,
    in_micro_batch: bool = False,
) -> jax.Array:
    """Critic values `V[N,T]` of the states before each completion token (0 outside the mask).

    A `ValueModel` runs its own forward and is read at `P − 1 + t`; a `ValueHead` is applied to
    the policy's completion `hidden` states (shared backbone).

    Args:
      value_model: a `ValueModel` or a `ValueHead`.
      batch: the batch.
      hidden: `[N,T,D]` policy hidden states; required for a `ValueHead`.
      group_size: rows per shared prompt of a `ValueModel`'s forward (`completion_hidden`).
      packed: the batch's `PackedGroups`: a `ValueModel` runs the packed rows
        (`packed_completion_hidden`).
      in_micro_batch: `packed` is one of the update step's micro-batches (its rows `row`,
        else `batch_row`).

    Returns:
      `[N,T]` float32.

    Examples:
      >>> from jaxrl_llm.models import ValueHead
      >>> b = SequenceBatch(jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4)), jnp.array([[1, 0]]))
      >>> v = critic_values(ValueHead(8, rngs=nnx.Rngs(0)), b, hidden=jnp.ones((1, 2, 8)))
      >>> v.shape, float(v[0, 1])
      ((1, 2), 0.0)
    """
    mask = batch.completion_mask > 0
    if isinstance(value_model, ValueModel):  # its own forward pass
        if packed is not None:
            backbone = packed_completion_hidden(
                value_model.backbone, packed, in_micro_batch=in_micro_batch
            )
        else:
            backbone = completion_hidden(value_model.backbone, batch, group_size=group_size)
        values = value_model.head(backbone)
    else:
        if hidden is None:
            raise ValueError("critic_values: a ValueHead needs the policy's `hidden` states.")
        values = value_model(hidden)
    return jnp.where(mask, values.astype(jnp.float32), 0.0)


def make_logprob_fn(
    graphdef: Any,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    group_size: int = 1,
) -> Callable[[Any, Any, SequenceBatch], jax.Array]:
    """A jitted forward `(params, frozen, batch) -> logp[N,T]` of one policy graph.

    Used for the old-policy log-probs (`state.params["policy"], state.frozen["policy"]`) and the
    reference log-probs (`reference_params(...)`, the same frozen state; or a separately loaded
    reference split with `split_models`). Both calls share one compiled program.

    Args:
      graphdef: `ModelGraphs.policy`.
      temperature: the sampling temperature τ.
      chunk_size: positions per vocabulary chunk.
      group_size: rows per shared prompt (`completion_hidden`): the batches it is called on
        must come in groups of this many rows with the same prompt.

    Returns:
      The jitted function; it returns float32 log-probs, 0 outside the completion mask
      (called on `PackedPairs`, the pairs' `[N, 2, T]`: `packed_pair_logprobs`; on
      `PackedSequences`, the padded batch's `[N, T]` from its packed groups).

    Examples:
      >>> from jaxrl_llm.models import Decoder, ModelConfig
      >>> from jaxrl_llm.train.params import split_models
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> graphs, params, frozen = split_models(Decoder(cfg, rngs=nnx.Rngs(0)))
      >>> fn = make_logprob_fn(graphs.policy)
      >>> b = SequenceBatch(jnp.ones((2, 5), jnp.int32), jnp.ones((2, 5)), jnp.ones((2, 3)))
      >>> fn(params["policy"], frozen["policy"], b).shape
      (2, 3)
    """

    def forward(params: Any, frozen: Any, batch: SequenceBatch) -> jax.Array:
        model = nnx.merge(graphdef, params, frozen)
        if isinstance(batch, PackedPairs):  # packed preference pairs: logp[N, 2, T]
            return packed_pair_logprobs(
                model, batch, temperature=temperature, chunk_size=chunk_size
            )
        if isinstance(batch, PackedSequences):  # packed rollout groups: logp[N, T]
            logp, _ = packed_completion_logprobs(
                model,
                batch.sequences,
                batch.packed,
                temperature=temperature,
                chunk_size=chunk_size,
            )
            return logp
        logp, _, _ = completion_logprobs(
            model, batch, temperature=temperature, chunk_size=chunk_size, group_size=group_size
        )
        return logp

    return jax.jit(forward)


def make_value_fn(
    graphs: Any, *, group_size: int = 1
) -> Callable[[dict, dict, SequenceBatch], jax.Array]:
    """A jitted critic forward `(params, frozen, batch) -> values[N,T]` (the "old values").

    `params` and `frozen` are the dicts of `split_models` / `TrainState` (keys "policy", "value"):
    a `ValueHead` critic needs the policy backbone, a `ValueModel` only its own state.

    Args:
      graphs: `ModelGraphs` with a `value` graph.
      group_size: rows per shared prompt (`completion_hidden`) of the critic's (or, for a
        `ValueHead`, the policy backbone's) forward.

    Returns:
      The jitted function (float32 values, 0 outside the completion mask).

    Examples:
      >>> from jaxrl_llm.models import ModelConfig, ValueModel, Decoder
      >>> from jaxrl_llm.train.params import split_models
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> graphs, params, frozen = split_models(Decoder(cfg, rngs=nnx.Rngs(0)),
      ...                                       ValueModel(cfg, rngs=nnx.Rngs(1)))
      >>> b = SequenceBatch(jnp.ones((2, 5), jnp.int32), jnp.ones((2, 5)), jnp.ones((2, 3)))
      >>> make_value_fn(graphs)(params, frozen, b).shape
      (2, 3)
    """
    if graphs.value is None:
        raise ValueError("make_value_fn: `graphs.value` is None (no critic was split).")

    def forward(params: dict, frozen: dict, batch: SequenceBatch) -> jax.Array:
        packed = None
        if isinstance(batch, PackedSequences):  # packed rollout groups
            batch, packed = batch
        critic = nnx.merge(graphs.value, params["value"], frozen["value"])
        if isinstance(critic, ValueModel):
            return critic_values(critic, batch, group_size=group_size, packed=packed)
        policy = nnx.merge(graphs.policy, params["policy"], frozen["policy"])
        if packed is not None:
            hidden = packed_completion_hidden(policy, packed)
        else:
            hidden = completion_hidden(policy, batch, group_size=group_size)
        return critic_values(critic, batch, hidden=hidden)

    return jax.jit(forward)
