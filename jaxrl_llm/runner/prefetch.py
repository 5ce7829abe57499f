"""The next step's host batch, prepared on a background thread while the device runs this one.

A supervised step spends part of its time on the host: drawing the next indices, tokenizing
and padding the examples, cutting or packing the rows (NumPy only). Run one after the other,
that host work and the device's update never overlap. `BatchPrefetch` starts the next step's
preparation on a thread right after this step's update is dispatched, so it runs while the
main thread waits for the update's metrics (JAX releases the GIL while it waits).

The preparation is a pure function of the data iterator's state (`IteratorState`, a tuple of
ints), so a prefetched batch is used only for the state it was started from; any other state
(the first step, a resume, a state the loop did not expect) is prepared on the spot, and the
batches are the same either way. An error raised while preparing surfaces in the step that
asks for the batch, as it would without the thread.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Hashable
from typing import Any


class BatchPrefetch:
    """One batch prepared ahead, keyed by the state it is prepared from.

    Args:
      prepare: `key -> batch`, a pure function of a hashable key (host work only: it runs on a
        background thread and must not dispatch device work).

    Examples:
      >>> calls = []
      >>> prefetch = BatchPrefetch(lambda k: calls.append(k) or k * 10)
      >>> prefetch.take(1)  # nothing started: prepared on the spot
      10
      >>> prefetch.start(2)
      >>> prefetch.take(2), calls
      (20, [1, 2])
      >>> prefetch.start(3)
      >>> prefetch.take(4)  # not the state it started from: prepared on the spot
      40
      >>> prefetch.close()
    """

    def __init__(self, prepare: Callable[[Hashable], Any]) -> None:
        self._prepare = prepare
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prefetch")
        self._key: Hashable | None = None
        self._future: concurrent.futures.Future | None = None

    def start(self, key: Hashable) -> None:
        """Begin preparing the batch of `key` on the background thread."""
        self._key, self._future = key, self._pool.submit(self._prepare, key)

    def take(self, key: Hashable) -> Any:
        """The batch of `key`: the prefetched one when it was started from an equal key (waiting
        for it, and re-raising its error), else prepared now on this thread."""
        future, started = self._future, self._key
        self._key = self._future = None
        if future is not None and started == key:
            return future.result()
        if future is not None:
            future.cancel()
        return self._prepare(key)

    def close(self) -> None:
        """Drop a batch still waiting to be prepared and release the thread."""
        self._key = self._future = None
        self._pool.shutdown(wait=False, cancel_futures=True)
