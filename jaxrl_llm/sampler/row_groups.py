"""Row groups: one sampling call split by prompts and run side by side from host threads.

XLA:CPU runs each kernel of a decode step on one core (at 32-64 rows the step's matmuls and
attention reductions are below the size at which its kernels split their work), and the
kernels of one step depend on each other, so one sampler call keeps about one core busy.
PjRt's CPU client runs a call on the thread that makes it. Splitting the `B` prompts into
`g` groups of `B / g` prompts and calling the compiled sampler once per group, each call from
its own host thread, runs the groups on different cores:

    rows of group j = prompts [j·B/g, (j+1)·B/g) × G samples      (rows stay prompt-major)
    row keys        = split(key, N), group j gets its own N/g      (as one call would draw)
    outputs         = concatenation of the groups' rollouts along the rows

Each row's tokens depend only on its row key, its prompt and the weights, so the rollout is
the same as one call over all rows (tested: identical tokens, log-probs equal). On the 2-core
benchmark machine, 2 groups made the sampler 1.35-2.0× faster than one call (docs/sampler.md);
4 groups were slower than 2. The groups compile one program (every group has the same shape).

Where it applies: the CPU backend with one device (a mesh of more than one device already
splits the rows over devices). `row_groups=None` picks `auto_row_groups`; any other backend
uses 1 (accelerators run one call's kernels asynchronously and gain nothing from threads).
Splitting costs ≈ 0.5 ms of thread hand-off per call, more than a call of the tiny benchmark
model at 2 × 4 × 16 takes to gain (1.6 → 2.1 ms), so the automatic choice also keeps
`MIN_GROUP_FLOPS` of work per group (`call_flops`, about 2 · rows · tokens · parameters).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import jax
import numpy as np

MAX_AUTO_GROUPS = 8
"""`auto_row_groups` uses at most this many groups, whatever the core count."""

MIN_GROUP_FLOPS = 1e8
"""`auto_row_groups` gives each group at least this much work (`call_flops`), when told it."""

_pool: tuple[int, ThreadPoolExecutor] | None = None  # (workers, executor), grown on demand
_pool_lock = threading.Lock()
_in_pool = threading.local()  # `active` while a thread runs a group of `map_in_threads`


def cpu_cores() -> int:
    """The CPU cores this process may run on (`sched_getaffinity`, else `os.cpu_count()`).

    Examples:
      >>> cpu_cores() >= 1
      True
    """
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, min(n, at_most)) + 1) if n % d == 0)


def call_flops(params: Any, rows: int, tokens: int) -> float:
    """About the FLOPs of one forward of `rows` sequences of `tokens` tokens: `2 · rows ·
    tokens · (number of parameters in params)` (the matmuls' multiply-adds; embeddings counted
    as if they were matmuls, attention's own work left out: a size estimate, not a cost model).

    Examples:
      >>> call_flops({"w": jax.numpy.ones((10, 10)), "b": jax.numpy.ones(10)}, rows=4, tokens=8)
      7040.0
    """
    count = sum(x.size for x in jax.tree.leaves(params) if hasattr(x, "size"))
    return 2.0 * rows * tokens * count


def auto_row_groups(
    num_prompts: int, *, backend: str | None = None, devices: int = 1, flops: float | None = None
) -> int:
    """Groups for `row_groups=None`: on one CPU device, the largest divisor of `num_prompts`
    that is at most the core count, at most `MAX_AUTO_GROUPS` and (given the call's `flops`)
    leaves each group at least `MIN_GROUP_FLOPS`; 1 anywhere else.

    Args:
      num_prompts: `B`, the prompts of the call.
      backend: the JAX backend the call runs on (None: `jax.default_backend()`).
      devices: devices the call spans (a mesh's size).
      flops: the call's work (`call_flops`); None: not considered.

    Examples:
      >>> auto_row_groups(8, backend="gpu")
      1
      >>> auto_row_groups(7, backend="cpu") in (1, 7)  # a prime splits only into 1 or 7 groups
      True
      >>> auto_row_groups(8, backend="cpu", flops=1e7)  # too little work to split
      1
    """
    backend = jax.default_backend() if backend is None else backend
    if backend != "cpu" or devices != 1:
        return 1
    most = min(cpu_cores(), MAX_AUTO_GROUPS)
    if flops is not None:
        most = min(most, max(1, int(flops // MIN_GROUP_FLOPS)))
    return _largest_divisor(num_prompts, most)


def resolve_row_groups(
    row_groups: int | None, num_prompts: int, *, devices: int = 1, flops: float | None = None
) -> int:
    """The number of groups a call over `num_prompts` prompts runs in.

    Args:
      row_groups: None (auto, `auto_row_groups`) or an int >= 1 that divides `num_prompts`.
      num_prompts: `B`.
      devices: devices the call spans; row groups need one.
      flops: the call's work (`call_flops`), for the automatic choice.

    Raises:
      ValueError: `row_groups` is not an int >= 1, does not divide `num_prompts`, or is more
        than 1 for a call over several devices.

    Examples:
      >>> resolve_row_groups(2, 8)
      2
      >>> resolve_row_groups(3, 8)
      Traceback (most recent call last):
      ...
      ValueError: row_groups: 3 groups do not divide the 8 prompts of the call evenly; use a divisor of 8 (or None for automatic).
    """
    if row_groups is None:
        return auto_row_groups(num_prompts, devices=devices, flops=flops)
    if isinstance(row_groups, bool) or not isinstance(row_groups, int) or row_groups < 1:
        raise ValueError(f"row_groups: must be None or an int >= 1, got {row_groups!r}.")
    if num_prompts % row_groups:
        raise ValueError(
            f"row_groups: {row_groups} groups do not divide the {num_prompts} prompts of the call "
            f"evenly; use a divisor of {num_prompts} (or None for automatic)."
        )
    if row_groups > 1 and devices != 1:
        raise ValueError(
            f"row_groups: {row_groups} groups need a call on one device; this call spans "
            f"{devices} devices (their mesh already splits the rows). Use 1 or None."
        )
    return row_groups


def split_row_keys(key: Any, num_rows: int, groups: int) -> list[jax.Array]:
    """The `N` per-row keys one call would draw (`split(key, N)`), cut into `groups` parts.

    `key` is one PRNG key (typed, or raw uint32 data) or `N` per-row keys.

    Examples:
      >>> parts = split_row_keys(jax.random.key(0), 4, 2)
      >>> [p.shape for p in parts]
      [(2,), (2,)]
      >>> bool((jax.random.key_data(parts[1]) == jax.random.key_data(
      ...     jax.random.split(jax.random.key(0), 4)[2:])).all())
      True
    """
    if not isinstance(key, jax.Array) or not jax.numpy.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.numpy.asarray(key)
        if key.dtype != jax.numpy.uint32:  # as `sample_tokens` says it in one group
            raise ValueError(
                f"sample_tokens: `key` must be a PRNG key (jax.random.key) or raw uint32 key "
                f"data, got dtype {key.dtype}."
            )
        key = jax.random.wrap_key_data(key)
    keys = jax.random.split(key, num_rows) if key.shape == () else key
    if keys.shape != (num_rows,):
        raise ValueError(
            f"split_row_keys: `key` must be one key or {num_rows} per-row keys, got key shape "
            f"{key.shape}."
        )
    impl = jax.random.key_impl(keys)
    data = np.asarray(jax.random.key_data(keys))
    rows = num_rows // groups
    return [
        jax.random.wrap_key_data(data[j * rows : (j + 1) * rows], impl=impl) for j in range(groups)
    ]


def devices_of(tree: Any) -> int:
    """How many devices the arrays of `tree` span together (at least 1).

    Examples:
      >>> devices_of({"w": jax.numpy.ones(3), "n": None, "s": 2.0})
      1
    """
    found = {
        d for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array) for d in leaf.devices()
    }
    return max(1, len(found))


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] < workers:
            executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="jaxrl_llm-rows")
            _pool = (workers, executor)
        return _pool[1]


def _concatenate(*parts: jax.Array) -> jax.Array:
    """Join the groups' `[n, ...]` outputs on the host, placed like the first group's."""
    joined = np.concatenate([np.asarray(p) for p in parts], axis=0)
    return jax.device_put(joined, parts[0].sharding)


def map_in_threads(call: Callable[[int], Any], groups: int) -> list[Any]:
    """`[call(j) for j < groups]`: group 0 on the calling thread, each other group from its own
    thread of the row-group pool; every output is waited for (`jax.block_until_ready`).

    The worker threads enter the caller's mesh (`jax.set_mesh`), which is thread-local; other
    thread-local JAX contexts of the caller are not carried over. A call made from a pool
    thread (a group that itself runs in row groups) runs its groups one after the other on
    that thread: the pool's threads are all busy with the outer groups, so waiting for them
    would never end.

    Examples:
      >>> map_in_threads(lambda j: 10 * j, 3)
      [0, 10, 20]
      >>> map_in_threads(lambda j: map_in_threads(lambda i: 10 * j + i, 2), 2)  # nested
      [[0, 1], [10, 11]]
    """
    if groups == 1 or getattr(_in_pool, "active", False):
        return [jax.block_until_ready(call(j)) for j in range(groups)]
    mesh = jax.sharding.get_mesh()

    def run(j: int) -> Any:
        _in_pool.active = True
        try:
            if mesh.empty:
                return jax.block_until_ready(call(j))
            with jax.set_mesh(mesh):
                return jax.block_until_ready(call(j))
        finally:
            _in_pool.active = False

    futures = [_executor(groups - 1).submit(run, j) for j in range(1, groups)]
    try:
        first = run(0)
    except BaseException:  # the other groups finish before the error propagates
        wait(futures)
        raise
    return [first, *(f.result() for f in futures)]


def call_in_row_groups(call: Callable[[int], Any], groups: int) -> Any:
    """`call(j)` for `j < groups`, each from its own thread; outputs joined along the rows.

    `call(j)` runs group `j` (the caller slices its inputs) and returns a pytree of arrays
    whose leading axis is the group's rows; None leaves stay None. With one group `call(0)`
    runs on the calling thread and its output is returned as is. Threads as in
    `map_in_threads`.

    Examples:
      >>> import jax.numpy as jnp
      >>> out = call_in_row_groups(lambda j: {"rows": jnp.full((2,), j), "none": None}, 3)
      >>> out["rows"].tolist(), out["none"]
      ([0, 0, 1, 1, 2, 2], None)
    """
    if groups == 1:
        return call(0)
    return jax.tree.map(_concatenate, *map_in_threads(call, groups))
