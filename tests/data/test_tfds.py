"""TFDS sources: offline reading via `tfds.data_source` (TFDS's mock data when installed)."""

from __future__ import annotations

import sys
import types

import pytest

from jaxrl_llm.data import (
    DataConfig,
    DataError,
    TemplateConfig,
    load_split,
    make_prompt_batch,
    read_tfds,
)
from jaxrl_llm.rewards import math_answer
from jaxrl_llm.tokenizer import ByteTokenizer


def test_missing_tfds_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[data\]'"):
        read_tfds("gsm8k", split="train")


class _NotFoundError(Exception):
    pass


def _fake_tfds(examples, calls):
    """A stand-in for `tensorflow_datasets` exposing what `read_tfds` uses."""

    def data_source(name, *, split, data_dir, download, try_gcs):
        calls.append((name, split, data_dir, download, try_gcs))
        if name != "toy":
            raise _NotFoundError(f"Dataset {name} not found.\nAvailable datasets: toy")
        return examples

    module = types.ModuleType("fake_tfds")
    module.data_source = data_source
    module.core = types.SimpleNamespace(
        registered=types.SimpleNamespace(DatasetNotFoundError=_NotFoundError)
    )
    return module


def test_read_tfds_converts_checks_and_never_downloads(monkeypatch):
    examples = [
        {"question": b"1+1?", "answer": b"#### 2"},
        {"question": b"caf\xe9", "answer": b"#### 3"},
        {"question": "3+3?"},
    ]
    calls: list = []
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", _fake_tfds(examples, calls))
    records, issues = read_tfds(
        "toy", split="test", data_dir="/data", required=["question", "answer"], on_error="skip"
    )
    assert records == [{"question": "1+1?", "answer": "#### 2"}]
    assert [(i.location, i.reason) for i in issues] == [
        ("example 1", "field 'question' is not valid UTF-8 (byte 0xe9 at offset 3)"),
        ("example 2", "missing field 'answer' (the record has: question)"),
    ]
    assert calls == [("toy", "test", "/data", False, False)]
    with pytest.raises(
        DataError, match=r"tfds:toy\[test\], example 1: field 'question' is not valid UTF-8"
    ):
        read_tfds("toy", split="test", required=["question"])
    with pytest.raises(DataError, match="tfds:nope: no TFDS dataset of that name"):
        read_tfds("nope", split="train")


def test_gsm8k_with_tfds_mock_data():
    tfds = pytest.importorskip("tensorflow_datasets")
    cfg = DataConfig(
        source="tfds:gsm8k", template=TemplateConfig(prompt="Question: {question}\nAnswer:")
    )
    with tfds.testing.mock_data(num_examples=6):
        train = load_split(cfg, "train")
        evals = load_split(cfg, "eval")
    assert len(train) == len(evals) == 6
    assert all(isinstance(e[k], str) for e in train for k in ("question", "answer"))
    batch = make_prompt_batch(train[:4], template=cfg.template, tokenizer=ByteTokenizer())
    assert batch.prompts[0].startswith("Question: ") and batch.prompt_tokens.shape[0] == 4
    scores = math_answer(
        list(batch.prompts),
        [e["answer"] for e in train[:4]],
        answer=[e["answer"] for e in train[:4]],
    )
    assert len(scores) == 4


def test_unprepared_tfds_dataset_explains_how_to_prepare_it(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    with pytest.raises(DataError, match="tfds build gsm8k --file_format=array_record"):
        read_tfds("gsm8k", split="train", data_dir=str(tmp_path))
