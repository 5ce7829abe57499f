"""Reward-function failures in the loop: fail, score, drop_group — counted, never silent."""

from __future__ import annotations

import jax
import numpy as np

from jaxrl_llm.cli import main
from jaxrl_llm.data import IteratorState
from jaxrl_llm.runner import load_run_config, prepare_run
from jaxrl_llm.runner.rollout import collect
from tests.runner.helpers import CONFIGS, TINY, checksum_reward, records

GRPO = str(CONFIGS / "grpo.yaml")
FLAKY = "rewards.functions=[{fn: 'tests.runner.helpers:first_row_fails'}]"


def test_on_failure_fail_stops_the_run_naming_the_example(capsys, tmp_path):
    code = main(["train", GRPO, *TINY, FLAKY, "train.eval_prompts=0", "--run-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "reward function 'first_row_fails' returned None on row 0 of 4" in err
    assert "on_failure='fail'" in err and "prompt:" in err


def _collected(tmp_path, policy, *extra):
    overrides = [*TINY, FLAKY, f"rewards.on_failure={policy}", *extra]
    prepared = prepare_run(load_run_config(GRPO, overrides, run_dir=tmp_path))
    prepared.checkpointer.close()
    start = IteratorState(seed=0, epoch=0, position=0)
    return collect(prepared.context, prepared.state, start, jax.random.key(5))[0]


def test_on_failure_score_uses_the_failure_score(tmp_path):
    collected = _collected(tmp_path, "score", "rewards.failure_score=-3.0")
    rewards = collected.scores.total
    assert rewards[0] == -3.0 and np.all(rewards[1:] >= 0)
    assert collected.metrics["reward/failures/none"] == 1.0
    assert collected.metrics["reward/valid_frac"] == 1.0
    assert float(np.asarray(collected.sequences.completion_mask)[0].sum()) > 0  # still trains


def test_on_failure_drop_group_removes_the_group_from_the_loss(tmp_path):
    collected = _collected(tmp_path, "drop_group")
    mask = np.asarray(collected.sequences.completion_mask)
    assert mask[:2].sum() == 0 and mask[2:].sum() > 0  # group 0 (rows 0, 1) left the loss
    assert collected.scores.valid.tolist() == [False, False, True, True]
    assert collected.metrics["reward/dropped_groups"] == 1.0
    assert collected.metrics["reward/valid_frac"] == 0.5
    # reward metrics are over the valid rows only
    assert collected.metrics["reward/mean"] == np.mean(collected.scores.total[2:])


def test_drop_group_run_completes_and_counts(tmp_path):
    overrides = [*TINY, FLAKY, "rewards.on_failure=drop_group", "train.eval_prompts=0"]
    assert main(["train", GRPO, *overrides, "--run-dir", str(tmp_path)]) == 0
    steps = [r for r in records(tmp_path) if "loss/total" in r]
    assert [r["reward/dropped_groups"] for r in steps] == [1.0, 1.0]
    assert all(np.isfinite(r["loss/total"]) for r in steps)


def test_checksum_reward_varies():  # the helper the other runs rely on for a signal
    assert len(set(checksum_reward([""] * 4, ["ab", "ac", "ad", "ae"]))) == 4
