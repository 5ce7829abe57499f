"""Prompt templates, chat rendering, and prompt/answer token batches."""

from __future__ import annotations

import numpy as np
import pytest

from jaxrl_llm.data import (
    ArithmeticConfig,
    DataError,
    TemplateConfig,
    arithmetic_examples,
    format_prompt,
    group_fields,
    make_prompt_batch,
    render_prompt,
    template_fields,
)
from jaxrl_llm.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def test_template_fields_and_literal_braces():
    assert template_fields("{a} and {{literal}} {b} {a}") == ("a", "b")
    assert format_prompt({"a": 1, "b": "x"}, TemplateConfig(prompt="{a} {{b}} {b}")) == "1 {b} x"
    with pytest.raises(ValueError, match="must be a plain field name"):
        template_fields("{a.b}")
    with pytest.raises(ValueError, match="must be a plain field name"):
        template_fields("{}")
    with pytest.raises(ValueError, match="Single '}' encountered"):
        template_fields("a}")
    # conversions and format specs: the valid ones format, the rest are refused by name
    assert (
        format_prompt({"a": "x", "n": 3}, TemplateConfig(prompt="{a!r:>5}|{n:03d}")) == "  'x'|003"
    )
    with pytest.raises(ValueError, match=r"field 'a' has the unknown conversion '!z'"):
        template_fields("{a!z}")
    with pytest.raises(ValueError, match=r"field 'a' has a nested field in its format spec"):
        template_fields("{a:>{w}}")
    with pytest.raises(DataError, match=r"cannot format the example's fields: Unknown format code"):
        format_prompt({"a": "text"}, TemplateConfig(prompt="{a:d}"))


def test_chat_rendering_with_system_message():
    template = TemplateConfig(prompt="Solve: {q}", system="Answer with a number.", chat=True)
    text = render_prompt({"q": "2+2"}, template, ByteTokenizer(chat_template=True))
    assert text == "system: Answer with a number.\nuser: Solve: 2+2\nassistant: "
    with pytest.raises(ValueError, match="needs chat_template=True"):
        render_prompt({"q": "2+2"}, template, ByteTokenizer())


def test_missing_template_field_names_it():
    with pytest.raises(
        DataError,
        match="uses field 'question', which the example lacks \\(it has: prompt, answer\\)",
    ):
        format_prompt({"prompt": "x", "answer": "y"}, TemplateConfig(prompt="{question}"))


def test_arithmetic_batch_token_form():
    examples = arithmetic_examples(ArithmeticConfig(train_size=16), split="train", seed=0)
    batch = make_prompt_batch(
        examples, template=TemplateConfig(), tokenizer=TOK, prompt_length=10, answer_length=5
    )
    assert batch.prompt_tokens.shape == (16, 10) and batch.prompt_tokens.dtype == np.int32
    assert batch.answer_tokens.shape == (16, 5)
    for i, ex in enumerate(examples):
        row, mask = batch.prompt_tokens[i], batch.prompt_mask[i]
        assert mask[-1] and not mask[: 10 - mask.sum()].any()  # left-padded
        assert row[mask].tolist() == [TOK.bos_id, *ex["prompt"].encode()]
        n = batch.answer_lengths[i]
        assert batch.answer_tokens[i, :n].tolist() == list(ex["answer"].encode())
        assert (batch.answer_tokens[i, n:] == TOK.pad_id).all()
        assert batch.prompts[i] == ex["prompt"]


def test_batch_length_errors_name_the_prompt():
    examples = [{"prompt": "123+456=", "answer": "579"}]
    with pytest.raises(
        DataError, match="prompt '123\\+456=' has 9 tokens, more than prompt_length=5"
    ):
        make_prompt_batch(examples, template=TemplateConfig(), tokenizer=TOK, prompt_length=5)
    with pytest.raises(DataError, match="longer than answer_length=2"):
        make_prompt_batch(examples, template=TemplateConfig(), tokenizer=TOK, answer_length=2)
    with pytest.raises(DataError, match="example 0 has no answer field 'solution'"):
        make_prompt_batch(
            examples, template=TemplateConfig(), tokenizer=TOK, answer_field="solution"
        )
    batch = make_prompt_batch(examples, template=TemplateConfig(), tokenizer=TOK, answer_field=None)
    assert batch.answer_tokens is None and batch.answer_lengths is None
    with pytest.raises(ValueError, match="`examples` is empty"):
        make_prompt_batch([], template=TemplateConfig(), tokenizer=TOK)


def test_group_fields_repeat_prompt_major():
    fields = group_fields(
        [{"answer": "1", "x": 0}, {"answer": "2", "x": 1}, {"answer": "3", "x": 2}], 2
    )
    assert fields == {"answer": ["1", "1", "2", "2", "3", "3"], "x": [0, 0, 1, 1, 2, 2]}
    assert group_fields([], 3) == {}
    with pytest.raises(ValueError, match="`group_size` must be >= 1"):
        group_fields([{"a": 1}], 0)
