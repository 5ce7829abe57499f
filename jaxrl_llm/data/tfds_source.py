"""TensorFlow Datasets by name (`tfds:gsm8k`), read without TensorFlow and without downloading.

`tensorflow-datasets` is an optional dependency (`pip install -e '.[data]'`), imported only
here, when a TFDS source is loaded. Records are read through `tfds.data_source`, TFDS's
random-access reader, which needs neither TensorFlow nor the network, but does need the
dataset already prepared in a random-access format under `data_dir`. On a machine with
network access, prepare it once with

    tfds build gsm8k --file_format=array_record --data_dir DIR

(that command needs TensorFlow for most datasets), then copy `DIR` over. `download=False` and
`try_gcs=False` are always passed: nothing is ever fetched at training time.

TFDS registers its dataset builders by importing one module per category and stops at the
first category whose optional dependency is missing (e.g. `h5py`), so builders of later
categories (text ones such as `gsm8k` among them) can be missing from the registry. When a
name is not found, each category module is imported on its own, skipping those that fail,
and the lookup is retried.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from jaxrl_llm.data.records import DataError, IssueLog, OnError, RecordIssue, clean_record

# TFDS's dataset categories (tensorflow_datasets/__init__.py), imported one by one when needed.
_CATEGORIES = (
    "text",
    "question_answering",
    "summarization",
    "translate",
    "structured",
    "text_simplification",
    "image_classification",
    "image",
    "audio",
    "video",
    "graphs",
    "object_detection",
    "ranking",
    "recommendation",
    "time_series",
    "vision_language",
)


def import_tfds() -> Any:
    """`tensorflow_datasets`, or an `ImportError` naming the extra that provides it.

    Examples:
      >>> try:
      ...     tfds = import_tfds()
      ... except ImportError as err:
      ...     print("'.[data]'" in str(err))
      ... else:
      ...     print(True)
      True
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:
        raise ImportError(
            "TFDS sources (tfds:NAME) need tensorflow-datasets, which is not installed; install "
            "the data extra: pip install -e '.[data]' (or: pip install tensorflow-datasets)."
        ) from err
    return tfds


def _register_builders(tfds: Any) -> None:
    for category in _CATEGORIES:
        try:
            importlib.import_module(f"{tfds.__name__}.{category}")
        except Exception:  # a category whose optional dependencies are missing: not ours to fix
            continue


def _open(tfds: Any, name: str, split: str, data_dir: str | None) -> Any:
    def attempt() -> Any:
        return tfds.data_source(name, split=split, data_dir=data_dir, download=False, try_gcs=False)

    try:
        return attempt()
    except tfds.core.registered.DatasetNotFoundError:
        _register_builders(tfds)
        try:
            return attempt()
        except tfds.core.registered.DatasetNotFoundError as err:
            raise DataError(
                f"tfds:{name}: no TFDS dataset of that name ({str(err).splitlines()[0]})."
            ) from None
    except (AssertionError, FileNotFoundError, NotImplementedError, ValueError) as err:
        raise DataError(
            f"tfds:{name}, split {split!r}: cannot read it offline from data_dir={data_dir!r}: {err}\n"
            f"Prepare it on a machine with network access: tfds build {name} "
            "--file_format=array_record --data_dir DIR, then set data.tfds_data_dir to DIR."
        ) from err


def read_tfds(
    name: str,
    *,
    split: str,
    data_dir: str | None = None,
    required: Sequence[str] = (),
    on_error: OnError = "fail",
) -> tuple[list[dict[str, Any]], list[RecordIssue]]:
    """Records of a prepared TFDS dataset split, as plain Python dicts.

    Byte strings (TFDS `Text` features may decode to bytes) become `str`, checked as UTF-8;
    NumPy scalars become Python numbers.

    Args:
      name: the TFDS dataset name, optionally with a config and version (`"gsm8k"`).
      split: a TFDS split expression (`"train"`, `"test"`, `"train[:1000]"`).
      data_dir: where the prepared dataset lives (None: TFDS's default, `~/tensorflow_datasets`).
      required: fields every record must have (non-null text or numbers).
      on_error: `"fail"` raises `DataError` at the first bad example, `"skip"` leaves it out.

    Returns:
      `(records, issues)`; `issues` name the skipped examples (`"example 3"`) and why.

    Examples:
      >>> tfds = __import__("pytest").importorskip("tensorflow_datasets")
      >>> with tfds.testing.mock_data(num_examples=3):
      ...     records, issues = read_tfds("gsm8k", split="test", required=["question", "answer"])
      >>> len(records), sorted(records[0]), issues
      (3, ['annotation', 'answer', 'question', 'short_answer'], [])
    """
    tfds = import_tfds()
    source = _open(tfds, name, split, data_dir)
    issues = IssueLog(f"tfds:{name}[{split}]", on_error)
    records: list[dict[str, Any]] = []
    for index in range(len(source)):
        try:
            records.append(clean_record(source[index], required))
        except ValueError as err:
            issues.add(f"example {index}", str(err))
    return records, issues.finish(len(records))
