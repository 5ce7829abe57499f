"""The CLI entry: override parsing, user errors (one line, exit status 2), config validation."""

from __future__ import annotations

import pytest

from jaxrl_llm.cli import main
from jaxrl_llm.config import ConfigError
from jaxrl_llm.runner import apply_overrides, build_run_config, load_run_config, parse_override
from tests.runner.helpers import CONFIGS, TINY

GRPO = str(CONFIGS / "grpo.yaml")


@pytest.fixture(autouse=True)
def _no_traceback_env(monkeypatch):
    monkeypatch.delenv("JAXRL_LLM_TRACEBACK", raising=False)  # a user's shell may set it


def _error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_override_values_are_yaml_scalars():
    assert parse_override("train.steps=20") == (("train", "steps"), 20)
    assert parse_override("optim.learning_rate=3e-4") == (("optim", "learning_rate"), 3e-4)
    assert parse_override("optim.learning_rate=-2.5E+1") == (("optim", "learning_rate"), -25.0)
    assert parse_override("warm_start=null") == (("warm_start",), None)
    assert parse_override("data.shuffle=false") == (("data", "shuffle"), False)
    assert parse_override("rewards.combine=decoupled") == (("rewards", "combine"), "decoupled")
    assert parse_override("x.y=[1, 2]") == (("x", "y"), [1, 2])
    assert parse_override("x.y=") == (("x", "y"), "")
    assert parse_override("a.b={c: 1}") == (("a", "b"), {"c": 1})
    for bad in ("steps", "=3", "a..b=1", "a.b=[1"):
        with pytest.raises(ConfigError, match="override"):
            parse_override(bad)


def test_overrides_create_sections_and_replace_values():
    data = {"train": {"steps": 5}, "warm_start": None}
    out = apply_overrides(data, ["train.steps=2", "warm_start.steps=3", "optim.name=sgd"])
    assert out == {"train": {"steps": 2}, "warm_start": {"steps": 3}, "optim": {"name": "sgd"}}
    assert data == {"train": {"steps": 5}, "warm_start": None}  # the input is not modified
    cfg = load_run_config(GRPO, [*TINY, "train.steps=7"], run_dir="somewhere")
    assert cfg.train.steps == 7 and cfg.run_dir == "somewhere"
    assert cfg.model.init.hidden_size == 16 and cfg.optim.name == "sgd"


def test_a_preset_name_on_other_settings_is_warned_about(caplog):
    """`algorithm.name` is only a label: naming a preset over another preset's settings (or
    over the defaults) trained something else under that name without a word."""
    with caplog.at_level("WARNING", logger="jaxrl_llm.runner.overrides"):
        load_run_config(GRPO, [*TINY], run_dir="x")
        assert caplog.records == []  # a preset's own file
        load_run_config(GRPO, [*TINY, "algorithm.policy_loss.clip_high=0.28"], run_dir="x")
        assert caplog.records == []  # a deliberate change to a preset's field
        load_run_config(GRPO, [*TINY, "algorithm.name=dapo"], run_dir="x")
        assert "the settings are those of the 'grpo' preset" in caplog.records[-1].getMessage()
        load_run_config(GRPO, [*TINY, "algorithm={name: dapo}"], run_dir="x")
        message = caplog.records[-1].getMessage()
        assert "start from configs/dapo.yaml" in message and len(caplog.records) == 2


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.stpes=3", "train: unknown key 'stpes' (did you mean 'steps'?)"),
        ("optm.learning_rate=1", "unknown key 'optm' (did you mean 'optim'?)"),
        (
            "algorithm.policy_loss.clip_hgh=0.3",
            "unknown key 'clip_hgh' (did you mean 'clip_high'?)",
        ),
        ("train.steps=many", "train.steps: expected an integer, got 'many'"),
        ("optim.learning_rate=fast", "optim.learning_rate: expected a number, got 'fast'"),
        ("algorithm.policy_loss.clip_low=-0.1", "`clip_low` must be >= 0"),
        ("sampling.num_samples=1", "sampling.num_samples: the 'group' estimator"),
        (("parallel=pmap", "mesh.fsdp=2"), "parallel: 'pmap' replicates the parameters"),
        ("parallel=jitt", "parallel: must be one of 'jit', 'pmap'"),
        ("optim.accumulation_steps=3", "not divisible into algorithm.minibatches"),
        ("mesh.data=4", "do not split evenly over the mesh's data × fsdp = 4 devices"),
        ("algorithm.temperature=0.7", "algorithm.temperature: the update scores the sampler's"),
        ("rewards.jax_native=true", "rewards.jax_native: the in-graph reward reproduces only"),
        ("train.eval_pass_k=[1, 8]", "train.eval_pass_k: pass@k needs k <= the eval samples"),
        ("seed.x=1", "'seed' is a value"),
        ("data.preference_eval_source=parquet:x", "data.preference_eval_source: held-out"),
    ],
)
def test_bad_overrides_are_one_line_user_errors(capsys, tmp_path, override, message):
    overrides = (override,) if isinstance(override, str) else override  # or a conflicting pair
    err = _error(capsys, ["train", GRPO, *TINY, *overrides, "--run-dir", str(tmp_path)])
    assert err.startswith("jaxrl-llm train: ") and message in err, err
    assert not (tmp_path / "metrics.jsonl").exists()


def test_traceback_env_prints_the_user_errors_traceback(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("JAXRL_LLM_TRACEBACK", "1")
    code = main(["train", GRPO, *TINY, "train.stpes=3", "--run-dir", str(tmp_path)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and lines[0] == "Traceback (most recent call last):", lines
    assert lines[-1].startswith("jaxrl-llm train: ") and "stpes" in lines[-1], lines
    assert any("ConfigError" in line for line in lines[1:-1]), lines
    monkeypatch.setenv("JAXRL_LLM_TRACEBACK", "0")
    _error(capsys, ["train", GRPO, *TINY, "train.stpes=3", "--run-dir", str(tmp_path)])


def test_cross_section_rules(capsys, tmp_path):
    ppo = str(CONFIGS / "ppo.yaml")
    err = _error(
        capsys, ["train", ppo, *TINY, "rewards.combine=decoupled", "--run-dir", str(tmp_path)]
    )
    assert "rewards.combine: 'decoupled' (GDPO)" in err
    err = _error(
        capsys,
        ["train", GRPO, *TINY, "rewards.on_failure=drop_group", "algorithm.advantage.scale=batch"],
    )
    assert "rewards.on_failure: 'drop_group'" in err
    err = _error(capsys, ["train", GRPO, *TINY, "sft.agg=token_mean"])
    assert "algorithm: set exactly one of `algorithm:`" in err
    err = _error(capsys, ["train", GRPO, *TINY, "model.checkpoint=/nowhere"])
    assert "model: set exactly one of `checkpoint`" in err


def test_jax_native_rewards_refuse_stop_strings():
    # configs/grpo.yaml scores in-graph: a stop string's tokens would be part of the answer
    with pytest.raises(
        ConfigError, match=r"a right answer that stopped on one of sampling\.stop_strings"
    ):
        load_run_config(GRPO, ["sampling.stop_strings=['Q:']"])
    cfg = load_run_config(GRPO, ["sampling.stop_strings=['Q:']", "rewards.jax_native=false"])
    assert cfg.sampling.stop_strings == ("Q:",) and not cfg.rewards.jax_native


def test_preference_run_rules(capsys, tmp_path):
    model = [f"model.init.{k}={v}" for k, v in {"family": "qwen3", "vocab_size": 259}.items()]
    kto = str(CONFIGS / "kto.yaml")
    err = _error(capsys, ["train", kto, *model, *TINY, "train.prompts_per_step=1"])
    assert "KTO's reference point needs mismatched pairs" in err
    err = _error(capsys, ["train", kto, *model, *TINY, "data.source=sorting"])
    assert "data.source: preference runs read preference records" in err
    err = _error(capsys, ["train", kto, *TINY])  # the file has no model; TINY sets its width
    assert "model.init: missing required key(s) 'family', 'vocab_size'." in err


def test_missing_files_and_runs(capsys, tmp_path):
    err = _error(capsys, ["train", str(tmp_path / "nope.yaml")])
    assert "config file not found" in err
    err = _error(capsys, ["train", GRPO, *TINY, "--resume", "--run-dir", str(tmp_path / "new")])
    assert "--resume: no complete checkpoint" in err
    err = _error(
        capsys,
        [
            "train",
            GRPO,
            *TINY,
            "model.init=null",
            "model.checkpoint=/nowhere",
            "--run-dir",
            str(tmp_path),
        ],
    )
    assert err.startswith("jaxrl-llm train: model.checkpoint:"), err
    err = _error(capsys, ["eval", GRPO, *TINY, "--checkpoint", "last", "--run-dir", str(tmp_path)])
    assert "--checkpoint: expected a step number, 'latest' or 'none'" in err


def test_unknown_arguments_exit_with_usage(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", GRPO, "--resum", "--run-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --resum" in capsys.readouterr().err


def test_build_run_config_prefixes_component_errors():
    with pytest.raises(ConfigError, match=r"^sampling: SamplingConfig: `top_p` must be in"):
        build_run_config({"model": {"checkpoint": "/m"}, "sft": {}, "sampling": {"top_p": 2.0}})
    with pytest.raises(ConfigError, match="model: missing"):
        build_run_config({"sft": {}})
    # a component that raises ConfigError itself is prefixed too (it named no key path)
    with pytest.raises(ConfigError, match=r"^model.lora: LoRAConfig: `rank` must be an int >= 1"):
        build_run_config({"model": {"checkpoint": "/m", "lora": {"rank": 0}}, "sft": {}})


def test_plan_subcommand_is_wired(capsys):
    assert main(["plan", "qwen3-0.6b", "--batch", "4", "--json"]) == 0
    assert "peak" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "qwen3-0.6b", "--devices", "0"],
        ["plan", "qwen3-0.6b", "--batch", "-1"],
        ["sample", "ckpt", "--prompt", "x", "--max-new-tokens", "0"],
        ["sample", "ckpt", "--prompt", "x", "--num-samples", "two"],
    ],
)
def test_counts_on_the_command_line_are_checked_against_their_flag(capsys, args):
    """A count that must be positive is refused by argparse, naming the flag (the library's
    check named an internal name: `mesh_candidates: num_devices`, `generate: max_new_tokens`)."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    flag = next(a for a in args if a.startswith("--") and a != "--prompt")
    assert f"argument {flag}: must be a positive integer, got {args[-1]!r}" in err, err


@pytest.mark.parametrize(
    ("flag", "value", "bounds"),
    [
        ("--temperature", "-1", ">= 0"),
        ("--top-p", "0", "in (0, 1]"),
        ("--min-p", "nan", "in [0, 1]"),
    ],
)
def test_sampling_settings_on_the_command_line_name_their_flag(capsys, flag, value, bounds):
    with pytest.raises(SystemExit) as exit_info:
        main(["sample", "ckpt", "--prompt", "x", flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be a number {bounds}, got {value!r}" in err, err


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_missing_config_is_the_only_required_argument(capsys, command):
    """The overrides are optional; argparse named them as required too."""
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--run-dir", "x"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("the following arguments are required: config")


@pytest.mark.parametrize(
    ("config", "extra", "shown"),
    [
        ("grpo.yaml", [], ("reward/mean", "kl/mean", "entropy/mean", "perf/tokens_per_sec")),
        ("sft.yaml", ["metrics={print_every: 25}"], ("sft/nll", "perf/tokens_per_sec")),
        ("dpo.yaml", ["model.checkpoint=/m"], ("loss/total", "pref/accuracy", "pref/margin")),
        ("reward_model.yaml", ["model.checkpoint=/m"], ("loss/total", "rm/accuracy")),
        ("dpo.yaml", ["model.checkpoint=/m", "metrics.progress_keys=[kl/mean]"], ("kl/mean",)),
    ],
)
def test_the_progress_line_shows_the_run_kinds_own_metrics(config, extra, shown):
    """The RL default showed only tokens/s for SFT, preference and reward-model runs."""
    from jaxrl_llm.runner.loop import _metrics_config

    cfg = load_run_config(str(CONFIGS / config), extra, run_dir="x")
    assert _metrics_config(cfg).progress_keys[: len(shown)] == shown
