"""Preference data: JSONL records → tokenized, truncated examples → fixed-shape batches.

Two record kinds, one JSON object per line:

    paired    {"prompt": ..., "chosen": ..., "rejected": ...}            DPO, RPO, SimPO, CPO, ORPO, BCO
    unpaired  {"prompt": ..., "completion": ..., "label": true|false}    KTO

Each text field is a string, or (conversational form, as in TRL's datasets) the prompt is a
list of `{"role", "content"}` messages and a completion a list holding one
`{"role": "assistant", "content": ...}` message. Text prompts are rendered with the
`TemplateConfig` (format string, optional chat template); conversational prompts go through the
tokenizer's chat template as given. A completion's tokens are its content's tokens (no BOS)
followed by EOS (`add_eos`).

Truncation rule: a prompt longer than `max_prompt_length` tokens keeps its *last*
`max_prompt_length` tokens (the end of the prompt, next to the answer, is kept; BOS may be cut);
a completion longer than `max_completion_length` keeps its *first* `max_completion_length`
tokens (its EOS is then cut). Truncations are counted (`TruncationStats`) and logged.

Batches (`make_preference_batch`) put each row in the layout of `jaxrl_llm.train.batch`: the
prompt left-padded to `P`, the completion right-padded to `T`; chosen and rejected share `P`
and `T`. `P` and `T` are bucketed — the next power of two of the batch's longest prompt /
completion, at least `bucket_minimum`, at most the max length — so a run compiles a handful of
programs. Bad lines are reported with their line number (`jaxrl_llm.data.records`: fail or
skip).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from jaxrl_llm.config import ConfigError
from jaxrl_llm.data.jsonl import read_jsonl
from jaxrl_llm.data.records import DataError, IssueLog, OnError, RecordIssue, plain_fields
from jaxrl_llm.data.tasks.arithmetic import ArithmeticConfig, arithmetic_examples
from jaxrl_llm.data.templates import TemplateConfig, render_prompt

log = logging.getLogger(__name__)

PAIRED_FIELDS = ("prompt", "chosen", "rejected")
UNPAIRED_FIELDS = ("prompt", "completion", "label")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreferenceDataConfig:
    """How preference records become batches.

    Attributes:
      template: how a text prompt is rendered (default: the `prompt` field as is).
      max_prompt_length: prompt tokens kept (the last ones).
      max_completion_length: completion tokens kept (the first ones), EOS included.
      bucket_minimum: smallest padded prompt / completion length of a batch.
      add_eos: end every completion with the tokenizer's EOS.
      on_bad_record: "fail" stops at the first bad record, "skip" leaves it out (logged).

    Examples:
      >>> PreferenceDataConfig(max_prompt_length=64).max_completion_length
      256
      >>> PreferenceDataConfig(max_prompt_length=0)
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: PreferenceDataConfig: `max_prompt_length` must be an int >= 1, got 0.
    """

    template: TemplateConfig = dataclasses.field(default_factory=TemplateConfig)
    max_prompt_length: int = 256
    max_completion_length: int = 256
    bucket_minimum: int = 16
    add_eos: bool = True
    on_bad_record: OnError = "fail"

    def __post_init__(self) -> None:
        for key in ("max_prompt_length", "max_completion_length", "bucket_minimum"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"PreferenceDataConfig: `{key}` must be an int >= 1, got {value!r}."
                )
        if self.on_bad_record not in ("fail", "skip"):
            raise ConfigError(
                "PreferenceDataConfig: `on_bad_record` must be 'fail' or 'skip', got "
                f"{self.on_bad_record!r}."
            )


class TokenizedPreference(NamedTuple):
    """One example as token ids, after truncation.

    Attributes:
      prompt: the rendered prompt's tokens (with BOS unless truncated away).
      chosen: the chosen completion's tokens (unpaired: the completion's).
      rejected: the rejected completion's tokens; None for unpaired examples.
      label: unpaired: True = desirable; None for pairs.

    Examples:
      >>> TokenizedPreference((257, 49), (50, 258), (51, 258), None).rejected
      (51, 258)
    """

    prompt: tuple[int, ...]
    chosen: tuple[int, ...]
    rejected: tuple[int, ...] | None
    label: bool | None


class TruncationStats(NamedTuple):
    """How many examples, and how many of their prompts / completions were truncated.

    Unpaired examples count their completion under `chosen`. `tied` counts the pairs whose
    chosen and rejected tokens are the same after truncation (they differ only past
    `max_completion_length`): their margin is 0, so they carry no preference.

    Examples:
      >>> TruncationStats(examples=10, prompt=1, chosen=0, rejected=2).rejected
      2
    """

    examples: int
    prompt: int
    chosen: int
    rejected: int
    tied: int = 0


def _messages(value: Any, field: str) -> list[dict[str, str]]:
    if not value:
        raise ValueError(f"field {field!r} is an empty list of messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
            raise ValueError(
                f"field {field!r} message {i} must be an object with exactly 'role' and "
                f"'content', got {message!r}"
            )
        if not isinstance(message["role"], str) or not isinstance(message["content"], str):
            raise ValueError(f"field {field!r} message {i}: 'role' and 'content' must be text")
        out.append({"role": message["role"], "content": message["content"]})
    return out


def _completion(value: Any, field: str) -> str:
    """A completion's text: a string, or a list of one assistant message."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        messages = _messages(value, field)
        if len(messages) != 1 or messages[0]["role"] != "assistant":
            raise ValueError(
                f"field {field!r} must hold exactly one message with role 'assistant', got "
                f"roles {[m['role'] for m in messages]}"
            )
        return messages[0]["content"]
    raise ValueError(
        f"field {field!r} must be text or a list with one assistant message, got "
        f"{type(value).__name__}"
    )


def split_implicit_prompt(chosen: Any, rejected: Any) -> tuple[Any, Any, Any]:
    """`(prompt, chosen, rejected)` of a pair given as two whole sequences that start with the
    same prompt (the "implicit prompt" form of datasets such as Anthropic's HH-RLHF; TRL
    extracts it the same way).

    Text: the prompt is the longest common prefix of the two strings, cut so that each
    completion keeps at least one character; when the character before the cut is a space, the
    space goes to the completions (`"Human: hi Assistant: yes"` / `"… no"` → prompt
    `"Human: hi Assistant:"`, completions `" yes"` / `" no"`). Conversational (lists of
    `{"role", "content"}` messages): the prompt is the longest common prefix of messages, and
    each side keeps the rest (one assistant message, as a paired record needs).

    Raises:
      ValueError: the two are equal, share no prefix, or are not both text or both messages.

    Examples:
      >>> split_implicit_prompt("Q: 1+1? A: 2", "Q: 1+1? A: 3")
      ('Q: 1+1? A:', ' 2', ' 3')
      >>> user = {"role": "user", "content": "hi"}
      >>> split_implicit_prompt([user, {"role": "assistant", "content": "hello"}],
      ...                       [user, {"role": "assistant", "content": "go away"}])[0]
      [{'role': 'user', 'content': 'hi'}]
    """
    if isinstance(chosen, str) and isinstance(rejected, str):
        shorter = min(len(chosen), len(rejected))
        cut = next((i for i in range(shorter) if chosen[i] != rejected[i]), shorter)
        cut = min(cut, shorter - 1)
        if cut > 0 and chosen[cut - 1] == " ":
            cut -= 1
    elif isinstance(chosen, list) and isinstance(rejected, list):
        chosen, rejected = _messages(chosen, "chosen"), _messages(rejected, "rejected")
        shorter = min(len(chosen), len(rejected))
        cut = next((i for i in range(shorter) if chosen[i] != rejected[i]), shorter)
        cut = min(cut, shorter - 1)
    else:
        raise ValueError(
            "no field 'prompt', and 'chosen' / 'rejected' are not both text or both lists of "
            f"messages (got {type(chosen).__name__} and {type(rejected).__name__})"
        )
    if chosen == rejected:
        raise ValueError("no field 'prompt', and 'chosen' equals 'rejected': nothing to prefer")
    if cut <= 0:
        raise ValueError(
            "no field 'prompt', and 'chosen' and 'rejected' share no leading prompt to use as one"
        )
    return chosen[:cut], chosen[cut:], rejected[cut:]


def check_preference_record(raw: Any, *, unpaired: bool = False) -> dict[str, Any]:
    """A checked preference record (raises `ValueError` describing the first problem).

    Paired records need `prompt`, `chosen`, `rejected`; unpaired ones `prompt`, `completion`
    and a boolean `label`. A paired record without `prompt` whose `chosen` and `rejected` are
    whole sequences starting with the same prompt is split (`split_implicit_prompt`). Text
    must be valid UTF-8 (no unpaired surrogates). Completions in conversational form become
    their text; a conversational prompt stays a list of messages. Other fields are kept (a
    prompt template may use them).

    Examples:
      >>> check_preference_record({"prompt": "1+1=", "chosen": "2", "rejected": "3"})
      {'prompt': '1+1=', 'chosen': '2', 'rejected': '3'}
      >>> check_preference_record({"prompt": [{"role": "user", "content": "hi"}],
      ...     "completion": [{"role": "assistant", "content": "hello"}], "label": True},
      ...     unpaired=True)["completion"]
      'hello'
      >>> check_preference_record({"prompt": "1+1=", "chosen": "2"})
      Traceback (most recent call last):
      ...
      ValueError: missing field 'rejected' (the record has: prompt, chosen)
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected an object of fields, got {type(raw).__name__}")
    required = UNPAIRED_FIELDS if unpaired else PAIRED_FIELDS
    record = plain_fields(raw, required)
    implicit = not unpaired and "prompt" not in record
    if implicit and record.get("chosen") is not None and record.get("rejected") is not None:
        record["prompt"], record["chosen"], record["rejected"] = split_implicit_prompt(
            record["chosen"], record["rejected"]
        )
    for field in required:
        if field not in record:
            raise ValueError(
                f"missing field {field!r} (the record has: {', '.join(record) or 'nothing'})"
            )
        if record[field] is None:
            raise ValueError(f"field {field!r} is null")
    prompt = record["prompt"]
    if isinstance(prompt, list):
        record["prompt"] = _messages(prompt, "prompt")
    elif not isinstance(prompt, str):
        raise ValueError(
            f"field 'prompt' must be text or a list of messages, got {type(prompt).__name__}"
        )
    for field in required[1:]:
        if field == "label":
            if not isinstance(record["label"], bool):
                raise ValueError(f"field 'label' must be true or false, got {record['label']!r}")
            continue
        record[field] = _completion(record[field], field)
    if not unpaired and record["chosen"] == record["rejected"]:
        raise ValueError("'chosen' equals 'rejected': nothing to prefer")
    return record


def read_preference_jsonl(
    path: str | pathlib.Path, *, unpaired: bool = False, on_error: OnError = "fail"
) -> tuple[list[dict[str, Any]], list[RecordIssue]]:
    """Preference records of a JSONL file, checked line by line (`check_preference_record`).

    A line that is not UTF-8, not JSON, not an object, or not a valid preference record is
    reported with its 1-based line number and stops the read (`on_error="fail"`, a
    `DataError`) or is skipped and listed (`"skip"`). Blank lines are ignored.

    Args:
      path: a local `.jsonl` file.
      unpaired: read KTO's `{"prompt", "completion", "label"}` records.
      on_error: "fail" or "skip".

    Returns:
      `(records, issues)`.

    Examples:
      >>> import tempfile, os
      >>> path = os.path.join(tempfile.mkdtemp(), "p.jsonl")
      >>> _ = open(path, "w").write('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\\n{"prompt": "x"}\\n')
      >>> records, issues = read_preference_jsonl(path, on_error="skip")
      >>> len(records), issues
      (1, [RecordIssue(location='line 2', reason="missing field 'chosen' (the record has: prompt)")])
    """
    check = functools.partial(check_preference_record, unpaired=unpaired)
    return read_jsonl(path, on_error=on_error, check=check)


def write_preference_jsonl(path: str | pathlib.Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Write records as JSON Lines (UTF-8, one object per line), e.g. a generated demo set.

    Examples:
      >>> import tempfile, os
      >>> path = os.path.join(tempfile.mkdtemp(), "p.jsonl")
      >>> write_preference_jsonl(path, [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}])
      >>> len(read_preference_jsonl(path)[0])
      1
    """
    lines = [json.dumps(dict(r), ensure_ascii=False) + "\n" for r in records]
    pathlib.Path(path).write_text("".join(lines), encoding="utf-8")


def truncate_tokens(
    tokens: Sequence[int], max_length: int, *, keep: Literal["first", "last"]
) -> tuple[tuple[int, ...], bool]:
    """`tokens` cut to `max_length`, keeping the first or the last ones; and whether it was cut.

    Examples:
      >>> truncate_tokens([1, 2, 3, 4], 2, keep="last"), truncate_tokens([1, 2, 3, 4], 2, keep="first")
      (((3, 4), True), ((1, 2), True))
    """
    tokens = tuple(int(t) for t in tokens)
    if len(tokens) <= max_length:
        return tokens, False
    return (tokens[-max_length:] if keep == "last" else tokens[:max_length]), True


def tokenize_preferences(
    records: Sequence[Mapping[str, Any]],
    *,
    tokenizer: Any,
    config: PreferenceDataConfig,
    unpaired: bool = False,
) -> tuple[list[TokenizedPreference], TruncationStats]:
    """Render, tokenize and truncate checked records (the module docstring's rule).

    Args:
      records: checked records (`read_preference_jsonl` / `check_preference_record`).
      tokenizer: a `jaxrl_llm.tokenizer` tokenizer.
      config: lengths, template, EOS.
      unpaired: the records are KTO's labelled examples.

    Returns:
      `(examples, stats)`; truncations are also logged as a warning.

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> cfg = PreferenceDataConfig(max_prompt_length=3, max_completion_length=2)
      >>> ex, stats = tokenize_preferences([{"prompt": "12+7=", "chosen": "19", "rejected": "2"}],
      ...                                  tokenizer=ByteTokenizer(), config=cfg)
      >>> ex[0].prompt, ex[0].chosen, ex[0].rejected, stats
      ((43, 55, 61), (49, 57), (50, 258), TruncationStats(examples=1, prompt=1, chosen=1, rejected=0, tied=0))
    """
    counts = {"prompt": 0, "chosen": 0, "rejected": 0}
    out = []
    for i, record in enumerate(records):
        try:
            if isinstance(record["prompt"], list):
                text = tokenizer.render(record["prompt"])
            else:
                text = render_prompt(record, config.template, tokenizer)
        except (ValueError, KeyError) as err:
            raise DataError(f"example {i}: cannot render its prompt: {err}") from None
        prompt, cut = truncate_tokens(
            tokenizer.encode(text, add_bos=True), config.max_prompt_length, keep="last"
        )
        counts["prompt"] += cut
        if not prompt:
            raise DataError(f"example {i}: the prompt {text!r} has no tokens.")
        sides = {}
        for field, name in (
            ("completion" if unpaired else "chosen", "chosen"),
            ("rejected", "rejected"),
        ):
            if unpaired and name == "rejected":
                continue
            ids = tokenizer.encode(str(record[field]), add_bos=False, add_eos=config.add_eos)
            ids, cut = truncate_tokens(ids, config.max_completion_length, keep="first")
            counts[name] += cut
            if not ids:
                raise DataError(
                    f"example {i}: the {field} completion has no tokens (empty text and "
                    "add_eos=false)."
                )
            sides[name] = ids
        label = bool(record["label"]) if unpaired else None
        out.append(TokenizedPreference(prompt, sides["chosen"], sides.get("rejected"), label))
    tied = sum(e.chosen == e.rejected for e in out)
    stats = TruncationStats(len(out), counts["prompt"], counts["chosen"], counts["rejected"], tied)
    if tied:
        log.warning(
            "preference data: %d of %d pairs have the same chosen and rejected tokens after "
            "truncating the completions to %d tokens: they carry no preference (margin 0) and "
            "dilute the loss; raise preference_data.max_completion_length",
            tied,
            stats.examples,
            config.max_completion_length,
        )
    if stats.prompt or stats.chosen or stats.rejected:
        log.warning(
            "preference data: truncated %d prompt(s) to their last %d tokens and %d chosen / %d "
            "rejected completion(s) to their first %d tokens, of %d examples",
            stats.prompt,
            config.max_prompt_length,
            stats.chosen,
            stats.rejected,
            config.max_completion_length,
            stats.examples,
        )
    return out, stats


def load_preference_data(
    source: str | pathlib.Path | Sequence[Any],
    *,
    tokenizer: Any,
    config: PreferenceDataConfig,
    unpaired: bool = False,
) -> tuple[list[TokenizedPreference], TruncationStats, list[RecordIssue]]:
    """A JSONL path, records, or already tokenized examples → tokenized examples.

    In-memory records are checked like file lines (locations `"example i"`, same skip/fail
    policy).

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> ex, stats, issues = load_preference_data(
      ...     [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}, {"prompt": 1}],
      ...     tokenizer=ByteTokenizer(), config=PreferenceDataConfig(on_bad_record="skip"))
      >>> len(ex), issues[0].location
      (1, 'example 1')
    """
    if isinstance(source, str | pathlib.Path):
        records, issues = read_preference_jsonl(
            source, unpaired=unpaired, on_error=config.on_bad_record
        )
    else:
        source = list(source)
        if source and all(isinstance(s, TokenizedPreference) for s in source):
            kinds = {s.rejected is None for s in source}
            if kinds != {unpaired}:
                raise DataError(
                    "load_preference_data: the tokenized examples are "
                    + ("unpaired" if True in kinds else "paired")
                    + f" but unpaired={unpaired} was asked for."
                )
            tied = sum(s.rejected is not None and s.chosen == s.rejected for s in source)
            return source, TruncationStats(len(source), 0, 0, 0, tied), []
        log_ = IssueLog("records", config.on_bad_record)
        records = []
        for i, raw in enumerate(source):
            try:
                records.append(check_preference_record(raw, unpaired=unpaired))
            except ValueError as err:
                log_.add(f"example {i}", str(err))
        issues = log_.finish(len(records))
    examples, stats = tokenize_preferences(
        records, tokenizer=tokenizer, config=config, unpaired=unpaired
    )
    return examples, stats, issues


def _bucket(length: int, *, minimum: int, cap: int) -> int:
    """Next power of two `>= max(length, minimum)`, at most `cap` (and never below `length`)."""
    target = max(length, minimum)
    return max(length, min(1 << (target - 1).bit_length(), cap))


def _rows(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], P: int, T: int, pad: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    N = len(prompts)
    tokens = np.full((N, P + T), pad, np.int32)
    attention = np.zeros((N, P + T), np.int32)
    completion_mask = np.zeros((N, T), np.float32)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        tokens[i, P - len(p) : P] = p
        tokens[i, P : P + len(c)] = c
        attention[i, P - len(p) : P + len(c)] = 1
        completion_mask[i, : len(c)] = 1.0
    return tokens, attention, completion_mask


def make_preference_batch(
    examples: Sequence[TokenizedPreference], *, pad_id: int, config: PreferenceDataConfig
) -> Any:
    """A fixed-shape `jaxrl_llm.train.PreferenceBatch` (NumPy arrays) of tokenized examples.

    Chosen and rejected rows share the bucketed prompt length `P` and completion length `T`
    (module docstring). Unpaired examples give `rejected=None` and `labels[N]` (1 = desirable).
    The reference fields are left None: `prepare_preference_batch` fills them.

    Examples:
      >>> ex = [TokenizedPreference((257, 49), (50,), (51, 52), None)]
      >>> b = make_preference_batch(ex, pad_id=0, config=PreferenceDataConfig(bucket_minimum=2))
      >>> b.chosen.tokens.tolist(), b.rejected.completion_mask.tolist()
      ([[257, 49, 50, 0]], [[1.0, 1.0]])
    """
    from jaxrl_llm.train.batch import SequenceBatch
    from jaxrl_llm.train.preference import PreferenceBatch

    if not examples:
        raise ValueError("make_preference_batch: `examples` is empty.")
    unpaired = examples[0].rejected is None
    if any((e.rejected is None) != unpaired for e in examples):
        raise ValueError("make_preference_batch: mixes paired and unpaired examples.")
    longest_prompt = max(len(e.prompt) for e in examples)
    longest = max(max(len(e.chosen), len(e.rejected or ())) for e in examples)
    if longest_prompt > config.max_prompt_length or longest > config.max_completion_length:
        raise ValueError(
            f"make_preference_batch: examples of up to {longest_prompt} prompt / {longest} "
            f"completion tokens exceed max_prompt_length={config.max_prompt_length} / "
            f"max_completion_length={config.max_completion_length}; tokenize them with "
            "tokenize_preferences and the same config."
        )
    P = _bucket(longest_prompt, minimum=config.bucket_minimum, cap=config.max_prompt_length)
    T = _bucket(longest, minimum=config.bucket_minimum, cap=config.max_completion_length)
    prompts = [e.prompt for e in examples]
    chosen = SequenceBatch(*_rows(prompts, [e.chosen for e in examples], P, T, pad_id))
    if unpaired:
        labels = np.asarray([float(bool(e.label)) for e in examples], np.float32)
        return PreferenceBatch(chosen=chosen, labels=labels)
    rejected = SequenceBatch(*_rows(prompts, [e.rejected for e in examples], P, T, pad_id))
    return PreferenceBatch(chosen=chosen, rejected=rejected)


def arithmetic_preference_records(
    config: ArithmeticConfig,
    *,
    split: Literal["train", "eval"] = "train",
    seed: int = 0,
    unpaired: bool = False,
    desirable_fraction: float = 0.5,
) -> list[dict[str, Any]]:
    """A tiny preference set from the arithmetic task: the right answer is preferred (no download).

    Each problem `"a+b="` of `arithmetic_examples(config, split=split, seed=seed)` gives
    `{"prompt", "chosen": correct answer, "rejected": a wrong answer}`; the wrong answer is the
    correct one plus a nonzero offset in `[-9, 9]` drawn from the seed. Unpaired (KTO): one
    `{"prompt", "completion", "label"}` per problem, desirable (the correct answer) with
    probability `desirable_fraction`, else undesirable (a wrong answer).

    Examples:
      >>> recs = arithmetic_preference_records(ArithmeticConfig(max_digits=2, train_size=2), seed=0)
      >>> recs[0]["prompt"], recs[0]["chosen"], recs[0]["chosen"] != recs[0]["rejected"]
      ('67+34=', '101', True)
    """
    if not 0.0 <= desirable_fraction <= 1.0:
        raise ValueError(
            "arithmetic_preference_records: `desirable_fraction` must lie in [0, 1], got "
            f"{desirable_fraction!r}."
        )
    if config.answer_noise:  # the noisy answer would be `chosen`, a true one sometimes rejected
        raise ValueError(
            "arithmetic_preference_records: data.arithmetic.answer_noise is a noisy teacher's "
            "SFT demonstrations; preference pairs prefer the right answer, so it must be 0, got "
            f"{config.answer_noise}."
        )
    rng = np.random.default_rng([seed, 7919])
    records = []
    for example in arithmetic_examples(config, split=split, seed=seed):
        answer = int(example["answer"])
        offset = int(rng.integers(1, 10)) * (1 if rng.random() < 0.5 else -1)
        wrong = str(answer + offset)
        if not unpaired:
            records.append(
                {"prompt": example["prompt"], "chosen": example["answer"], "rejected": wrong}
            )
            continue
        good = bool(rng.random() < desirable_fraction)
        records.append(
            {
                "prompt": example["prompt"],
                "completion": example["answer"] if good else wrong,
                "label": good,
            }
        )
    return records
