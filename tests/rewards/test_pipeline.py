"""Data → completions → rewards → advantages, host path and in-graph path side by side."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.config import build
from jaxrl_llm.data import (
    DataConfig,
    IteratorState,
    load_split,
    make_prompt_batch,
    next_batch,
)
from jaxrl_llm.rewards import (
    RewardConfig,
    combined_advantages,
    decode_completions,
    exact_answer_reward,
    score_completions,
)
from jaxrl_llm.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
G, T = 4, 6
reward_fn = jax.jit(exact_answer_reward, static_argnames="stop_ids")
advantages_fn = jax.jit(combined_advantages, static_argnames=("group_size", "mode"))


def fails_on_long(prompts, completions, **fields):
    """A user reward function that breaks on completions longer than 3 characters."""
    return [1.0 / (3 - len(c)) if len(c) != 3 else float("nan") for c in completions]


def _completions(rng, answers):
    """G completions per answer: the right one, a wrong digit, an empty one, random bytes."""
    rows, masks = [], []
    for answer in answers:
        ids = list(answer.encode())
        wrong = [*ids[:-1], 48 + (ids[-1] - 47) % 10]
        for body in (
            [*ids, TOK.eos_id],
            [*wrong, TOK.eos_id],
            [TOK.eos_id],
            rng.integers(48, 58, size=rng.integers(1, T + 1)).tolist(),
        ):
            body = body[:T]
            rows.append(body + [TOK.pad_id] * (T - len(body)))
            masks.append([True] * len(body) + [False] * (T - len(body)))
    return np.array(rows, np.int32), np.array(masks)


def _batch(cfg, seed=0):
    examples = load_split(cfg, "train")
    idx, _ = next_batch(IteratorState(cfg.seed, 0, 0), num_examples=len(examples), batch_size=5)
    chosen = [examples[i] for i in idx]
    tokens, mask = _completions(np.random.default_rng(seed), [e["answer"] for e in chosen])
    return chosen, make_prompt_batch(chosen, template=cfg.template, tokenizer=TOK), tokens, mask


def test_host_and_in_graph_rewards_agree_on_the_arithmetic_task():
    cfg = build(DataConfig, {"arithmetic": {"max_digits": 2, "train_size": 50, "eval_size": 5}})
    examples, batch, tokens, mask = _batch(cfg)
    reward_cfg = RewardConfig()
    host = score_completions(
        reward_cfg.resolve(),
        reward_cfg,
        examples=examples,
        prompts=batch.prompts,
        completion_tokens=tokens,
        completion_mask=mask,
        tokenizer=TOK,
        group_size=G,
    )
    device = reward_fn(
        jnp.asarray(tokens),
        jnp.asarray(mask),
        jnp.repeat(batch.answer_tokens, G, axis=0),
        jnp.repeat(batch.answer_lengths, G, axis=0),
        stop_ids=TOK.eos_id,
    )
    np.testing.assert_array_equal(host.rewards[:, 0], np.asarray(device))
    assert host.rewards[::G, 0].tolist() == [1.0] * 5  # the first sample of each group is right
    assert host.rewards[1::G, 0].tolist() == [0.0] * 5
    adv = advantages_fn(host.rewards, reward_cfg.weights(), group_size=G)
    assert np.all(np.asarray(adv)[::G] > 0)


def test_failing_user_reward_drops_its_groups_and_overlong_reads_lengths():
    cfg = build(
        DataConfig,
        {"arithmetic": {"min_digits": 1, "max_digits": 1, "train_size": 30, "eval_size": 2}},
    )
    examples, batch, tokens, mask = _batch(cfg, seed=1)
    reward_cfg = build(
        RewardConfig,
        {
            "functions": [
                {"fn": "exact_answer"},
                {"fn": f"{__name__}:fails_on_long", "weight": 0.5},
                {"fn": "overlong", "kwargs": {"max_length": T, "buffer_length": 2}},
            ],
            "combine": "decoupled",
            "on_failure": "drop_group",
        },
    )
    scores = score_completions(
        reward_cfg.resolve(),
        reward_cfg,
        examples=examples,
        prompts=batch.prompts,
        completion_tokens=tokens,
        completion_mask=mask,
        tokenizer=TOK,
        group_size=G,
    )
    lengths = mask.sum(1)
    texts = decode_completions(TOK, tokens, mask)
    bad_groups = np.array([len(t) == 3 for t in texts]).reshape(-1, G).any(axis=1)
    assert bad_groups.any() and not bad_groups.all()
    np.testing.assert_array_equal(scores.valid, np.repeat(~bad_groups, G))
    assert scores.metrics["reward/dropped_groups"] == bad_groups.sum()
    # overlong: 0 up to T-2 tokens, then -1/2 per token, from the sampler's token counts
    np.testing.assert_allclose(scores.rewards[:, 2], -np.clip((lengths - (T - 2)) / 2, 0, 1))
    adv = advantages_fn(
        scores.rewards, reward_cfg.weights(), group_size=G, mode="decoupled", valid=scores.valid
    )
    assert np.all(np.asarray(adv)[~scores.valid] == 0) and np.isfinite(np.asarray(adv)).all()


def test_score_completions_checks_shapes():
    cfg = RewardConfig()
    with pytest.raises(ValueError, match=r"expected 1 prompts and \[B·G = 2, T\] completions"):
        score_completions(
            cfg.resolve(),
            cfg,
            examples=[{"answer": "1"}],
            prompts=["q"],
            completion_tokens=np.zeros((3, 2), np.int32),
            completion_mask=np.ones((3, 2), bool),
            tokenizer=TOK,
            group_size=2,
        )
    # an example field named like the token counts the rewards receive was replaced silently
    with pytest.raises(ValueError, match=r"a field 'completion_lengths'.*rename the field"):
        score_completions(
            cfg.resolve(),
            cfg,
            examples=[{"answer": "1", "completion_lengths": 7}],
            prompts=["q"],
            completion_tokens=np.zeros((2, 2), np.int32),
            completion_mask=np.ones((2, 2), bool),
            tokenizer=TOK,
            group_size=2,
        )
