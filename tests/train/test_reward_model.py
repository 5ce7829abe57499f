"""Reward-model training (`train_reward_model`): the loss against a float64 reference, and the
RLHF chain.

- The first step's loss (before its update; 2 micro-batches) equals a float64 Bradley-Terry
  loss with margin and centring term on scores that `transformers`'
  `*ForSequenceClassification` computes for each pair's texts alone.
- A reward model trained on 8 arithmetic pairs ranks them all, and scores them the same way
  once exported (`save_pretrained`) and loaded by `fn: reward_model`, the RL reward.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.data import (
    ArithmeticConfig,
    IteratorState,
    PreferenceDataConfig,
    arithmetic_preference_records,
    load_preference_data,
    next_batch,
)
from jaxrl_llm.models import ValueModel, save_pretrained
from jaxrl_llm.rewards import reward_model
from jaxrl_llm.tokenizer import ByteTokenizer
from jaxrl_llm.train import OptimConfig, RewardModelConfig, train_reward_model
from tests.rewards.test_reward_model import CFG  # the reward model of the RL test

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

RECORDS = arithmetic_preference_records(ArithmeticConfig(max_digits=1, train_size=8), seed=0)


def test_first_step_loss_equals_a_float64_reference(tmp_path):
    config = RewardModelConfig(margin=0.1, center_coef=0.05)
    model = ValueModel(CFG, rngs=nnx.Rngs(1))
    save_pretrained(model, tmp_path)  # before training donates the arrays
    optim = OptimConfig(name="sgd", learning_rate=0.1, accumulation_steps=2)  # loss: before it
    _, history = train_reward_model(
        model, ByteTokenizer(), RECORDS, config, optim, steps=1, batch_size=4
    )
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path, dtype=torch.float64
    ).eval()
    examples, _, _ = load_preference_data(
        RECORDS, tokenizer=ByteTokenizer(), config=PreferenceDataConfig()
    )
    rows, _ = next_batch(IteratorState(0, 0, 0), num_examples=len(examples), batch_size=4)

    def score(prompt, completion):
        with torch.no_grad():
            return float(hf(torch.tensor([list(prompt) + list(completion)])).logits[0, 0])

    terms, center = [], []
    for i in rows:
        c = score(examples[i].prompt, examples[i].chosen)
        r = score(examples[i].prompt, examples[i].rejected)
        terms.append(math.log1p(math.exp(-(c - r - config.margin))))
        center.append((c + r) ** 2)
    expected = np.mean(terms) + config.center_coef * np.mean(center)
    assert history[0]["loss/total"] == pytest.approx(expected, rel=1e-5)
    assert history[0]["loss/center"] == pytest.approx(
        config.center_coef * np.mean(center), rel=1e-5
    )


def test_a_trained_reward_model_ranks_its_pairs_and_scores_them_as_the_rl_reward(tmp_path):
    optim = OptimConfig(name="adamw", learning_rate=1e-2)
    trained, history = train_reward_model(
        ValueModel(CFG, rngs=nnx.Rngs(0)),
        ByteTokenizer(),
        RECORDS,
        RewardModelConfig(),
        optim,
        steps=40,
        batch_size=8,
    )
    assert (
        history[-1]["rm/accuracy"] == 1.0 and history[-1]["loss/total"] < history[0]["loss/total"]
    )
    save_pretrained(trained, tmp_path)
    score = reward_model(checkpoint=str(tmp_path), tokenizer="byte")
    prompts = [r["prompt"] for r in RECORDS]
    chosen = np.array(score(prompts, [r["chosen"] for r in RECORDS]))
    rejected = np.array(score(prompts, [r["rejected"] for r in RECORDS]))
    assert (chosen > rejected).all(), (chosen, rejected)


def test_a_linear_probe_trains_the_head_alone():
    model = ValueModel(CFG, rngs=nnx.Rngs(2))
    before = jax.tree.map(np.array, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    trained, _ = train_reward_model(
        model, ByteTokenizer(), RECORDS, RewardModelConfig(),
        OptimConfig(name="adamw", learning_rate=1e-2), steps=2, batch_size=4,
        trainable=(r"^policy\.head\.",),
    )  # fmt: skip
    after = nnx.to_pure_dict(nnx.state(trained, nnx.Param))
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)), after, before)
    assert all(jax.tree.leaves(moved["head"]))
    assert not any(jax.tree.leaves({k: v for k, v in moved.items() if k != "head"}))


def test_an_update_without_valid_pairs_has_loss_zero_not_nan():
    import jax.numpy as jnp

    from jaxrl_llm.train import Normalizers, reward_model_loss

    none = Normalizers(jnp.array(0.0), jnp.array(0.0), jnp.array(1.0))
    config = RewardModelConfig(center_coef=0.01)
    loss, metrics = reward_model_loss(config, jnp.ones(2), jnp.zeros(2), jnp.zeros(2), none)
    assert float(loss) == 0.0 and float(metrics["loss/center"]) == 0.0
