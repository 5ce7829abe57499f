"""JSONL and Parquet sources: bad records reported with their line / row, skipped or fatal."""

from __future__ import annotations

import logging
import sys

import pytest

from jaxrl_llm.config import ConfigError, build
from jaxrl_llm.data import DataConfig, DataError, load_split, read_jsonl, read_parquet

GOOD = b'{"question": "1+1?", "answer": "2"}\n'


def write(tmp_path, content: bytes, name: str = "d.jsonl"):
    path = tmp_path / name
    path.write_bytes(content)
    return path


BAD_LINES = [
    (b'{"question": "2+2?", "answer": \n', "line 2: invalid JSON: Expecting value (column 32)"),
    (
        b'{"question": "caf\xe9", "answer": "x"}\n',
        "line 2: not valid UTF-8 (byte 0xe9 at column 18)",
    ),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 2: invalid JSON: nested too deeply to read"),
    (b'["question", "answer"]\n', "line 2: expected an object of fields, got list"),
    (b'{"question": "3+3?"}\n', "line 2: missing field 'answer' (the record has: question)"),
    (b'{"question": "3+3?", "answer": null}\n', "line 2: field 'answer' is null"),
    (b'{"question": "3+3?", "answer": NaN}\n', "line 2: field 'answer' is NaN"),
    (
        b'{"question": "3+3?", "answer": Infinity}\n',
        "line 2: field 'answer' is inf (not a finite number)",
    ),
    (
        b'{"question": "3+3?", "answer": "6", "answer": "7"}\n',
        "line 2: field 'answer' appears twice in one object",
    ),
    (
        b'{"question": {"a": 1}, "answer": "1"}\n',
        "line 2: field 'question' must be text or a number, got dict",
    ),
    (
        b'{"question": "\\ud800", "answer": "1"}\n',
        "line 2: field 'question' holds an unpaired surrogate at character 0",
    ),
]


@pytest.mark.parametrize(("bad", "message"), BAD_LINES)
def test_bad_jsonl_line_fails_with_its_line_number(tmp_path, bad, message):
    path = write(tmp_path, GOOD + bad + GOOD)
    with pytest.raises(DataError) as err:
        read_jsonl(path, required=["question", "answer"])
    assert f"{path}, {message}" in str(err.value)
    assert "set it to 'skip'" in str(err.value)


@pytest.mark.parametrize(("bad", "message"), BAD_LINES)
def test_bad_jsonl_line_is_skipped_and_reported(tmp_path, bad, message, caplog):
    path = write(tmp_path, GOOD + bad + GOOD)
    with caplog.at_level(logging.WARNING, logger="jaxrl_llm.data.records"):
        records, issues = read_jsonl(path, required=["question", "answer"], on_error="skip")
    assert records == [{"question": "1+1?", "answer": "2"}] * 2
    assert [f"{i.location}: {i.reason}" for i in issues] == [message]
    assert "skipped 1 bad record(s)" in caplog.text and message in caplog.text


def test_jsonl_blank_lines_bom_and_unicode(tmp_path):
    path = write(
        tmp_path, b"\xef\xbb\xbf" + GOOD + b"\n   \n" + '{"question": "π?", "answer": 3}\n'.encode()
    )
    records, issues = read_jsonl(path, required=["question", "answer"])
    assert records == [{"question": "1+1?", "answer": "2"}, {"question": "π?", "answer": 3}]
    assert issues == []


def test_a_byte_order_mark_is_allowed_on_the_first_line_only(tmp_path):
    path = write(tmp_path, GOOD + b"\xef\xbb\xbf" + GOOD)
    records, issues = read_jsonl(path, required=["question", "answer"], on_error="skip")
    assert len(records) == 1
    assert [i.location for i in issues] == ["line 2"] and "invalid JSON" in issues[0].reason


def test_jsonl_line_numbers_count_blank_lines(tmp_path):
    path = write(tmp_path, GOOD + b"\n\n{oops}\n")
    with pytest.raises(DataError, match="line 4: invalid JSON"):
        read_jsonl(path)


def test_jsonl_missing_file_and_nothing_usable(tmp_path):
    with pytest.raises(DataError, match="JSONL file not found"):
        read_jsonl(tmp_path / "missing.jsonl")
    path = write(tmp_path, b"{bad\n")
    with pytest.raises(DataError, match="no usable records \\(1 skipped\\)"):
        read_jsonl(path, on_error="skip")


def test_load_split_reads_train_and_eval_files(tmp_path):
    train = write(tmp_path, GOOD * 3, "train.jsonl")
    evals = write(tmp_path, b'{"question": "5+5?", "answer": "10", "id": 7}\n', "eval.jsonl")
    cfg = build(
        DataConfig,
        {
            "source": f"jsonl:{train}",
            "eval_source": f"jsonl:{evals}",
            "template": {"prompt": "Q: {question}"},
        },
    )
    assert len(load_split(cfg, "train")) == 3
    assert load_split(cfg, "eval") == [{"question": "5+5?", "answer": "10", "id": 7}]
    no_eval = build(DataConfig, {"source": f"jsonl:{train}", "template": {"prompt": "{question}"}})
    with pytest.raises(ConfigError, match="has no eval split; set eval_source"):
        load_split(no_eval, "eval")


def test_load_split_checks_the_template_fields(tmp_path):
    path = write(tmp_path, GOOD)
    cfg = DataConfig(source=f"jsonl:{path}")  # default template uses {prompt}
    with pytest.raises(DataError, match="line 1: missing field 'prompt'"):
        load_split(cfg, "train")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"source": "arithmetc"}, "unknown source 'arithmetc' (did you mean 'arithmetic'?)"),
        ({"source": "jsonl:"}, "unknown source 'jsonl:'"),
        (
            {"source": "csv:/a.csv"},
            "use arithmetic, sorting, jsonl:PATH, parquet:PATH or tfds:NAME",
        ),
        ({"source": "arithmetic", "eval_source": "jsonl:/e.jsonl"}, "only file sources"),
        ({"source": "jsonl:/a", "eval_source": "tfds:gsm8k"}, "only file sources"),
        ({"on_bad_record": "ignore"}, "on_bad_record: must be one of 'fail', 'skip'"),
        ({"seed": -1}, "data.seed: must be >= 0"),
        ({"template": {"prompt": "{0}"}}, "field '0' must be a plain field name"),
        ({"template": {"system": "hi"}}, "a system message needs chat: true"),
    ],
)
def test_data_config_errors(data, message):
    with pytest.raises(ConfigError) as err:
        build(DataConfig, data)
    assert message in str(err.value)


def test_missing_pyarrow_names_the_extra(tmp_path, monkeypatch):
    path = write(tmp_path, b"PAR1", "d.parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[data\]'"):
        read_parquet(path)


def test_parquet_round_trip_and_bad_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "question": pa.array([b"1+1?", b"caf\xe9", b"3+3?", b"4+4?"], pa.binary()),
            "answer": pa.array(["2", "x", None, "8"], pa.string()),
            "level": pa.array([1, 2, 3, 4], pa.int64()),
        }
    )
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    records, issues = read_parquet(path, required=["question", "answer"], on_error="skip")
    assert records == [
        {"question": "1+1?", "answer": "2", "level": 1},
        {"question": "4+4?", "answer": "8", "level": 4},
    ]
    assert [(i.location, i.reason) for i in issues] == [
        ("row 1", "field 'question' is not valid UTF-8 (byte 0xe9 at offset 3)"),
        ("row 2", "field 'answer' is null"),
    ]
    with pytest.raises(DataError, match="row 1: field 'question' is not valid UTF-8"):
        read_parquet(path, required=["question", "answer"])
    # a decimal column is its digits as written (every row was refused as "not text")
    import decimal

    money = pa.table(
        {"q": ["a"], "answer": pa.array([decimal.Decimal("18.50")], pa.decimal128(5, 2))}
    )
    pq.write_table(money, tmp_path / "m.parquet")
    assert read_parquet(tmp_path / "m.parquet", required=["q", "answer"])[0] == [
        {"q": "a", "answer": "18.50"}
    ]
    with pytest.raises(DataError, match=r"missing column\(s\) \['solution'\]"):
        read_parquet(path, required=["solution"])
    cfg = DataConfig(
        source=f"parquet:{path}", template=build_template("{question}"), on_bad_record="skip"
    )
    assert len(load_split(cfg, "train")) == 2


def test_an_unused_column_that_is_not_text_keeps_its_rows(tmp_path):
    """An image's bytes beside the prompt and answer: the rows load and the column stays bytes
    (every row was rejected as not UTF-8); the same bytes in a used column still are."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "question": pa.array([b"1+1?", b"2+2?"], pa.binary()),
            "answer": pa.array(["2", "4"], pa.string()),
            "image": pa.array([b"\x89PNG", b"\xff\xd8"], pa.binary()),
        }
    )
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    records, issues = read_parquet(path, required=["question", "answer"], on_error="fail")
    assert issues == [] and [r["image"] for r in records] == [b"\x89PNG", b"\xff\xd8"]
    assert records[0]["question"] == "1+1?"
    with pytest.raises(DataError, match="row 0: field 'image' is not valid UTF-8"):
        read_parquet(path, required=["question", "image"])


def test_corrupt_parquet_is_a_data_error(tmp_path):
    pytest.importorskip("pyarrow")
    path = write(tmp_path, b"not parquet", "d.parquet")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        read_parquet(path)


def build_template(prompt):
    from jaxrl_llm.data import TemplateConfig

    return TemplateConfig(prompt=prompt)
