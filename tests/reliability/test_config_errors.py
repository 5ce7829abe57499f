"""Bad configs: one clear line, exit status 2, no traceback, and nothing compiled.

`tests/runner/test_cli.py::test_bad_overrides_are_one_line_user_errors` already covers unknown
keys with a "did you mean" (`train.stpes`, `optm`, `clip_hgh`), wrong types (`train.steps=many`,
`optim.learning_rate=fast`), `clip_low < 0`, group size 1 with the group estimator, a step that
does not split into micro-batches, and a batch that does not split over the mesh (`mesh.data=4`).
This file adds the rows it lacks, checks that each error comes before the model and its
programs are built (so before any compilation), and runs the real `jaxrl-llm` process once
for its exit status and output.
"""

from __future__ import annotations

import math
import sys

import pytest

from jaxrl_llm.cli import main
from jaxrl_llm.config import ConfigError
from jaxrl_llm.rewards import (
    RewardConfig,
    RewardFunction,
    RewardFunctionConfig,
    score_rewards,
)
from jaxrl_llm.runner import setup
from tests.reliability.helpers import BASE, GRPO, run_cli, user_error


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if the run gets as far as building its model and programs."""

    def build_context(*args, **kwargs):
        raise AssertionError("the error came after the model and its programs were built")

    monkeypatch.setattr(setup, "build_context", build_context)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # a mesh that does not divide the device count (1 CPU device here)
        (
            "mesh.data=2",
            "mesh: MeshConfig: data×fsdp×tensor = 2 must equal the number of devices (1); "
            "use -1 for one axis to take the rest.",
        ),
        # non-finite numbers (YAML .nan / .inf) are never a meaningful setting
        ("rewards.failure_score=.nan", "rewards.failure_score: expected a finite number, got nan."),
        ("optim.learning_rate=.inf", "optim.learning_rate: expected a finite number, got inf."),
        (
            "algorithm.policy_loss.clip_high=.nan",
            "algorithm.policy_loss.clip_high: expected a finite number, got nan.",
        ),
        (
            "rewards.functions=[{fn: exact_answer, weight: .inf}]",
            "rewards.functions[0].weight: expected a finite number, got inf.",
        ),
        # out-of-range values
        (
            "algorithm.policy_loss.clip_high=-0.1",
            "algorithm.policy_loss: PolicyLossConfig: `clip_high` must be >= 0, got -0.1.",
        ),
        ("algorithm.kl.coef=-1", "algorithm.kl: KLConfig: mode='loss' needs `coef` > 0, got -1.0."),
        ("sampling.temperature=-1", "`temperature` must be a finite number >= 0 (0 = greedy)"),
        ("rewards.timeout_s=-1", "rewards.timeout_s: must be > 0 or null, got -1.0."),
        ("checkpoint.every=0", "checkpoint: CheckpointConfig: `every` must be an int >= 1, got 0."),
        # reward options that a checkpoint's JSON meta cannot hold (YAML makes a date)
        (
            "rewards.functions=[{fn: exact_answer, kwargs: {since: 2024-01-01}}]",
            "`kwargs.since`: datetime.date(2024, 1, 1) is a date; options must be JSON data",
        ),
        # wrong types and values
        ("train.eval_pass_k=3", "train.eval_pass_k: expected a list, got int."),
        ("optim.name=adamm", "optim.name: must be one of 'adamw', 'adam', 'lion', 'sgd'"),
        ("seed=18446744073709551616", "seed: must lie in [0, 2**62), got 18446744073709551616."),
        (  # it failed at the first prompt, naming no config key
            "data.template={prompt: '{prompt}', chat: true}",
            "data.template.chat: renders the prompt as chat messages, which needs "
            "tokenizer.chat_template: true.",
        ),
        (
            "optim.critic_learning_rate=1e-5",
            "optim.critic_learning_rate: is the PPO critic's learning rate, and this run has no "
            "critic (algorithm.critic); unset it.",
        ),
        ("checkpoint.evry=3", "checkpoint: unknown key 'evry' (did you mean 'every'?)"),
        ("sampling.row_groups=0", "SamplingConfig: `row_groups` must be an int >= 1, got 0."),
        (
            "sampling.row_groups=3",
            "sampling.row_groups: 3 groups must divide train.prompts_per_step (2), the prompts "
            "of each sampling call",
        ),
    ],
)
def test_bad_values_are_one_line_errors_before_any_compilation(
    capsys, tmp_path, nothing_built, override, message
):
    err = user_error(capsys, ["train", GRPO, *BASE, override, "--run-dir", str(tmp_path)])
    assert err.startswith("jaxrl-llm train: ") and message in err, err
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["rewards.functions=[{fn: 'nosuchmod:f'}]"],
            "reward function 'nosuchmod:f': cannot import module 'nosuchmod'",
        ),
        (
            ["rewards.functions=[{fn: 'math:sqrt'}]"],
            "reward function 'sqrt' must take (prompts, completions, **fields): it takes (x, /).",
        ),
        # a built-in's option value: refused at once, not as a failure of every batch
        (
            ["rewards.functions=[{fn: overlong, kwargs: {max_length: 4, buffer_length: 0}}]"],
            "overlong: overlong_penalty: `buffer_length` must be > 0.0, got 0.0.",
        ),
        # a mistyped checkpoint, named as such (it was reported as a tokenizer directory)
        (
            ["model={checkpoint: /no/such/model}", "tokenizer.path=null"],
            "model.checkpoint: /no/such/model is not a directory (tokenizer.path: null reads",
        ),
    ],
)
def test_rewards_and_the_checkpoint_path_are_checked_before_a_model_is_built(
    capsys, tmp_path, monkeypatch, overrides, message
):
    """After the data (which gives the fields a reward receives), before the model: an import
    error once came after a whole warm start, a wrong signature at the first scoring, and a
    mistyped checkpoint was named as a tokenizer directory."""

    def build_policy(*args, **kwargs):
        raise AssertionError("the error came after the model was built")

    monkeypatch.setattr(setup, "build_policy", build_policy)
    argv = ["train", GRPO, *BASE, *overrides, "--run-dir", str(tmp_path)]
    err = user_error(capsys, argv)
    assert err.startswith("jaxrl-llm train: ") and message in err, err


def test_a_reward_module_in_the_current_directory_is_imported(tmp_path, monkeypatch):
    """`fn: "beside:score"` with `beside.py` in the working directory, as `python -m` would
    import it (the console script once did not): resolved and checked, then the model."""
    (tmp_path / "beside.py").write_text(
        "def score(prompts, completions, **fields):\n    return [0.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])

    class ModelReachedError(Exception):
        pass

    def build_policy(*args, **kwargs):
        raise ModelReachedError

    monkeypatch.setattr(setup, "build_policy", build_policy)
    with pytest.raises(ModelReachedError):
        main(["train", GRPO, *BASE, "rewards.functions=[{fn: 'beside:score'}]", "--run-dir", "r"])


def test_a_model_that_cannot_be_exported_is_refused_before_training(
    capsys, tmp_path, nothing_built
):
    """Not after the last step: `transformers`' Qwen3 has no attention scalar."""
    bad = ["model.init.query_pre_attn_scalar=8.0", "--run-dir", str(tmp_path)]
    err = user_error(capsys, ["train", GRPO, *BASE, "export.enabled=true", *bad])
    assert err.startswith(
        "jaxrl-llm train: model.init: the trained model could not be exported as a Hugging Face "
        "checkpoint: qwen3 has no query_pre_attn_scalar"
    ), err
    assert err.rstrip().endswith("or set export.enabled: false."), err
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_run_dir_that_cannot_be_created_and_bad_eval_prompts_are_one_line(
    capsys, tmp_path, nothing_built
):
    """Before the model is built (a traceback after it, once)."""
    afile = tmp_path / "afile"
    afile.write_text("")
    err = user_error(capsys, ["train", GRPO, *BASE, "--run-dir", str(afile / "run")])
    assert err.startswith(f"jaxrl-llm train: run_dir: {afile / 'run'} cannot be created ("), err
    err = user_error(capsys, ["eval", GRPO, *BASE, "--prompts", "0", "--run-dir", str(tmp_path)])
    assert err == "jaxrl-llm eval: --prompts (num_prompts): must be >= 1, got 0.", err


def test_the_process_exits_with_status_2_and_one_line(tmp_path, compile_cache):
    result = run_cli(
        ["train", GRPO, *BASE, "train.stpes=3", "--run-dir", str(tmp_path)],
        cache_dir=compile_cache,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(
        "jaxrl-llm train: train: unknown key 'stpes' (did you mean 'steps'?); allowed keys: "
    )
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_non_finite_failure_scores_and_weights_are_rejected_in_python_too():
    with pytest.raises(ConfigError, match=r"rewards\.failure_score: must be a finite number"):
        RewardConfig(failure_score=math.nan)
    with pytest.raises(ConfigError, match=r"rewards\.timeout_s: must be > 0 or null, got inf"):
        RewardConfig(timeout_s=math.inf)
    infinite = RewardFunctionConfig(fn="exact_answer", weight=math.inf)
    with pytest.raises(ConfigError, match=r"every `weight` must be a finite number, got \[inf\]"):
        RewardConfig(functions=(infinite,))
    one = RewardFunction("one", lambda prompts, completions: [1.0] * len(completions), 1.0)
    with pytest.raises(ValueError, match="`failure_score` must be a finite number"):
        score_rewards([one], ["p"], ["c"], on_failure="score", failure_score=math.nan)


@pytest.fixture
def no_model_built(monkeypatch):
    """Fail the test if the run gets as far as loading or initialising its model."""

    def build_policy(*args, **kwargs):
        raise AssertionError("the error came after the model was built")

    monkeypatch.setattr(setup, "build_policy", build_policy)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"question": "2+2=", "answer": \n', "line 2: invalid JSON: Expecting value (column 32)"),
        (b'{"question": "caf\xe9", "answer": "4"}\n', "line 2: not valid UTF-8 (byte 0xe9"),
        (b'{"question": "2+2="}\n', "line 2: missing field 'answer' (the record has: question)"),
    ],
)
def test_a_bad_data_line_is_one_line_error_naming_file_and_line(
    capsys, tmp_path, no_model_built, line, message
):
    """Malformed JSONL under `data.on_bad_record: fail` (the default); `skip` and every other
    kind of bad record: tests/data/test_files.py."""
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"question": "1+1=", "answer": "2"}\n' + line)
    data = [
        f"data.source=jsonl:{path}",
        f"data.eval_source=jsonl:{path}",
        "data.template.prompt='{question}'",
    ]
    err = user_error(capsys, ["train", GRPO, *BASE, *data, "--run-dir", str(tmp_path / "run")])
    assert err.startswith(f"jaxrl-llm train: {path}, {message}"), err
    assert "(on_bad_record='fail'; set it to 'skip' to leave bad records out)" in err


def test_an_empty_run_dir_is_refused_not_the_current_directory(capsys, tmp_path, monkeypatch):
    """`--run-dir "$RUN"` with RUN unset trained into the working directory."""
    monkeypatch.chdir(tmp_path)
    err = user_error(capsys, ["train", GRPO, *BASE, "--run-dir", ""])
    assert "run_dir: must name a directory, got an empty path." in err
    assert list(tmp_path.iterdir()) == []
