"""Multi-digit arithmetic: `"12+7="` → `"19"`, the embedded demo's task (no download).

Each operand has a number of digits drawn uniformly from `[min_digits, max_digits]`, then a
value drawn uniformly among the numbers with that many digits (`0…9` for one digit), so
short and long problems are equally common. Prompts and answers are short plain text, meant
for the byte tokenizer: the model sees `BOS 1 2 + 7 =` and should emit `1 9 EOS`. The reward
is `exact_answer` (text) / `exact_answer_reward` (tokens, in-graph).

`answer_noise` makes the train split a noisy teacher's demonstrations: each train example's
answer has, with that probability, its last digit replaced by a different digit (uniform over
the other nine), from its own seeded stream, so the problems are those of the clean split and
only their answers change. The eval split is never corrupted. Supervised fine-tuning on such
data imitates the teacher's mistakes; a verifier reward (RL) can correct them: the embedded
demo (`jaxrl-llm demo`, docs/demo.md).
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
      answer_noise: probability in [0, 1) that a *train* example's answer has its last digit
        replaced by a different random digit (a noisy teacher for supervised data; the eval
        split is never corrupted). An RL run on such a train split would reward the
        corrupted answers: use it for `sft:` runs.

    Examples:
      >>> from jaxrl_llm.config import build
      >>> build(ArithmeticConfig, {"max_digits": 2, "operations": ["+", "-"]}).operations
      ('+', '-')
      >>> ArithmeticConfig(answer_noise=1.0)
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: arithmetic.answer_noise: must be in [0, 1), got 1.0.
    """

    min_digits: int = 1
    max_digits: int = 3
    operations: tuple[Operation, ...] = ("+",)
    allow_negative: bool = False
    train_size: int = 10_000
    eval_size: int = 200
    eval_fraction: float = 0.1
    answer_noise: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_digits <= self.max_digits <= 9:
            raise ConfigError(
                "arithmetic: need 1 <= min_digits <= max_digits <= 9, got "
                f"min_digits={self.min_digits}, max_digits={self.max_digits}."
            )
        if not self.operations:
            raise ConfigError("arithmetic.operations: name at least one of '+', '-', '*'.")
        _check_sizes("arithmetic", self.train_size, self.eval_size, self.eval_fraction)
        if not 0.0 <= self.answer_noise < 1.0:
            raise ConfigError(
                f"arithmetic.answer_noise: must be in [0, 1), got {self.answer_noise}."
            )


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


def corrupt_last_digits(examples: list[Example], *, probability: float, seed: int) -> list[Example]:
    """Copies of `examples` whose answer's last digit is, with `probability` each, replaced.

    Per example `i`, from `rng = default_rng([seed, 2])` (a stream of its own, so the same
    examples and seed always give the same corruption):

        u_i ~ U[0, 1),  s_i ~ U{1, …, 9}
        last digit d → (d + s_i) mod 10   if u_i < probability   (uniform over the 9 others)

    Args:
      examples: `{"prompt", "answer"}` dicts whose answer ends in a digit.
      probability: in [0, 1].
      seed: the task's seed.

    Returns:
      New dicts (the inputs are not modified), in order.

    Examples:
      >>> clean = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "9+9=", "answer": "18"}]
      >>> corrupt_last_digits(clean, probability=0.999, seed=0)
      [{'prompt': '1+1=', 'answer': '5'}, {'prompt': '9+9=', 'answer': '14'}]
      >>> corrupt_last_digits(clean, probability=0.0, seed=0) == clean
      True
    """
    if not 0.0 <= probability <= 1.0:
        raise ValueError(
            f"corrupt_last_digits: `probability` must be in [0, 1], got {probability}."
        )
    rng = np.random.default_rng([seed, 2])
    flip = rng.random(len(examples)) < probability
    shift = rng.integers(1, 10, len(examples))
    out = []
    for example, f, s in zip(examples, flip, shift, strict=True):
        answer = str(example["answer"])
        if not answer[-1:].isdigit():
            raise ValueError(
                f"corrupt_last_digits: every answer must end in a digit, got {answer!r} "
                f"(prompt {example['prompt']!r})."
            )
        if f:
            answer = answer[:-1] + str((int(answer[-1]) + int(s)) % 10)
        out.append({**example, "answer": answer})
    return out


def arithmetic_examples(config: ArithmeticConfig, *, split: Split, seed: int) -> list[Example]:
    """The `split` of the arithmetic task under `seed`: a list of `{"prompt", "answer"}`.

    Deterministic in `(config, split, seed)`; train and eval never share a prompt. With
    `config.answer_noise > 0` the train answers are corrupted by `corrupt_last_digits` (same
    prompts as without noise); the eval split never is.

    Examples:
      >>> cfg = ArithmeticConfig(max_digits=2, train_size=3, eval_size=2)
      >>> arithmetic_examples(cfg, split="train", seed=0)
      [{'prompt': '67+34=', 'answer': '101'}, {'prompt': '0+0=', 'answer': '0'}, {'prompt': '8+92=', 'answer': '100'}]
      >>> noisy = ArithmeticConfig(max_digits=2, train_size=3, eval_size=2, answer_noise=0.5)
      >>> [e["answer"] for e in arithmetic_examples(noisy, split="train", seed=0)]
      ['100', '2', '100']
    """

    def draw(rng: np.random.Generator) -> Example:
        op = config.operations[int(rng.integers(len(config.operations)))]
        a, b = _operand(rng, config), _operand(rng, config)
        if op == "-" and not config.allow_negative and a < b:
            a, b = b, a
        return arithmetic_problem(a, op, b)

    size = config.train_size if split == "train" else config.eval_size
    examples = sample_split(
        draw,
        split=split,
        size=size,
        seed=seed,
        eval_fraction=config.eval_fraction,
        where="arithmetic",
    )
    if split == "train" and config.answer_noise > 0:
        return corrupt_last_digits(examples, probability=config.answer_noise, seed=seed)
    return examples
