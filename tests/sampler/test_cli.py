"""`jaxrl-llm sample` and `sample_texts` on a tiny checkpoint with the byte tokenizer."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_llm.cli import main
from jaxrl_llm.models import from_pretrained, save_pretrained
from jaxrl_llm.sampler import generate
from jaxrl_llm.sampler.text import sample_texts
from jaxrl_llm.tokenizer import ByteTokenizer
from tests.sampler.helpers import tiny_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("byte_lm")
    save_pretrained(tiny_model(vocab=259, seed=3, layers=1, std=0.3), path)
    return str(path)


def test_sample_command_prints_each_completion_and_is_seeded(checkpoint, capsys):
    argv = [
        "sample",
        checkpoint,
        "--tokenizer",
        "byte",
        "--prompt",
        "hi",
        "--prompt",
        "abc",
        "--max-new-tokens",
        "6",
        "--num-samples",
        "2",
        "--seed",
        "1",
        "--top-k",
        "50",
    ]
    assert main(argv) == 0
    first = capsys.readouterr().out
    headers = [line for line in first.splitlines() if line.startswith("[prompt ")]
    assert headers[0].startswith("[prompt 0 sample 0]")
    assert len(headers) == 4 and headers[3].startswith("[prompt 1 sample 1]")
    assert main(argv) == 0
    assert capsys.readouterr().out == first


def test_greedy_text_is_the_decoded_greedy_rollout(checkpoint, capsys):
    tok = ByteTokenizer()
    model = from_pretrained(checkpoint)
    [sample] = sample_texts(
        model, tok, ["hello"], key=jax.random.key(0), max_new_tokens=7, temperature=0.0
    )
    rollout = generate(
        model,
        [tok.encode("hello")],
        max_new_tokens=7,
        key=jax.random.key(0),
        temperature=0.0,
        stop_tokens=[tok.eos_id],
        pad_id=tok.pad_id,
    )
    ids = np.asarray(rollout.completion_tokens[0, : int(rollout.lengths[0])]).tolist()
    if not bool(rollout.truncated[0]):
        ids = ids[:-1]
    assert sample.text == tok.decode(ids) and sample.num_tokens == int(rollout.lengths[0])
    lp = float(np.asarray(rollout.logprobs[0], np.float64)[: sample.num_tokens].sum())
    assert sample.logprob == pytest.approx(lp, abs=1e-6)
    argv = [
        "sample",
        checkpoint,
        "--tokenizer",
        "byte",
        "--prompt",
        "hello",
        "--max-new-tokens",
        "7",
        "--temperature",
        "0",
    ]
    assert main(argv) == 0
    header, text = capsys.readouterr().out.split("\n", 1)  # the text may hold newlines itself
    assert header.startswith("[prompt 0 sample 0]") and text == sample.text + "\n"


def test_stop_strings_reach_the_sampler(checkpoint, capsys):
    tok, model, letters = ByteTokenizer(), from_pretrained(checkpoint), tuple("abcdefghijklm")
    common = dict(key=jax.random.key(2), max_new_tokens=24, num_samples=4)
    samples = sample_texts(model, tok, ["hello"], stop_strings=letters, **common)
    for s in samples:  # each text ends at its first string, or holds none (EOS, budget)
        ends = [s.text.find(x) + len(x) for x in letters if x in s.text]
        assert not ends or (min(ends) == len(s.text) and not s.truncated), s
    assert any(s.text.endswith(letters) for s in samples)  # the strings were used
    argv = ["sample", checkpoint, "--tokenizer", "byte", "--prompt", "hello", "--seed", "2"]
    argv += ["--max-new-tokens", "24", "--num-samples", "4"]
    assert main([*argv, *(a for x in letters for a in ("--stop", x))]) == 0
    lines = capsys.readouterr().out.split("\n")
    ends = [f"{s.num_tokens} tokens" for s in samples]
    assert [
        line.split(", ")[0].split("] ")[1] for line in lines if line.startswith("[prompt")
    ] == ends


def test_sample_command_reports_bad_input_with_exit_status_2(checkpoint, tmp_path, capsys):
    assert main(["sample", str(tmp_path), "--tokenizer", "byte", "--prompt", "x"]) == 2
    assert "jaxrl-llm sample:" in capsys.readouterr().err
    assert (
        main(["sample", checkpoint, "--tokenizer", "byte", "--prompt", "x", "--dtype", "int8"]) == 2
    )
    assert "--dtype must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse's range check, naming the flag
        main(["sample", checkpoint, "--tokenizer", "byte", "--prompt", "x", "--top-p", "2"])
    assert exit_info.value.code == 2
    assert "argument --top-p: must be a number in (0, 1], got '2'" in capsys.readouterr().err
    # a mistyped checkpoint is named as such, not as a tokenizer directory
    assert main(["sample", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err == f"jaxrl-llm sample: {tmp_path / 'nope'} is not a checkpoint directory.\n", err


def test_sample_command_reports_exact_match_pass_at_k(checkpoint, capsys):
    tok = ByteTokenizer()
    [greedy] = sample_texts(
        from_pretrained(checkpoint), tok, ["hi"], key=jax.random.key(0), max_new_tokens=5,
        temperature=0.0,
    )  # fmt: skip
    argv = ["sample", checkpoint, "--tokenizer", "byte", "--max-new-tokens", "5"]
    argv += ["--temperature", "0", "--num-samples", "3", "--prompt", "hi", "--prompt", "abc"]
    # greedy: all 3 samples of a prompt are its greedy text; the second answer never matches
    assert main([*argv, "--answer", greedy.text, "--answer", "\x00never"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        "exact match over 2 prompts x 3 samples: pass@1 0.500  pass@2 0.500  pass@3 0.500"
    )
    assert main([*argv, "--answer", "only one"]) == 2
    assert "--answer: give one per --prompt (2), got 1." in capsys.readouterr().err


def test_pass_at_k_compares_the_text_without_its_stop_string():
    """`--stop "\\n" --answer 4` never matched "4\\n", the text a stop string leaves."""
    from jaxrl_llm.cli import _pass_at_k_line
    from jaxrl_llm.sampler.text import TextSample

    samples = [TextSample(0, g, text, 2, False, -1.0) for g, text in enumerate(["4\n", "5\n"])]
    assert "pass@1 0.500" in _pass_at_k_line(samples, ["4"], 2, ("\n",))
    assert "pass@1 0.000" in _pass_at_k_line(samples, ["4"], 2)
