"""Built-in reward functions, with the signature every reward function has.

    reward_fn(prompts: list[str], completions: list[str], **example_fields) -> list[float]

`prompts[n]` and `completions[n]` are the rendered prompt and the decoded completion of row
`n` (`jaxrl_llm.rewards.decode_completions`); every example field (e.g. `answer`) arrives as a
list with one entry per row, repeated over the `G` samples of a prompt. Options are
keyword-only parameters, set from the config's `kwargs` (`jaxrl_llm.rewards.registry`); the
reference answer's field is named by `answer_field`.

The verifiers behind them live in `jaxrl_llm.rewards.verifiers`. `overlong` applies the
length formula of `losses` (`overlong_penalty`, ALGORITHMS.md §10.1) to the completions' token
counts, which the training loop passes as the field `completion_lengths` (the sampler's
`Rollout.lengths`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_llm.rewards.verifiers import (
    EXTRACT_METHODS,
    ExtractMethod,
    answers_match,
    extract_answer,
    extract_boxed,
    extract_hash_answer,
    extract_tag,
    follows_tag_format,
)
from losses.length_rewards import overlong_penalty


def _field(fields: dict[str, Any], name: str, n: int, where: str) -> list[Any]:
    if name not in fields:
        available = ", ".join(sorted(fields)) or "none"
        raise ValueError(
            f"{where}: the field {name!r} is missing; the examples have the fields: {available}."
        )
    values = list(fields[name])
    if len(values) != n:
        raise ValueError(f"{where}: field {name!r} has {len(values)} entries for {n} completions.")
    return values


def _check_method(method: str, name: str, where: str) -> None:
    if method not in EXTRACT_METHODS:
        raise ValueError(
            f"{where}: `{name}` must be one of {', '.join(EXTRACT_METHODS)}, got {method!r}."
        )


def math_answer(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    answer_field: str = "answer",
    extract: ExtractMethod = "auto",
    reference_extract: ExtractMethod = "auto",
    **fields: Any,
) -> list[float]:
    """1.0 where the completion's final answer equals the reference answer, else 0.0.

    The completion goes through `extract_answer` (`\\boxed{}` → GSM8K `####` → `<answer>` →
    last number, by default), then `answers_match` (exact rational comparison when both are
    numbers, normalised text otherwise). The reference, with `reference_extract="auto"`, is its
    last marker's content (`\\boxed{}`, `####`, `<answer>`) or, without a marker, used whole:
    a MATH-style answer column (`1/2`, `\\frac{1}{2}`, `(3, 4)`) is not cut to its last number.

    Examples:
      >>> math_answer(["q"] * 3, [r"so \\boxed{18}", "it is 17", "no idea"],
      ...             answer=["Janet... #### 18"] * 3)
      [1.0, 0.0, 0.0]
      >>> math_answer(["q"] * 3, [r"\\boxed{0.5}", "so 1/2", "2"], answer=["1/2"] * 3)
      [1.0, 1.0, 0.0]
    """
    where = "math_answer"
    _math_answer_options(
        extract=extract, reference_extract=reference_extract, answer_field=answer_field
    )
    refs = _field(fields, answer_field, len(completions), where)
    out = []
    for completion, ref in zip(completions, refs, strict=True):
        ref = str(ref)
        target = _reference_answer(ref, reference_extract)
        out.append(float(answers_match(extract_answer(completion, extract), target)))
    return out


def _math_answer_options(
    *,
    extract: Any = "auto",
    reference_extract: Any = "auto",
    answer_field: Any = "answer",
    **_: Any,
) -> None:
    _check_method(extract, "extract", "math_answer")
    _check_method(reference_extract, "reference_extract", "math_answer")
    _check_field_name(answer_field, "answer_field", "math_answer")


def _check_field_name(value: Any, name: str, where: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: `{name}` must be a non-empty field name, got {value!r}.")


def _reference_answer(reference: str, method: ExtractMethod) -> str:
    """The answer a reference states: with "auto" its last marker's content, else whole."""
    if method == "auto":
        for extractor in (extract_boxed, extract_hash_answer, extract_tag):
            found = extractor(reference)
            if found is not None:
                return found
        return reference.strip()
    return extract_answer(reference, method) or reference.strip()


def exact_match(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    answer_field: str = "answer",
    extract: ExtractMethod = "full",
    ignore_case: bool = False,
    **fields: Any,
) -> list[float]:
    """1.0 where the (extracted) completion equals the reference text after normalisation.

    Normalisation (`normalize_text`): whitespace collapsed, ends stripped, one trailing `.`
    dropped, optionally case-folded. No numeric equivalence (`1.0` ≠ `1`).

    Examples:
      >>> exact_match(["q", "q"], ["Paris.", " paris"], answer=["Paris", "Paris"])
      [1.0, 0.0]
    """
    where = "exact_match"
    _exact_match_options(extract=extract, ignore_case=ignore_case, answer_field=answer_field)
    refs = _field(fields, answer_field, len(completions), where)
    return [
        float(
            answers_match(
                extract_answer(c, extract), str(r), numeric=False, ignore_case=ignore_case
            )
        )
        for c, r in zip(completions, refs, strict=True)
    ]


def _exact_match_options(
    *, extract: Any = "full", ignore_case: Any = False, answer_field: Any = "answer", **_: Any
) -> None:
    _check_method(extract, "extract", "exact_match")
    if not isinstance(ignore_case, bool):  # the string "false" is true
        raise ValueError(f"exact_match: `ignore_case` must be true or false, got {ignore_case!r}.")
    _check_field_name(answer_field, "answer_field", "exact_match")


def exact_answer(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    answer_field: str = "answer",
    **fields: Any,
) -> list[float]:
    """1.0 where the completion is exactly the reference string (no normalisation at all).

    The text twin of `jaxrl_llm.rewards.jax_rewards.exact_answer_reward` for the built-in
    tasks: with completions decoded by `decode_completions` (cut at the first stop token,
    special tokens shown), both give the same reward on every completion.

    Examples:
      >>> exact_answer(["12+7="] * 3, ["19", "19 ", "019"], answer=["19"] * 3)
      [1.0, 0.0, 0.0]
    """
    refs = _field(fields, answer_field, len(completions), "exact_answer")
    return [float(c == str(r)) for c, r in zip(completions, refs, strict=True)]


def tag_format(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    tags: Sequence[str] = ("think", "answer"),
    **fields: Any,
) -> list[float]:
    """1.0 where the completion is exactly the tagged blocks `tags`, in order (`follows_tag_format`).

    Examples:
      >>> tag_format(["q", "q"], ["<think>a</think><answer>1</answer>", "1"])
      [1.0, 0.0]
    """
    tags = _tag_format_options(tags=tags)
    return [float(follows_tag_format(c, tags)) for c in completions]


def _tag_format_options(*, tags: Any = ("think", "answer"), **_: Any) -> tuple[str, ...]:
    if isinstance(tags, str):  # tuple("answer") would be its letters
        raise ValueError(
            f"tag_format: `tags` must be a list of tag names, got the string {tags!r} (write "
            f"[{tags}])."
        )
    if not isinstance(tags, Sequence):
        raise ValueError(f"tag_format: `tags` must be a list of tag names, got {tags!r}.")
    tags = tuple(tags)
    if not tags or not all(isinstance(t, str) and t for t in tags):
        raise ValueError(f"tag_format: `tags` must be non-empty tag names, got {tags!r}.")
    return tags


def regex_format(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    pattern: str,
    **fields: Any,
) -> list[float]:
    """1.0 where the whole completion matches the regular expression `pattern` (DOTALL).

    Examples:
      >>> regex_format(["q", "q"], ["-12", "12a"], pattern=r"-?\\d+")
      [1.0, 0.0]
    """
    compiled = _regex_format_options(pattern=pattern)
    return [float(compiled.fullmatch(c) is not None) for c in completions]


def _regex_format_options(*, pattern: Any, **_: Any) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise ValueError(f"regex_format: `pattern` must be a string, got {pattern!r}.")
    try:
        return re.compile(pattern, flags=re.DOTALL)
    except re.error as err:
        raise ValueError(
            f"regex_format: `pattern` {pattern!r} is not a valid regex: {err}."
        ) from None


def overlong(
    prompts: Sequence[str],
    completions: Sequence[str],
    *,
    max_length: int,
    buffer_length: int,
    factor: float = 1.0,
    lengths_field: str = "completion_lengths",
    **fields: Any,
) -> list[float]:
    """DAPO's soft overlong penalty on token counts: `losses.overlong_penalty` per completion.

    With `L₀ = max_length − buffer_length`: 0 up to `L₀`, then linear down to `−factor` at
    `max_length` ("DAPO", arXiv 2503.14476). Add it to a correctness reward (weight 1).

    Examples:
      >>> overlong(["q"] * 3, ["a", "b", "c"], max_length=100, buffer_length=20,
      ...          completion_lengths=[70, 90, 120])
      [0.0, -0.5, -1.0]
    """
    _overlong_options(max_length=max_length, buffer_length=buffer_length, factor=factor)
    lengths = _field(fields, lengths_field, len(completions), "overlong")
    penalty = overlong_penalty(
        np.asarray(lengths, np.float32),
        max_length=max_length,
        buffer_length=buffer_length,
        factor=factor,
    )
    return np.asarray(penalty, np.float64).tolist()


def _overlong_options(*, max_length: Any, buffer_length: Any, factor: Any = 1.0, **_: Any) -> None:
    try:  # the formula's own checks, on no lengths
        overlong_penalty(
            np.zeros(0, np.float32),
            max_length=max_length,
            buffer_length=buffer_length,
            factor=factor,
        )
    except ValueError as err:
        raise ValueError(f"overlong: {err}") from None


# the option checks each built-in runs first; the registry runs them when it binds the options
BUILTIN_OPTION_CHECKS = {
    "math_answer": _math_answer_options,
    "exact_match": _exact_match_options,
    "tag_format": _tag_format_options,
    "regex_format": _regex_format_options,
    "overlong": _overlong_options,
}

BUILTIN_REWARDS = {
    "math_answer": math_answer,
    "exact_match": exact_match,
    "exact_answer": exact_answer,
    "tag_format": tag_format,
    "regex_format": regex_format,
    "overlong": overlong,
}
