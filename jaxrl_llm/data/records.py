"""Checking loaded records: missing fields, bad values, non-UTF-8 text; skip or fail.

Every source (`jsonl`, `parquet`, `tfds_source`) hands each raw record to `clean_record`
with a location (`"line 7"`, `"row 3"`, `"example 12"`). A bad record either stops the load
with a `DataError` naming the file, the location and the problem (`on_error="fail"`), or is
skipped and listed in the returned issues, with a logged warning (`on_error="skip"`).
"""

from __future__ import annotations

import decimal
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

OnError = Literal["fail", "skip"]
log = logging.getLogger(__name__)


class DataError(ValueError):
    """A data source could not be read, or a record is bad under `on_error="fail"`.

    Examples:
      >>> issubclass(DataError, ValueError)
      True
    """


class RecordIssue(NamedTuple):
    """One skipped record: where it is and what was wrong.

    Examples:
      >>> RecordIssue("line 3", "invalid JSON").location
      'line 3'
    """

    location: str
    reason: str


def _text(value: bytes, field: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"field {field!r} is not valid UTF-8 (byte 0x{value[err.start]:02x} at offset "
            f"{err.start})"
        ) from None


def plain_value(value: Any, field: str) -> Any:
    """A record value as plain Python: bytes → str (UTF-8, checked), NumPy → Python, a
    `Decimal` → its text (`Decimal("18.50")` → `"18.50"`).

    Raises `ValueError` (naming `field`) for bytes that are not UTF-8 and for strings with
    unpaired surrogates, which no tokenizer can encode.

    Examples:
      >>> plain_value(b"caf\\xc3\\xa9", "q"), plain_value(np.int64(3), "a")
      ('café', 3)
      >>> plain_value(b"\\xff", "q")
      Traceback (most recent call last):
      ...
      ValueError: field 'q' is not valid UTF-8 (byte 0xff at offset 0)
    """
    if isinstance(value, bytes):
        return _text(value, field)
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(
                f"field {field!r} holds an unpaired surrogate at character {err.start}"
            ) from None
        return value
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return plain_value(value.item(), field)
        return [plain_value(v, field) for v in value.tolist()]
    if isinstance(value, np.generic):
        return plain_value(value.item(), field)
    if isinstance(value, decimal.Decimal):  # a Parquet decimal column: its digits as written
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): plain_value(v, f"{field}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_value(v, field) for v in value]
    return value


def plain_fields(raw: Mapping, required: Sequence[str]) -> dict[str, Any]:
    """`plain_value` of every field; a field outside `required` that is not text (an image's
    bytes, a string with an unpaired surrogate) is kept as given instead of failing the record:
    nothing reads it as text, and a custom reward may read it as it is.

    Examples:
      >>> plain_fields({"q": b"2+2", "image": b"\\x89PNG"}, ["q"])
      {'q': '2+2', 'image': b'\\x89PNG'}
    """
    record = {}
    for key, value in raw.items():
        name = str(key)
        try:
            record[name] = plain_value(value, name)
        except ValueError:
            if name in required:
                raise
            record[name] = value
    return record


def clean_record(raw: Any, required: Sequence[str]) -> dict[str, Any]:
    """A checked record: a mapping, every `required` field present, non-null and scalar.

    Required fields (those the prompt template and the reward use) must be text, a number or
    a bool; NaN and infinite numbers are rejected. Other fields are decoded when they can be
    and kept as given when not (`plain_fields`). Raises `ValueError` describing the first
    problem.

    Examples:
      >>> clean_record({"q": b"2+2", "a": 4}, ["q", "a"])
      {'q': '2+2', 'a': 4}
      >>> clean_record({"q": "2+2"}, ["q", "a"])
      Traceback (most recent call last):
      ...
      ValueError: missing field 'a' (the record has: q)
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected an object of fields, got {type(raw).__name__}")
    record = plain_fields(raw, required)
    for field in required:
        if field not in record:
            raise ValueError(
                f"missing field {field!r} (the record has: {', '.join(record) or 'nothing'})"
            )
        value = record[field]
        if value is None:
            raise ValueError(f"field {field!r} is null")
        if not isinstance(value, str | int | float | bool):
            raise ValueError(
                f"field {field!r} must be text or a number, got {type(value).__name__}"
            )
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(f"field {field!r} is NaN")
        if isinstance(value, float) and math.isinf(value):
            raise ValueError(f"field {field!r} is {value} (not a finite number)")
    return record


class IssueLog:
    """Collects skipped records of one source, or raises at the first one under `"fail"`.

    Examples:
      >>> issues = IssueLog("data.jsonl", "skip")
      >>> issues.add("line 2", "invalid JSON")
      >>> issues.issues
      [RecordIssue(location='line 2', reason='invalid JSON')]
      >>> IssueLog("data.jsonl", "fail").add("line 2", "invalid JSON")
      Traceback (most recent call last):
      ...
      jaxrl_llm.data.records.DataError: data.jsonl, line 2: invalid JSON (on_bad_record='fail'; set it to 'skip' to leave bad records out)
    """

    def __init__(self, source: str, on_error: OnError):
        if on_error not in ("fail", "skip"):
            raise ValueError(f"`on_error` must be 'fail' or 'skip', got {on_error!r}.")
        self.source = source
        self.on_error = on_error
        self.issues: list[RecordIssue] = []

    def add(self, location: str, reason: str) -> None:
        """Record a bad record (or raise `DataError` under `"fail"`)."""
        if self.on_error == "fail":
            raise DataError(
                f"{self.source}, {location}: {reason} (on_bad_record='fail'; set it to 'skip' "
                "to leave bad records out)"
            )
        self.issues.append(RecordIssue(location, reason))

    def finish(self, kept: int) -> list[RecordIssue]:
        """Log a summary of the skipped records; raise if nothing is left."""
        if self.issues:
            shown = "; ".join(f"{i.location}: {i.reason}" for i in self.issues[:5])
            more = f" (and {len(self.issues) - 5} more)" if len(self.issues) > 5 else ""
            log.warning(
                "%s: skipped %d bad record(s): %s%s", self.source, len(self.issues), shown, more
            )
        if kept == 0:
            raise DataError(f"{self.source}: no usable records ({len(self.issues)} skipped).")
        return self.issues
