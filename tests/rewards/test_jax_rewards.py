"""The in-graph `exact_answer_reward` agrees with the text verifier on decoded completions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.data import ArithmeticConfig, TemplateConfig, arithmetic_examples, make_prompt_batch
from jaxrl_llm.rewards import (
    completion_content,
    decode_completions,
    exact_answer,
    exact_answer_reward,
)
from jaxrl_llm.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
EOS, PAD, BOS = TOK.eos_id, TOK.pad_id, TOK.bos_id
MODEL_VOCAB = 300  # a model vocabulary padded beyond the tokenizer's 259 ids (as HF models have)
NEWLINE = 10
reward_fn = jax.jit(exact_answer_reward, static_argnames="stop_ids")
content_fn = jax.jit(completion_content, static_argnames="stop_ids")


def _random_completion(
    rng: np.random.Generator, answer: str, T: int
) -> tuple[list[int], list[bool]]:
    """A completion that is right, nearly right, or malformed, with its mask."""
    ids = list(answer.encode())
    kind = rng.integers(14)
    if kind == 0:  # correct, then EOS
        body = [*ids, EOS]
    elif kind == 1:  # correct, no EOS (truncated)
        body = ids
    elif kind == 2:  # correct, EOS, then garbage (ignored after the stop)
        body = [*ids, EOS, *rng.integers(0, MODEL_VOCAB, size=3).tolist()]
    elif kind == 3:  # one digit changed
        body = list(ids)
        body[rng.integers(len(body))] = int(
            rng.choice([c for c in b"0123456789" if c not in body[:1]])
        )
        body.append(EOS)
    elif kind == 4:  # a prefix or an extension
        body = (
            ids[: rng.integers(len(ids))]
            if rng.random() < 0.5
            else [*ids, int(rng.integers(48, 58))]
        )
        body.append(EOS)
    elif kind == 5:  # leading zero / leading or trailing space
        body = [[48, *ids], [32, *ids], [*ids, 32]][rng.integers(3)] + [EOS]
    elif kind == 6:  # a special token inside the answer
        body = list(ids)
        body.insert(int(rng.integers(len(body) + 1)), int(rng.choice([PAD, BOS])))
        body.append(EOS)
    elif kind == 7:  # invalid UTF-8 bytes
        body = [*ids, 0xFF, 0xC3, EOS]
    elif kind == 8:  # empty completion: EOS first
        body = [EOS]
    elif kind == 9:  # random bytes and specials
        body = rng.integers(0, MODEL_VOCAB, size=rng.integers(1, T + 1)).tolist()
    elif kind == 10:  # the answer twice
        body = [*ids, *ids, EOS]
    elif kind == 11:  # an id the tokenizer does not know, inside or after the answer
        body = list(ids)
        body.insert(int(rng.integers(len(body) + 1)), int(rng.integers(259, MODEL_VOCAB)))
        body.append(EOS)
    elif kind == 12:  # correct, then a newline (a stop token in one of the cases)
        body = [*ids, NEWLINE, *rng.integers(48, 58, size=2).tolist()]
    else:  # random digits
        body = [*rng.integers(48, 58, size=rng.integers(1, 5)).tolist(), EOS]
    body = body[:T]
    mask = [True] * len(body)
    if rng.random() < 0.25 and len(body) > 1:  # a hole: an extra token the mask excludes
        at = int(rng.integers(1, len(body)))
        body.insert(at, int(rng.integers(0, MODEL_VOCAB)))
        mask.insert(at, False)
        body, mask = body[:T], mask[:T]
    pad = T - len(body)
    fill = rng.integers(0, MODEL_VOCAB, size=pad).tolist() if rng.random() < 0.5 else [PAD] * pad
    return body + fill, mask + [False] * pad


@pytest.mark.parametrize("stop_ids", [(EOS,), (NEWLINE, EOS)])
def test_jax_reward_agrees_with_text_verifier_on_random_completions(stop_ids):
    rng = np.random.default_rng(0)
    cfg = ArithmeticConfig(
        min_digits=1, max_digits=3, operations=("+", "-", "*"), allow_negative=True, train_size=600
    )
    examples = arithmetic_examples(cfg, split="train", seed=3)
    T = 9
    batch = make_prompt_batch(examples, template=TemplateConfig(), tokenizer=TOK)
    tokens, mask = zip(*(_random_completion(rng, e["answer"], T) for e in examples), strict=True)
    tokens, mask = np.array(tokens, np.int32), np.array(mask)

    reward = reward_fn(tokens, mask, batch.answer_tokens, batch.answer_lengths, stop_ids=stop_ids)
    texts = decode_completions(TOK, tokens, mask, stop_ids=stop_ids)
    expected = exact_answer(list(batch.prompts), texts, answer=[e["answer"] for e in examples])
    np.testing.assert_array_equal(np.asarray(reward), expected)
    assert reward.dtype == jnp.float32
    # the sample covers both outcomes well
    assert 0.1 < np.mean(expected) < 0.6


@pytest.mark.parametrize(
    ("completion", "mask", "correct"),
    [
        ([49, 57, EOS, PAD, PAD], [1, 1, 1, 0, 0], True),
        ([49, 57, PAD, PAD, PAD], [1, 1, 0, 0, 0], True),  # truncated, no stop token
        ([49, 57, EOS, 55, 55], [1, 1, 1, 1, 1], True),  # tokens after the stop don't count
        ([49, 56, 57, EOS, PAD], [1, 0, 1, 1, 0], True),  # a hole in the mask is skipped
        ([49, 57, 57, EOS, PAD], [1, 1, 1, 1, 0], False),
        ([49, EOS, 57, EOS, PAD], [1, 1, 1, 1, 0], False),
        ([48, 49, 57, EOS, PAD], [1, 1, 1, 1, 0], False),
        ([49, PAD, 57, EOS, PAD], [1, 1, 1, 1, 0], False),
        ([49, 57, EOS, PAD, PAD], [0, 0, 0, 0, 0], False),  # empty mask
        ([49, 57, 49, 57, 49], [1, 1, 0, 0, 0], True),
    ],
)
def test_hand_cases(completion, mask, correct):
    r = reward_fn(
        jnp.array([completion]),
        jnp.array([mask]),
        jnp.array([[49, 57, PAD]]),
        jnp.array([2]),
        stop_ids=EOS,
    )
    assert float(r[0]) == float(correct)


def test_answer_longer_than_completion_budget_and_several_stop_ids():
    answer = jnp.array([[49, 50, 51, 52]])
    r = reward_fn(jnp.array([[49, 50]]), jnp.ones((1, 2)), answer, jnp.array([4]), stop_ids=EOS)
    assert float(r[0]) == 0.0
    r = reward_fn(jnp.array([[49, 50]]), jnp.ones((1, 2)), answer, jnp.array([2]), stop_ids=EOS)
    assert float(r[0]) == 1.0
    tokens = jnp.array([[49, 50, 10, 7], [49, 50, 7, 10]])
    r = reward_fn(
        tokens, jnp.ones((2, 4)), jnp.repeat(answer, 2, 0), jnp.array([2, 2]), stop_ids=(7, 10)
    )
    np.testing.assert_array_equal(r, [1.0, 1.0])


def test_completion_content_compacts_and_cuts():
    tokens = jnp.array([[5, 6, 7, EOS, 8], [5, EOS, 6, 7, 8], [1, 2, 3, 4, 5]])
    mask = jnp.array([[1, 0, 1, 1, 1], [0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    content, lengths = content_fn(tokens, mask, stop_ids=EOS)
    np.testing.assert_array_equal(lengths, [2, 0, 5])
    np.testing.assert_array_equal(content[0], [5, 7, -1, -1, -1])
    np.testing.assert_array_equal(content[1], [-1] * 5)
    np.testing.assert_array_equal(content[2], [1, 2, 3, 4, 5])


def test_runs_inside_lax_scan():
    answer = jnp.array([[49, 57]] * 2)

    def step(carry, tokens):
        r = exact_answer_reward(
            tokens, jnp.ones_like(tokens), answer, jnp.array([2, 2]), stop_ids=EOS
        )
        return carry + r.sum(), r

    xs = jnp.array([[[49, 57, EOS], [49, 56, EOS]], [[49, 57, 57], [49, 57, EOS]]])
    total, per_step = jax.jit(lambda x: jax.lax.scan(step, 0.0, x))(xs)
    assert float(total) == 2.0
    np.testing.assert_array_equal(per_step, [[1, 0], [0, 1]])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((jnp.zeros((2,), jnp.int32), jnp.ones((2,))), "must be \\[N, T\\]"),
        ((jnp.zeros((2, 3)), jnp.ones((2, 3))), "must be integer ids"),
        ((jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 4))), "must have the tokens' shape"),
    ],
)
def test_bad_token_inputs(args, message):
    with pytest.raises(ValueError, match=message):
        completion_content(*args, stop_ids=EOS)


def test_bad_answer_inputs():
    tokens, mask = jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3))
    with pytest.raises(ValueError, match="`answer_tokens` must be \\[N=2, A\\]"):
        exact_answer_reward(
            tokens, mask, jnp.zeros((3, 2), jnp.int32), jnp.ones(2, jnp.int32), stop_ids=EOS
        )
    with pytest.raises(ValueError, match="`answer_lengths` must be \\[N=2\\] integers"):
        exact_answer_reward(tokens, mask, jnp.zeros((2, 2), jnp.int32), jnp.ones(2), stop_ids=EOS)
    with pytest.raises(ValueError, match="`stop_ids` must be an int"):
        completion_content(tokens, mask, stop_ids=())
