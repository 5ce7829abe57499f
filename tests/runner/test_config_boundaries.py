"""Run-config rules at their boundaries and the bookkeeping settings that mutation testing
found unpinned (2026-12-08): each rule's first refused and last accepted value, nested error
prefixes, derived properties, the resume hint, the run directory, the warm start's cache key."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

from jaxrl_llm.config import ConfigError
from jaxrl_llm.data import DataConfig
from jaxrl_llm.runner import load_run_config
from jaxrl_llm.runner.config import ModelSection, RunConfig, TrainConfig, WarmStartConfig
from jaxrl_llm.runner.warm_start import warm_start_hash
from jaxrl_llm.sampler import SamplingConfig
from jaxrl_llm.train import AlgorithmConfig
from tests.runner.helpers import CONFIGS, TINY

GRPO = str(CONFIGS / "grpo.yaml")


def _config(*overrides, name="grpo"):
    return load_run_config(str(CONFIGS / f"{name}.yaml"), [*TINY, *overrides], run_dir="unused")


@pytest.mark.parametrize(
    ("bad", "good", "message"),
    [
        # each rule at its boundary: the first value is refused, the second accepted
        (
            "train.pack_min_saving=1.0",
            "train.pack_min_saving=0.99",
            r"pack_min_saving: must be in \[0, 1\)",
        ),
        (
            "train.reference_sync={every: 2, alpha: 0.0}",
            "train.reference_sync={every: 2, alpha: 1.0}",
            r"alpha: must be in \(0, 1\]",
        ),
        (
            "train.overlong={buffer_length: 2, factor: -0.5}",
            "train.overlong={buffer_length: 2, factor: 0.0}",
            r"factor: must be >= 0",
        ),
        # sampling.max_new_tokens = 4 (TINY)
        (
            "train.overlong={buffer_length: 5, max_length: 4}",
            "train.overlong={buffer_length: 4, max_length: 4}",
            r"buffer_length: must be <= max_length \(4\)",
        ),
        (
            "train.overlong={buffer_length: 2, max_length: 6}",
            "train.overlong={buffer_length: 2, max_length: 5}",
            r"penalty starts after max_length − buffer_length = 4 tokens",
        ),
        ("train.eval_pass_k=[3]", "train.eval_pass_k=[2]", r"pass@k needs k <= the eval samples"),
        (
            "seed=4611686018427387904",
            "seed=4611686018427387903",
            r"seed: must lie in \[0, 2\*\*62\)",
        ),
    ],
)
def test_config_rules_hold_at_their_boundaries(bad, good, message):
    with pytest.raises(ConfigError, match=message):
        _config(bad)
    _config(good)


def test_more_cross_section_rules():
    # train.eval_samples (not sampling.num_samples = 2) bounds pass@k
    cfg = _config("train.eval_samples=4", "train.eval_pass_k=[1, 4]")
    assert cfg.eval_samples == 4
    # adapters loaded from a PEFT directory mix like `model.lora`'s: only alpha 1
    with pytest.raises(ConfigError, match=r"reference_sync\.alpha: 0\.5 with LoRA adapters"):
        _config("model.lora_adapter=/some/adapter", "train.reference_sync={every: 2, alpha: 0.5}")
    # the compiled iteration has no host refills: even one is refused
    compiled = [
        "rewards.jax_native=true",
        "rewards.functions=[{fn: exact_answer}]",
        "algorithm.advantage.drop_zero_variance=true",
        "train.compiled_iterations=2",
    ]
    with pytest.raises(ConfigError, match=r"set train\.max_refills: 0"):
        _config(*compiled, "train.max_refills=1")
    _config(*compiled, "train.max_refills=0")


def test_section_rules_and_error_prefixes():
    from jaxrl_llm.runner.config import WarmStartConfig

    # a nested section's own error names its key path once
    with pytest.raises(ConfigError) as err:
        _config("train.overlong={buffer_length: 0}")
    assert str(err.value) == "train.overlong.buffer_length: must be >= 1, got 0."
    with pytest.raises(ConfigError, match=r"packing_length: set, but warm_start\.packing is off"):
        WarmStartConfig(steps=1, packing_length=32)
    # a fixed mesh splits the warm start's pairs too (checked on load)
    with pytest.raises(ConfigError, match=r"warm_start\.batch_size: 3 pairs do not split evenly"):
        _config("mesh.data=2", "warm_start={steps: 1, batch_size: 3}")


def test_packed_sft_keeps_the_full_width_and_a_set_norm_length_is_kept():
    assert _config(name="sft").trims_completions
    assert not _config("sft.packing=true", name="sft").trims_completions
    cfg = _config("algorithm.policy_loss.norm_length=7", name="dr_grpo")
    assert cfg.trims_completions and cfg.update_objective.policy_loss.norm_length == 7


def test_online_dpo_packs_its_kept_pairs_into_strided_micro_batches():
    """Online DPO's update rows are whole pairs (unit 2), which `pack_groups` packs as groups of
    2 whatever `sampling.num_samples`: several micro-batches are allowed."""
    cfg = _config(
        "train.pack_groups=true",
        "algorithm.minibatches=2",
        "sampling.num_samples=4",
        name="online_dpo",
    )
    assert cfg.train.pack_groups and cfg.update_unit == 2


def test_the_resume_hint_repeats_the_overrides_and_the_run_dir():
    """The command printed on SIGTERM / a second SIGINT resumes the same config: it must carry
    the command line's overrides (without them the resumed run trains another config)."""
    from jaxrl_llm.cli import _resume_command

    args = argparse.Namespace(
        config="configs/grpo.yaml", overrides=["train.steps=5", "model.lora={rank: 2}"]
    )
    assert _resume_command(args, "runs/my run") == (
        "jaxrl-llm train configs/grpo.yaml train.steps=5 'model.lora={rank: 2}' --resume "
        "--run-dir 'runs/my run'"
    )


def test_trim_to_longest_keeps_a_last_target_just_past_a_power_of_two():
    """The width counts the slots up to and including the last target: a target in slot 16
    needs 17 slots, so the batch is cut to 32, not 16 (which would drop the target)."""
    from jaxrl_llm.runner.completion_width import trim_to_longest
    from jaxrl_llm.train import SequenceBatch

    mask = np.zeros((2, 64), np.float32)
    mask[0, 16] = 1.0
    mask[1, :3] = 1.0
    batch = SequenceBatch(np.zeros((2, 70), np.int32), np.ones((2, 70), np.int32), mask)
    cut = trim_to_longest(batch, minimum=4)
    assert cut.completion_mask.shape == (2, 32)
    assert cut.completion_mask.sum() == mask.sum()
    mask[0, 16] = 0.0
    mask[0, 15] = 1.0  # 16 slots suffice
    assert trim_to_longest(
        batch._replace(completion_mask=mask), minimum=4
    ).completion_mask.shape == (2, 16)


def test_the_files_run_dir_is_kept_unless_one_is_passed(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("model: {checkpoint: /m}\nsft: {}\nrun_dir: /data/runs/mine\n")
    assert load_run_config(path).run_dir == "/data/runs/mine"
    assert load_run_config(path, run_dir=tmp_path / "x").run_dir == str(tmp_path / "x")
    path.write_text("model: {checkpoint: /m}\nsft: {}\n")
    assert load_run_config(path).run_dir == "runs/tiny"


_BASE = RunConfig(
    model=ModelSection(checkpoint="/m"),
    algorithm=AlgorithmConfig(),
    sampling=SamplingConfig(num_samples=2),
    warm_start=WarmStartConfig(steps=5),
)


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 1},
        {"data": DataConfig(seed=1)},
        {"warm_start": WarmStartConfig(steps=6)},
        {"sampling": SamplingConfig(num_samples=2, max_new_tokens=17)},
        {"sampling": SamplingConfig(num_samples=2, min_bucket=4)},
        {"sampling": SamplingConfig(num_samples=2, bucket_multiple=8)},
        {"train": TrainConfig(max_prompt_tokens=20)},
    ],
    ids=lambda c: next(iter(c)),
)
def test_the_warm_start_cache_key_covers_every_setting_the_fine_tuning_depends_on(change):
    """A cached warm start is reused only for the same settings: another seed (the SFT state's
    key), data, length budget or prompt bucketing trains again instead of loading a stale cache."""
    assert warm_start_hash(dataclasses.replace(_BASE, **change)) != warm_start_hash(_BASE)


def test_the_warm_start_cache_key_ignores_the_rl_settings():
    other = dataclasses.replace(
        _BASE, train=TrainConfig(steps=7), sampling=SamplingConfig(num_samples=4)
    )
    assert warm_start_hash(other) == warm_start_hash(_BASE)
