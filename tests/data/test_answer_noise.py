"""`ArithmeticConfig.answer_noise`: a noisy teacher's train answers, a clean eval split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jaxrl_llm.config import ConfigError, build
from jaxrl_llm.data import ArithmeticConfig, DataConfig, load_split
from jaxrl_llm.data.tasks.arithmetic import arithmetic_examples, corrupt_last_digits

CLEAN = ArithmeticConfig(min_digits=1, max_digits=2, train_size=4000, eval_size=50)
NOISY = ArithmeticConfig(
    min_digits=1, max_digits=2, train_size=4000, eval_size=50, answer_noise=0.4
)


def _true_sum(prompt: str) -> str:
    a, b = prompt.removesuffix("=").split("+")
    return str(int(a) + int(b))


@pytest.mark.parametrize("seed", [0, 3])
def test_noise_changes_only_the_last_digit_of_train_answers(seed):
    clean = arithmetic_examples(CLEAN, split="train", seed=seed)
    noisy = arithmetic_examples(NOISY, split="train", seed=seed)
    assert [e["prompt"] for e in noisy] == [e["prompt"] for e in clean]
    assert all(e["answer"] == _true_sum(e["prompt"]) for e in clean)
    changed = [(c["answer"], n["answer"]) for c, n in zip(clean, noisy, strict=True)]
    changed = [(c, n) for c, n in changed if c != n]
    for c, n in changed:
        assert len(c) == len(n) and c[:-1] == n[:-1] and c[-1] != n[-1]
    # the share of corrupted answers is Binomial(4000, 0.4) / 4000: within 5 standard deviations
    share = len(changed) / len(clean)
    assert abs(share - 0.4) < 5 * math.sqrt(0.4 * 0.6 / len(clean))
    # the wrong digit is uniform over the nine others: the shift (new - old) mod 10 in 1..9
    shifts = np.asarray([(int(n[-1]) - int(c[-1])) % 10 for c, n in changed])
    counts = np.bincount(shifts, minlength=10)
    assert counts[0] == 0
    expected = len(changed) / 9
    chi2 = float(((counts[1:] - expected) ** 2 / expected).sum())
    assert chi2 < 30.0  # 8 degrees of freedom: P(chi2 > 30) ≈ 2e-4


def test_eval_split_is_never_corrupted_and_noise_is_seeded():
    for seed in (0, 1):
        assert arithmetic_examples(NOISY, split="eval", seed=seed) == arithmetic_examples(
            CLEAN, split="eval", seed=seed
        )
    first = arithmetic_examples(NOISY, split="train", seed=0)
    assert arithmetic_examples(NOISY, split="train", seed=0) == first
    other = arithmetic_examples(NOISY, split="train", seed=1)
    assert [e["answer"] for e in other] != [e["answer"] for e in first]
    # through the data config, as a run loads it
    data = build(
        DataConfig,
        {"arithmetic": {"max_digits": 2, "train_size": 300, "eval_size": 20, "answer_noise": 0.5}},
    )
    assert all(e["answer"] == _true_sum(e["prompt"]) for e in load_split(data, "eval"))
    assert any(e["answer"] != _true_sum(e["prompt"]) for e in load_split(data, "train"))


def test_corrupt_last_digits_edge_cases():
    examples = [{"prompt": "9+9=", "answer": "18", "id": 7}, {"prompt": "3-5=", "answer": "-2"}]
    assert corrupt_last_digits(examples, probability=0.0, seed=0) == examples
    every = corrupt_last_digits(examples, probability=1.0, seed=0)
    assert every[0]["id"] == 7 and every[0]["answer"][0] == "1" and every[0]["answer"] != "18"
    assert every[1]["answer"][0] == "-" and every[1]["answer"] != "-2"
    assert examples[0]["answer"] == "18"  # the inputs are not modified
    with pytest.raises(ValueError, match=r"`probability` must be in \[0, 1\], got 1.5"):
        corrupt_last_digits(examples, probability=1.5, seed=0)
    with pytest.raises(ValueError, match="must end in a digit, got 'x'"):
        corrupt_last_digits([{"prompt": "p", "answer": "x"}], probability=0.5, seed=0)


@pytest.mark.parametrize("value", [-0.1, 1.0, 2])
def test_answer_noise_out_of_range_is_a_config_error(value):
    with pytest.raises(ConfigError, match=r"arithmetic.answer_noise: must be in \[0, 1\), got"):
        build(ArithmeticConfig, {"answer_noise": value})


def test_preference_pairs_refuse_a_noisy_teacher():
    """Pairs from noisy answers preferred the corrupted answer (and sometimes rejected the true
    one) while promising the right answer is preferred."""
    from jaxrl_llm.data import arithmetic_preference_records

    with pytest.raises(ValueError, match=r"answer_noise .* must be 0, got 0\.4"):
        arithmetic_preference_records(NOISY)
    records = arithmetic_preference_records(CLEAN)
    assert all(r["chosen"] == _true_sum(r["prompt"]) != r["rejected"] for r in records)
