"""Prompt padding and length buckets, so a run compiles a handful of programs, not one per batch.

The compiled sampler is specialised to the padded prompt length `P`. Rounding `P` up to a
bucket (the next power of two, or a multiple of a fixed step) bounds the number of programs a
training run compiles by the number of buckets it meets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def bucket_length(length: int, *, multiple: int | None = None, minimum: int = 16) -> int:
    """The padded prompt length for a longest prompt of `length` tokens.

    `multiple=None`: the next power of two `>= max(length, minimum)`; otherwise the next multiple
    of `multiple` that is `>= max(length, minimum)`.

    Examples:
      >>> bucket_length(5), bucket_length(17), bucket_length(70, multiple=64)
      (16, 32, 128)
    """
    for name, value in (("length", length), ("minimum", minimum)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"bucket_length: `{name}` must be an int >= 1, got {value!r}.")
    if multiple is not None and (
        isinstance(multiple, bool) or not isinstance(multiple, int | np.integer) or multiple < 1
    ):
        raise ValueError(
            f"bucket_length: `multiple` must be None or an int >= 1, got {multiple!r}."
        )
    target = max(int(length), int(minimum))
    if multiple is None:
        return 1 << (target - 1).bit_length()
    return -(-target // multiple) * multiple


def left_pad(
    rows: Sequence[Sequence[int]], *, length: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token-id lists to `length`: `(tokens[B, length] int32, mask[B, length] bool)`.

    Every row must hold 1 to `length` tokens (a prompt needs at least one token: the sampler
    draws the first completion token from the logits of the prompt's last one).

    Examples:
      >>> tokens, mask = left_pad([[5, 6], [7]], length=3, pad_id=0)
      >>> tokens.tolist(), mask.astype(int).tolist()
      ([[0, 5, 6], [0, 0, 7]], [[0, 1, 1], [0, 0, 1]])
    """
    tokens = np.full((len(rows), length), pad_id, np.int32)
    mask = np.zeros((len(rows), length), bool)
    for i, row in enumerate(rows):
        n = len(row)
        if not 1 <= n <= length:
            raise ValueError(
                f"left_pad: prompt {i} has {n} tokens; every prompt needs 1 to {length} tokens."
            )
        tokens[i, length - n :] = np.asarray(row, np.int64)
        mask[i, length - n :] = True
    return tokens, mask
