"""Stop strings: a row stops at the first token whose text completes one of the strings.

`SamplingConfig.stop_strings` are matched on the completion's text, not on token ids: the same
string can be generated as many different token sequences (`"</answer>"` as `"</"`, `"answer"`,
`">"`, or as `">\\n"` ending in a newline, or inside a longer token), so comparing with the one
sequence the tokenizer gives the string alone would miss most of them. As Hugging Face's
`StopStringCriteria` does, the matcher works with each token's bytes, here as a small automaton
built once on the host from the tokenizer's vocabulary (`stop_string_table`) and run in the
compiled decode step (`stop_string_hits`), so nothing leaves the device.

A row stops after token `t_k` when the bytes of its completion `t_1 … t_k` contain a stop string
`S` (`L` bytes) and this is the first such `k`, i.e. an occurrence of `S` ends inside `t_k`'s
bytes. Reading the tokens backwards from `t_k`, with `r` the number of bytes of `S` still to
find before the part matched so far:

    t_k       contains S                                   → stop
              starts with the last e < L bytes of S         → r = L − e
    t_{k−j}   (r > 0) ends with the first r bytes of S     → stop
              equals S[r − len(t) : r]  (len(t) < r)       → r − len(t)

A row tracks the set of live `r` of every string (several placements of `t_k` may fit), over
at most `L` tokens back (each token has at least one byte). Only completion tokens are read
(an occurrence that begins in the prompt does not count, as in vLLM), and tokens without text
(special tokens: `None` in the byte table) break every match. The stop string's tokens are part
of the completion (they are trained on, like a stop token) and of its decoded text.

The tables list only the (token, state) pairs that can take part in a match — tokens that are a
piece of `S`, start with a suffix of it, end with a prefix of it or contain it — so the
automaton's cost per step is `O(N · pairs)` compares, independent of the vocabulary size.
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
MATCH = -1  # the state that means "a stop string was completed"


@dataclasses.dataclass(frozen=True)
class StopStringTable:
    """The automaton of `stop_string_table` (hashable: a static part of `SamplingConfig`).

    Attributes:
      strings: the stop strings it matches.
      window: tokens read back from the newest (the longest string's byte length, at most).
      states: the number of partial-match states (`Σ (L_s − 1)` over the strings).
      first: `(token, state)` pairs for the newest token: `state` is `MATCH` or the partial
        state the token leaves.
      steps: `(token, state_in, state_out)` transitions for the older tokens.
    """

    strings: tuple[str, ...]
    window: int
    states: int
    first: tuple[tuple[int, int], ...]
    steps: tuple[tuple[int, int, int], ...]


def stop_string_table(
    strings: Sequence[str], token_bytes: Sequence[bytes | None]
) -> StopStringTable:
    """Build the matcher of `strings` (module docstring) for a vocabulary.

    Args:
      strings: the stop strings (non-empty; matched on their UTF-8 bytes).
      token_bytes: each token id's bytes (`tokenizer_token_bytes`); None for a token without
        text (special tokens), which never takes part in a match.

    Raises:
      ValueError: an empty string.

    Examples:
      >>> vocab = [b"<", b"/", b"a", b">", b"</", b"a>", b"x</a>y", None]
      >>> table = stop_string_table(["</a>"], vocab)
      >>> table.window, table.states, table.first  # ">" and "a>" start partial matches
      (4, 3, ((3, 2), (5, 1), (6, -1)))
    """
    first: set[tuple[int, int]] = set()
    steps: set[tuple[int, int, int]] = set()
    offset, window = 0, 1
    for text in strings:
        if not isinstance(text, str) or not text:
            raise ValueError(f"stop strings must be non-empty strings, got {text!r}.")
        s = text.encode("utf-8")
        L = len(s)
        window = max(window, L)

        def state(r: int, L: int = L, offset: int = offset) -> int:
            return offset + r - 1  # r in 1 .. L-1

        for token, b in enumerate(token_bytes):
            if not b:
                continue
            if s in b:
                first.add((token, MATCH))
            else:  # t_k starts with the last e bytes of S: L - e bytes still to find
                for e in range(1, min(len(b), L - 1) + 1):
                    if b[:e] == s[L - e :]:
                        first.add((token, state(L - e)))
            for r in range(1, L):
                if len(b) >= r:
                    if b.endswith(s[:r]):
                        steps.add((token, state(r), MATCH))
                elif s[r - len(b) : r] == b:
                    steps.add((token, state(r), state(r - len(b))))
        offset += L - 1
    return StopStringTable(
        strings=tuple(strings),
        window=window,
        states=offset,
        first=tuple(sorted(first)),
        steps=tuple(sorted(steps)),
    )


def stop_string_hits(table: StopStringTable, recent: Array, counts: Array) -> Array:
    """`[N]` bool: whether each row's newest token completes a stop string.

    Args:
      table: the matcher (`stop_string_table`).
      recent: `[N, W]` int, the last `W = table.window` completion tokens, newest last (slots
        before the completion's start hold anything: they are not read).
      counts: `[N]` int, the row's completion tokens so far (the newest included).

    Examples:
      >>> vocab = [b"<", b"/", b"a", b">", b"</", b"a>", b"x</a>y", None]
      >>> table = stop_string_table(["</a>"], vocab)
      >>> recent = jnp.array([[0, 0, 4, 5], [0, 1, 2, 3], [7, 1, 2, 3], [0, 0, 0, 6]])
      >>> stop_string_hits(table, recent, jnp.array([2, 4, 4, 1])).tolist()
      [True, True, False, True]
    """
    recent = jnp.asarray(recent, jnp.int32)
    W = table.window
    first = np.asarray(table.first, np.int32).reshape(-1, 2)
    hit = recent[:, W - 1, None] == jnp.asarray(first[:, 0])[None]  # [N, F]
    matched = jnp.any(hit & jnp.asarray(first[:, 1] == MATCH)[None], axis=1)
    live = _to_states(hit, first[:, 1], table.states)  # [N, states]
    steps = np.asarray(table.steps, np.int32).reshape(-1, 3)
    if not len(steps):
        return matched
    for j in range(1, W):  # the token j places before the newest
        token = recent[:, W - 1 - j, None]
        read = (counts > j)[:, None]
        hit = (token == jnp.asarray(steps[:, 0])[None]) & live[:, steps[:, 1]] & read
        matched |= jnp.any(hit & jnp.asarray(steps[:, 2] == MATCH)[None], axis=1)
        live = _to_states(hit, steps[:, 2], table.states)
    return matched


def _to_states(hit: Array, targets: np.ndarray, states: int) -> Array:
    """`[N, states]` bool: the partial states reached by the pairs that `hit` `[N, R]` marks."""
    partial = targets != MATCH
    onehot = np.zeros((len(targets), states), np.float32)
    onehot[np.nonzero(partial)[0], targets[partial]] = 1.0
    return (hit.astype(jnp.float32) @ jnp.asarray(onehot)) > 0


_TABLES: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], StopStringTable]] = (
    weakref.WeakKeyDictionary()
)


def cached_stop_string_table(strings: Sequence[str], tokenizer: Any) -> StopStringTable:
    """`stop_string_table(strings, tokenizer_token_bytes(tokenizer))`, built once per tokenizer
    object and strings (a large vocabulary takes a few seconds on the host)."""
    per_tokenizer = _TABLES.setdefault(tokenizer, {})
    key = tuple(strings)
    if key not in per_tokenizer:
        per_tokenizer[key] = stop_string_table(key, tokenizer_token_bytes(tokenizer))
    return per_tokenizer[key]


def tokenizer_token_bytes(tokenizer: Any) -> list[bytes | None]:
    """Each token id's bytes, None for tokens without text (special tokens).

    `ByteTokenizer`: ids 0-255 are the bytes. A `transformers` tokenizer (`HFTokenizer`): the
    vocabulary's pieces, through the byte-level alphabet of GPT-2-style BPE (Qwen, Llama 3,
    GPT-2) or SentencePiece's conventions (`▁` for a space, `<0xNN>` byte-fallback pieces:
    Llama 2, Gemma, Mistral); otherwise each token decoded alone.

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> table = tokenizer_token_bytes(ByteTokenizer())
      >>> table[65], table[258]
      (b'A', None)
    """
    from jaxrl_llm.tokenizer import ByteTokenizer

    if isinstance(tokenizer, ByteTokenizer):
        return [bytes([i]) if i < 256 else None for i in range(tokenizer.vocab_size)]
    hf = tokenizer.tokenizer
    special = set(hf.all_special_ids)
    special |= {i for i, t in getattr(hf, "added_tokens_decoder", {}).items() if t.special}
    pieces = hf.convert_ids_to_tokens(list(range(len(hf))))
    kinds = _decoder_kinds(hf)
    byte_of = {c: b for b, c in _byte_alphabet().items()}
    out: list[bytes | None] = []
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            out.append(None)
        elif "ByteLevel" in kinds and all(c in byte_of for c in piece):
            out.append(bytes(byte_of[c] for c in piece))
        elif ("ByteFallback" in kinds or "Metaspace" in kinds or "▁" in piece) and (
            len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")
        ):
            out.append(bytes([int(piece[3:5], 16)]))
        elif "ByteFallback" in kinds or "Metaspace" in kinds or "Replace" in kinds:
            out.append(piece.replace("▁", " ").encode("utf-8"))
        else:
            out.append(hf.decode([i]).encode("utf-8") or None)
    return out


def _decoder_kinds(hf: Any) -> set[str]:
    """The `type`s in a fast tokenizer's decoder (nested `Sequence`s included)."""
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return set()
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds, todo = set(), [decoder]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            kinds.add(node.get("type"))
            todo.extend(node.get("decoders") or [])
    return kinds


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level BPE alphabet: each byte's printable stand-in character (printable
    Latin-1 bytes stand for themselves, the others for the characters from U+0100 on)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars
