"""Sorting small integers: `"sort 3,1,2="` → `"1,2,3"` (no download).

A list of `min_length…max_length` integers in `[0, max_value]` (duplicates allowed) is to be
written back in ascending order, comma-separated. Like arithmetic, its answer is one exact
string, so `exact_answer` (text) and `exact_answer_reward` (tokens, in-graph) score it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_llm.config import ConfigError
from jaxrl_llm.data.tasks._split import Example, Split, sample_split
from jaxrl_llm.data.tasks.arithmetic import _check_sizes


@dataclasses.dataclass(frozen=True, kw_only=True)
class SortingConfig:
    """Difficulty and split sizes of the sorting task.

    Attributes:
      min_length: fewest numbers in a list (>= 1).
      max_length: most numbers in a list (>= min_length).
      max_value: numbers are drawn uniformly from `0…max_value` (1 to 2**63 − 2: int64).
      train_size: examples in the train split (they may repeat).
      eval_size: distinct examples in the eval split.
      eval_fraction: share of all problems reserved for eval (by a seeded hash of the prompt).

    Examples:
      >>> SortingConfig(max_length=4).max_length
      4
    """

    min_length: int = 2
    max_length: int = 5
    max_value: int = 9
    train_size: int = 10_000
    eval_size: int = 200
    eval_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not 1 <= self.min_length <= self.max_length:
            raise ConfigError(
                "sorting: need 1 <= min_length <= max_length, got "
                f"min_length={self.min_length}, max_length={self.max_length}."
            )
        if not 1 <= self.max_value < 2**63 - 1:  # drawn as int64
            raise ConfigError(
                f"sorting.max_value: must be in [1, 2**63 - 2], got {self.max_value}."
            )
        _check_sizes("sorting", self.train_size, self.eval_size, self.eval_fraction)


def sorting_problem(values: list[int]) -> Example:
    """The example for sorting `values`.

    Examples:
      >>> sorting_problem([3, 1, 2])
      {'prompt': 'sort 3,1,2=', 'answer': '1,2,3'}
    """
    return {
        "prompt": "sort " + ",".join(map(str, values)) + "=",
        "answer": ",".join(map(str, sorted(values))),
    }


def sorting_examples(config: SortingConfig, *, split: Split, seed: int) -> list[Example]:
    """The `split` of the sorting task under `seed`: a list of `{"prompt", "answer"}`.

    Deterministic in `(config, split, seed)`; train and eval never share a prompt.

    Examples:
      >>> sorting_examples(SortingConfig(train_size=2), split="train", seed=0)
      [{'prompt': 'sort 6,5,2,3,0=', 'answer': '0,2,3,5,6'}, {'prompt': 'sort 6,9,5,6,9=', 'answer': '5,6,6,9,9'}]
    """

    def draw(rng: np.random.Generator) -> Example:
        length = int(rng.integers(config.min_length, config.max_length + 1))
        return sorting_problem([int(v) for v in rng.integers(0, config.max_value + 1, size=length)])

    size = config.train_size if split == "train" else config.eval_size
    return sample_split(
        draw, split=split, size=size, seed=seed, eval_fraction=config.eval_fraction, where="sorting"
    )
