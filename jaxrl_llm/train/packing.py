"""Sequence packing: several supervised sequences per row instead of one padded row each.

A padded `SequenceBatch` spends `N · S` token slots on `Σ_n len_n` real tokens. Packing moves
each row's real tokens (prompt and completion, without padding) into rows of `length` slots,
several per row, chosen by best-fit decreasing (TRL's default `packing_strategy="bfd"`): the
sequences in order of decreasing length, each into the open row with the least room that still
holds it, a new row when none does. A sequence is never split across rows.

The packed batch (layout in `jaxrl_llm.train.batch`) carries `segment_ids`: positions restart at
0 in each sequence and attention stays inside it (`Decoder.hidden_states(segment_ids=)`), so each
sequence's log-probs are those of its padded row, and `losses.aggregate(segment_ids=)` counts the
sequences rather than the rows: every aggregation mode gives the loss and the gradient of the
padded batch, up to float rounding (`tests/train/test_packing.py`). The rows' count is chosen by
the caller (the runner rounds it up to a power-of-two multiple of what the update needs, so
that a run compiles a few shapes at most).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from jaxrl_llm.train.batch import SequenceBatch, check_sequence_batch


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of item indices: best-fit decreasing (module docstring), items of equal length in
    index order, each bin's items in index order.

    Raises:
      ValueError: an item longer than `capacity`, or a capacity below 1.

    Examples:
      >>> best_fit_decreasing([3, 5, 2, 4, 1], capacity=6)
      [[1, 4], [2, 3], [0]]
    """
    if capacity < 1:
        raise ValueError(f"best_fit_decreasing: `capacity` must be >= 1, got {capacity}.")
    lengths = [int(n) for n in lengths]
    too_long = [i for i, n in enumerate(lengths) if n > capacity]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"best_fit_decreasing: item {i} has length {lengths[i]}, more than the capacity "
            f"{capacity} of a row ({len(too_long)} such items)."
        )
    bins: list[list[int]] = []
    open_rows: list[tuple[int, int]] = []  # (room, bin), sorted: the tightest fit is a bisection
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        k = bisect.bisect_left(open_rows, (lengths[i], -1))
        if k < len(open_rows):
            room, b = open_rows.pop(k)
            bins[b].append(i)
        else:
            room, b = capacity, len(bins)
            bins.append([i])
        bisect.insort(open_rows, (room - lengths[i], b))
    return [sorted(b) for b in bins]


def pack_batch(
    batch: SequenceBatch,
    *,
    length: int | None = None,
    num_rows: int | None = None,
    pad_id: int = 0,
) -> SequenceBatch:
    """Pack the rows of a padded `SequenceBatch` into rows of `length` slots (host NumPy).

    Each row's real tokens (`attention_mask = 1`, in order) become one sequence; its targets are
    the completion tokens the `completion_mask` marks. Packed row `r` holds sequences `1, 2, …`
    back to back from slot 0, then padding (`pad_id`, segment 0, no target).

    Args:
      batch: a padded batch (prompt left-padded to `P`, completion right-padded to `T`), not
        already packed.
      length: slots per packed row (None: `S`, the padded rows' length, which always fits).
      num_rows: rows of the result (None: as many as the packing needs); extra rows are all
        padding, which no loss or count sees.
      pad_id: the token id of empty slots.

    Returns:
      A packed `SequenceBatch`: `tokens[R, length]`, `attention_mask = segment_ids > 0`,
      `completion_mask[R, length − 1]` (`[r, t]` marks the target `tokens[r, t + 1]`) and
      `segment_ids[R, length]` int32.

    Raises:
      ValueError: a batch that is already packed, a target on a padding slot, or on the first
        token of a row, a sequence longer than `length`, or more rows needed than `num_rows`.

    Examples:
      >>> b = SequenceBatch(np.array([[0, 5, 6, 7, 0], [8, 9, 1, 2, 3]]),
      ...                   np.array([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
      ...                   np.array([[1, 0], [1, 1]]))
      >>> p = pack_batch(b, length=8)
      >>> p.tokens.tolist(), p.segment_ids.tolist()
      ([[5, 6, 7, 8, 9, 1, 2, 3]], [[1, 1, 1, 2, 2, 2, 2, 2]])
      >>> p.completion_mask.tolist()  # [r, t] marks tokens[r, t + 1]: 7 (row 0), 2 and 3 (row 1)
      [[0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]]
    """
    check_sequence_batch(batch, where="pack_batch")
    if batch.segment_ids is not None:
        raise ValueError("pack_batch: the batch is already packed (`segment_ids` is set).")
    tokens = np.asarray(batch.tokens)
    real = np.asarray(batch.attention_mask) > 0
    N, S = tokens.shape
    T = np.asarray(batch.completion_mask).shape[1]
    targets = np.zeros((N, S), bool)
    targets[:, S - T :] = np.asarray(batch.completion_mask) > 0
    if np.any(targets & ~real):
        row = int(np.argmax(np.any(targets & ~real, axis=1)))
        raise ValueError(
            f"pack_batch: row {row} has a completion target on a padding slot "
            "(`completion_mask` 1 where `attention_mask` is 0)."
        )
    sequences = [tokens[n, real[n]] for n in range(N)]
    flags = [targets[n, real[n]] for n in range(N)]
    starts = [n for n in range(N) if len(flags[n]) and flags[n][0]]
    if starts:
        raise ValueError(
            f"pack_batch: row {starts[0]}'s first real token is a completion target, but no "
            "state predicts the first token of a sequence."
        )
    length = S if length is None else int(length)
    try:
        bins = best_fit_decreasing([len(s) for s in sequences], length)
    except ValueError as err:
        raise ValueError(f"pack_batch: `length` {length}: {err}") from None
    rows = len(bins) if num_rows is None else int(num_rows)
    if len(bins) > rows:
        raise ValueError(
            f"pack_batch: the {N} sequences need {len(bins)} rows of {length} slots, more than "
            f"num_rows = {rows}."
        )
    out_tokens = np.full((rows, length), pad_id, tokens.dtype)
    out_segments = np.zeros((rows, length), np.int32)
    out_targets = np.zeros((rows, length), np.float32)
    for r, members in enumerate(bins):
        start = 0
        for segment, n in enumerate(members, start=1):
            end = start + len(sequences[n])
            out_tokens[r, start:end] = sequences[n]
            out_segments[r, start:end] = segment
            out_targets[r, start:end] = flags[n]
            start = end
    return SequenceBatch(
        tokens=out_tokens,
        attention_mask=(out_segments > 0).astype(np.int32),
        completion_mask=out_targets[:, 1:],
        segment_ids=out_segments,
    )
