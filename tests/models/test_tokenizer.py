"""Tokenizers: the byte tokenizer and a local `transformers` tokenizer (built in the test)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxrl_llm.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_byte_tokenizer_round_trips_unicode_and_pads_both_sides():
    tok = ByteTokenizer()
    # fixed ids (configs name them: stop token 258): bytes 0-255, then pad, BOS, EOS
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (256, 257, 258, 259)
    assert tok.encode("a", add_bos=True, add_eos=True) == [257, 97, 258]
    text = "héllo, 世界"
    ids = tok.encode(text, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and max(ids) < tok.vocab_size
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special=False) == f"<bos>{text}<eos>"
    left, left_mask = tok.batch_encode(["ab", "abcd"], add_bos=False)
    right, right_mask = tok.batch_encode(["ab", "abcd"], add_bos=False, padding_side="right")
    assert left.tolist()[0] == [256, 256, 97, 98] and right.tolist()[0] == [97, 98, 256, 256]
    np.testing.assert_array_equal(left[left_mask], right[right_mask])
    assert left.dtype == np.int32 and left_mask.dtype == bool
    with pytest.raises(ValueError, match=r"rows \[1\] are longer than max_length=3"):
        tok.batch_encode(["ab", "abcd"], add_bos=False, max_length=3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([300])


def test_byte_tokenizer_chat_format():
    tok = load_tokenizer("byte", chat_template=True)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    assert tok.render(messages) == "system: be brief\nuser: 2+2?\nassistant: "
    assert tok.render("2+2?") == "user: 2+2?\nassistant: "  # one user message, as with HF
    assert load_tokenizer("byte").render("2+2?") == "2+2?"
    with pytest.raises(ValueError, match="needs chat_template=True"):
        load_tokenizer("byte").render(messages)


@pytest.fixture
def hf_tokenizer_dir(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = ["<pad>", "<s>", "</s>", "<unk>", "the", "cat", "sat", "<user>", "<assistant>"]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    fast.chat_template = TEMPLATE
    fast.save_pretrained(tmp_path)
    return tmp_path


def test_local_transformers_tokenizer(hf_tokenizer_dir):
    tok = load_tokenizer(hf_tokenizer_dir)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 9)
    assert tok.encode("the cat sat", add_bos=False, add_eos=True) == [4, 5, 6, 2]
    assert tok.decode([4, 5, 2]) == "the cat"
    tokens, mask = tok.batch_encode(["the", "the cat sat"], add_bos=False)
    assert tokens.tolist() == [[0, 0, 4], [4, 5, 6]] and mask.sum() == 4
    assert tok.render("the cat") == "the cat"
    chat = load_tokenizer(hf_tokenizer_dir, chat_template=True)
    assert chat.render([{"role": "user", "content": "the cat"}]) == "<user>the cat</s><assistant>"
    custom = load_tokenizer(hf_tokenizer_dir, chat_template="{{ messages[0]['content'] }}!")
    assert custom.render("sat") == "sat!"
    # ids of a model vocabulary padded beyond the tokenizer's: transformers drops them, the
    # rewards' text shows them
    from jaxrl_llm.rewards import decode_completions

    assert tok.decode([4, 12, 5]) == "the cat"
    texts = decode_completions(tok, np.array([[4, 12, 5, 2]]), np.ones((1, 4), bool))
    assert texts == ["the<id:12>cat"]
    # this tokenizer adds no BOS: an empty prompt would leave nothing to condition on
    from jaxrl_llm.data import DataError, TemplateConfig, make_prompt_batch

    with pytest.raises(DataError, match=r"example 1's prompt '' has no tokens"):
        make_prompt_batch([{"prompt": "the"}, {"prompt": ""}], template=TemplateConfig(),
                          tokenizer=tok, answer_field=None)  # fmt: skip


def test_a_chat_template_that_writes_the_bos_gets_it_once(tmp_path):
    """A Llama- or Gemma-style template starts with `{{ bos_token }}` and the tokenizer's
    post-processor adds a BOS too: prompts carry one BOS, as `apply_chat_template` gives."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from jaxrl_llm.data import TemplateConfig, make_prompt_batch

    words = ["<pad>", "<s>", "</s>", "<unk>", "the", "cat", "sat", "<user>", "<assistant>"]
    vocab = {w: i for i, w in enumerate(words)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>",
    )  # fmt: skip
    fast.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path, chat_template=True)
    messages = [{"role": "user", "content": "the cat"}]
    expected = fast.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert expected == [1, 4, 5]  # one BOS, then "the cat"
    assert tok.encode(tok.render(messages)) == expected
    batch = make_prompt_batch(
        [{"prompt": "the cat"}], template=TemplateConfig(chat=True), tokenizer=tok,
        answer_field=None,
    )  # fmt: skip
    assert np.asarray(batch.prompt_tokens)[0].tolist() == expected
    assert tok.encode("the cat") == [1, 4, 5]  # plain text: the post-processor's BOS


def test_a_post_processor_eos_does_not_end_the_prompt(tmp_path):
    """A tokenizer whose post-processor writes `<s> $A </s>` (a Llama tokenizer saved with
    add_eos_token=True): a prompt gets the BOS only (it ended in EOS, so the sampler continued
    after the end) and `add_eos` adds one EOS, not two."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from jaxrl_llm.data import TemplateConfig, make_prompt_batch

    words = ["<pad>", "<s>", "</s>", "<unk>", "the", "cat"]
    backend = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>",
    )  # fmt: skip
    assert fast.encode("the cat") == [1, 4, 5, 2]  # what the tokenizer itself does
    fast.save_pretrained(tmp_path)
    tok = load_tokenizer(tmp_path)
    assert tok.encode("the cat") == [1, 4, 5]
    assert tok.encode("the cat", add_eos=True) == [1, 4, 5, 2]
    assert tok.encode("the cat", add_bos=False) == [4, 5]
    batch = make_prompt_batch(
        [{"prompt": "the cat"}], template=TemplateConfig(), tokenizer=tok, answer_field=None
    )
    assert np.asarray(batch.prompt_tokens)[0].tolist() == [1, 4, 5]


def test_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match="is not a local directory"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(ValueError, match="fixed chat format"):
        load_tokenizer("byte", chat_template="{{ x }}")
    # a model directory without tokenizer files (a byte-tokenizer run's export): transformers
    # would build an empty tokenizer that encodes every text to no token
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"no tokenizer files in .*export .*e\.g\. 'byte'"):
        load_tokenizer(tmp_path / "export")


def test_a_tokenizer_without_a_pad_token_pads_with_its_eos(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = ["<unk>", "<s>", "</s>", "the"]
    backend = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    assert fast.pad_token_id is None
    assert HFTokenizer(fast).pad_id == 2  # the EOS, not the BOS (1)
