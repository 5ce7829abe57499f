"""`DataConfig` and `load_split`: one config names where the train and eval examples come from.

Sources (`DataConfig.source`):

| source | train split | eval split |
|---|---|---|
| `arithmetic`, `sorting` | generated from `seed` | generated, disjoint from train |
| `jsonl:PATH`, `parquet:PATH` | the file | `eval_source` (another file), if set |
| `tfds:NAME` | TFDS split `train_split` | TFDS split `eval_split` |

Every record must have the fields the prompt template uses and `answer_field`; bad records
fail or are skipped by `on_bad_record`, always reported with their location.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Literal

from jaxrl_llm.config import ConfigError
from jaxrl_llm.data.jsonl import read_jsonl
from jaxrl_llm.data.parquet import read_parquet
from jaxrl_llm.data.records import OnError
from jaxrl_llm.data.tasks import TASK_NAMES, ArithmeticConfig, SortingConfig
from jaxrl_llm.data.tasks.arithmetic import arithmetic_examples
from jaxrl_llm.data.tasks.sorting import sorting_examples
from jaxrl_llm.data.templates import TemplateConfig
from jaxrl_llm.data.tfds_source import read_tfds

_PREFIXES = ("jsonl", "parquet", "tfds")
Split = Literal["train", "eval"]


def parse_source(source: str, key: str = "source") -> tuple[str, str]:
    """`(kind, argument)` of a source string: a task name, or `jsonl:` / `parquet:` / `tfds:`.

    Examples:
      >>> parse_source("arithmetic"), parse_source("tfds:gsm8k"), parse_source("jsonl:/d/a.jsonl")
      (('arithmetic', ''), ('tfds', 'gsm8k'), ('jsonl', '/d/a.jsonl'))
      >>> parse_source("arithmetc")
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: data.source: unknown source 'arithmetc' (did you mean 'arithmetic'?); use arithmetic, sorting, jsonl:PATH, parquet:PATH or tfds:NAME.
    """
    kind, sep, arg = source.partition(":")
    if sep and kind in _PREFIXES and arg:
        return kind, arg
    if not sep and source in TASK_NAMES:
        return source, ""
    close = difflib.get_close_matches(source, [*TASK_NAMES, *(f"{p}:" for p in _PREFIXES)], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(
        f"data.{key}: unknown source {source!r}{hint}; use "
        f"{', '.join(TASK_NAMES)}, jsonl:PATH, parquet:PATH or tfds:NAME."
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where examples come from and how they become prompts (the YAML `data:` section).

    Attributes:
      source: `arithmetic`, `sorting`, `jsonl:PATH`, `parquet:PATH` or `tfds:NAME`.
      eval_source: the eval file for `jsonl:` / `parquet:` sources (None: no eval split).
      preference_eval_source: held-out preference records (`jsonl:PATH`) that a preference
        run scores at every evaluation (None: the arithmetic task's eval split as pairs when
        `source` is `arithmetic`, else none).
      train_split: the TFDS split used for training.
      eval_split: the TFDS split used for evaluation.
      tfds_data_dir: where the prepared TFDS data lives (None: TFDS's default).
      seed: generates the built-in tasks and orders the batches.
      shuffle: a fresh seeded order each epoch (False: file order).
      arithmetic: the arithmetic task's difficulty and split sizes.
      sorting: the sorting task's difficulty and split sizes.
      template: how an example becomes a prompt.
      answer_field: the field holding the reference answer.
      on_bad_record: `fail` or `skip` a malformed record (always reported).

    Examples:
      >>> from jaxrl_llm.config import build
      >>> cfg = build(DataConfig, {"source": "tfds:gsm8k", "template": {"prompt": "{question}"}})
      >>> cfg.required_fields
      ('question', 'answer')
    """

    source: str = "arithmetic"
    eval_source: str | None = None
    preference_eval_source: str | None = None
    train_split: str = "train"
    eval_split: str = "test"
    tfds_data_dir: str | None = None
    seed: int = 0
    shuffle: bool = True
    arithmetic: ArithmeticConfig = dataclasses.field(default_factory=ArithmeticConfig)
    sorting: SortingConfig = dataclasses.field(default_factory=SortingConfig)
    template: TemplateConfig = dataclasses.field(default_factory=TemplateConfig)
    answer_field: str = "answer"
    on_bad_record: OnError = "fail"

    def __post_init__(self) -> None:
        kind, _ = parse_source(self.source)
        if self.eval_source is not None:
            eval_kind, _ = parse_source(self.eval_source, "eval_source")
            if kind not in ("jsonl", "parquet") or eval_kind not in ("jsonl", "parquet"):
                raise ConfigError(
                    "data.eval_source: only file sources (jsonl:, parquet:) take a separate eval "
                    f"file; {self.source!r} has its own eval split."
                )
        if self.preference_eval_source is not None:
            pref_kind, _ = parse_source(self.preference_eval_source, "preference_eval_source")
            if pref_kind != "jsonl":
                raise ConfigError(
                    "data.preference_eval_source: held-out preference records are read from "
                    f"'jsonl:PATH', got {self.preference_eval_source!r}."
                )
        if self.seed < 0:
            raise ConfigError(f"data.seed: must be >= 0, got {self.seed}.")

    @property
    def required_fields(self) -> tuple[str, ...]:
        """Fields every record needs: the template's, then `answer_field`."""
        fields = self.template.fields
        return fields if self.answer_field in fields else (*fields, self.answer_field)


def load_split(config: DataConfig, split: Split) -> list[dict[str, Any]]:
    """The examples of `split` (`"train"` or `"eval"`) for `config`, checked.

    Examples:
      >>> from jaxrl_llm.data.tasks import ArithmeticConfig
      >>> cfg = DataConfig(arithmetic=ArithmeticConfig(max_digits=1, train_size=4, eval_size=2))
      >>> [len(load_split(cfg, s)) for s in ("train", "eval")]
      [4, 2]
    """
    if split not in ("train", "eval"):
        raise ValueError(f"load_split: `split` must be 'train' or 'eval', got {split!r}.")
    kind, arg = parse_source(config.source)
    if kind == "arithmetic":
        return arithmetic_examples(config.arithmetic, split=split, seed=config.seed)
    if kind == "sorting":
        return sorting_examples(config.sorting, split=split, seed=config.seed)
    options: dict[str, Any] = {"required": config.required_fields, "on_error": config.on_bad_record}
    if kind == "tfds":
        name = config.train_split if split == "train" else config.eval_split
        records, _ = read_tfds(arg, split=name, data_dir=config.tfds_data_dir, **options)
        return records
    if split == "eval":
        if config.eval_source is None:
            raise ConfigError(
                f"data.eval_source: {config.source!r} has no eval split; set eval_source."
            )
        kind, arg = parse_source(config.eval_source, "eval_source")
    reader = read_jsonl if kind == "jsonl" else read_parquet
    records, _ = reader(arg, **options)
    return records
