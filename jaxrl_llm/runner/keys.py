"""The random keys of a run: one stream per purpose, one key per step, derived without eager ops.

    stream key    fold_in(key(seed), stream)        SAMPLE_STREAM, EVAL_STREAM
    step key      fold_in(stream key, step)         the sampling key of RL step `step`
    refill key    fold_in(step key, refill)         DAPO's refills of one step (refill 0 first)

Each derivation is a few threefry ops. Run eagerly, every one of them is its own dispatch (a
`fold_in` with its argument conversion took ≈ 0.24 ms on a 2-core CPU, a new key ≈ 0.08 ms),
which the step-by-step loop paid three times per step, ≈ 5 % of a tiny model's step. Here the
stream keys are made once per process (`stream_key` is cached: keys are immutable) and
`fold_in` is one compiled program: the same bits as `jax.random.fold_in` (threefry is integer
arithmetic; `tests/runner/test_keys.py`), one dispatch per call.
"""

from __future__ import annotations

import functools

import jax

SAMPLE_STREAM, EVAL_STREAM = 1, 2

fold_in = jax.jit(jax.random.fold_in)
"""`jax.random.fold_in(key, data)` as one compiled call (the same key, bit for bit)."""


@functools.lru_cache(maxsize=64)
def stream_key(seed: int, stream: int) -> jax.Array:
    """`fold_in(key(seed), stream)`: the root key of one stream of a run seeded with `seed`.

    Examples:
      >>> k = stream_key(0, SAMPLE_STREAM)
      >>> k is stream_key(0, SAMPLE_STREAM)  # made once per process
      True
      >>> expected = jax.random.fold_in(jax.random.key(0), SAMPLE_STREAM)
      >>> bool((jax.random.key_data(k) == jax.random.key_data(expected)).all())
      True
    """
    return fold_in(jax.random.key(seed), stream)
