"""Deterministic, resumable batch order over a dataset of `M` examples.

The order is a pure function of `(seed, epoch)`: epoch `e` visits the examples in the
permutation `π_e = permutation(M)` of `np.random.default_rng([seed, e])` (or `0…M−1` without
shuffling). The iterator's whole state is `IteratorState(seed, epoch, position)`: the next
batch is `π_epoch[position : position + B]`, continuing into `π_{epoch+1}` when an epoch runs
out, so every batch is full. The state is three integers: save it in a checkpoint
(`state._asdict()`, or as a pytree: it is a NamedTuple) and restore it to continue exactly
where the run stopped.

Multi-host: every process computes the same global batch from the same state and keeps its
own contiguous slice (`host_slice`), so no process needs to talk to another about data.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np


class IteratorState(NamedTuple):
    """Where an iteration stands: `seed`, `epoch`, `position` within the epoch's order.

    Examples:
      >>> state = IteratorState(seed=0, epoch=0, position=0)
      >>> IteratorState.from_dict(state._asdict()) == state
      True
    """

    seed: int
    epoch: int
    position: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IteratorState:
        """The state saved by `state._asdict()` (values may be NumPy / JAX scalars)."""
        if set(data) != set(cls._fields):
            raise ValueError(
                f"IteratorState.from_dict: expected keys {', '.join(cls._fields)}, got "
                f"{', '.join(map(str, data)) or 'none'}."
            )
        values = {}
        for key in cls._fields:
            value = data[key]
            try:
                as_int = int(value)
            except (TypeError, ValueError):
                raise ValueError(
                    f"IteratorState.from_dict: `{key}` must be an integer, got {value!r}."
                ) from None
            if as_int != value or as_int < 0:
                raise ValueError(
                    f"IteratorState.from_dict: `{key}` must be an integer >= 0, got {value!r}."
                )
            values[key] = as_int
        return cls(**values)


def epoch_order(seed: int, epoch: int, num_examples: int, *, shuffle: bool = True) -> np.ndarray:
    """The order `π_epoch` in which epoch `epoch` visits the `num_examples` examples: a
    read-only array, cached (a run asks for its epoch's order at every step).

    Examples:
      >>> epoch_order(0, 0, 5).tolist(), epoch_order(0, 0, 5, shuffle=False).tolist()
      ([2, 4, 3, 0, 1], [0, 1, 2, 3, 4])
    """
    return _epoch_order(int(seed), int(epoch), int(num_examples), bool(shuffle))


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, epoch: int, num_examples: int, shuffle: bool) -> np.ndarray:
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(num_examples)
    else:
        order = np.arange(num_examples)
    order.flags.writeable = False
    return order


def next_batch(
    state: IteratorState, *, num_examples: int, batch_size: int, shuffle: bool = True
) -> tuple[np.ndarray, IteratorState]:
    """The indices of the next global batch and the state after it.

    Args:
      state: where the iteration stands.
      num_examples: `M`, the dataset's size (must be the size the state was made with).
      batch_size: the global batch size `B` (prompts per batch).
      shuffle: a fresh seeded permutation per epoch (False: file order every epoch).

    Returns:
      `(indices[B] int64, next_state)`.

    Examples:
      >>> state = IteratorState(seed=0, epoch=0, position=0)
      >>> idx, state = next_batch(state, num_examples=5, batch_size=3)
      >>> idx.tolist(), state
      ([2, 4, 3], IteratorState(seed=0, epoch=0, position=3))
      >>> idx, state = next_batch(state, num_examples=5, batch_size=3)
      >>> idx.tolist(), state
      ([0, 1, 1], IteratorState(seed=0, epoch=1, position=1))
    """
    if num_examples < 1:
        raise ValueError(f"next_batch: `num_examples` must be >= 1, got {num_examples}.")
    if batch_size < 1:
        raise ValueError(f"next_batch: `batch_size` must be >= 1, got {batch_size}.")
    if not 0 <= state.position < num_examples:
        raise ValueError(
            f"next_batch: state position {state.position} is outside the dataset of "
            f"{num_examples} examples; was the state saved with a different dataset?"
        )
    seed, epoch, position = state
    parts = []
    remaining = batch_size
    while remaining:
        order = epoch_order(seed, epoch, num_examples, shuffle=shuffle)
        take = order[position : position + remaining]
        parts.append(take)
        remaining -= len(take)
        position += len(take)
        if position == num_examples:
            epoch, position = epoch + 1, 0
    return np.concatenate(parts), IteratorState(seed, epoch, position)


def host_slice(
    indices: np.ndarray, *, process_index: int | None = None, process_count: int | None = None
) -> np.ndarray:
    """This process's contiguous share of a global batch: rows `[i·B/P, (i+1)·B/P)`.

    Defaults to `jax.process_index()` / `jax.process_count()`.

    Examples:
      >>> host_slice(np.arange(8), process_index=1, process_count=4).tolist()
      [2, 3]
    """
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    total = len(indices)
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(
            f"host_slice: need 0 <= process_index < process_count, got {process_index} and "
            f"{process_count}."
        )
    if total % process_count:
        raise ValueError(
            f"host_slice: the global batch of {total} must divide evenly over {process_count} "
            "processes."
        )
    share = total // process_count
    return indices[process_index * share : (process_index + 1) * share]


def eval_batches(num_examples: int, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every example once, in order, in batches of a fixed size (for a compiled sampler).

    The last batch is padded by repeating example 0; its `valid[B]` mask is False there.

    Examples:
      >>> [(i.tolist(), v.tolist()) for i, v in eval_batches(5, 2)]
      [([0, 1], [True, True]), ([2, 3], [True, True]), ([4, 0], [True, False])]
    """
    if num_examples < 1 or batch_size < 1:
        raise ValueError(
            f"eval_batches: `num_examples` and `batch_size` must be >= 1, got {num_examples} "
            f"and {batch_size}."
        )
    batches = []
    for start in range(0, num_examples, batch_size):
        idx = np.arange(start, min(start + batch_size, num_examples))
        valid = np.ones(batch_size, bool)
        valid[len(idx) :] = False
        batches.append((np.concatenate([idx, np.zeros(batch_size - len(idx), idx.dtype)]), valid))
    return batches
