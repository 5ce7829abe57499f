"""Degenerate batches train without NaN and are reported (metrics and a warning).

All rewards equal in every group and all completions truncated: `tests/runner/
test_health.py::test_degenerate_batches_train_without_nan` (in-graph rewards of a random model).
Here: every completion empty, and prompts longer than the prompt budget (some, then all).
"""

from __future__ import annotations

import numpy as np

from jaxrl_llm.tokenizer import ByteTokenizer
from tests.reliability.helpers import BASE, GRPO, train, user_error
from tests.runner.helpers import records


def _finite(record):
    return all(np.isfinite(v) for v in record.values() if isinstance(v, float))


def test_empty_completions_train_without_nan_and_warn(tmp_path, caplog):
    """Every byte id is a stop token: each completion is its stop token and nothing else."""
    every_id = list(range(ByteTokenizer().vocab_size))
    with caplog.at_level("WARNING", logger="jaxrl_llm"):
        assert train(tmp_path / "run", [*BASE, f"sampling.stop_tokens={every_id}"]) == 0
    steps = [r for r in records(tmp_path / "run") if "loss/total" in r]
    assert len(steps) == 2 and all(_finite(r) for r in steps)
    for record in steps:
        assert record["response/empty_frac"] == 1.0 and record["response/length_max"] == 1.0
        assert record["response/truncated_frac"] == 0.0
    assert "step 1: every completion is empty (the stop token came first)" in caplog.text


def test_prompts_over_the_budget_are_left_out_counted_and_warned(tmp_path, caplog):
    """1- and 2-digit sums: prompts of 5, 6 and 7 tokens (BOS included); the budget is 6."""
    overrides = [*BASE, "data.arithmetic.max_digits=2", "train.max_prompt_tokens=6"]
    with caplog.at_level("WARNING", logger="jaxrl_llm"):
        assert train(tmp_path / "run", overrides) == 0
    setup, *steps = records(tmp_path / "run")
    assert setup["step"] == 0 and 0 < setup["data/too_long_prompts_train"] < 32
    assert len(steps) == 2 and all(_finite(r) for r in steps)
    assert "train split: left out" in caplog.text
    assert "whose prompt is longer than train.max_prompt_tokens=6 tokens (first: {" in caplog.text


def test_every_prompt_over_the_budget_is_one_clear_error(tmp_path, capsys):
    argv = ["train", GRPO, *BASE, "train.max_prompt_tokens=2", "--run-dir", str(tmp_path)]
    err = user_error(capsys, argv)
    assert "train.max_prompt_tokens" in err and "2" in err, err
    assert not (tmp_path / "metrics.jsonl").exists()
