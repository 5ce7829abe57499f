"""Data: built-in procedural tasks, JSONL / Parquet / TFDS sources, prompt templates, batch order.

- `tasks`: `arithmetic` (`"12+7="` → `"19"`) and `sorting` (`"sort 3,1,2="` → `"1,2,3"`),
  generated from a seed with disjoint train/eval splits; no download.
- `jsonl`, `parquet`, `tfds_source`: local files and prepared TFDS datasets; malformed records
  are reported with their line / row / example number and skipped or fatal (`records`).
- `templates`: format strings over example fields, optional chat rendering.
- `sources`: `DataConfig` and `load_split(config, "train" | "eval")`.
- `batch`: `make_prompt_batch` (prompt and answer tokens), `group_fields` (fields per completion).
- `preference`: preference / KTO JSONL records → truncated tokens → bucketed
  `PreferenceBatch`es; `arithmetic_preference_records` (a tiny generated set).
- `iterator`: `IteratorState(seed, epoch, position)`, `next_batch`, `host_slice`, `eval_batches`.
"""

from jaxrl_llm.data.batch import PromptBatch, group_fields, make_prompt_batch
from jaxrl_llm.data.iterator import (
    IteratorState,
    epoch_order,
    eval_batches,
    host_slice,
    next_batch,
)
from jaxrl_llm.data.jsonl import read_jsonl
from jaxrl_llm.data.parquet import read_parquet
from jaxrl_llm.data.preference import (
    PreferenceDataConfig,
    TokenizedPreference,
    TruncationStats,
    arithmetic_preference_records,
    check_preference_record,
    load_preference_data,
    make_preference_batch,
    read_preference_jsonl,
    split_implicit_prompt,
    tokenize_preferences,
    truncate_tokens,
    write_preference_jsonl,
)
from jaxrl_llm.data.records import DataError, RecordIssue, clean_record, plain_fields, plain_value
from jaxrl_llm.data.sources import DataConfig, load_split, parse_source
from jaxrl_llm.data.tasks import (
    ArithmeticConfig,
    SortingConfig,
    arithmetic_examples,
    arithmetic_problem,
    corrupt_last_digits,
    in_eval_split,
    sorting_examples,
    sorting_problem,
)
from jaxrl_llm.data.templates import TemplateConfig, format_prompt, render_prompt, template_fields
from jaxrl_llm.data.tfds_source import import_tfds, read_tfds

__all__ = [
    "ArithmeticConfig",
    "DataConfig",
    "DataError",
    "IteratorState",
    "PreferenceDataConfig",
    "PromptBatch",
    "RecordIssue",
    "SortingConfig",
    "TemplateConfig",
    "TokenizedPreference",
    "TruncationStats",
    "arithmetic_examples",
    "arithmetic_preference_records",
    "arithmetic_problem",
    "check_preference_record",
    "clean_record",
    "corrupt_last_digits",
    "epoch_order",
    "eval_batches",
    "format_prompt",
    "group_fields",
    "host_slice",
    "import_tfds",
    "in_eval_split",
    "load_preference_data",
    "load_split",
    "make_preference_batch",
    "make_prompt_batch",
    "next_batch",
    "parse_source",
    "plain_fields",
    "plain_value",
    "read_jsonl",
    "read_parquet",
    "read_preference_jsonl",
    "read_tfds",
    "render_prompt",
    "sorting_examples",
    "sorting_problem",
    "split_implicit_prompt",
    "template_fields",
    "tokenize_preferences",
    "truncate_tokens",
    "write_preference_jsonl",
]
