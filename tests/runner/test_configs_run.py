"""Every `configs/<algorithm>.yaml` is a complete run: a few steps end to end through the CLI.

Each config is shrunk by command-line overrides (`helpers.TINY`: a 1-layer width-16 model, two
steps of 2 prompts × 2 samples) and scored by a host reward that varies between completions, so
every algorithm gets a learning signal. Checked: exit status 0, finite losses, moved parameters
(the exported policy against a fresh initialisation), the metrics in `metrics.jsonl`, and
`summary.json`.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.cli import main
from jaxrl_llm.config import ConfigError, load_yaml
from jaxrl_llm.models import Decoder, from_pretrained
from jaxrl_llm.runner import load_run_config, prepare_run
from tests.runner.helpers import (
    CONFIGS,
    PREFERENCE,
    RL_CONFIGS,
    SFT_OPTIM,
    TINY,
    records,
    train_records,
)

TRAIN_KEYS = {
    "reward/mean",
    "reward/std",
    "reward/accuracy",
    "response/length_mean",
    "response/truncated_frac",
    "entropy/mean",
    "loss/total",
    "optim/grad_norm",
    "optim/learning_rate",
    "optim/skipped",
    "perf/tokens_per_sec",
    "time/sample_s",
    "time/reward_s",
    "time/update_s",
}
EVAL_KEYS = {"eval/accuracy", "eval/accuracy_greedy", "eval/pass@1", "eval/pass@2"}


def _moved_parameters(run_dir, overrides, config_path):
    config = load_run_config(config_path, overrides, run_dir=run_dir)
    initial = nnx.state(Decoder(config.model.init, rngs=nnx.Rngs(config.seed)))
    exported = nnx.state(from_pretrained(run_dir / "export"))
    diffs = jax.tree.map(
        lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))), initial, exported
    )
    return max(jax.tree.leaves(diffs))


def _check_run(run_dir, train_keys):
    assert (run_dir / "summary.json").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["interrupted"] is None
    for key in ("accuracy_before_rl", "accuracy_after_rl", "greedy_accuracy_after_rl"):
        assert 0.0 <= summary[key] <= 1.0
    assert set(summary["pass_at_k_after_rl"]) == {"1", "2"}
    logged = records(run_dir)
    steps = [r for r in logged if "loss/total" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:
        assert train_keys <= set(record), sorted(train_keys - set(record))
        assert np.isfinite(record["loss/total"]) and record["optim/skipped"] == 0.0
    evals = [r for r in logged if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2]
    assert all(set(r) >= EVAL_KEYS for r in evals)
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (run_dir / "checkpoints" / "2").is_dir()
    return summary, steps


@pytest.mark.parametrize("name", RL_CONFIGS)
def test_each_algorithm_config_runs(tmp_path, name):
    path = CONFIGS / f"{name}.yaml"
    algorithm = load_yaml(path)["algorithm"]
    run_dir = tmp_path / name
    assert main(["train", str(path), *TINY, "--run-dir", str(run_dir)]) == 0
    keys = set(TRAIN_KEYS)
    if algorithm.get("kl", {}).get("mode") == "loss":
        keys |= {"kl/mean", "loss/kl", "nonfinite/kl"}
    if algorithm["policy_loss"]["name"] in ("ppo_clip", "gspo", "cispo"):
        keys.add("policy/clip_frac")
    if "critic" in algorithm:
        keys |= {"loss/value", "value/explained_var"}
    if name == "dapo":
        keys |= {"dapo/sampled_batches", "dapo/kept_groups"}
    _, steps = _check_run(run_dir, keys)
    assert any(r["optim/grad_norm"] > 0 for r in steps)
    assert _moved_parameters(run_dir, TINY, path) > 0


def test_sft_config_runs_padded_and_packed(tmp_path):
    """`configs/sft.yaml` end to end, then the same run with `sft.packing`: the pairs of a step
    share rows, and the loss and gradient are those of the padded batch, so both runs log the
    same losses and end at the same parameters (float rounding apart)."""
    path = CONFIGS / "sft.yaml"
    overrides = [*TINY, *SFT_OPTIM, "metrics.progress_keys=[sft/nll]"]
    run_dir, packed_dir = tmp_path / "sft", tmp_path / "packed"
    assert main(["train", str(path), *overrides, "--run-dir", str(run_dir)]) == 0
    summary, padded = _check_run(run_dir, {"sft/nll", "loss/total", "optim/grad_norm"})
    assert summary["kind"] == "sft"
    assert _moved_parameters(run_dir, overrides, path) > 0
    held_out = [r["eval/sft/nll"] for r in records(run_dir) if "eval/accuracy" in r]
    assert len(held_out) == 2 and held_out[1] < held_out[0], held_out  # the held-out NLL falls

    packing = [*overrides, "sft.packing=true", "sft.packing_length=32"]
    assert main(["train", str(path), *packing, "--run-dir", str(packed_dir)]) == 0
    packed = train_records(packed_dir)
    assert all(r["sft/packed_rows"] == 1 and 0 < r["sft/packing_fill"] <= 1 for r in packed)
    assert "sft/packed_rows" not in padded[0]
    np.testing.assert_allclose(
        [r["sft/nll"] for r in packed], [r["sft/nll"] for r in padded], rtol=1e-5
    )
    a, b = (nnx.state(from_pretrained(d / "export")) for d in (run_dir, packed_dir))
    diffs = jax.tree.map(lambda x, y: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))), a, b)
    assert max(jax.tree.leaves(diffs)) < 1e-5
    too_short = [*overrides, "sft.packing=true", "sft.packing_length=5"]
    config = load_run_config(path, too_short, run_dir=tmp_path / "too_short")
    with pytest.raises(ConfigError, match=r"sft.packing_length: 5 slots .* fewer than"):
        prepare_run(config)


def test_dpo_config_runs_on_generated_pairs(tmp_path):
    """`configs/dpo.yaml` holds the `preference:` and `optim:` sections; the model, the data
    (pairs generated from the arithmetic task) and the run's length come from overrides."""
    path = CONFIGS / "dpo.yaml"
    overrides = PREFERENCE
    run_dir = tmp_path / "dpo"
    assert main(["train", str(path), *overrides, "--run-dir", str(run_dir)]) == 0
    summary, steps = _check_run(run_dir, {"loss/total", "pref/accuracy", "optim/grad_norm"})
    assert summary["kind"] == "preference"
    assert summary["setup"]["data/preference_examples"] == 32
    assert all(np.isfinite(r["loss/total"]) for r in steps)
    assert _moved_parameters(run_dir, overrides, path) > 0


def test_bco_config_runs_and_resumes_with_its_reward_shift(tmp_path):
    """`configs/bco.yaml`: BCO's shift δ (the running mean of the implicit rewards) lives in the
    train state, so 4 steps equal 2 steps, a resume and 2 more, δ included."""
    path = str(CONFIGS / "bco.yaml")
    four = [*PREFERENCE, "train.steps=4", "checkpoint.every=2", "optim.learning_rate=0.01"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", path, *four, "--run-dir", str(straight)]) == 0
    assert main(["train", path, *four, "train.steps=2", "--run-dir", str(split)]) == 0
    assert main(["train", path, *four, "--resume", "--run-dir", str(split)]) == 0
    steps = train_records(straight)
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert train_records(split) == steps  # every metric, δ included, exactly
    deltas = [r["pref/delta"] for r in steps]
    assert len(set(deltas)) == 4 and all(np.isfinite(deltas)), deltas  # δ moves every step
    exported = (straight / "export" / "model.safetensors").read_bytes()
    assert exported == (split / "export" / "model.safetensors").read_bytes()
    prepared = prepare_run(load_run_config(path, four, run_dir=split), resume=True)
    prepared.checkpointer.close()
    moments = prepared.state.reward_moments  # the checkpoint holds δ's statistics
    assert float(moments.count) == 4 * 2 * 2  # 4 steps × 2 pairs × (chosen, rejected)
    assert float(moments.mean) == pytest.approx(deltas[-1], abs=1e-7)


def test_a_progress_key_the_run_does_not_log_is_named(tmp_path, caplog):
    """`metrics.progress_keys` with a typo showed nothing, silently: the first step names it."""
    overrides = [*TINY, "train.steps=1", "metrics.progress_keys=[reward/mean, reward/maen]"]
    assert main(["train", str(CONFIGS / "grpo.yaml"), *overrides, "--run-dir", str(tmp_path)]) == 0
    # only the key the step did not log (reward/mean is one it logs)
    assert "metrics.progress_keys: reward/maen not among this run's step metrics" in caplog.text
