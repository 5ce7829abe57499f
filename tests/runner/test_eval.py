"""Evaluation: the pass@k estimator against its definition, and `jaxrl-llm eval` on a run."""

from __future__ import annotations

import itertools
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.checkpoint import IncompleteCheckpointWarning
from jaxrl_llm.cli import main
from jaxrl_llm.models import from_pretrained
from jaxrl_llm.runner import load_run_config, pass_at_k, prepare_run
from jaxrl_llm.runner.eval_run import format_eval_table
from jaxrl_llm.runner.evaluate import evaluate_sft
from jaxrl_llm.runner.task import answer_fits, sft_batch
from jaxrl_llm.sampler import generate
from jaxrl_llm.tokenizer import ByteTokenizer
from jaxrl_llm.train import completion_logprobs
from tests.runner.helpers import CONFIGS, TINY, even_checksum, records

GRPO = str(CONFIGS / "grpo.yaml")


def _pass_at_k_by_enumeration(n, c, k):
    """The fraction of the k-subsets of n samples (c of them correct) holding a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return np.float64(sum(any(samples[i] for i in s) for s in subsets)) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_its_definition(n):
    for k in range(1, n + 1):
        correct = np.arange(n + 1)
        expected = [_pass_at_k_by_enumeration(n, c, k) for c in correct]
        np.testing.assert_allclose(pass_at_k(n, correct, k), expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(pass_at_k(n, np.arange(n + 1), 1), np.arange(n + 1) / n)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="`k` must be in"):
        pass_at_k(4, np.array([1]), 5)
    with pytest.raises(ValueError, match="`num_correct` must be"):
        pass_at_k(4, np.array([5]), 1)


def test_eval_command_on_a_trained_run(tmp_path, capsys):
    """Five eval prompts in batches of two (the last one padded), correct = an even byte sum:
    the greedy accuracy equals an independent greedy decode scored with the same reward;
    pass@1 is the sampled accuracy."""
    overrides = [
        *TINY,
        "rewards.functions=[{fn: 'tests.runner.helpers:even_checksum'}]",
        "data.arithmetic.eval_size=5",
        "train.eval_prompts=5",
    ]
    assert main(["train", GRPO, *overrides, "--run-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["eval", GRPO, *overrides, "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["checkpoint", "2"]
    assert "eval/accuracy_greedy" in out and "eval/pass@2" in out
    result = json.loads((tmp_path / "eval" / "step_2.json").read_text())
    assert result["checkpoint"] == "2" and result["eval/num_prompts"] == 5.0
    assert result["eval/pass@1"] == pytest.approx(result["eval/accuracy"], abs=1e-12)
    assert result["eval/pass@2"] >= result["eval/pass@1"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["greedy_accuracy_after_rl"] == result["eval/accuracy_greedy"]
    # the same key as the run's own evaluation at step 2: every logged eval metric reproduced
    logged = [r for r in records(tmp_path) if r["step"] == 2 and "eval/accuracy" in r][-1]
    shared = [k for k in logged if k.startswith("eval/") and k in result]
    assert "eval/accuracy" in shared and "eval/pass@2" in shared
    assert {k: result[k] for k in shared} == {k: logged[k] for k in shared}
    # the temperature-1 samples are plain samples of the policy: the run's top-k is not applied
    assert main(["eval", GRPO, *overrides, "sampling.top_k=1", "--run-dir", str(tmp_path)]) == 0
    filtered = json.loads((tmp_path / "eval" / "step_2.json").read_text())
    assert {k: v for k, v in filtered.items() if k != "time/eval_s"} == {
        k: v for k, v in result.items() if k != "time/eval_s"
    }
    # another optimizer than the run's: the restored state cannot match; said so, in one line
    adam = ["optim.name=adamw", "optim.momentum=null"]
    assert main(["eval", GRPO, *overrides, *adam, "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "The optimizer state differs: evaluate with the optim.* settings" in err, err
    # another model (adapters the run did not train): not an optimizer setting, not said to be
    assert main(["eval", GRPO, *overrides, "model.lora={rank: 2}", "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "does not match the target state" in err and "optimizer state differs" not in err, err

    # the greedy accuracy, recomputed with the public sampler on the exported policy
    from jaxrl_llm.runner import load_run_config, load_task

    config = load_run_config(GRPO, overrides, run_dir=tmp_path)
    tokenizer = ByteTokenizer()
    task = load_task(config, tokenizer)
    policy = from_pretrained(tmp_path / "export")
    rows = [tokenizer.encode(e["prompt"]) for e in task.eval]
    rollout = generate(
        policy,
        rows,
        max_new_tokens=4,
        key=jax.random.key(0),
        temperature=0.0,
        stop_tokens=[tokenizer.eos_id],
        pad_id=tokenizer.pad_id,
    )
    texts = []
    for tokens, length, truncated in zip(
        np.asarray(rollout.completion_tokens),
        np.asarray(rollout.lengths),
        np.asarray(rollout.truncated),
        strict=True,
    ):
        ids = tokens[:length].tolist()
        texts.append(tokenizer.decode(ids if truncated else ids[:-1], skip_special=False))
    prompts = [e["prompt"] for e in task.eval]
    expected = np.mean(np.asarray(even_checksum(prompts, texts)) >= 1.0)
    assert 0.0 < expected < 1.0  # a check that tells prompts apart
    assert result["eval/accuracy_greedy"] == pytest.approx(expected)

    # a failed reward call is no answer: with failure score 1 or 0 alike it is not correct, and
    # the failures are counted (the first row of each of 3 batches × greedy and sampled calls)
    flaky = ["rewards.functions=[{fn: 'tests.runner.helpers:first_row_fails'}]"]
    by_score = []
    for score in ("1.0", "0.0"):
        policy = [*flaky, "rewards.on_failure=score", f"rewards.failure_score={score}"]
        assert main(["eval", GRPO, *overrides, *policy, "--run-dir", str(tmp_path)]) == 0
        by_score.append(json.loads((tmp_path / "eval" / "step_2.json").read_text()))
    assert by_score[0]["eval/reward_failures"] == 6.0
    for key in ("eval/accuracy_greedy", "eval/accuracy", "eval/pass@2"):
        assert by_score[0][key] == by_score[1][key], key

    assert main(["eval", GRPO, *overrides, "--checkpoint", "none", "--run-dir", str(tmp_path)]) == 0
    initial = json.loads((tmp_path / "eval" / "step_initial.json").read_text())
    assert initial["eval/accuracy_greedy"] == summary["greedy_accuracy_before_rl"]
    capsys.readouterr()
    assert main(["eval", GRPO, *overrides, "--checkpoint", "7", "--run-dir", str(tmp_path)]) == 2
    assert "step 7 has no complete checkpoint" in capsys.readouterr().err
    assert main(["eval", GRPO, *overrides, "--prompts", "0", "--run-dir", str(tmp_path)]) == 2
    assert "--prompts (num_prompts): must be >= 1, got 0." in capsys.readouterr().err
    off = [*overrides, "train.eval_prompts=0"]
    assert main(["eval", GRPO, *off, "--run-dir", str(tmp_path)]) == 2
    assert "train.eval_prompts: 0 (evaluation off)" in capsys.readouterr().err

    # a newer step that cannot be read: `latest` evaluates step 2, and says it skipped step 4
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(checkpoints / "2", checkpoints / "4")
    for damaged in (checkpoints / "4" / "state").iterdir():
        if damaged.name.startswith(("d", "ocdbt")):
            shutil.rmtree(damaged) if damaged.is_dir() else damaged.unlink()
    with pytest.warns(IncompleteCheckpointWarning, match=r"skipping step\(s\) \[4\].*step 2"):
        assert main(["eval", GRPO, *overrides, "--run-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == ["checkpoint", "2"]
    shutil.rmtree(checkpoints / "4")

    # the wrong config on --resume (an SFT config on this RL run): refused, not run as SFT
    sft = [*TINY, "train.steps=3"]  # the run's optimizer: the state restores, the kind differs
    assert (
        main(["train", str(CONFIGS / "sft.yaml"), *sft, "--run-dir", str(tmp_path), "--resume"])
        == 2
    )
    err = capsys.readouterr().err
    assert "--resume: the checkpoint in" in err and "`algorithm:`" in err and "`sft:`" in err, err


def test_the_eval_table_shows_small_values_and_counts():
    table = format_eval_table("2", {"eval/pref/margin": 3.62e-06, "eval/accuracy": 0.75, "n": 4})
    assert table.splitlines() == [
        "checkpoint         2",
        "eval/pref/margin   3.620e-06",
        "eval/accuracy      0.7500",
        "n                  4",
    ]
    assert format_eval_table("x", {"a": 0.0, "b": -0.00012}).endswith(" -0.0001")


def test_eval_of_no_checkpoint_is_step_0_after_the_warm_start(tmp_path):
    """`--checkpoint none` evaluates the policy the run's first step started from: with a warm
    start, the fine-tuned one (it evaluated the random model before)."""
    overrides = [
        *[o for o in TINY if not o.startswith("warm_start")],
        "warm_start={steps: 3, batch_size: 4, learning_rate: 0.05}",
        "train.steps=1",
        "train.eval_prompts=4",
    ]
    assert main(["train", GRPO, *overrides, "--run-dir", str(tmp_path)]) == 0
    assert main(["eval", GRPO, *overrides, "--checkpoint", "none", "--run-dir", str(tmp_path)]) == 0
    initial = json.loads((tmp_path / "eval" / "step_initial.json").read_text())
    logged = next(r for r in records(tmp_path) if r["step"] == 0 and "eval/accuracy" in r)
    shared = [k for k in logged if k.startswith("eval/") and k in initial]
    assert "eval/response_length_mean" in shared or len(shared) > 3
    assert {k: initial[k] for k in shared} == {k: logged[k] for k in shared}


def test_sft_eval_nll_is_the_token_mean_over_every_fitting_eval_pair(tmp_path):
    """`evaluate_sft` in batches of `prompts_per_step` (the last padded) equals one forward over
    all the eval pairs whose answer fits, token-weighted; pairs that do not fit are left out."""
    overrides = [
        *TINY,
        "train.prompts_per_step=3",
        "train.eval_prompts=4",
        "sampling.max_new_tokens=3",
    ]
    config = load_run_config(str(CONFIGS / "sft.yaml"), overrides, run_dir=tmp_path)
    prepared = prepare_run(config)
    prepared.checkpointer.close()
    ctx, state = prepared.context, prepared.state
    policy, frozen = state.params["policy"], state.frozen["policy"]
    out = evaluate_sft(ctx, policy, frozen)
    pairs = [e for e in ctx.task.eval if answer_fits(ctx.task, e, config, ctx.tokenizer)]
    assert 0 < len(pairs) <= 4 and out["eval/sft/tokens"] > 0
    batch = sft_batch(ctx.task, pairs, config, ctx.tokenizer)
    model = nnx.merge(ctx.graphs.policy, policy, frozen)
    logp, _, _ = completion_logprobs(model, jax.tree.map(jnp.asarray, batch))
    mask = np.asarray(batch.completion_mask) > 0
    expected = -np.asarray(logp, np.float64)[mask].mean()
    assert out["eval/sft/tokens"] == mask.sum()
    np.testing.assert_allclose(out["eval/sft/nll"], expected, rtol=1e-5)
    long = [dict(ctx.task.eval[0], answer="9" * 5)]  # answer + EOS longer than T = 3
    assert not answer_fits(ctx.task, long[0], config, ctx.tokenizer)
    assert evaluate_sft(ctx._replace(task=ctx.task._replace(eval=long)), policy, frozen) == {}
    # `jaxrl-llm eval` reports it too, as the run's own evaluation does (the initial model)
    args = ["eval", str(CONFIGS / "sft.yaml"), *overrides, "--checkpoint", "none"]
    assert main([*args, "--run-dir", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "eval" / "step_initial.json").read_text())
    assert result["eval/sft/tokens"] == out["eval/sft/tokens"]
    np.testing.assert_allclose(result["eval/sft/nll"], out["eval/sft/nll"], rtol=1e-6)
