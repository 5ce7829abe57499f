"""Prompt templates (example fields → prompt text) and chat rendering.

A template is a Python format string over the example's fields, e.g. `"{question}"` or
`"Q: {question}\\nA:"` (write `{{` / `}}` for literal braces). With `chat: true` the text
becomes the user message, after an optional system message, and the tokenizer's chat
template renders it with the generation prompt (`jaxrl_llm.tokenizer` `render`).
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Mapping
from typing import Any

from jaxrl_llm.config import ConfigError
from jaxrl_llm.data.records import DataError

Prompt = str | list[dict[str, str]]


def template_fields(template: str) -> tuple[str, ...]:
    """The field names a template uses, in order of first use.

    Only plain names are allowed (`{question}`); attribute, index and positional fields are
    rejected with a `ValueError`, as are unbalanced braces.

    Examples:
      >>> template_fields("Q: {question} ({source}) {question}")
      ('question', 'source')
      >>> template_fields("{0}")
      Traceback (most recent call last):
      ...
      ValueError: prompt template '{0}': field '0' must be a plain field name such as {question}.
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(
            f"prompt template {template!r}: {err} (write {{{{ and }}}} for literal braces)."
        ) from None
    names: list[str] = []
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            raise ValueError(
                f"prompt template {template!r}: field {field!r} must be a plain field name "
                "such as {question}."
            )
        if conversion not in (None, "r", "s", "a"):
            raise ValueError(
                f"prompt template {template!r}: field {field!r} has the unknown conversion "
                f"'!{conversion}' (use !r, !s or !a)."
            )
        if spec and "{" in spec:
            raise ValueError(
                f"prompt template {template!r}: field {field!r} has a nested field in its "
                f"format spec {spec!r}; write the spec out."
            )
        if field not in names:
            names.append(field)
    return tuple(names)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TemplateConfig:
    """How an example becomes a prompt.

    Attributes:
      prompt: format string over the example's fields (default: the `prompt` field as is).
      system: system message for chat rendering (None: none).
      chat: render as chat messages through the tokenizer's chat template.

    Examples:
      >>> TemplateConfig(prompt="Q: {question}\\nA:").fields
      ('question',)
      >>> TemplateConfig(prompt="{question")
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: template.prompt: prompt template '{question': expected '}' before end of string (write {{ and }} for literal braces).
    """

    prompt: str = "{prompt}"
    system: str | None = None
    chat: bool = False

    def __post_init__(self) -> None:
        try:
            template_fields(self.prompt)
        except ValueError as err:
            raise ConfigError(f"template.prompt: {err}") from None
        if self.system is not None and not self.chat:
            raise ConfigError("template.system: a system message needs chat: true.")

    @property
    def fields(self) -> tuple[str, ...]:
        """The example fields the prompt uses."""
        return template_fields(self.prompt)


def format_prompt(example: Mapping[str, Any], template: TemplateConfig) -> Prompt:
    """The prompt of one example: text, or chat messages when `template.chat`.

    Examples:
      >>> format_prompt({"question": "2+2?"}, TemplateConfig(prompt="Q: {question}"))
      'Q: 2+2?'
      >>> format_prompt({"question": "2+2?"}, TemplateConfig(prompt="{question}", system="Be brief.", chat=True))
      [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': '2+2?'}]
      >>> format_prompt({"q": "x"}, TemplateConfig(prompt="{question}"))
      Traceback (most recent call last):
      ...
      jaxrl_llm.data.records.DataError: prompt template '{question}' uses field 'question', which the example lacks (it has: q).
    """
    missing = [f for f in template.fields if f not in example]
    if missing:
        raise DataError(
            f"prompt template {template.prompt!r} uses field {missing[0]!r}, which the example "
            f"lacks (it has: {', '.join(example) or 'nothing'})."
        )
    try:
        text = template.prompt.format_map({f: example[f] for f in template.fields})
    except (ValueError, TypeError) as err:  # a format spec that does not suit the value
        raise DataError(
            f"prompt template {template.prompt!r} cannot format the example's fields: {err}."
        ) from None
    if not template.chat:
        return text
    messages = [{"role": "system", "content": template.system}] if template.system else []
    return [*messages, {"role": "user", "content": text}]


def render_prompt(example: Mapping[str, Any], template: TemplateConfig, tokenizer: Any) -> str:
    """The prompt text the model sees: `format_prompt`, then the tokenizer's `render`.

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> render_prompt({"q": "2+2?"}, TemplateConfig(prompt="{q}", chat=True), ByteTokenizer(chat_template=True))
      'user: 2+2?\\nassistant: '
    """
    return tokenizer.render(format_prompt(example, template))
