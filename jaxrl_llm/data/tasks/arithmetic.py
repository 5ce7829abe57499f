"""Multi-digit arithmetic: `"12+7="` → `"19"`, the embedded demo's task (no download).

Each operand has a number of digits drawn uniformly from `[min_digits, max_digits]`, then a
value drawn uniformly among the numbers with that many digits (`0…9` for one digit), so
short and long problems are equally common. Prompts and answers are short plain text, meant
for the byte tokenizer: the model sees `BOS 1 2 + 7 =` and should emit `1 9 EOS`. The reward
is `exact_answer` (text) / `exact_answer_reward` (tokens, in-graph).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from jaxrl_llm.config import ConfigError
from jaxrl_llm.data.tasks._split import Example, Split, sample_split

Operation = Literal["+", "-", "*"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArithmeticConfig:
    """Difficulty and split sizes of the arithmetic task.

    Attributes:
      min_digits: fewest digits of an operand (>= 1).
      max_digits: most digits of an operand (>= min_digits, <= 9).
      operations: the operators drawn from, uniformly (`+`, `-`, `*`).
      allow_negative: if False, `a - b` is drawn with `a >= b`.
      train_size: examples in the train split (they may repeat).
      eval_size: distinct examples in the eval split.
      eval_fraction: share of all problems reserved for eval (by a seeded hash of the prompt).

    Examples:
      >>> from jaxrl_llm.config import build
      >>> build(ArithmeticConfig, {"max_digits": 2, "operations": ["+", "-"]}).operations
      ('+', '-')
    """

    min_digits: int = 1
    max_digits: int = 3
    operations: tuple[Operation, ...] = ("+",)
    allow_negative: bool = False
    train_size: int = 10_000
    eval_size: int = 200
    eval_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits <= 9:
            raise ConfigError(
                "arithmetic: need 1 <= min_digits <= max_digits <= 9, got "
                f"min_digits={self.min_digits}, max_digits={self.max_digits}."
            )
        if not self.operations:
            raise ConfigError("arithmetic.operations: name at least one of '+', '-', '*'.")
        _check_sizes("arithmetic", self.train_size, self.eval_size, self.eval_fraction)


def _check_sizes(where: str, train_size: int, eval_size: int, eval_fraction: float) -> None:
    if train_size < 1 or eval_size < 1:
        raise ConfigError(
            f"{where}: train_size and eval_size must be >= 1, got {train_size} and {eval_size}."
        )
    if not 0.0 < eval_fraction < 1.0:
        raise ConfigError(f"{where}.eval_fraction: must be in (0, 1), got {eval_fraction}.")


def _operand(rng: np.random.Generator, config: ArithmeticConfig) -> int:
    digits = int(rng.integers(config.min_digits, config.max_digits + 1))
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return int(rng.integers(low, 10**digits))


def arithmetic_problem(a: int, op: str, b: int) -> Example:
    """The example for `a op b`: `{"prompt": "a op b=", "answer": str(result)}`.

    Examples:
      >>> arithmetic_problem(12, "+", 7)
      {'prompt': '12+7=', 'answer': '19'}
      >>> arithmetic_problem(3, "-", 5)["answer"], arithmetic_problem(4, "*", 25)["answer"]
      ('-2', '100')
    """
    results = {"+": a + b, "-": a - b, "*": a * b}
    if op not in results:
        raise ValueError(f"arithmetic_problem: `op` must be one of '+', '-', '*', got {op!r}.")
    return {"prompt": f"{a}{op}{b}=", "answer": str(results[op])}


def arithmetic_examples(config: ArithmeticConfig, *, split: Split, seed: int) -> list[Example]:
    """The `split` of the arithmetic task under `seed`: a list of `{"prompt", "answer"}`.

    Deterministic in `(config, split, seed)`; train and eval never share a prompt.

    Examples:
      >>> cfg = ArithmeticConfig(max_digits=2, train_size=3, eval_size=2)
      >>> arithmetic_examples(cfg, split="train", seed=0)
      [{'prompt': '67+34=', 'answer': '101'}, {'prompt': '0+0=', 'answer': '0'}, {'prompt': '8+92=', 'answer': '100'}]
    """

    def draw(rng: np.random.Generator) -> Example:
        op = config.operations[int(rng.integers(len(config.operations)))]
        a, b = _operand(rng, config), _operand(rng, config)
        if op == "-" and not config.allow_negative and a < b:
            a, b = b, a
        return arithmetic_problem(a, op, b)

    size = config.train_size if split == "train" else config.eval_size
    return sample_split(
        draw,
        split=split,
        size=size,
        seed=seed,
        eval_fraction=config.eval_fraction,
        where="arithmetic",
    )
