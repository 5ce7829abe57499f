"""The reference's log-probs computed once before training (`precompute_reference`): the same
values as the per-step forward up to float rounding, the same training, in the library's
`train_preference` and in the runner, and the refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import losses
from jaxrl_llm.config import ConfigError
from jaxrl_llm.data import (
    ArithmeticConfig,
    PreferenceDataConfig,
    arithmetic_preference_records,
    load_preference_data,
    make_preference_batch,
)
from jaxrl_llm.runner import load_run_config, prepare_run
from jaxrl_llm.tokenizer import ByteTokenizer
from jaxrl_llm.train import (
    OptimConfig,
    PreferenceConfig,
    make_logprob_fn,
    precompute_reference_logprobs,
    prepare_preference_batch,
    reference_logprobs,
    split_models,
    train_preference,
)
from tests.runner.helpers import CONFIGS, PREFERENCE, records
from tests.train.helpers import tiny_policy

TOKENIZER = ByteTokenizer()
DATA = PreferenceDataConfig(bucket_minimum=4)
RECORDS = arithmetic_preference_records(ArithmeticConfig(max_digits=3, train_size=7), seed=2)


def _examples():
    examples, _, _ = load_preference_data(RECORDS, tokenizer=TOKENIZER, config=DATA)
    return examples


@pytest.mark.parametrize("config", [PreferenceConfig(), PreferenceConfig(ld_alpha=0.5)])
def test_the_table_equals_the_reference_forward_of_each_pair_alone(config):
    """7 examples in batches of 3 (the last one filled with repeats), longest first: every
    example's sums against a forward of a batch that holds it alone (other padding)."""
    graphs, params, frozen = split_models(tiny_policy(2, vocab=TOKENIZER.vocab_size, layers=1))
    fn = make_logprob_fn(graphs.policy)
    examples = _examples()
    kw = dict(logprob_fn=fn, ref_params=params["policy"], frozen=frozen["policy"])
    chosen, rejected = precompute_reference_logprobs(
        config, examples, **kw, pad_id=TOKENIZER.pad_id, data_config=DATA, batch_size=3
    )
    assert chosen.shape == rejected.shape == (7,) and chosen.dtype == np.float32
    for i, example in enumerate(examples):
        alone = jax.tree.map(
            jnp.asarray, make_preference_batch([example], pad_id=TOKENIZER.pad_id, config=DATA)
        )
        c, r = reference_logprobs(**kw, batch=alone, ld_alpha=config.ld_alpha)
        np.testing.assert_allclose(chosen[i], c[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(rejected[i], r[0], rtol=1e-5, atol=1e-5)
    assert len(set(chosen.tolist())) == 7 and chosen.max() < -1.0


def test_prepare_keeps_the_reference_log_probs_and_the_shift_a_batch_carries():
    graphs, params, frozen = split_models(tiny_policy(2, vocab=TOKENIZER.vocab_size, layers=1))
    batch = make_preference_batch(_examples()[:2], pad_id=TOKENIZER.pad_id, config=DATA)
    given = batch._replace(
        ref_chosen_logp=np.array([-3.0, -4.0], np.float32),
        ref_rejected_logp=np.array([-5.0, -6.0], np.float32),
    )
    out, _ = prepare_preference_batch(
        PreferenceConfig(),
        given,
        logprob_fn=make_logprob_fn(graphs.policy),
        policy_params=params["policy"],
        ref_params=None,  # never read
        frozen=frozen["policy"],
    )
    assert out.ref_chosen_logp.tolist() == [-3.0, -4.0]
    assert out.ref_rejected_logp.tolist() == [-5.0, -6.0]
    # BCO: a batch with its shift (an evaluation) keeps it, and the moments do not move
    moments = losses.running_moments_update(
        losses.init_running_moments(), jnp.array([0.5, 1.5]), jnp.ones(2)
    )
    shifted = given._replace(reward_shift=np.full(2, 0.25, np.float32))
    out, after = prepare_preference_batch(
        PreferenceConfig(loss="bco"),
        shifted,
        logprob_fn=make_logprob_fn(graphs.policy),
        policy_params=params["policy"],
        ref_params=None,
        frozen=frozen["policy"],
        reward_moments=moments,
    )
    assert out.reward_shift.tolist() == [0.25, 0.25]
    assert after is moments


@pytest.mark.parametrize("loss", ["dpo", "bco"])
def test_train_preference_trains_as_with_the_per_step_reference(loss):
    runs = {}
    for precompute in (False, True):
        config = PreferenceConfig(loss=loss, beta=0.5, precompute_reference=precompute)
        policy = tiny_policy(4, vocab=TOKENIZER.vocab_size, layers=1)
        model, history = train_preference(
            policy,
            TOKENIZER,
            RECORDS,
            config,
            OptimConfig(learning_rate=0.01),
            steps=4,  # two epochs of 7 examples in batches of 3
            batch_size=3,
            data_config=DATA,
        )
        runs[precompute] = (jax.tree.leaves(jax.tree.map(np.asarray, model)), history)
    (params, history), (params_pre, history_pre) = runs[False], runs[True]
    for ours, theirs in zip(history_pre, history, strict=True):
        for key, value in theirs.items():
            np.testing.assert_allclose(ours[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
    for a, b in zip(params_pre, params, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert history[-1]["pref/margin"] != history[0]["pref/margin"]


def _run(run_dir, *extra):
    config = load_run_config(
        str(CONFIGS / "dpo.yaml"),
        [*PREFERENCE, "train.eval_every=2", "train.eval_prompts=4", *extra],
        run_dir=run_dir,
    )
    return config


def test_a_runner_dpo_run_with_the_table_trains_and_evaluates_as_without(tmp_path):
    from jaxrl_llm.cli import main

    plain, pre = tmp_path / "plain", tmp_path / "pre"
    for run_dir, extra in ((plain, []), (pre, ["preference.precompute_reference=true"])):
        overrides = [*PREFERENCE, "train.eval_every=2", "train.eval_prompts=4", *extra]
        assert (
            main(["train", str(CONFIGS / "dpo.yaml"), *overrides, "--run-dir", str(run_dir)]) == 0
        )
    ours, theirs = records(pre), records(plain)
    assert len(ours) == len(theirs) and any(r.get("eval/pref/accuracy") is not None for r in ours)
    for a, b in zip(ours, theirs, strict=True):
        for key, value in b.items():
            timing = key == "elapsed" or key.startswith(("time/", "perf/"))
            if isinstance(value, float) and not timing:
                np.testing.assert_allclose(a[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
    # resuming rebuilds the table from the initial policy, before the checkpoint is restored
    prepared = prepare_run(_run(pre, "preference.precompute_reference=true"), resume=True)
    prepared.checkpointer.close()
    ctx = prepared.context
    assert int(prepared.state.step) == 2
    assert ctx.reference is None  # no copy of the reference's parameters
    assert {k: len(v[0]) for k, v in ctx.reference_logprobs.items()} == {"train": 32, "eval": 4}


def test_refusals_name_the_conflict():
    with pytest.raises(ValueError, match="loss 'kto' scores mismatched pairs"):
        PreferenceConfig(loss="kto", precompute_reference=True)
    with pytest.raises(ValueError, match="loss 'dpo' with reference_free reads no reference"):
        PreferenceConfig(reference_free=True, precompute_reference=True)
    sync = "train.reference_sync={every: 1, alpha: 0.5}"
    with pytest.raises(ConfigError, match="cannot be computed once before it"):
        _run("/tmp/unused", "preference.precompute_reference=true", sync)
