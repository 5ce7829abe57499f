"""A supervised run prepares each next batch on a thread (`runner.prefetch`) and trains exactly as
one that prepares it in the step; the prefetch keys its batch by the data position."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_llm.runner import load_run_config, loop, prepare_run
from jaxrl_llm.runner.prefetch import BatchPrefetch
from tests.runner.helpers import CONFIGS
from tests.runner.test_trim_completions import RUN


def test_an_error_while_preparing_surfaces_in_the_step_that_takes_the_batch():
    def prepare(key):
        if key == 2:
            raise ValueError("bad example at 2")
        return key

    prefetch = BatchPrefetch(prepare)
    prefetch.start(2)
    with pytest.raises(ValueError, match="bad example at 2"):
        prefetch.take(2)
    assert prefetch.take(3) == 3  # the failed batch is gone; the next one is prepared
    prefetch.close()


def test_prefetched_sft_steps_equal_steps_that_prepare_their_own_batch(tmp_path):
    def host(state, data, metrics):  # the update donates its state: read it before the next
        return [np.asarray(leaf) for leaf in jax.tree.leaves(state.params)], data, metrics

    runs = {}
    for form in ("in_step", "prefetched"):
        config = load_run_config(str(CONFIGS / "sft.yaml"), RUN, run_dir=tmp_path / form)
        prepared = prepare_run(config)
        prepared.checkpointer.close()
        ctx, state, data = prepared.context, prepared.state, prepared.data
        steps = []
        if form == "in_step":
            for step in (1, 2):
                state, data, metrics = loop._sft_step(ctx, state, data, step)
                steps.append(host(state, data, metrics))
        else:
            results = loop._step_results(ctx, loop._sft_step, state, data, 0, 2)
            steps = [host(*result[1:4]) for result in results]
        runs[form] = steps
    for (params, data, metrics), (params_p, data_p, metrics_p) in zip(
        runs["in_step"], runs["prefetched"], strict=True
    ):
        assert data == data_p
        assert metrics["sft/nll"] == metrics_p["sft/nll"]
        for a, b in zip(params, params_p, strict=True):
            np.testing.assert_array_equal(a, b)
