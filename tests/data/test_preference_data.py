"""Preference JSONL: reading, record errors with line numbers, rendering, truncation, batches."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from jaxrl_llm.config import ConfigError, build
from jaxrl_llm.data import (
    ArithmeticConfig,
    DataError,
    PreferenceDataConfig,
    TemplateConfig,
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
from jaxrl_llm.tokenizer import ByteTokenizer

TOK = ByteTokenizer()
BOS, EOS, PAD = TOK.bos_id, TOK.eos_id, TOK.pad_id
GOOD = {"prompt": "1+1=", "chosen": "2", "rejected": "3"}


def _write(tmp_path, lines: list[bytes | str]) -> str:
    path = tmp_path / "prefs.jsonl"
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return str(path)


def _ids(text: str) -> list[int]:
    return list(text.encode())


# ------------------------------------------------------------------ reading and errors


def test_reads_paired_conversational_and_unpaired_records(tmp_path):
    chat = {
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        "chosen": [{"role": "assistant", "content": "4"}],
        "rejected": [{"role": "assistant", "content": "5"}],
        "source": "demo",
    }
    path = _write(tmp_path, [json.dumps(GOOD), "", json.dumps(chat)])
    records, issues = read_preference_jsonl(path)
    assert issues == []
    assert records[0] == GOOD
    assert records[1]["prompt"] == chat["prompt"]
    assert (records[1]["chosen"], records[1]["rejected"], records[1]["source"]) == (
        "4",
        "5",
        "demo",
    )

    kto = [
        {"prompt": "a", "completion": "b", "label": True},
        {"prompt": "c", "completion": "d", "label": False},
    ]
    records, _ = read_preference_jsonl(
        _write(tmp_path, [json.dumps(r) for r in kto]), unpaired=True
    )
    assert records == kto


@pytest.mark.parametrize(
    "line, reason",
    [
        (b'{"prompt": "1+1=", "chosen": "2"', "invalid JSON"),
        (
            b'{"prompt": "1+1=", "chosen": "2"}',
            "missing field 'rejected' (the record has: prompt, chosen)",
        ),
        (b'{"prompt": "1+1=", "chosen": null, "rejected": "3"}', "field 'chosen' is null"),
        (
            b'{"prompt": "caf\xe9", "chosen": "2", "rejected": "3"}',
            "not valid UTF-8 (byte 0xe9 at column 16)",
        ),
        (
            b'{"prompt": "\\ud800", "chosen": "2", "rejected": "3"}',
            "field 'prompt' holds an unpaired surrogate",
        ),
        (
            b'{"prompt": 7, "chosen": "2", "rejected": "3"}',
            "field 'prompt' must be text or a list of messages",
        ),
        (b'["prompt", "chosen"]', "expected an object of fields, got list"),
        (
            b'{"prompt": "x", "chosen": [{"role": "user", "content": "2"}], "rejected": "3"}',
            "field 'chosen' must hold exactly one message with role 'assistant'",
        ),
        (
            b'{"prompt": [{"role": "user"}], "chosen": "2", "rejected": "3"}',
            "field 'prompt' message 0",
        ),
    ],
)
def test_a_bad_line_is_reported_with_its_number(tmp_path, line, reason):
    path = _write(tmp_path, [json.dumps(GOOD), json.dumps(GOOD), line, json.dumps(GOOD)])
    with pytest.raises(DataError, match="line 3: ") as err:
        read_preference_jsonl(path)
    assert reason in str(err.value)
    assert path in str(err.value)
    records, issues = read_preference_jsonl(path, on_error="skip")
    assert len(records) == 3
    assert [i.location for i in issues] == ["line 3"]
    assert reason in issues[0].reason


def test_implicit_prompts_are_split_from_whole_text_and_conversations(tmp_path):
    """HH-RLHF's form: no `prompt`, `chosen` and `rejected` hold the whole dialogue."""
    hh = {
        "chosen": "\n\nHuman: 2+2?\n\nAssistant: 4",
        "rejected": "\n\nHuman: 2+2?\n\nAssistant: 5, I think",
    }
    user = {"role": "user", "content": "hi"}
    chat = {
        "chosen": [user, {"role": "assistant", "content": "hello"}],
        "rejected": [user, {"role": "assistant", "content": "go away"}],
    }
    records, issues = read_preference_jsonl(_write(tmp_path, [json.dumps(hh), json.dumps(chat)]))
    assert issues == []
    assert records[0] == {
        "prompt": "\n\nHuman: 2+2?\n\nAssistant:",  # the space goes to the completions
        "chosen": " 4",
        "rejected": " 5, I think",
    }
    assert records[1] == {"prompt": [user], "chosen": "hello", "rejected": "go away"}
    # a prompt that is given is never re-split, whatever the completions share
    assert (
        check_preference_record({"prompt": "x", "chosen": "ab", "rejected": "ac"})["chosen"] == "ab"
    )
    # one completion extends the other: each side keeps at least its last character
    assert split_implicit_prompt("Q: yes", "Q: yes!") == ("Q: ye", "s", "s!")
    examples, _, _ = load_preference_data(records[:1], tokenizer=TOK, config=PreferenceDataConfig())
    assert examples[0].prompt == (BOS, *_ids("\n\nHuman: 2+2?\n\nAssistant:"))
    assert examples[0].chosen == (*_ids(" 4"), EOS)


@pytest.mark.parametrize(
    "record, reason",
    [
        ({"chosen": "same", "rejected": "same"}, "'chosen' equals 'rejected': nothing to prefer"),
        ({"chosen": "yes", "rejected": "no"}, "share no leading prompt to use as one"),
        ({"chosen": "a b", "rejected": [{"role": "assistant", "content": "c"}]}, "not both text"),
        ({"chosen": "4"}, "missing field 'prompt' (the record has: chosen)"),
    ],
)
def test_implicit_prompts_that_cannot_be_split_are_refused(record, reason):
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        check_preference_record(record)


def test_unpaired_label_must_be_a_bool_and_nothing_left_is_an_error(tmp_path):
    bad = {"prompt": "a", "completion": "b", "label": 1}
    path = _write(tmp_path, [json.dumps(bad)])
    with pytest.raises(DataError, match="line 1: field 'label' must be true or false, got 1"):
        read_preference_jsonl(path, unpaired=True)
    with pytest.raises(DataError, match="no usable records"):
        read_preference_jsonl(path, unpaired=True, on_error="skip")
    with pytest.raises(DataError, match="missing field 'completion'"):
        read_preference_jsonl(_write(tmp_path, [json.dumps(GOOD)]), unpaired=True)
    with pytest.raises(DataError, match="JSONL file not found"):
        read_preference_jsonl(tmp_path / "missing.jsonl")


def test_in_memory_records_use_the_same_checks():
    cfg = PreferenceDataConfig()
    with pytest.raises(DataError, match=r"records, example 1: missing field 'rejected'"):
        load_preference_data([GOOD, {"prompt": "x", "chosen": "y"}], tokenizer=TOK, config=cfg)
    examples, stats, issues = load_preference_data(
        [GOOD, {"prompt": b"\xff", "chosen": "y", "rejected": "z"}],
        tokenizer=TOK,
        config=PreferenceDataConfig(on_bad_record="skip"),
    )
    assert len(examples) == 1 and stats.examples == 1
    assert issues[0].location == "example 1" and "not valid UTF-8" in issues[0].reason
    # already tokenized examples pass through, their kind is checked
    again, _, _ = load_preference_data(examples, tokenizer=TOK, config=cfg)
    assert again == examples
    with pytest.raises(DataError, match="are paired but unpaired=True"):
        load_preference_data(examples, tokenizer=TOK, config=cfg, unpaired=True)


def test_write_then_read_round_trips_unicode(tmp_path):
    records = [{"prompt": "Größe?", "chosen": "groß", "rejected": "klein 😀"}]
    path = tmp_path / "r.jsonl"
    write_preference_jsonl(path, records)
    assert read_preference_jsonl(path)[0] == records


# ------------------------------------------------------------------ rendering and truncation


def test_tokens_of_prompts_and_completions():
    examples, stats = tokenize_preferences([GOOD], tokenizer=TOK, config=PreferenceDataConfig())
    (ex,) = examples
    assert ex.prompt == (BOS, *_ids("1+1="))
    assert ex.chosen == (*_ids("2"), EOS) and ex.rejected == (*_ids("3"), EOS)
    assert ex.label is None and stats == TruncationStats(1, 0, 0, 0)
    no_eos, _ = tokenize_preferences(
        [GOOD], tokenizer=TOK, config=PreferenceDataConfig(add_eos=False)
    )
    assert no_eos[0].chosen == tuple(_ids("2"))
    with pytest.raises(DataError, match="example 0: the chosen completion has no tokens"):
        tokenize_preferences(
            [{**GOOD, "chosen": ""}], tokenizer=TOK, config=PreferenceDataConfig(add_eos=False)
        )


def test_templates_and_chat_rendering():
    tok = ByteTokenizer(chat_template=True)
    record = {"prompt": "ignored", "question": "2+2?", "chosen": "4", "rejected": "5"}
    cfg = PreferenceDataConfig(
        template=TemplateConfig(prompt="Q: {question}", system="Be brief.", chat=True)
    )
    (ex,), _ = tokenize_preferences([record], tokenizer=tok, config=cfg)
    assert ex.prompt == (BOS, *_ids("system: Be brief.\nuser: Q: 2+2?\nassistant: "))
    conversational = check_preference_record(
        {"prompt": [{"role": "user", "content": "hi"}], "chosen": "a", "rejected": "b"}
    )
    (ex,), _ = tokenize_preferences([conversational], tokenizer=tok, config=PreferenceDataConfig())
    assert ex.prompt == (BOS, *_ids("user: hi\nassistant: "))
    with pytest.raises(
        DataError, match="example 0: cannot render its prompt: a list of messages needs"
    ):
        tokenize_preferences([conversational], tokenizer=TOK, config=PreferenceDataConfig())
    with pytest.raises(DataError, match="uses field 'question'"):
        tokenize_preferences([GOOD], tokenizer=tok, config=cfg)


def test_truncation_keeps_the_end_of_prompts_and_the_start_of_completions(caplog):
    records = [
        {"prompt": "abcdefgh", "chosen": "0123456789", "rejected": "xy"},
        {"prompt": "ab", "chosen": "1", "rejected": "uvwxyz"},
        {"prompt": "a", "chosen": "1", "rejected": "2"},
    ]
    cfg = PreferenceDataConfig(max_prompt_length=4, max_completion_length=5)
    with caplog.at_level(logging.WARNING, logger="jaxrl_llm.data.preference"):
        examples, stats = tokenize_preferences(records, tokenizer=TOK, config=cfg)
    assert examples[0].prompt == tuple(_ids("efgh"))  # BOS and "abcd" cut from the left
    assert examples[0].chosen == tuple(_ids("01234"))  # "56789" and EOS cut from the right
    assert examples[0].rejected == (*_ids("xy"), EOS)
    assert examples[1].prompt == (BOS, *_ids("ab"))  # 3 tokens: kept whole
    assert examples[1].rejected == tuple(_ids("uvwxy"))
    assert stats == TruncationStats(examples=3, prompt=1, chosen=1, rejected=1)
    assert "truncated 1 prompt(s) to their last 4 tokens" in caplog.text
    assert truncate_tokens([1, 2, 3], 3, keep="last") == ((1, 2, 3), False)


def test_pairs_tied_by_truncation_are_counted_and_identical_pairs_refused(caplog):
    """Completions that differ only past `max_completion_length` become the same tokens: a pair
    with margin 0, counted (`tied`) and warned about; a record whose chosen and rejected texts
    are equal is a bad record, as the implicit-prompt form already was."""
    records = [
        {"prompt": "p", "chosen": "abcdefgh GOOD", "rejected": "abcdefgh BAD"},
        {"prompt": "q", "chosen": "1", "rejected": "2"},
    ]
    cfg = PreferenceDataConfig(max_completion_length=4)
    with caplog.at_level(logging.WARNING, logger="jaxrl_llm.data.preference"):
        examples, stats = tokenize_preferences(records, tokenizer=TOK, config=cfg)
    assert examples[0].chosen == examples[0].rejected == tuple(_ids("abcd"))
    assert stats.tied == 1 and stats.chosen == stats.rejected == 1
    assert "1 of 2 pairs have the same chosen and rejected tokens" in caplog.text
    same = {"prompt": "p", "chosen": "same", "rejected": "same"}
    with pytest.raises(ValueError, match="'chosen' equals 'rejected': nothing to prefer"):
        check_preference_record(same)
    kept, _, issues = load_preference_data(
        [same, records[1]], tokenizer=TOK, config=PreferenceDataConfig(on_bad_record="skip")
    )
    assert len(kept) == 1 and "nothing to prefer" in issues[0].reason
    _, again, _ = load_preference_data(examples, tokenizer=TOK, config=cfg)  # tokenized input
    assert again.tied == 1


# ------------------------------------------------------------------ batches


def test_batches_are_bucketed_left_right_padded_and_share_shapes():
    records = [
        {"prompt": "12+7=", "chosen": "19", "rejected": "1900000"},
        {"prompt": "3+4=", "chosen": "7", "rejected": "8"},
    ]
    cfg = PreferenceDataConfig(bucket_minimum=4, max_prompt_length=100, max_completion_length=6)
    examples, stats = tokenize_preferences(records, tokenizer=TOK, config=cfg)
    assert stats.rejected == 1
    batch = make_preference_batch(examples, pad_id=PAD, config=cfg)
    P, T = 8, 6  # longest prompt 6 → 8; longest completion 6 (truncated) → min(8, cap 6)
    for seqs in (batch.chosen, batch.rejected):
        assert seqs.tokens.shape == (2, P + T) and seqs.tokens.dtype == np.int32
        assert seqs.completion_mask.shape == (2, T)
    c = batch.chosen
    assert c.tokens[0].tolist() == [PAD, PAD, BOS, *_ids("12+7="), *_ids("19"), EOS, PAD, PAD, PAD]
    assert c.attention_mask[0].tolist() == [0, 0] + [1] * 9 + [0] * 3
    assert c.completion_mask[0].tolist() == [1, 1, 1, 0, 0, 0]
    assert c.tokens[1, :P].tolist() == [PAD] * 3 + [BOS, *_ids("3+4=")]
    assert batch.rejected.tokens[0, P:].tolist() == _ids("190000")
    assert batch.rejected.completion_mask[0].tolist() == [1] * 6
    assert np.array_equal(batch.chosen.tokens[:, :P], batch.rejected.tokens[:, :P])
    assert batch.labels is None and batch.ref_chosen_logp is None

    small = make_preference_batch(examples[1:], pad_id=PAD, config=cfg)
    assert small.chosen.tokens.shape == (1, 8 + 4)  # prompt 5 → 8, completion 2 → minimum 4


def test_unpaired_batches_carry_labels():
    records = [
        {"prompt": "a", "completion": "b", "label": True},
        {"prompt": "c", "completion": "d", "label": False},
    ]
    cfg = PreferenceDataConfig(bucket_minimum=2)
    examples, _, _ = load_preference_data(records, tokenizer=TOK, config=cfg, unpaired=True)
    batch = make_preference_batch(examples, pad_id=PAD, config=cfg)
    assert batch.rejected is None
    assert batch.labels.tolist() == [1.0, 0.0] and batch.labels.dtype == np.float32
    with pytest.raises(ValueError, match="mixes paired and unpaired"):
        make_preference_batch(
            [examples[0], TokenizedPreference((BOS,), (1,), (2,), None)], pad_id=PAD, config=cfg
        )
    with pytest.raises(ValueError, match="exceed max_prompt_length=1"):
        make_preference_batch(
            examples, pad_id=PAD, config=PreferenceDataConfig(max_prompt_length=1)
        )
    with pytest.raises(ValueError, match="`examples` is empty"):
        make_preference_batch([], pad_id=PAD, config=cfg)


def test_config_builds_from_yaml_and_rejects_bad_values():
    cfg = build(PreferenceDataConfig, {"template": {"prompt": "Q: {q}"}, "max_prompt_length": 64})
    assert cfg.template.fields == ("q",) and cfg.max_prompt_length == 64
    with pytest.raises(ConfigError, match="`bucket_minimum` must be an int >= 1"):
        PreferenceDataConfig(bucket_minimum=0)
    with pytest.raises(ConfigError, match="on_bad_record"):
        build(PreferenceDataConfig, {"on_bad_record": "ignore"})


# ------------------------------------------------------------------ generated arithmetic set


def test_arithmetic_preferences_prefer_the_correct_answer():
    config = ArithmeticConfig(max_digits=2, operations=("+", "-", "*"), train_size=50)
    records = arithmetic_preference_records(config, seed=4)
    assert len(records) == 50
    for r in records:
        a, op, b = r["prompt"][:-1].partition(next(o for o in "+-*" if o in r["prompt"][1:]))
        value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert r["chosen"] == str(value)
        assert 1 <= abs(int(r["rejected"]) - value) <= 9
    assert records == arithmetic_preference_records(config, seed=4)
    assert records != arithmetic_preference_records(config, seed=5)
    unpaired = arithmetic_preference_records(config, seed=4, unpaired=True, desirable_fraction=0.7)
    labels = [r["label"] for r in unpaired]
    assert 20 < sum(labels) < 50
    for r, paired in zip(unpaired, records, strict=True):
        assert (r["completion"] == paired["chosen"]) == r["label"]
    assert [check_preference_record(r, unpaired=True) for r in unpaired] == unpaired
    with pytest.raises(ValueError, match="desirable_fraction"):
        arithmetic_preference_records(config, desirable_fraction=1.5)
