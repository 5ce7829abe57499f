"""`generate`: the host-side entry point over the compiled sampler.

It takes a model and prompts of different lengths, left-pads them to a bucketed length, builds
the static `SamplingConfig`, and calls `jit_sample_tokens`, the one jitted `sample_tokens`
shared by every call in the process (its compilation cache is keyed by the model's graph, the
config and the input shapes, never by the weights).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from jaxrl_llm.models.decoder import Decoder
from jaxrl_llm.sampler.buckets import bucket_length, left_pad
from jaxrl_llm.sampler.config import SamplingConfig, with_stop_strings
from jaxrl_llm.sampler.core import check_left_padded, sample_tokens
from jaxrl_llm.sampler.rollout import Rollout
from jaxrl_llm.sampler.row_groups import (
    call_flops,
    call_in_row_groups,
    devices_of,
    resolve_row_groups,
    split_row_keys,
)

_jitted_sample_tokens = jax.jit(sample_tokens, static_argnames=("graphdef", "config"))


def jit_sample_tokens(
    graphdef: Any, state: Any, prompt_tokens: Any, prompt_mask: Any, key: Any, **kwargs: Any
) -> Rollout:
    """`sample_tokens` under `jax.jit` with `graphdef` and `config` static (one compile cache
    shared by every call in the process), after checking on the host that a concrete
    `prompt_mask` is left-padded with no empty prompt (`sample_tokens` cannot check a traced
    one). Inside another `jit`, call `sample_tokens` itself.

    `jit_sample_tokens.lower(...)` lowers the jitted function ahead of time, and
    `jit_sample_tokens.jitted` is the `jax.jit` object itself (no check).

    Raises:
      ValueError: a prompt is not left-padded or has no token (named), or the checks of
        `sample_tokens`.
    """
    check_left_padded(prompt_mask)
    return _jitted_sample_tokens(graphdef, state, prompt_tokens, prompt_mask, key, **kwargs)


jit_sample_tokens.jitted = _jitted_sample_tokens
jit_sample_tokens.lower = _jitted_sample_tokens.lower


def _prompt_rows(prompt_tokens: Any, prompt_mask: Any, vocab_size: int) -> list[list[int]]:
    if (
        prompt_mask is None
        and isinstance(prompt_tokens, Sequence)
        and not isinstance(prompt_tokens, str)
    ):
        ids = [
            list(row) if isinstance(row, Sequence | np.ndarray) else row for row in prompt_tokens
        ]
        if not all(isinstance(row, list) and all(map(_is_token_id, row)) for row in ids):
            raise ValueError(
                "generate: `prompt_tokens` must be token ids (a list of lists of ints, or an "
                f"integer array [B, P]), got {prompt_tokens!r:.80}; encode texts with the "
                "tokenizer first."
            )
        rows = [[int(t) for t in row] for row in ids]
    else:
        try:
            tokens = np.asarray(prompt_tokens)
            mask = np.ones(tokens.shape, bool) if prompt_mask is None else np.asarray(prompt_mask)
        except ValueError:  # ragged lists with a mask
            raise ValueError(
                "generate: with `prompt_mask`, `prompt_tokens` must be an integer array [B, P] "
                "(rows of one length)."
            ) from None
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(
                "generate: `prompt_tokens` must be a list of token-id lists or an integer array "
                f"[B, P], got {tokens.dtype}{tokens.shape}."
            )
        if mask.shape != tokens.shape:
            raise ValueError(
                f"generate: `prompt_mask` must have the prompts' shape {tokens.shape}, "
                f"got {mask.shape}."
            )
        real = (mask > 0).astype(np.int8)
        runs = real[:, 0] + (np.diff(real, axis=1) == 1).sum(axis=1)  # runs of real tokens
        if (runs > 1).any():
            i = int(np.argmax(runs > 1))
            raise ValueError(
                f"generate: `prompt_mask` row {i} has a hole ({real[i].tolist()}); a prompt is "
                "one run of real tokens, padded on the left or the right."
            )
        rows = [row[m > 0].tolist() for row, m in zip(tokens, mask, strict=True)]
    if not rows:
        raise ValueError("generate: `prompt_tokens` holds no prompt.")
    for i, row in enumerate(rows):
        if not row:
            raise ValueError(f"generate: prompt {i} is empty; every prompt needs a token.")
        bad = [t for t in row if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"generate: prompt {i} has token ids {bad[:5]} outside the vocabulary "
                f"[0, {vocab_size})."
            )
    return rows


def _is_token_id(t: Any) -> bool:
    return isinstance(t, int | np.integer) and not isinstance(t, bool | np.bool_)


def _budgets(max_new_tokens: Any, num_prompts: int, num_samples: int) -> tuple[int, np.ndarray]:
    """The static budget T and the per-row budgets `[N]` from an int or a per-prompt/row list."""
    N = num_prompts * num_samples
    per = np.atleast_1d(np.asarray(max_new_tokens))
    if not np.issubdtype(per.dtype, np.integer) or per.ndim != 1 or (per < 1).any():
        raise ValueError(
            "generate: `max_new_tokens` must be an int >= 1 or a list of them (one per prompt or "
            f"one per row), got {max_new_tokens!r}."
        )
    if per.size == 1:
        per = np.full((N,), per[0])
    elif per.size == num_prompts:
        per = np.repeat(per, num_samples)
    elif per.size != N:
        raise ValueError(
            f"generate: `max_new_tokens` has {per.size} entries; expected 1, {num_prompts} (one "
            f"per prompt) or {N} (one per row)."
        )
    return int(per.max()), per.astype(np.int32)


def _default_stop_tokens(model: Decoder) -> tuple[int, ...]:
    eos = model.config.eos_token_id
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(eos)


def generate(
    model: Decoder,
    prompt_tokens: Any,
    *,
    max_new_tokens: int | Sequence[int],
    key: jax.Array,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    num_samples: int = 1,
    stop_tokens: Sequence[int] | None = None,
    prompt_mask: Any = None,
    pad_id: int | None = None,
    steps_per_loop: int = 1,
    bucket_multiple: int | None = None,
    row_groups: int | None = None,
    merge_lora: bool = True,
    stop_strings: Sequence[str] = (),
    tokenizer: Any = None,
) -> Rollout:
    """Sample `num_samples` completions of each prompt with the compiled sampler.

    Prompts are left-padded to `P = bucket_length(longest prompt)`, so prompts of similar
    lengths reuse one compiled program; `Rollout.tokens` is `[N, P + T]` with `T = max budget`
    and `N = len(prompts) · num_samples` rows, prompt-major. See `SamplingConfig` for the
    order of the temperature / top-k / top-p / min-p filters and `Rollout` for the outputs.

    Args:
      model: a `Decoder` (weights are passed to the compiled program as arguments).
      prompt_tokens: a list of token-id lists (any lengths >= 1), or an integer array `[B, P]`
        with `prompt_mask` (padding on either side).
      max_new_tokens: the budget: one int, or one per prompt, or one per row.
      key: one PRNG key, or `N` per-row keys.
      temperature: τ; 0 is greedy (top-k, top-p and min-p then do nothing: a warning).
      top_k, top_p, min_p: filters (None: off).
      num_samples: G completions per prompt; the prompt is prefilled once.
      stop_tokens: ids that end a row; None uses the model config's `eos_token_id` (if any),
        `()` never stops early.
      prompt_mask: `[B, P]` 1 on real tokens when `prompt_tokens` is an array.
      pad_id: the id written after a stop; None uses the model's `pad_token_id`, else 0.
      steps_per_loop: decode steps per while-loop iteration.
      bucket_multiple: pad prompt lengths to this multiple instead of a power of two.
      row_groups: run the prompts as this many equal groups, one host thread each (CPU;
        `jaxrl_llm.sampler.row_groups`; the same rollout). None: automatic.
      merge_lora: fold a LoRA model's adapters into its weights once per call (the default);
        False applies them at every token (`SamplingConfig.merge_lora`).
      stop_strings: texts that end a row once its completion contains one, however the
        tokens spell it (`sampler.stop_strings`); needs `tokenizer`.
      tokenizer: the `jaxrl_llm.tokenizer` tokenizer whose vocabulary `stop_strings` are
        matched with (only with stop strings: alone it is unused, with a warning).

    Returns:
      A `Rollout`.

    Examples:
      >>> from jaxrl_llm.models import ModelConfig
      >>> cfg = ModelConfig(family="qwen3", vocab_size=259, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> model = Decoder(cfg, rngs=nnx.Rngs(0))
      >>> out = generate(model, [[257, 104, 105], [257, 121]], max_new_tokens=4,
      ...                key=jax.random.key(0), num_samples=2, stop_tokens=[258], pad_id=256)
      >>> out.tokens.shape, out.completion_tokens.shape, out.lengths.shape
      ((4, 20), (4, 4), (4,))
    """
    if not isinstance(model, Decoder) or not model.has_lm_head:
        raise ValueError(f"generate: `model` must be a Decoder with an LM head, got {type(model)}.")
    vocab = model.config.vocab_size
    rows = _prompt_rows(prompt_tokens, prompt_mask, vocab)
    if isinstance(num_samples, np.integer):
        num_samples = int(num_samples)
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"generate: `num_samples` must be an int >= 1, got {num_samples!r}.")
    T, budgets = _budgets(max_new_tokens, len(rows), num_samples)
    if stop_tokens is None:
        stops = _default_stop_tokens(model)
    else:
        stops = (stop_tokens,) if _is_token_id(stop_tokens) else tuple(stop_tokens)
        if not all(map(_is_token_id, stops)):
            raise ValueError(
                f"generate: `stop_tokens` must be a token id or a list of them, got {stop_tokens!r}."
            )
        stops = tuple(int(t) for t in stops)
    if pad_id is None:
        pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    if isinstance(pad_id, int) and not 0 <= pad_id < vocab:  # it also left-pads the prompts
        raise ValueError(
            f"generate: `pad_id` must be a token of the model's vocabulary [0, {vocab}), "
            f"got {pad_id}."
        )
    outside = [t for t in stops if not 0 <= t < vocab]
    if outside:
        raise ValueError(
            f"generate: `stop_tokens` must be tokens of the model's vocabulary [0, {vocab}), "
            f"got {outside}."
        )
    if isinstance(stop_strings, str):  # one stop string, not its characters
        stop_strings = (stop_strings,)
    config = SamplingConfig(
        max_new_tokens=T,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        num_samples=num_samples,
        stop_tokens=stops,
        pad_id=pad_id,
        steps_per_loop=steps_per_loop,
        bucket_multiple=bucket_multiple,
        row_groups=row_groups,
        merge_lora=merge_lora,
        stop_strings=tuple(stop_strings),
    )
    if config.greedy and (top_k is not None or top_p is not None or min_p):  # as HF warns
        warnings.warn(
            "generate: temperature 0 decodes greedily; top_k, top_p and min_p have no effect.",
            stacklevel=2,
        )
    if config.stop_strings:
        if tokenizer is None:
            raise ValueError("generate: `stop_strings` need the `tokenizer` they are matched with.")
        config = with_stop_strings(config, tokenizer)
    elif tokenizer is not None:
        warnings.warn(
            "generate: `tokenizer` is used only to match `stop_strings`; none were given.",
            stacklevel=2,
        )
    longest = max(len(r) for r in rows)
    context = model.config.max_position_embeddings
    if context is not None and longest + T > context:  # RoPE runs on; quality is not assured
        warnings.warn(
            f"generate: the longest prompt ({longest} tokens) plus max_new_tokens ({T}) is over "
            f"the model's context of {context} positions (max_position_embeddings).",
            stacklevel=2,
        )
    P = bucket_length(longest, multiple=config.bucket_multiple, minimum=config.min_bucket)
    tokens, mask = left_pad(rows, length=P, pad_id=pad_id)
    graphdef, state = nnx.split(model)
    B, N = len(rows), len(rows) * num_samples
    groups = resolve_row_groups(
        config.row_groups, B, devices=devices_of(state), flops=call_flops(state, N, P + T)
    )
    if groups == 1:
        return jit_sample_tokens(
            graphdef, state, tokens, mask, key, config=config, max_new_tokens=budgets
        )
    keys, b, n = split_row_keys(key, N, groups), B // groups, N // groups

    def call(j: int) -> Rollout:
        prompts = slice(j * b, (j + 1) * b)
        return jit_sample_tokens(
            graphdef,
            state,
            tokens[prompts],
            mask[prompts],
            keys[j],
            config=config,
            max_new_tokens=budgets[j * n : (j + 1) * n],
        )

    return call_in_row_groups(call, groups)
