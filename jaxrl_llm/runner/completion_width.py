"""Completions trimmed to the batch's longest before a step's forwards and update.

The sampler returns `T = sampling.max_new_tokens` completion slots per row whatever the rows'
lengths: a row that stopped early (a stop token or a stop string) is padding after its stop.
The old-policy, reference and value forwards and the update then pay for `P + T` token slots
per row. With `train.trim_completions` (on by default) the step-by-step loop cuts the batch to

    W = min(T, next power of two >= max(longest completion of the batch, train.trim_minimum))

completion slots first (`completion_width`, `trim_collected`), so a batch whose rows all
stopped within 40 of 256 tokens runs 64. Every slot cut is padding in every row, so the
log-probs, advantages, losses and gradients are those of the full width up to float rounding
(`tests/runner/test_trim_completions.py`): the aggregation modes count the completion mask,
except `seq_mean_token_sum_norm`, whose constant `C` defaults to the width. For it the update
reads `norm_length = T` (`RunConfig.update_objective`), and a run whose `C` cannot be fixed
(a critic aggregated that way, or a policy loss without `norm_length`) keeps the full width
(`RunConfig.trims_completions`). The supervised steps (an `sft:` run, unless packed or
aggregated with `seq_mean_token_sum_norm`, and an unpacked warm start) cut their (prompt,
answer) batches to the longest answer + EOS the same way (`trim_to_longest`). Powers of two
bound the shapes a run compiles: each program at most `log2(T / trim_minimum) + 2` times.
TRL pads each batch to its longest completion the same way; the fully compiled iteration
(`train.compiled_iterations`) keeps its fixed width.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxrl_llm.runner.rollout import Collected
from jaxrl_llm.sampler.buckets import bucket_length
from jaxrl_llm.train import SequenceBatch


def completion_width(lengths: Sequence[int] | np.ndarray, *, max_width: int, minimum: int) -> int:
    """The completion slots `W` the step keeps (module docstring).

    Args:
      lengths: `[N]` the batch's completion lengths (stop token included; 0 for an empty row).
      max_width: `T`, the sampler's completion slots.
      minimum: the smallest width a batch is cut to (`train.trim_minimum`).

    Raises:
      ValueError: a length outside `[0, max_width]`, or `max_width` / `minimum` below 1.

    Examples:
      >>> completion_width([3, 40, 17], max_width=256, minimum=16)
      64
      >>> completion_width([3, 5], max_width=256, minimum=16), completion_width([0], max_width=8, minimum=16)
      (16, 8)
      >>> completion_width([200], max_width=256, minimum=16)
      256
    """
    for name, value in (("max_width", max_width), ("minimum", minimum)):
        if value < 1:
            raise ValueError(f"completion_width: `{name}` must be >= 1, got {value}.")
    lengths = np.asarray(lengths)
    if lengths.size and (lengths.min() < 0 or lengths.max() > max_width):
        raise ValueError(
            f"completion_width: lengths must lie in [0, {max_width}], got "
            f"[{lengths.min()}, {lengths.max()}]."
        )
    longest = int(lengths.max()) if lengths.size else 0
    return min(max_width, bucket_length(max(longest, 1), minimum=minimum))


def trim_sequences(batch: SequenceBatch, width: int) -> SequenceBatch:
    """`batch` with its completions cut to their first `width` slots: tokens and attention mask
    `[N, P + width]`, completion mask `[N, width]`. Returns `batch` itself at the full width.

    Raises:
      ValueError: `width` outside `[1, T]`.

    Examples:
      >>> import numpy as np
      >>> b = SequenceBatch(np.arange(5)[None], np.ones((1, 5)), np.array([[1.0, 0.0, 0.0]]))
      >>> cut = trim_sequences(b, 1)
      >>> cut.tokens.tolist(), cut.completion_mask.tolist()
      ([[0, 1, 2]], [[1.0]])
    """
    T = batch.completion_mask.shape[1]
    if not 1 <= width <= T:
        raise ValueError(f"trim_sequences: `width` must be in [1, {T}], got {width}.")
    if width == T:
        return batch
    keep = batch.tokens.shape[1] - (T - width)
    return SequenceBatch(
        tokens=batch.tokens[:, :keep],
        attention_mask=batch.attention_mask[:, :keep],
        completion_mask=batch.completion_mask[:, :width],
    )


def trim_to_longest(batch: SequenceBatch, *, minimum: int) -> SequenceBatch:
    """A host (NumPy) `SequenceBatch` cut to `completion_width` of its rows' last target
    (`completion_mask` > 0), as the supervised steps cut theirs (`train.trim_completions`).

    Examples:
      >>> import numpy as np
      >>> mask = np.zeros((2, 64), np.float32); mask[0, :3] = 1; mask[1, 10] = 1
      >>> b = SequenceBatch(np.zeros((2, 70), np.int32), np.ones((2, 70), np.int32), mask)
      >>> trim_to_longest(b, minimum=4).completion_mask.shape  # the last target at slot 10
      (2, 16)
    """
    mask = np.asarray(batch.completion_mask) > 0
    T = mask.shape[1]
    last = np.where(mask.any(axis=1), T - np.argmax(mask[:, ::-1], axis=1), 0)
    return trim_sequences(batch, completion_width(last, max_width=T, minimum=minimum))


def trim_collected(collected: Collected, width: int) -> Collected:
    """`collected` with its completions cut to their first `width` slots: the sequences
    (`trim_sequences`) and the sampler's log-probs `[N, width]`. Returns `collected` itself at
    the full width.

    Raises:
      ValueError: `width` outside `[1, T]`.

    Examples:
      >>> import jax.numpy as jnp
      >>> seqs = SequenceBatch(jnp.ones((1, 5), jnp.int32), jnp.ones((1, 5), jnp.int32),
      ...                      jnp.array([[1.0, 0.0, 0.0]]))
      >>> c = Collected(seqs, jnp.zeros((1, 3)), jnp.zeros(1), None, {})
      >>> t = trim_collected(c, 1)
      >>> t.sequences.tokens.shape, t.sequences.completion_mask.shape, t.sampling_logprobs.shape
      ((1, 3), (1, 1), (1, 1))
    """
    sequences = trim_sequences(collected.sequences, width)
    if sequences is collected.sequences:
        return collected
    logprobs = collected.logprobs
    return collected._replace(
        sequences=sequences,
        sampling_logprobs=collected.sampling_logprobs[:, :width],
        logprobs=None if logprobs is None else logprobs[:, :width],
    )
