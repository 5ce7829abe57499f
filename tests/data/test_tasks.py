"""Built-in tasks: correct answers, configurable difficulty, deterministic and disjoint splits."""

from __future__ import annotations

import re

import pytest

from jaxrl_llm.config import ConfigError, build
from jaxrl_llm.data import (
    ArithmeticConfig,
    DataConfig,
    SortingConfig,
    arithmetic_examples,
    load_split,
    sorting_examples,
)

PROBLEM = re.compile(r"^(\d+)([-+*])(\d+)=$")


def _solve(prompt: str) -> tuple[int, str, int, int]:
    a, op, b = PROBLEM.match(prompt).groups()  # type: ignore[union-attr]
    a, b = int(a), int(b)
    return a, op, b, {"+": a + b, "-": a - b, "*": a * b}[op]


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize(
    "cfg",
    [
        ArithmeticConfig(
            min_digits=1, max_digits=1, train_size=300, eval_size=8, eval_fraction=0.2
        ),
        ArithmeticConfig(
            min_digits=1, max_digits=3, operations=("+", "-", "*"), train_size=500, eval_size=100
        ),
    ],
)
def test_arithmetic_splits_never_overlap_and_are_deterministic(cfg, seed):
    train = arithmetic_examples(cfg, split="train", seed=seed)
    evals = arithmetic_examples(cfg, split="eval", seed=seed)
    assert len(train) == cfg.train_size and len(evals) == cfg.eval_size
    assert not {e["prompt"] for e in train} & {e["prompt"] for e in evals}
    assert len({e["prompt"] for e in evals}) == len(evals)  # eval examples are distinct
    assert arithmetic_examples(cfg, split="train", seed=seed) == train
    assert arithmetic_examples(cfg, split="eval", seed=seed) == evals
    assert arithmetic_examples(cfg, split="train", seed=seed + 100) != train


def test_arithmetic_answers_and_difficulty():
    cfg = ArithmeticConfig(min_digits=2, max_digits=3, operations=("+", "-", "*"), train_size=2000)
    examples = arithmetic_examples(cfg, split="train", seed=0)
    ops, digits = set(), set()
    for ex in examples:
        a, op, b, result = _solve(ex["prompt"])
        assert ex["answer"] == str(result)
        assert op != "-" or a >= b  # allow_negative=False
        ops.add(op)
        digits |= {len(str(a)), len(str(b))}
    assert ops == {"+", "-", "*"} and digits == {2, 3}
    # both operand lengths are about equally common although 3-digit numbers are 10x more
    three = sum(len(str(_solve(e["prompt"])[0])) == 3 for e in examples)
    assert 0.4 < three / len(examples) < 0.6


def test_arithmetic_negative_results_when_allowed():
    cfg = ArithmeticConfig(operations=("-",), allow_negative=True, train_size=400)
    answers = [int(e["answer"]) for e in arithmetic_examples(cfg, split="train", seed=0)]
    assert min(answers) < 0 < max(answers)


def test_arithmetic_default_prompts_are_short():
    examples = arithmetic_examples(ArithmeticConfig(train_size=200), split="train", seed=0)
    assert max(len(e["prompt"]) for e in examples) <= 8  # "999+999="
    assert max(len(e["answer"]) for e in examples) <= 4


def test_too_small_problem_space_is_an_error():
    cfg = ArithmeticConfig(min_digits=1, max_digits=1, eval_size=50, eval_fraction=0.1)
    with pytest.raises(ValueError, match=r"found only .* of the 50 eval examples"):
        arithmetic_examples(cfg, split="eval", seed=0)


@pytest.mark.parametrize(("split", "fraction"), [("eval", 0.004), ("train", 0.996)])
def test_a_small_share_of_a_large_space_fills_its_split(split, fraction):
    # ~10^17 problems: a split of 0.4 % of them is not too small, it only needs more draws
    cfg = ArithmeticConfig(
        min_digits=9, max_digits=9, train_size=200, eval_size=200, eval_fraction=fraction
    )
    assert len(arithmetic_examples(cfg, split=split, seed=0)) == 200


@pytest.mark.parametrize("seed", [0, 5])
def test_sorting_task(seed):
    cfg = SortingConfig(min_length=2, max_length=4, max_value=5, train_size=300, eval_size=50)
    train = sorting_examples(cfg, split="train", seed=seed)
    evals = sorting_examples(cfg, split="eval", seed=seed)
    assert not {e["prompt"] for e in train} & {e["prompt"] for e in evals}
    for ex in train + evals:
        values = [int(v) for v in ex["prompt"].removeprefix("sort ").removesuffix("=").split(",")]
        assert 2 <= len(values) <= 4 and all(0 <= v <= 5 for v in values)
        assert ex["answer"] == ",".join(map(str, sorted(values)))
    assert sorting_examples(cfg, split="train", seed=seed) == train


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"min_digits": 0}, "need 1 <= min_digits <= max_digits <= 9"),
        ({"min_digits": 3, "max_digits": 2}, "need 1 <= min_digits <= max_digits"),
        ({"operations": ["/"]}, "operations[0]: must be one of '+', '-', '*', got '/'"),
        ({"operations": []}, "name at least one"),
        ({"eval_fraction": 1.0}, "eval_fraction: must be in (0, 1)"),
        ({"train_size": 0}, "train_size and eval_size must be >= 1"),
        ({"max_digit": 2}, "unknown key 'max_digit' (did you mean 'max_digits'?)"),
    ],
)
def test_arithmetic_config_errors(data, message):
    with pytest.raises(ConfigError) as err:
        build(ArithmeticConfig, data)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"min_length": 0}, "need 1 <= min_length <= max_length"),
        ({"max_value": 0}, "max_value: must be in [1, 2**63 - 2], got 0"),
        ({"max_value": 2**70}, "max_value: must be in [1, 2**63 - 2], got 1180591620717411303424"),
    ],
)
def test_sorting_config_errors(data, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build(SortingConfig, data)


def test_load_split_builds_the_builtin_tasks_from_a_config():
    cfg = build(
        DataConfig,
        {"source": "sorting", "seed": 3, "sorting": {"train_size": 20, "eval_size": 5}},
    )
    assert len(load_split(cfg, "train")) == 20 and len(load_split(cfg, "eval")) == 5
    assert load_split(cfg, "train") == sorting_examples(cfg.sorting, split="train", seed=3)
    with pytest.raises(ValueError, match="`split` must be 'train' or 'eval'"):
        load_split(cfg, "test")  # type: ignore[arg-type]
