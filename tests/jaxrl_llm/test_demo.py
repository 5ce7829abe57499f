"""The demo's recipes learn the toy verifiable task (a learning test on a tiny policy)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import demo


def _config(**recipe):
    return demo.DemoConfig(
        prompts=4,
        group_size=8,
        max_length=5,
        vocab=4,
        steps=40,
        epochs=2,
        learning_rate=0.1,
        seeds=2,
        recipes=(demo.Recipe(name="r", **recipe),),
    )


def test_completion_mask_and_reward():
    tokens = jnp.array([[2, 0, 3, 1], [1, 2, 3, 1], [0, 1, 1, 1]])
    mask = demo.completion_mask(tokens)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    targets = jnp.array([[2, 0, 0, 0]])
    lengths = jnp.array([1])
    reward = demo.verifiable_reward(tokens[None], mask[None], targets, lengths)
    # row 0 reproduces "2 EOS": 1.0; row 1 has 1 at position 0? no: 1 != 2, and no EOS: 0.0;
    # row 2 stops at once: EOS at position 0 is not the answer's first token: 0.0
    np.testing.assert_allclose(np.asarray(reward), [[1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "recipe",
    [
        {"advantages": "grpo", "loss": "ppo_clip", "agg": "seq_mean_token_mean", "kl_coef": 0.04},
        {"advantages": "dr_grpo", "loss": "ppo_clip", "agg": "seq_mean_token_sum_norm"},
        {"advantages": "rloo", "loss": "cispo", "clip_low": 1.0, "clip_high": 4.0},
    ],
    ids=["grpo", "dr_grpo", "rloo_cispo"],
)
def test_recipes_learn(recipe):
    config = _config(**recipe)
    keys = jax.random.split(jax.random.key(0), config.seeds)
    history = jax.jit(jax.vmap(demo.make_train(config, config.recipes[0])))(keys)
    reward = np.asarray(history["reward"]).mean(0)
    assert np.all(np.isfinite(reward))
    assert reward[-5:].mean() > reward[:5].mean() + 0.2, reward


def test_run_prints_a_table():
    lines = []
    results = demo.run(_config(), print_fn=lines.append)
    assert set(results) == {"r"}
    assert any(line.startswith("r ") for line in lines)
