"""Text in, text out: `sample_texts` renders and encodes prompts, samples, and decodes completions.

For quick inspection and evaluation (`jaxrl-llm sample`); training code works on token ids with
`generate` / `sample_tokens` directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxrl_llm.models.decoder import Decoder
from jaxrl_llm.sampler.api import generate


class TextSample(NamedTuple):
    """One sampled completion of prompt `prompt_index` (`sample_index` of `num_samples`).

    `logprob` is the sum of the completion's token log-probs under the policy at the sampling
    temperature (`Rollout.logprobs`, float32 summed in float64).
    """

    prompt_index: int
    sample_index: int
    text: str
    num_tokens: int
    truncated: bool
    logprob: float


def sample_texts(
    model: Decoder,
    tokenizer: Any,
    prompts: Sequence[Any],
    *,
    key: jax.Array,
    max_new_tokens: int,
    num_samples: int = 1,
    stop_tokens: Sequence[int] | None = None,
    stop_strings: Sequence[str] = (),
    **sampling: Any,
) -> list[TextSample]:
    """Sample `num_samples` completions of each prompt text and decode them.

    Prompts go through `tokenizer.render` (the chat template when the tokenizer has one on)
    and `tokenizer.encode`. Stop tokens default to the tokenizer's EOS (plus the model
    config's `eos_token_id`); the stop token is not part of the decoded text, a stop string is
    (the text ends with it: with a subword tokenizer the token that completes it may carry more
    text, which is cut off; `num_tokens` and `logprob` still count that token).

    Args:
      model: a `Decoder`.
      tokenizer: a `jaxrl_llm.tokenizer` tokenizer (`ByteTokenizer` or `HFTokenizer`).
      prompts: prompt strings (or message lists with a chat template).
      key: a PRNG key.
      max_new_tokens: the completion budget.
      num_samples: completions per prompt.
      stop_tokens: an id or ids that end a completion (None: EOS as above).
      stop_strings: texts that end a completion once it contains one (`generate`).
      **sampling: `temperature`, `top_k`, `top_p`, `min_p` (see `generate`).

    Returns:
      `len(prompts) · num_samples` `TextSample`s, prompt-major.

    Examples:
      >>> from flax import nnx
      >>> from jaxrl_llm.models import ModelConfig
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> cfg = ModelConfig(family="qwen3", vocab_size=259, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> out = sample_texts(Decoder(cfg, rngs=nnx.Rngs(0)), ByteTokenizer(), ["hi", "yo"],
      ...                    key=jax.random.key(0), max_new_tokens=4, num_samples=2)
      >>> len(out), out[3].prompt_index, out[3].sample_index, out[3].num_tokens <= 4
      (4, 1, 1, True)
    """
    if stop_tokens is None:
        stops = {tokenizer.eos_id} if tokenizer.eos_id is not None else set()
        eos = model.config.eos_token_id
        stops |= set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))
        stop_tokens = sorted(stops)
    elif isinstance(stop_tokens, int | np.integer):  # one id, as generate takes it
        stop_tokens = [int(stop_tokens)]
    if isinstance(stop_strings, str):  # one string, as generate takes it (not its characters)
        stop_strings = (stop_strings,)
    rows = [tokenizer.encode(tokenizer.render(p)) for p in prompts]
    rollout = generate(
        model,
        rows,
        key=key,
        max_new_tokens=max_new_tokens,
        num_samples=num_samples,
        stop_tokens=stop_tokens,
        pad_id=tokenizer.pad_id,
        stop_strings=stop_strings,
        tokenizer=tokenizer if stop_strings else None,
        **sampling,
    )
    tokens = np.asarray(rollout.completion_tokens)
    lengths = np.asarray(rollout.lengths)
    truncated = np.asarray(rollout.truncated)
    logprobs = np.asarray(rollout.logprobs, np.float64)
    out = []
    for n in range(len(rows) * num_samples):
        ids = tokens[n, : lengths[n]].tolist()
        stopped_on_token = bool(ids) and not truncated[n] and ids[-1] in stop_tokens
        if stopped_on_token:
            ids = ids[:-1]  # the stop token (a stop string stays in the text)
        text = tokenizer.decode(ids)
        if stop_strings and not truncated[n] and not stopped_on_token:
            text = _through_first_stop(text, stop_strings)
        out.append(
            TextSample(
                prompt_index=n // num_samples,
                sample_index=n % num_samples,
                text=text,
                num_tokens=int(lengths[n]),
                truncated=bool(truncated[n]),
                logprob=float(logprobs[n, : lengths[n]].sum()),
            )
        )
    return out


def _through_first_stop(text: str, stop_strings: Sequence[str]) -> str:
    """`text` up to the end of its earliest stop string (the whole text if none occurs).

    Examples:
      >>> _through_first_stop("a answer", ["an", "sw"])
      'a an'
    """
    ends = [i + len(stop) for stop in stop_strings if (i := text.find(stop)) >= 0]
    return text[: min(ends)] if ends else text
