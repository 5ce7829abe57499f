"""Reward-model runs (`reward_model:`, configs/reward_model.yaml) through `jaxrl-llm train`.

A run on generated arithmetic pairs must take the steps of the library loop
`train.train_reward_model` on the same model, pairs, order and optimizer (every logged metric),
resume bit for bit, score its held-out pairs with the reward model itself (`eval/rm/...`
equal the scores of `train.sequence_scores`), and export a `*ForSequenceClassification`
checkpoint that `fn: reward_model` scores RL completions with.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.cli import main
from jaxrl_llm.config import ConfigError
from jaxrl_llm.data import arithmetic_preference_records, make_preference_batch
from jaxrl_llm.models import ValueModel, from_pretrained
from jaxrl_llm.rewards import reward_model
from jaxrl_llm.runner import load_preference_eval_examples, load_run_config
from jaxrl_llm.tokenizer import ByteTokenizer
from jaxrl_llm.train import sequence_scores, train_reward_model
from jaxrl_llm.train.preference import concat_sequences
from tests.runner.helpers import CONFIGS, PREFERENCE, records, train_records

RM = str(CONFIGS / "reward_model.yaml")
RUN = [*PREFERENCE, "train.steps=4", "train.eval_every=2", "optim.learning_rate=0.05"]


def _initial_model(config):
    return ValueModel(config.model.init, rngs=nnx.Rngs(config.seed))


def _eval_scores(model, config):
    """Mean chosen and rejected scores of the run's held-out pairs (one whole batch)."""
    examples = load_preference_eval_examples(config, ByteTokenizer())
    batch = make_preference_batch(examples, pad_id=0, config=config.preference_data)
    scores = np.asarray(sequence_scores(model, concat_sequences(batch.chosen, batch.rejected)))
    n = len(examples)
    return scores[:n].mean(), scores[n:].mean()


def test_a_reward_model_run_trains_resumes_evaluates_and_exports_a_scorer(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", RM, *RUN, "--run-dir", str(straight)]) == 0
    assert main(["train", RM, *RUN, "train.steps=2", "--run-dir", str(split)]) == 0
    assert main(["train", RM, *RUN, "--resume", "--run-dir", str(split)]) == 0
    steps = train_records(straight)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert train_records(split) == steps  # resumed bit for bit

    # the library loop on the same model, pairs, order and optimizer takes the same steps
    config = load_run_config(RM, RUN, run_dir=str(straight))
    records_ = arithmetic_preference_records(config.data.arithmetic, seed=config.data.seed)
    model, history = train_reward_model(
        _initial_model(config),
        ByteTokenizer(),
        records_,
        config.reward_model,
        config.optim,
        steps=4,
        batch_size=config.train.prompts_per_step,
        seed=config.data.seed,
        data_config=config.preference_data,
    )
    for ours, theirs in zip(steps, history, strict=True):
        for key, value in theirs.items():
            assert ours[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert steps[-1]["loss/center"] > 0  # the config's centring term is on

    # held-out pairs: the logged means are the scores of the model at that step
    evals = [r for r in records(straight) if "eval/rm/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert "eval/accuracy" not in evals[0]  # a reward model does not generate
    chosen, rejected = _eval_scores(_initial_model(config), config)
    assert evals[0]["eval/rm/chosen_mean"] == pytest.approx(chosen, rel=1e-5, abs=1e-6)
    assert evals[0]["eval/rm/rejected_mean"] == pytest.approx(rejected, rel=1e-5, abs=1e-6)
    chosen, rejected = _eval_scores(model, config)
    assert evals[-1]["eval/rm/chosen_mean"] == pytest.approx(chosen, rel=1e-4, abs=1e-5)
    assert evals[-1]["eval/rm/margin"] == pytest.approx(chosen - rejected, rel=1e-3, abs=1e-5)

    # the export is the trained reward model, a scorer for RL and a critic's starting point
    export = straight / "export"
    written = json.loads((export / "config.json").read_text())
    assert written["pad_token_id"] == ByteTokenizer().pad_id  # batches in transformers need it
    loaded = from_pretrained(export, head="value")
    ours, theirs = nnx.state(loaded, nnx.Param), nnx.state(model, nnx.Param)
    for a, b in zip(nnx.to_flat_state(ours), nnx.to_flat_state(theirs), strict=True):
        np.testing.assert_allclose(a[1][...], b[1][...], rtol=1e-5, atol=1e-6, err_msg=str(a[0]))
    score = reward_model(checkpoint=str(export), tokenizer="byte")
    prompt, completion = records_[0]["prompt"], records_[0]["chosen"]
    expected = sequence_scores(model, _pair_sequences(prompt, completion, config))
    assert score([prompt], [completion]) == pytest.approx([float(expected[0])], abs=1e-5)


def _pair_sequences(prompt, completion, config):
    from jaxrl_llm.data import load_preference_data

    record = {"prompt": prompt, "chosen": completion, "rejected": completion + "?"}  # unused
    examples, _, _ = load_preference_data(
        [record], tokenizer=ByteTokenizer(), config=config.preference_data
    )
    return make_preference_batch(examples, pad_id=0, config=config.preference_data).chosen


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["preference={loss: dpo}"], "set exactly one of"),
        (["data.source=parquet:/data/pairs.parquet"], "reward_model runs read preference"),
        (["reward_model.minibatches=0"], "`minibatches` must be an int >= 1"),
        (["reward_model.center_coef=-1"], "`center_coef` must be a finite number >= 0"),
    ],
)
def test_reward_model_config_errors_name_the_setting(overrides, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        load_run_config(RM, [*RUN, *overrides], run_dir="unused")
