"""Stop strings (`sampler.stop_strings`): matched on the completion's bytes, however the tokens
spell them.

- The automaton, on random vocabularies of overlapping multi-byte tokens (with special tokens),
  says "stop" after token `k` exactly when an occurrence of a stop string in the bytes of
  tokens `1 … k` ends inside token `k` (a brute-force search over the bytes is the reference).
- `generate` draws the same tokens as without stop strings up to the first token that
  completes one, stops there (not truncated), and runs to the budget where none occurs.
- The token bytes of a byte-level BPE and of a SentencePiece-style (`▁`, byte fallback)
  `transformers` tokenizer spell the texts they encode.
- Bad settings are errors that name the problem; the runner builds the matcher.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.sampler import SamplingConfig, generate, sample_tokens, with_stop_strings
from jaxrl_llm.sampler.stop_strings import (
    stop_string_hits,
    stop_string_table,
    tokenizer_token_bytes,
)
from jaxrl_llm.tokenizer import ByteTokenizer, HFTokenizer
from tests.sampler.helpers import tiny_model

SEP = b"\x00"  # stands for a special token in the reference text (not in the alphabet)


def _reference_hits(strings, vocab, sequence):
    """Per position k: does an occurrence of a string end inside token k's bytes?"""
    out, text = [], b""
    for token in sequence:
        before = len(text)
        text += vocab[token] if vocab[token] is not None else SEP
        ends = [
            i + len(s)
            for s in (x.encode() for x in strings)
            for i in range(len(text) - len(s) + 1)
            if text[i : i + len(s)] == s
        ]
        out.append(any(end > before for end in ends))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_automaton_stops_where_a_string_ends_inside_the_newest_token(seed):
    rng = np.random.default_rng(seed)
    alphabet = "ab</>"
    singles = [c.encode() for c in alphabet]
    pieces = {"".join(rng.choice(list(alphabet), rng.integers(2, 6))).encode() for _ in range(40)}
    vocab = [*singles, *sorted(pieces), None, None]  # two special tokens
    strings = ["".join(rng.choice(list(alphabet), rng.integers(1, 6))) for _ in range(3)]
    table = stop_string_table(strings, vocab)
    W, K, rows = table.window, 14, 64
    sequences = rng.integers(0, len(vocab), (rows, K))
    hits = jax.jit(lambda r, c: stop_string_hits(table, r, c))
    padded = np.concatenate([np.zeros((rows, W - 1), np.int64), sequences], axis=1)
    found = 0
    for k in range(1, K + 1):
        window = padded[:, k - 1 : k - 1 + W]  # the last W tokens up to token k
        got = np.asarray(hits(jnp.asarray(window), jnp.full((rows,), k)))
        want = [_reference_hits(strings, vocab, seq[:k])[-1] for seq in sequences]
        np.testing.assert_array_equal(got, want, err_msg=f"strings {strings}, token {k}")
        found += int(np.sum(want))
    assert found > rows // 4, found  # the data exercises matches, not only misses


def test_generate_stops_at_the_first_token_that_completes_a_string():
    model, tok = tiny_model(vocab=259, layers=1, std=0.1), ByteTokenizer()
    prompts = [tok.encode("hello"), tok.encode("ab")]
    strings = [*"abcdefghijk", "xy", "é"]  # "é" is two bytes, never one of them alone
    common = dict(max_new_tokens=40, key=jax.random.key(1), num_samples=4, temperature=3.0)
    free = generate(model, prompts, stop_tokens=[], **common)
    stopped = generate(
        model, prompts, stop_tokens=[], stop_strings=strings, tokenizer=tok, **common
    )
    tokens, lengths = np.asarray(free.completion_tokens), np.asarray(stopped.lengths)
    stops = 0
    for n in range(len(tokens)):
        hit = _reference_hits(strings, [bytes([i]) for i in range(256)] + [None] * 3, tokens[n])
        first = hit.index(True) + 1 if any(hit) else None
        np.testing.assert_array_equal(
            np.asarray(stopped.completion_tokens)[n, : lengths[n]], tokens[n, : lengths[n]]
        )
        if first is None:
            assert lengths[n] == 40 and bool(stopped.truncated[n])
        else:
            assert lengths[n] == first and not bool(stopped.truncated[n]), (n, first)
            stops += 1
    assert 0 < stops < len(tokens)
    # a plain string is one stop string, not its characters
    one = generate(model, prompts, stop_tokens=[], stop_strings="xy", tokenizer=tok, **common)
    listed = generate(model, prompts, stop_tokens=[], stop_strings=["xy"], tokenizer=tok, **common)
    np.testing.assert_array_equal(np.asarray(one.lengths), np.asarray(listed.lengths))


def _trained_tokenizer(kind: str):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    corpus = ["the answer is </answer> 42", "über café naïve ", "a\nb\tc  d"] * 20
    specials = ["<s>", "</s>", "<pad>"]
    if kind == "byte_level":
        backend = tokenizers.Tokenizer(tokenizers.models.BPE())
        backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = tokenizers.decoders.ByteLevel()
        alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=400, special_tokens=specials, initial_alphabet=alphabet
        )
        backend.train_from_iterator(corpus, trainer)
    else:  # SentencePiece-style: ▁ for spaces, <0xNN> pieces for bytes outside the vocabulary
        chars = [chr(c) for c in range(33, 127)] + ["▁"]
        merges = [("▁", "t"), ("▁t", "h"), ("▁th", "e"), ("<", "/"), ("a", "n"), ("s", "w")]
        merges += [("e", "r"), ("sw", "er"), ("an", "swer"), ("answer", ">"), ("▁", "a")]
        pieces = [*specials, *(f"<0x{b:02X}>" for b in range(256)), *chars]
        pieces += ["".join(m) for m in merges]
        model = tokenizers.models.BPE(
            vocab={p: i for i, p in enumerate(pieces)}, merges=merges, byte_fallback=True
        )
        backend = tokenizers.Tokenizer(model)
        backend.add_special_tokens(specials)
        backend.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
        backend.decoder = tokenizers.decoders.Sequence(
            [
                tokenizers.decoders.Replace("▁", " "),
                tokenizers.decoders.ByteFallback(),
                tokenizers.decoders.Fuse(),
            ]
        )
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    return HFTokenizer(hf)


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_token_bytes_of_transformers_tokenizers_spell_their_texts(kind):
    tok = _trained_tokenizer(kind)
    table = tokenizer_token_bytes(tok)
    assert len(table) == tok.vocab_size
    for special in (tok.eos_id, tok.pad_id, tok.bos_id):
        assert table[special] is None
    texts = ["the answer is </answer>", "über café", "x\ny\tz  w", "zzé→"]
    for text in texts:
        ids = tok.encode(text, add_bos=False)
        spelled = b"".join(table[i] for i in ids)
        decoded = tok.decode(ids, skip_special=False).encode()
        assert spelled == decoded, (kind, text, ids)
    # a stop string is found in the tokens the tokenizer gives a longer text
    config = with_stop_strings(SamplingConfig(stop_strings=("</answer>",)), tok)
    ids = tok.encode("the answer is </answer> 42", add_bos=False)
    W = config.stop_table.window
    padded = [0] * (W - 1) + ids
    hits = [
        bool(
            stop_string_hits(
                config.stop_table, jnp.asarray([padded[k : k + W]]), jnp.array([k + 1])
            )[0]
        )
        for k in range(len(ids))
    ]
    text_before = [tok.decode(ids[: k + 1], skip_special=False) for k in range(len(ids))]
    first = next(k for k, t in enumerate(text_before) if "</answer>" in t)
    assert hits.index(True) == first, (ids, hits)


def test_bad_stop_string_settings_are_named():
    with pytest.raises(ValueError, match="`stop_strings` must be a tuple of non-empty strings"):
        SamplingConfig(stop_strings=("",))
    config = SamplingConfig(stop_strings=("ab",), max_new_tokens=2)
    tok = ByteTokenizer()
    other = with_stop_strings(SamplingConfig(stop_strings=("cd",)), tok)
    with pytest.raises(ValueError, match="`stop_table` does not match `stop_strings`"):
        SamplingConfig(stop_strings=("ab",), stop_table=other.stop_table)
    graphdef, state = nnx.split(tiny_model(vocab=259, layers=1))
    prompts, mask = jnp.array([[1, 2]]), jnp.ones((1, 2), bool)
    with pytest.raises(ValueError, match="`stop_strings` need their matcher"):
        sample_tokens(graphdef, state, prompts, mask, jax.random.key(0), config=config)
    with pytest.raises(ValueError, match="`stop_strings` need the `tokenizer`"):
        generate(
            nnx.merge(graphdef, state),
            [[1, 2]],
            max_new_tokens=2,
            key=jax.random.key(0),
            stop_strings=["ab"],
        )


def test_the_runner_matches_its_stop_strings_with_the_run_tokenizer():
    from jaxrl_llm.runner import load_run_config
    from jaxrl_llm.runner.setup import _sampling
    from tests.runner.helpers import CONFIGS, TINY

    config = load_run_config(
        CONFIGS / "grpo.yaml", [*TINY, "sampling.stop_strings=['</answer>']"], run_dir="/r"
    )
    sampling = _sampling(config, ByteTokenizer())
    assert sampling.stop_strings == ("</answer>",)
    assert sampling.stop_table is not None and sampling.stop_table.window == 9


def test_sample_texts_end_at_the_stop_string_with_a_subword_tokenizer():
    """The token that completes a stop string may carry more text (`' answer'` completes
    `'an'`): the decoded text once ran past the string. One stop id as an int is taken too
    (a row that stopped on it raised TypeError)."""
    from jaxrl_llm.sampler.text import sample_texts

    tok = _trained_tokenizer("byte_level")
    model = tiny_model(vocab=tok.vocab_size, layers=1)
    out = sample_texts(model, tok, ["the answer is"], key=jax.random.key(0), max_new_tokens=16,
                       num_samples=8, stop_tokens=[], stop_strings=["an"], row_groups=1)  # fmt: skip
    stopped = [s for s in out if not s.truncated]
    assert stopped and all(s.text.endswith("an") and s.text.count("an") == 1 for s in stopped)
    # one string as a str is that string, not its characters (the text was cut at "a")
    one = sample_texts(model, tok, ["the answer is"], key=jax.random.key(0), max_new_tokens=16,
                       num_samples=8, stop_tokens=[], stop_strings="an", row_groups=1)  # fmt: skip
    assert one == out
    single = sample_texts(model, tok, ["the"], key=jax.random.key(1), max_new_tokens=8,
                          num_samples=8, stop_tokens=tok.eos_id, temperature=2.0, row_groups=1)  # fmt: skip
    listed = sample_texts(model, tok, ["the"], key=jax.random.key(1), max_new_tokens=8,
                          num_samples=8, stop_tokens=[tok.eos_id], temperature=2.0, row_groups=1)  # fmt: skip
    assert single == listed
