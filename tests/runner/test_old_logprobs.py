"""`algorithm.old_logprobs: sampler`: the old policy's log-probs taken from the sampler instead of
a forward before the update. They are the forward's to float rounding, the forward is skipped,
and a run that reuses its batch (2 epochs) trains as with the forward, in the loop and in the
compiled iteration."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_llm.config import ConfigError
from jaxrl_llm.runner import load_run_config, loop, prepare_run
from jaxrl_llm.runner.compiled import compiled_steps
from jaxrl_llm.runner.keys import SAMPLE_STREAM, stream_key
from jaxrl_llm.runner.programs import logprob_program
from jaxrl_llm.runner.rollout import collect, sampler_old_logprobs
from jaxrl_llm.train import AlgorithmConfig
from tests.runner.helpers import CONFIGS
from tests.runner.test_compiled import IN_GRAPH, STEPS, _comparable, _host

REUSE = ["algorithm.epochs=2", "sampling.num_samples=4", "sampling.max_new_tokens=6"]


def _prepared(run_dir, source, *extra):
    config = load_run_config(
        str(CONFIGS / "grpo.yaml"),
        [*IN_GRAPH, *REUSE, f"algorithm.old_logprobs={source}", *extra],
        run_dir=run_dir,
    )
    prepared = prepare_run(config)
    prepared.checkpointer.close()
    return prepared


def test_the_sampler_log_probs_are_the_forwards_to_rounding(tmp_path):
    prepared = _prepared(tmp_path, "sampler")
    ctx, state = prepared.context, prepared.state
    key = jax.random.fold_in(stream_key(0, SAMPLE_STREAM), 1)
    with jax.set_mesh(ctx.mesh):
        collected, _ = collect(ctx, state, prepared.data, key)
        seqs = collected.sequences
        alg = ctx.config.algorithm
        forward = logprob_program(ctx.graphs.policy, alg.temperature, alg.chunk_size)
        expected = forward(state.params["policy"], state.frozen["policy"], seqs)
    ours = sampler_old_logprobs(seqs, collected.logprobs)
    mask = np.asarray(seqs.completion_mask) > 0
    assert mask.sum() > 8
    np.testing.assert_allclose(np.asarray(ours)[mask], np.asarray(expected)[mask], atol=2e-5)
    assert np.all(np.asarray(ours)[~mask] == 0)
    assert float(np.min(np.asarray(ours)[mask])) < -1.0  # a random policy's log-probs


def _loop(prepared, monkeypatch):
    calls = []
    original = loop.forward_in_row_groups

    def counting(*args, **kw):
        calls.append(1)
        return original(*args, **kw)

    monkeypatch.setattr(loop, "forward_in_row_groups", counting)
    ctx, state, data = prepared.context, prepared.state, prepared.data
    history = []
    for step in range(1, STEPS + 1):
        state, data, metrics = loop._rl_step(ctx, state, data, step)
        history.append(_comparable(metrics))
    return _host(state), history, len(calls)


def test_two_epochs_train_as_with_the_forward_and_skip_it(tmp_path, monkeypatch):
    forward_state, forward_metrics, forward_calls = _loop(
        _prepared(tmp_path / "forward", "forward"), monkeypatch
    )
    state, metrics, calls = _loop(_prepared(tmp_path / "sampler", "sampler"), monkeypatch)
    assert (forward_calls, calls) == (2 * STEPS, STEPS)  # old + reference, reference alone
    for ours, theirs in zip(metrics, forward_metrics, strict=True):
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            np.testing.assert_allclose(ours[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
    assert forward_metrics[0]["adv/std"] > 0
    for a, b in zip(state, forward_state, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    _, compiled_metrics = _compiled(tmp_path / "compiled")
    for ours, theirs in zip(compiled_metrics, metrics, strict=True):
        for key, value in theirs.items():
            np.testing.assert_allclose(ours[key], value, rtol=1e-4, atol=1e-5, err_msg=key)


def _compiled(run_dir):
    prepared = _prepared(run_dir, "sampler", "train.compiled_iterations=2")
    key = stream_key(0, SAMPLE_STREAM)
    out = list(compiled_steps(prepared.context, prepared.state, prepared.data, 0, STEPS, key))
    return _host(out[-1][1]), [_comparable(r[3]) for r in out]


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="`old_logprobs` must be 'forward' or 'sampler'"):
        AlgorithmConfig(old_logprobs="rollout")


def test_a_rollout_correction_of_the_sampler_against_itself_is_refused(tmp_path):
    # with no sampling filter the sampler's old log-probs equal its rollout log-probs: every
    # importance weight would be 1
    correction = ["algorithm.rollout_correction={level: token}"]
    with pytest.raises(ConfigError, match="every weight would be 1; use old_logprobs 'forward'"):
        load_run_config(
            str(CONFIGS / "grpo.yaml"),
            [*IN_GRAPH, *REUSE, "algorithm.old_logprobs=sampler", *correction],
            run_dir=tmp_path,
        )
    for extra in (["algorithm.old_logprobs=forward"], ["sampling.top_k=8"]):
        load_run_config(  # the trainer's forward, or a filter to correct: accepted
            str(CONFIGS / "grpo.yaml"),
            [*IN_GRAPH, *REUSE, "algorithm.old_logprobs=sampler", *correction, *extra],
            run_dir=tmp_path,
        )
