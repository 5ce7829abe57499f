"""Local JSON Lines files: one JSON object per line.

Lines are read as bytes and decoded one at a time, so a line that is not UTF-8, not JSON, not
an object, or lacks a required field is reported with its (1-based) line number, and skipped
or fatal by `on_error`. Blank lines are ignored; a UTF-8 byte-order mark on line 1 is allowed.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

from jaxrl_llm.data.records import DataError, IssueLog, OnError, RecordIssue, clean_record


class _DuplicateFieldError(ValueError):
    """A JSON object names a field twice (json would keep the last value silently)."""


def _unique_fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateFieldError(key)
        out[key] = value
    return out


def read_jsonl(
    path: str | pathlib.Path,
    *,
    required: Sequence[str] = (),
    on_error: OnError = "fail",
    check: Callable[[Any], dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[RecordIssue]]:
    """Records of a JSONL file, checked, with the list of skipped lines.

    Args:
      path: a local `.jsonl` file.
      required: fields every record must have (non-null text or numbers).
      on_error: `"fail"` raises `DataError` at the first bad line, `"skip"` leaves it out.
      check: `check(value) -> record`, raising `ValueError` naming the problem, for each
        line's JSON value (default: `clean_record(value, required)`; e.g.
        `data.preference.check_preference_record`).

    Returns:
      `(records, issues)`; `issues` name the skipped lines (`"line 7"`) and why.

    Examples:
      >>> import tempfile, os
      >>> path = os.path.join(tempfile.mkdtemp(), "d.jsonl")
      >>> _ = open(path, "wb").write(b'{"q": "1+1", "a": "2"}\\n{"q": "2+2"\\n\\n{"q": "3+3", "a": 6}\\n')
      >>> records, issues = read_jsonl(path, required=["q", "a"], on_error="skip")
      >>> records, [i.location for i in issues]
      ([{'q': '1+1', 'a': '2'}, {'q': '3+3', 'a': 6}], ['line 2'])
    """
    if check is None:

        def check(value: Any) -> dict[str, Any]:
            return clean_record(value, required)

    path = pathlib.Path(path)
    if not path.is_file():
        raise DataError(f"JSONL file not found: {path}")
    issues = IssueLog(str(path), on_error)
    records: list[dict[str, Any]] = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            location = f"line {number}"
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as err:
                issues.add(
                    location,
                    f"not valid UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})",
                )
                continue
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"), object_pairs_hook=_unique_fields)
            except json.JSONDecodeError as err:
                issues.add(location, f"invalid JSON: {err.msg} (column {err.pos + 1})")
                continue
            except RecursionError:
                issues.add(location, "invalid JSON: nested too deeply to read")
                continue
            except _DuplicateFieldError as err:
                issues.add(location, f"field {err.args[0]!r} appears twice in one object")
                continue
            try:
                records.append(check(value))
            except ValueError as err:
                issues.add(location, str(err))
    return records, issues.finish(len(records))
