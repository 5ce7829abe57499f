"""Local Parquet files, read with `pyarrow` (an optional dependency: `pip install -e '.[data]'`).

`pyarrow` is imported only when a Parquet file is read. Binary columns are decoded as UTF-8
(a row whose template or answer column is not UTF-8 is reported with its 0-based row index;
other columns that are not text, e.g. an image's bytes, stay bytes), string columns come back
as text, and every record goes through the same checks as JSONL (`records.clean_record`).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

from jaxrl_llm.data.records import DataError, IssueLog, OnError, RecordIssue, clean_record


def _import_pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError(
            "reading Parquet needs pyarrow, which is not installed; install the data extra: "
            "pip install -e '.[data]' (or: pip install pyarrow)."
        ) from err
    return pq


def read_parquet(
    path: str | pathlib.Path,
    *,
    required: Sequence[str] = (),
    on_error: OnError = "fail",
) -> tuple[list[dict[str, Any]], list[RecordIssue]]:
    """Records of a Parquet file, checked, with the list of skipped rows.

    Args:
      path: a local `.parquet` file.
      required: columns every record must have, non-null (text or numbers).
      on_error: `"fail"` raises `DataError` at the first bad row, `"skip"` leaves it out.

    Returns:
      `(records, issues)`; `issues` name the skipped rows (`"row 3"`, 0-based) and why.

    Examples:
      >>> read_parquet("/nonexistent.parquet")
      Traceback (most recent call last):
      ...
      jaxrl_llm.data.records.DataError: Parquet file not found: /nonexistent.parquet
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise DataError(f"Parquet file not found: {path}")
    pq = _import_pyarrow_parquet()
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises its own error types for corrupt files
        raise DataError(f"{path}: not a readable Parquet file: {err}") from err
    missing = [c for c in required if c not in table.column_names]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {missing}; the file has: {', '.join(table.column_names)}."
        )
    issues = IssueLog(str(path), on_error)
    records: list[dict[str, Any]] = []
    for index, raw in enumerate(table.to_pylist()):
        try:
            records.append(clean_record(raw, required))
        except ValueError as err:
            issues.add(f"row {index}", str(err))
    return records, issues.finish(len(records))
