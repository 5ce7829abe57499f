"""Built-in procedural tasks, generated from a seed (no download): arithmetic and sorting."""

from jaxrl_llm.data.tasks._split import in_eval_split
from jaxrl_llm.data.tasks.arithmetic import (
    ArithmeticConfig,
    arithmetic_examples,
    arithmetic_problem,
    corrupt_last_digits,
)
from jaxrl_llm.data.tasks.sorting import SortingConfig, sorting_examples, sorting_problem

TASK_NAMES: tuple[str, ...] = ("arithmetic", "sorting")

__all__ = [
    "TASK_NAMES",
    "ArithmeticConfig",
    "SortingConfig",
    "arithmetic_examples",
    "arithmetic_problem",
    "corrupt_last_digits",
    "in_eval_split",
    "sorting_examples",
    "sorting_problem",
]
