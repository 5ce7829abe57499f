"""Completion tokens → the text the host-side reward functions see."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np


def decode_completions(
    tokenizer: Any,
    completion_tokens: Any,
    completion_mask: Any,
    *,
    stop_ids: int | Sequence[int] | None = None,
) -> list[str]:
    """Decode each row's valid tokens up to (not including) the first stop token.

    Special tokens before the stop are kept visible (`<pad>`, `<bos>` with the
    `ByteTokenizer`), so a completion that emits them is not mistaken for a clean one: this is
    the text form of `jax_rewards.completion_content`, and `builtin.exact_answer` on it agrees
    with `jax_rewards.exact_answer_reward`. So are ids the tokenizer does not know (a model
    vocabulary padded beyond the tokenizer's, as many Hugging Face checkpoints have): each
    shows as `<id:N>`, where a `transformers` tokenizer would drop it silently and the
    `ByteTokenizer` would raise.

    Args:
      tokenizer: a `jaxrl_llm.tokenizer` tokenizer (`decode(ids, skip_special=...)`, `eos_id`).
      completion_tokens: `[N, T]` int token ids (NumPy or JAX).
      completion_mask: `[N, T]` bool / {0,1}, True on generated tokens.
      stop_ids: stop token id(s); default the tokenizer's `eos_id`.

    Returns:
      `N` strings.

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> tok = ByteTokenizer()
      >>> tokens = np.array([[49, 57, 258, 50], [49, 256, 57, 258]])
      >>> decode_completions(tok, tokens, np.ones((2, 4), bool))
      ['19', '1<pad>9']
      >>> decode_completions(tok, np.array([[49, 300, 57, 258]]), np.ones((1, 4), bool))
      ['1<id:300>9']
    """
    tokens = np.asarray(completion_tokens)
    mask = np.asarray(completion_mask)
    if tokens.ndim != 2 or mask.shape != tokens.shape:
        raise ValueError(
            "decode_completions: `completion_tokens` and `completion_mask` must both be [N, T], "
            f"got shapes {tokens.shape} and {mask.shape}."
        )
    stops = set(
        _stop_id_tuple(tokenizer.eos_id if stop_ids is None else stop_ids, "decode_completions")
    )
    texts = []
    known = (tokens >= 0) & (tokens < tokenizer.vocab_size)
    for row, keep, row_known in zip(tokens, mask > 0, known, strict=True):
        ids = row[keep].tolist()
        cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
        if row_known[keep][:cut].all():
            texts.append(tokenizer.decode(ids[:cut], skip_special=False))
        else:
            texts.append(_decode_unknown(tokenizer, ids[:cut]))
    return texts


def _stop_id_tuple(stop_ids: Any, where: str) -> tuple[int, ...]:
    """One stop id or several (ints, NumPy or JAX integers or an integer array) as a tuple.

    Examples:
      >>> _stop_id_tuple(np.int64(2), "f"), _stop_id_tuple(np.array([1, 2]), "f")
      ((2,), (1, 2))
    """
    ids = np.asarray(stop_ids)
    if (
        isinstance(stop_ids, bool)
        or ids.dtype == bool
        or ids.ndim > 1
        or ids.size == 0
        or (
            not np.issubdtype(ids.dtype, np.integer)
            and not (ids.dtype == object and all(_is_int(i) for i in ids.reshape(-1)))
        )
    ):
        raise ValueError(
            f"{where}: `stop_ids` must be an int or a non-empty sequence of ints, got {stop_ids!r}."
        )
    return tuple(int(i) for i in ids.reshape(-1))


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _decode_unknown(tokenizer: Any, ids: list[int]) -> str:
    """`tokenizer.decode(ids, skip_special=False)`, with `<id:N>` for each id outside
    `[0, tokenizer.vocab_size)` (the runs between them decoded on their own)."""
    vocab = tokenizer.vocab_size
    parts, run = [], []
    for t in ids:
        if 0 <= t < vocab:
            run.append(t)
            continue
        parts += [tokenizer.decode(run, skip_special=False), f"<id:{t}>"]
        run = []
    parts.append(tokenizer.decode(run, skip_special=False))
    return "".join(parts)
