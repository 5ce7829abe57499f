"""`jaxrl-llm convert`: checks a checkpoint, re-exports it, and reports bad ones in one line."""

from __future__ import annotations

import json

from jaxrl_llm.cli import main
from jaxrl_llm.models import from_pretrained


def test_convert_checks_and_rewrites_in_bfloat16(hf_checkpoints, tmp_path, capsys):
    path = hf_checkpoints["qwen2"][1]
    assert main(["convert", str(path), "--out", str(tmp_path), "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: qwen2, 2 layers,") and "bfloat16" in out
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert from_pretrained(tmp_path).config == from_pretrained(path).config


def test_convert_reports_a_bad_checkpoint(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert main(["convert", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxrl-llm convert: unsupported model_type 'gpt2'")
    assert main(["convert", str(tmp_path), "--dtype", "int8"]) == 2


def test_convert_reports_unreadable_files_in_one_line(hf_checkpoints, tmp_path, capsys):
    """Not JSON (named with its path), and an `--out` that is a file: one line, status 2."""
    (tmp_path / "config.json").write_text('{"model_type": "qwen2",\n}')
    assert main(["convert", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"jaxrl-llm convert: {tmp_path / 'config.json'}: not valid JSON ("), err
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["convert", str(hf_checkpoints["qwen2"][1]), "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("jaxrl-llm convert: ") and str(afile) in err and len(err.splitlines()) == 1
    )
