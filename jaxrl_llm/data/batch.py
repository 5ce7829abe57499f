"""Examples → what the sampler and the rewards take: prompt tokens, answer tokens, fields.

`make_prompt_batch` renders `B` examples with the template and tokenizes them: prompts
left-padded (every prompt ends in the same column, as the sampler wants), reference answers
right-padded without BOS/EOS (the token form `exact_answer_reward` compares against).
`group_fields` repeats each example's fields over its `G` samples, prompt-major
(`n = b·G + g`), as the host-side reward functions receive them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrl_llm.data.records import DataError
from jaxrl_llm.data.templates import TemplateConfig, render_prompt


class PromptBatch(NamedTuple):
    """A batch of `B` prompts in text and token form (NumPy, host side).

    Attributes:
      examples: the `B` example dicts (all their fields).
      prompts: the `B` rendered prompt texts.
      prompt_tokens: `[B, P]` int32, left-padded with `pad_id`.
      prompt_mask: `[B, P]` bool, True on real prompt tokens.
      answer_tokens: `[B, A]` int32 reference answers, right-padded (None without answers).
      answer_lengths: `[B]` int32 answer lengths in tokens (None without answers).

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> b = make_prompt_batch([{"prompt": "1+1=", "answer": "2"}], template=TemplateConfig(),
      ...                       tokenizer=ByteTokenizer())
      >>> b.prompt_tokens.tolist(), b.answer_tokens.tolist(), b.answer_lengths.tolist()
      ([[257, 49, 43, 49, 61]], [[50]], [1])
    """

    examples: tuple[dict[str, Any], ...]
    prompts: tuple[str, ...]
    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray
    answer_tokens: np.ndarray | None
    answer_lengths: np.ndarray | None


def make_prompt_batch(
    examples: Sequence[Mapping[str, Any]],
    *,
    template: TemplateConfig,
    tokenizer: Any,
    answer_field: str | None = "answer",
    prompt_length: int | None = None,
    answer_length: int | None = None,
) -> PromptBatch:
    """Render and tokenize `B` examples.

    Args:
      examples: the batch's examples.
      template: how an example becomes a prompt.
      tokenizer: a `jaxrl_llm.tokenizer` tokenizer.
      answer_field: the field with the reference answer (None: no answer tokens).
      prompt_length: pad prompts to exactly this many tokens (None: the longest prompt); a
        longer prompt is an error naming it.
      answer_length: pad answers to exactly this many tokens (None: the longest answer).

    Returns:
      A `PromptBatch`.

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> b = make_prompt_batch([{"prompt": "12+7=", "answer": "19"}, {"prompt": "3+4=", "answer": "7"}],
      ...                       template=TemplateConfig(), tokenizer=ByteTokenizer(), prompt_length=7)
      >>> b.prompt_mask.sum(axis=1).tolist(), b.answer_tokens.tolist()
      ([6, 5], [[49, 57], [55, 256]])
    """
    if not examples:
        raise ValueError("make_prompt_batch: `examples` is empty.")
    examples = tuple(dict(e) for e in examples)
    prompts = tuple(render_prompt(e, template, tokenizer) for e in examples)
    rows = [tokenizer.encode(p, add_bos=True) for p in prompts]
    empty = [i for i, r in enumerate(rows) if not r]
    if empty:  # nothing to condition on: the sampler and the forwards need a prompt token
        raise DataError(
            f"make_prompt_batch: example {empty[0]}'s prompt {prompts[empty[0]]!r} has no "
            f"tokens ({len(empty)} empty prompt(s))."
        )
    if prompt_length is not None:
        too_long = [i for i, r in enumerate(rows) if len(r) > prompt_length]
        if too_long:
            i = too_long[0]
            raise DataError(
                f"make_prompt_batch: prompt {prompts[i]!r} has {len(rows[i])} tokens, more than "
                f"prompt_length={prompt_length} ({len(too_long)} prompt(s) too long)."
            )
    tokens, mask = tokenizer.batch_encode(
        list(prompts), padding_side="left", max_length=prompt_length
    )
    answer_tokens = answer_lengths = None
    if answer_field is not None:
        missing = [i for i, e in enumerate(examples) if answer_field not in e]
        if missing:
            raise DataError(
                f"make_prompt_batch: example {missing[0]} has no answer field {answer_field!r} "
                f"(it has: {', '.join(examples[missing[0]])})."
            )
        answers = [str(e[answer_field]) for e in examples]
        answer_rows = [tokenizer.encode(a, add_bos=False) for a in answers]
        if answer_length is not None and max(len(r) for r in answer_rows) > answer_length:
            raise DataError(
                f"make_prompt_batch: an answer is longer than answer_length={answer_length} tokens."
            )
        answer_tokens, answer_mask = tokenizer.batch_encode(
            answers, padding_side="right", max_length=answer_length, add_bos=False
        )
        answer_lengths = answer_mask.sum(axis=1).astype(np.int32)
    return PromptBatch(examples, prompts, tokens, mask, answer_tokens, answer_lengths)


def group_fields(examples: Sequence[Mapping[str, Any]], group_size: int) -> dict[str, list[Any]]:
    """Each field as a list over the `B·G` completions (example `b` repeated `G` times).

    Fields missing from some examples are left out (a reward function that needs one then
    names it as missing).

    Examples:
      >>> group_fields([{"answer": "2"}, {"answer": "5", "id": 1}], 2)
      {'answer': ['2', '2', '5', '5']}
    """
    if group_size < 1:
        raise ValueError(f"group_fields: `group_size` must be >= 1, got {group_size}.")
    common = [k for k in examples[0] if all(k in e for e in examples)] if examples else []
    return {k: [e[k] for e in examples for _ in range(group_size)] for k in common}
