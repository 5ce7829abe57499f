"""A run that starts from a Hugging Face checkpoint and hands its result back to `transformers`.

A tiny random Qwen3 checkpoint written by `transformers` (the user's download, offline) is the
policy of a two-step GRPO run through the CLI (`model.checkpoint=DIR`, byte tokenizer); the
exported policy is loaded back with `transformers.AutoModelForCausalLM` and must give the same
logits as our model loaded from the same directory, and differ from the starting checkpoint.
"""

from __future__ import annotations

import numpy as np
import pytest

from jaxrl_llm.cli import main
from jaxrl_llm.models import from_pretrained
from tests.runner.helpers import CONFIGS, TINY

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# `TINY` without its random architecture: the model comes from the checkpoint
FROM_CHECKPOINT = [o for o in TINY if not o.startswith("model.init.")]


def _tiny_qwen3(path):
    """A 1-layer random Qwen3 with the byte tokenizer's 259 ids, saved by `transformers`."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "qwen3",
        vocab_size=259,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=True,
    )
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(path)
    return model


def _logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.float().numpy()


def _ours(path, tokens):
    model = from_pretrained(path)
    positions = np.broadcast_to(np.arange(tokens.shape[1], dtype=np.int32), tokens.shape)
    return np.asarray(model(tokens, positions))


def test_train_from_hf_checkpoint_and_export_back(tmp_path):
    base = tmp_path / "hf_base"
    start = _tiny_qwen3(base)
    run_dir = tmp_path / "run"
    argv = ["train", str(CONFIGS / "grpo.yaml"), *FROM_CHECKPOINT]
    argv += [f"model.checkpoint={base}", "model.init=null", "--run-dir", str(run_dir)]
    assert main(argv) == 0

    export = run_dir / "export"
    tokens = np.random.default_rng(0).integers(0, 259, (2, 9)).astype(np.int32)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(export).eval()
    theirs = _logits(reloaded, tokens)
    np.testing.assert_allclose(_ours(export, tokens), theirs, rtol=1e-4, atol=1e-4)
    # training moved the weights: the exported model is not the starting checkpoint
    assert np.max(np.abs(theirs - _logits(start, tokens))) > 1e-4
