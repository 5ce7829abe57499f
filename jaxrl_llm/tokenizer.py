"""Tokenizers: Hugging Face tokenizers from a local directory, and a file-free byte tokenizer.

Both implement one small interface, used by the data pipeline and the sampler:

- `encode(text) -> list[int]`, `decode(ids) -> str`;
- `batch_encode(texts, padding_side=..., max_length=...) -> (tokens[N, S] int32, mask[N, S] bool)`,
  padded to the longest row with `pad_id` (left padding is what the sampler wants: every
  prompt then ends in the same column);
- `render(prompt)`: the prompt text the model sees. With a chat template a prompt may be a
  list of `{"role", "content"}` messages and is rendered with the generation prompt appended;
  without one it must be a string and is used as is;
- `pad_id`, `bos_id`, `eos_id`, `vocab_size`.

`load_tokenizer("byte")` gives the `ByteTokenizer`; any other path must be a local directory
holding a `transformers` tokenizer (nothing is downloaded).
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

Prompt = str | Sequence[dict[str, str]]
PaddingSide = Literal["left", "right"]


def _pad(
    rows: list[list[int]], pad_id: int, padding_side: PaddingSide, max_length: int | None
) -> tuple[np.ndarray, np.ndarray]:
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}.")
    if max_length is not None:
        too_long = [i for i, r in enumerate(rows) if len(r) > max_length]
        if too_long:
            raise ValueError(f"rows {too_long} are longer than max_length={max_length} tokens.")
    width = max_length if max_length is not None else max((len(r) for r in rows), default=0)
    tokens = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), bool)
    for i, row in enumerate(rows):
        cols = slice(width - len(row), width) if padding_side == "left" else slice(0, len(row))
        tokens[i, cols] = row
        mask[i, cols] = True
    return tokens, mask


class _BatchEncoding:
    """`batch_encode` over a tokenizer's `encode` and `pad_id`."""

    def batch_encode(
        self,
        texts: Sequence[str],
        *,
        padding_side: PaddingSide = "left",
        max_length: int | None = None,
        add_bos: bool = True,
        add_eos: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """`(tokens[N, S] int32, mask[N, S] bool)`, padded with `pad_id` on `padding_side`."""
        rows = [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
        return _pad(rows, self.pad_id, padding_side, max_length)


class ByteTokenizer(_BatchEncoding):
    """UTF-8 bytes as tokens: ids 0-255 are bytes, then PAD=256, BOS=257, EOS=258.

    Needs no files; for the built-in tasks, demos and tests. Its chat format is a plain
    `"<role>: <content>\\n"` per message followed by `"assistant: "`.

    Examples:
      >>> tok = ByteTokenizer()
      >>> tok.encode("hi"), tok.vocab_size
      ([257, 104, 105], 259)
      >>> tok.decode([257, 104, 105, 258, 256])
      'hi'
      >>> tokens, mask = tok.batch_encode(["a", "abc"], add_bos=False)
      >>> tokens.tolist(), mask.sum(axis=1).tolist()
      ([[256, 256, 97], [97, 98, 99]], [1, 3])
    """

    pad_id = 256
    bos_id = 257
    eos_id = 258
    vocab_size = 259

    def __init__(self, *, chat_template: bool = False):
        self.chat_template = chat_template

    def encode(self, text: str, *, add_bos: bool = True, add_eos: bool = False) -> list[int]:
        """Token ids of `text`, optionally framed by BOS / EOS."""
        ids = list(text.encode("utf-8"))
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """Text of `ids`; special tokens dropped (or shown as `<pad>`, `<bos>`, `<eos>`)."""
        names = {self.pad_id: "<pad>", self.bos_id: "<bos>", self.eos_id: "<eos>"}
        out, pending = [], bytearray()
        for i in (int(i) for i in ids):
            if 0 <= i < 256:
                pending.append(i)
                continue
            if i not in names:
                raise ValueError(f"ByteTokenizer.decode: id {i} is outside the vocabulary (259).")
            out.append(pending.decode("utf-8", errors="replace"))
            pending = bytearray()
            if not skip_special:
                out.append(names[i])
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def render(self, prompt: Prompt) -> str:
        """The prompt text: messages in the plain chat format (a string, with
        `chat_template=True`, as one user message, as `HFTokenizer.render` does), or a string
        as is."""
        if isinstance(prompt, str) and not self.chat_template:
            return prompt
        if not self.chat_template:
            raise ValueError("a list of messages needs chat_template=True.")
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        lines = [f"{m['role']}: {m['content']}\n" for m in prompt]
        return "".join(lines) + "assistant: "


class HFTokenizer(_BatchEncoding):
    """A `transformers` tokenizer behind the same interface as `ByteTokenizer`."""

    def __init__(self, tokenizer: Any, *, chat_template: bool | str = False):
        if chat_template is True and not tokenizer.chat_template:
            raise ValueError(
                "chat_template=True, but this tokenizer has no chat template; pass the template "
                "as a string or use chat_template=False."
            )
        if isinstance(chat_template, str):
            tokenizer.chat_template = chat_template
        self.tokenizer = tokenizer
        self.chat_template = bool(chat_template)
        self.eos_id = tokenizer.eos_token_id
        self.bos_id = tokenizer.bos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        if self.pad_id is None:
            raise ValueError("the tokenizer defines neither a pad nor an eos token.")
        self.vocab_size = len(tokenizer)

    def encode(self, text: str, *, add_bos: bool = True, add_eos: bool = False) -> list[int]:
        """Token ids of `text`: with `add_bos`, the special tokens the tokenizer puts *before* a
        text (its BOS, a BERT-style CLS; none for Qwen), unless the text already starts with
        its BOS, as a Llama or Gemma chat template's output does (then nothing is added, as
        `transformers`' `apply_chat_template(tokenize=True)`). The tokens a post-processor
        appends (a Llama tokenizer saved with `add_eos_token=True`) are never added: a prompt
        ending in EOS would ask the sampler to continue after the end; `add_eos` appends one."""
        bos = self.tokenizer.bos_token
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if add_bos and not (bos and text.startswith(bos)):
            ids = self.leading_special_ids + ids
        return ids + [self.eos_id] * (add_eos and self.eos_id is not None)

    @functools.cached_property
    def leading_special_ids(self) -> list[int]:
        """The special tokens the tokenizer's post-processor puts before a text (probed once)."""
        with_specials = list(self.tokenizer.encode("a", add_special_tokens=True))
        plain = list(self.tokenizer.encode("a", add_special_tokens=False))
        for start in range(len(with_specials) - len(plain) + 1):
            if with_specials[start : start + len(plain)] == plain:
                return with_specials[:start]
        raise ValueError(  # a post-processor that rewrites the text's own tokens
            f"cannot tell which special tokens this tokenizer puts before a text: 'a' encodes "
            f"to {with_specials} with its special tokens and to {plain} without them."
        )

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """Text of `ids`."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def render(self, prompt: Prompt) -> str:
        """The prompt text: messages through the chat template (with the generation prompt)."""
        if isinstance(prompt, str) and not self.chat_template:
            return prompt
        if not self.chat_template:
            raise ValueError("a list of messages needs chat_template=True (or a template string).")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )


# the files one of which a `transformers` tokenizer directory holds
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)
# every file a `transformers` tokenizer may be saved as (a checkpoint copy takes those present)
TOKENIZER_FILES = (
    *_TOKENIZER_FILES,
    "special_tokens_map.json",
    "added_tokens.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


def load_tokenizer(
    path: str | pathlib.Path, *, chat_template: bool | str = False
) -> ByteTokenizer | HFTokenizer:
    """`"byte"` → `ByteTokenizer`; a local directory → its `transformers` tokenizer.

    Args:
      path: `"byte"` or a directory with `tokenizer.json` / `tokenizer_config.json`.
      chat_template: False renders prompts as given; True uses the tokenizer's chat template
        (an error if it has none); a string is a Jinja template that replaces it.

    Examples:
      >>> load_tokenizer("byte").eos_id
      258
    """
    if str(path) == "byte":
        if isinstance(chat_template, str):
            raise ValueError("the byte tokenizer has a fixed chat format; use chat_template=True.")
        return ByteTokenizer(chat_template=bool(chat_template))
    path = pathlib.Path(path)
    if not path.is_dir():
        raise ValueError(f"tokenizer path {path} is not a local directory (nor 'byte').")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        # transformers would build an empty tokenizer that encodes every text to no tokens
        raise ValueError(
            f"no tokenizer files in {path} (none of {', '.join(_TOKENIZER_FILES)}); a run's "
            "export holds them only when the run used a transformers tokenizer: give the "
            "tokenizer the model was trained with (`tokenizer.path`, `--tokenizer`), e.g. 'byte'."
        )
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return HFTokenizer(tokenizer, chat_template=chat_template)
