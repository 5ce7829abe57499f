"""One call for the training loop: sampled tokens of a prompt batch → `RewardScores`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.data.batch import group_fields
from jaxrl_llm.rewards.config import RewardConfig
from jaxrl_llm.rewards.decode import decode_completions
from jaxrl_llm.rewards.guard import RewardScores, score_rewards
from jaxrl_llm.rewards.registry import RewardFunction


def score_completions(
    functions: Sequence[RewardFunction],
    config: RewardConfig,
    *,
    examples: Sequence[Mapping[str, Any]],
    prompts: Sequence[str],
    completion_tokens: Any,
    completion_mask: Any,
    tokenizer: Any,
    group_size: int,
    stop_ids: int | Sequence[int] | None = None,
) -> RewardScores:
    """Decode `B·G` completions and score them with the configured failure policy.

    Row `n = b·G + g` is sample `g` of prompt `b` (the sampler's layout). Each reward function
    receives the prompt text, the decoded completion (`decode_completions`), every field of
    its example, and `completion_lengths` (the completion's token count, stop token included).

    Args:
      functions: `config.resolve()`, resolved once outside the loop.
      config: the `RewardConfig` (failure policy, timeout, isolation).
      examples: the `B` examples of the prompt batch.
      prompts: their `B` rendered prompts (`PromptBatch.prompts`).
      completion_tokens: `[B·G, T]` int.
      completion_mask: `[B·G, T]` bool / {0,1}.
      tokenizer: the tokenizer the prompts were encoded with.
      group_size: `G`.
      stop_ids: the sampler's stop token id(s): each completion is read up to the first of
        them (`decode_completions`); default the tokenizer's EOS.

    Returns:
      `RewardScores(rewards[B·G, K], valid[B·G], failures, metrics, failed[B·G, K])`.

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> config = RewardConfig()
      >>> tokens = np.array([[50, 258], [51, 258]])
      >>> scores = score_completions(config.resolve(), config, examples=[{"answer": "2"}],
      ...     prompts=["1+1="], completion_tokens=tokens, completion_mask=np.ones((2, 2), bool),
      ...     tokenizer=ByteTokenizer(), group_size=2)
      >>> scores.rewards[:, 0].tolist()
      [1.0, 0.0]
    """
    mask = np.asarray(completion_mask)
    n = len(examples) * group_size
    if len(prompts) != len(examples) or mask.ndim != 2 or mask.shape[0] != n:
        raise ValueError(
            f"score_completions: expected {len(examples)} prompts and [B·G = {n}, T] completions "
            f"for {len(examples)} examples and group_size={group_size}, got {len(prompts)} prompts "
            f"and a mask of shape {mask.shape}."
        )
    texts = decode_completions(tokenizer, completion_tokens, mask, stop_ids=stop_ids)
    repeated = [p for p in prompts for _ in range(group_size)]
    fields = group_fields(examples, group_size)
    if "completion_lengths" in fields:  # it would be replaced without a word
        raise ValueError(
            "score_completions: the examples have a field 'completion_lengths', the name under "
            "which reward functions receive the completions' token counts; rename the field."
        )
    fields["completion_lengths"] = (mask > 0).sum(axis=1).tolist()
    return score_rewards(
        functions,
        repeated,
        texts,
        fields,
        group_size=group_size,
        on_failure=config.on_failure,
        failure_score=config.failure_score,
        timeout_s=config.timeout_s,
        isolate=config.isolate,
    )
