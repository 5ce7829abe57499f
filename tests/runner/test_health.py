"""Non-finite steps are skipped in-graph, counted, and stop the run with a diagnosis."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_llm.cli import main
from jaxrl_llm.runner import (
    SkipTracker,
    TrainingDivergedError,
    degenerate_batch_warnings,
    load_run_config,
    nonfinite_terms,
    prepare_run,
    rollout,
    run_training,
)
from tests.runner.helpers import CONFIGS, TINY, records, tree_equal

GRPO = str(CONFIGS / "grpo.yaml")


def _host(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_a_nonfinite_kl_skips_steps_then_stops_naming_the_kl(tmp_path):
    overrides = [*TINY, "train.steps=5", "train.max_consecutive_skips=2", "checkpoint.every=100"]
    prepared = prepare_run(load_run_config(GRPO, overrides, run_dir=tmp_path))
    params0, opt0 = _host(prepared.state.params), _host(prepared.state.opt_state)
    poisoned = jax.tree.map(lambda x: x * np.nan, prepared.context.reference)
    prepared = prepared._replace(context=prepared.context._replace(reference=poisoned))
    with pytest.raises(TrainingDivergedError) as err:
        run_training(prepared)
    message = str(err.value)
    assert "stopped at step 2: 2 consecutive steps were skipped" in message
    assert "non-finite: KL (loss/kl)" in message and "policy loss" not in message
    assert "latest checkpoint: step 2" in message

    steps = [r for r in records(tmp_path) if "loss/total" in r]
    assert [r["optim/skipped"] for r in steps] == [1.0, 1.0]
    assert [r["nonfinite/kl"] for r in steps] == [1.0, 1.0]
    assert [r["nonfinite/policy"] for r in steps] == [0.0, 0.0]
    # the skipped steps left the parameters and the optimizer state untouched, bit for bit
    resumed = prepare_run(load_run_config(GRPO, overrides, run_dir=tmp_path), resume=True)
    resumed.checkpointer.close()
    assert resumed.start_step == 2 and resumed.skips == SkipTracker(2, 2)
    assert tree_equal(_host(resumed.state.params), params0)
    assert tree_equal(_host(resumed.state.opt_state), opt0)
    assert int(resumed.state.step) == 2  # the batches were consumed


def test_nonfinite_rewards_stop_the_cli_with_exit_status_1(capsys, tmp_path, monkeypatch):
    """The reward guard and the config keep rewards finite (`rewards.failure_score: .nan` is a
    config error); a NaN planted after them (a bug in shaping, say) still stops the run."""
    real = rollout.component_rewards

    def first_row_nan(*args, **kwargs):
        rewards, valid, failed, metrics = real(*args, **kwargs)
        rewards = rewards.copy()
        rewards[0, 0] = np.nan
        return rewards, valid, failed, metrics

    monkeypatch.setattr(rollout, "component_rewards", first_row_nan)
    code = main(
        [
            "train",
            GRPO,
            *TINY,
            "train.steps=4",
            "train.max_consecutive_skips=1",
            "--run-dir",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err
    assert "training stopped at step 1: 1 consecutive steps were skipped" in err
    assert "non-finite: the rewards (1 non-finite), the advantages (adv/mean), policy loss" in err


def test_diagnosis_and_degenerate_batches():
    assert nonfinite_terms({"nonfinite/value": 1.0, "nonfinite/entropy": 1.0}) == [
        "value loss (loss/value)",
        "entropy (loss/entropy)",
    ]
    assert nonfinite_terms({"nonfinite/total": 1.0}) == ["the total loss (loss/total)"]
    assert degenerate_batch_warnings({"reward/valid_frac": 0.0, "adv/frac_zero_std": 1.0}) == [
        "every group was dropped by reward-function failures (rewards.on_failure)"
    ]
    assert degenerate_batch_warnings({"response/empty_frac": 1.0}) == [
        "every completion is empty (the stop token came first)"
    ]
    assert degenerate_batch_warnings({"adv/frac_zero_std": 0.5}) == []
    # equal rewards in every group, but a critic's GAE (or a KL in the reward) still gives
    # advantages: no warning (PPO logged it at every all-zero-reward step before)
    assert degenerate_batch_warnings({"adv/frac_zero_std": 1.0, "adv/std": 1.0}) == []


def test_degenerate_batches_train_without_nan(tmp_path, caplog):
    """In-graph exact-answer rewards of a random model: every group is all zeros; every
    completion is truncated. The advantages are 0, the only gradient is the KL's, which is 0 up
    to the rounding between the reference forward and the update's; reported, never NaN."""
    overrides = [
        *TINY,
        "rewards.functions=[{fn: exact_answer}]",
        "rewards.jax_native=true",
        "train.eval_prompts=0",
    ]
    with caplog.at_level("WARNING", logger="jaxrl_llm"):
        assert main(["train", GRPO, *overrides, "--run-dir", str(tmp_path)]) == 0
    steps = [r for r in records(tmp_path) if "loss/total" in r]
    for record in steps:
        assert all(np.isfinite(v) for v in record.values() if isinstance(v, float)), record
        assert record["adv/frac_zero_std"] == 1.0 and record["adv/std"] == 0.0
        assert record["optim/grad_norm"] < 1e-6 and record["response/truncated_frac"] == 1.0
    text = caplog.text
    assert text.count("every group has equal rewards") == 1  # warned once per streak


def test_a_skipped_bco_step_leaves_the_reward_shift_as_it_was(tmp_path):
    """BCO's running moments (the shift δ) are updated before the update step; a step skipped
    as non-finite (a NaN reference here) once kept the NaN statistics, so every later step
    was non-finite too. Now the skipped step leaves them as they were, like the parameters."""
    from tests.runner.helpers import PREFERENCE

    path = str(CONFIGS / "bco.yaml")
    overrides = [*PREFERENCE, "train.steps=3", "train.max_consecutive_skips=2"]
    prepared = prepare_run(load_run_config(path, overrides, run_dir=tmp_path))
    initial = _host(prepared.state.reward_moments)
    poisoned = jax.tree.map(lambda x: x * np.nan, prepared.context.reference)
    prepared = prepared._replace(context=prepared.context._replace(reference=poisoned))
    with pytest.raises(TrainingDivergedError, match="2 consecutive steps were skipped"):
        run_training(prepared)
    resumed = prepare_run(load_run_config(path, overrides, run_dir=tmp_path), resume=True)
    resumed.checkpointer.close()
    assert resumed.start_step == 2
    assert tree_equal(_host(resumed.state.reward_moments), initial)
