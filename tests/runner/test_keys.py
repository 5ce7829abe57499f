"""The run's keys (`jaxrl_llm.runner.keys`) and the programs' lookup (`runner.programs`)."""

from __future__ import annotations

import jax
import numpy as np

from jaxrl_llm.runner import programs
from jaxrl_llm.runner.keys import EVAL_STREAM, SAMPLE_STREAM, fold_in, stream_key
from jaxrl_llm.sampler import SamplingConfig


def _bits(key: jax.Array) -> np.ndarray:
    return np.asarray(jax.random.key_data(key))


def test_compiled_fold_in_gives_the_keys_of_jax_random_fold_in():
    for seed in (0, 1, 2**31 - 1):
        for stream in (SAMPLE_STREAM, EVAL_STREAM):
            root = jax.random.fold_in(jax.random.key(seed), stream)
            np.testing.assert_array_equal(_bits(stream_key(seed, stream)), _bits(root))
            for step in (0, 1, 17, 10**6, 2**31 - 1):
                expected = jax.random.fold_in(root, step)
                np.testing.assert_array_equal(_bits(fold_in(root, step)), _bits(expected))
                refill = jax.random.fold_in(expected, 2)
                np.testing.assert_array_equal(_bits(fold_in(expected, 2)), _bits(refill))


def test_stream_keys_are_made_once_and_differ_by_stream_and_seed():
    assert stream_key(5, SAMPLE_STREAM) is stream_key(5, SAMPLE_STREAM)
    keys = {tuple(_bits(stream_key(s, k))) for s in (0, 1) for k in (SAMPLE_STREAM, EVAL_STREAM)}
    assert len(keys) == 4


def test_program_lookup_by_identity_returns_the_value_keyed_program():
    built = []
    lookup = programs._program_cache(lambda config, group: built.append(config) or object())
    config = SamplingConfig(max_new_tokens=3)
    first = lookup(config, 2)
    assert lookup(config, 2) is first  # the same objects: the identity lookup
    equal = SamplingConfig(max_new_tokens=3)  # another object, equal: the lru_cache's program
    assert equal is not config and lookup(equal, 2) is first
    assert len(built) == 1
    by_keyword = lookup(config, group=2)  # as with lru_cache, a keyword call is its own key
    assert lookup(config, group=2) is by_keyword
    assert lookup(SamplingConfig(max_new_tokens=4), 2) is not first
    assert lookup(config, 3) is not first  # a scalar argument is part of the key by value
    assert len(built) == 4


def test_program_lookup_forgets_its_oldest_identities_beyond_its_size():
    lookup = programs._program_cache(lambda config: object())
    configs = [SamplingConfig(max_new_tokens=t) for t in range(1, programs._CACHE_SIZE + 3)]
    made = [lookup(c) for c in configs]
    assert [lookup(c) for c in configs[-programs._CACHE_SIZE :]] == made[-programs._CACHE_SIZE :]
