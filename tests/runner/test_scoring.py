"""Reward shaping and combination, DAPO's group selection and refills, warm start caching."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.cli import main
from jaxrl_llm.config import ConfigError
from jaxrl_llm.data import IteratorState
from jaxrl_llm.rewards import (
    RewardFunction,
    RewardFunctionConfig,
    RewardFunctionError,
    resolve_reward_function,
)
from jaxrl_llm.runner import load_run_config, prepare_run, scoring
from jaxrl_llm.runner.in_graph import in_graph_scores
from jaxrl_llm.runner.rollout import _select, collect
from jaxrl_llm.runner.scoring import combine_rewards, component_rewards, group_has_spread
from jaxrl_llm.tokenizer import ByteTokenizer
from tests.runner.helpers import CONFIGS, SFT_OPTIM, TINY, records

GRPO = str(CONFIGS / "grpo.yaml")
DAPO = str(CONFIGS / "dapo.yaml")


def _config(*overrides, path=GRPO):
    return load_run_config(path, [*TINY, *overrides], run_dir="unused")


def _overlong_reference(lengths, max_length, buffer, factor):
    start = max_length - buffer
    return np.where(
        lengths <= start,
        0.0,
        np.where(lengths > max_length, -factor, -factor * (lengths - start) / buffer),
    )


def test_sum_of_weighted_rewards_plus_overlong_punishment():
    cfg = _config(
        "rewards.functions=[{fn: exact_answer, weight: 2.0}, {fn: tag_format, weight: 0.5}]",
        "train.overlong={buffer_length: 2, factor: 0.5}",
    )
    rng = np.random.default_rng(0)
    rewards = rng.integers(0, 2, (8, 2)).astype(np.float64)
    lengths = np.array([1, 2, 3, 4, 4, 3, 2, 1])
    scores = combine_rewards(cfg, rewards, np.ones(8, bool), lengths, 2)
    expected = 2.0 * rewards[:, 0] + 0.5 * rewards[:, 1] + _overlong_reference(lengths, 4, 2, 0.5)
    np.testing.assert_allclose(scores.total, expected, rtol=1e-6)
    np.testing.assert_array_equal(scores.signal, scores.total)
    np.testing.assert_array_equal(scores.correct, rewards[:, 0] >= 1)


@pytest.mark.parametrize("coef", [0.5, -1.0])
def test_truncation_penalty_shapes_the_total_of_truncated_rows_alike_on_host_and_in_graph(coef):
    """ProRL's stop-properly penalty after the weighted sum and the overlong ramp: a truncated
    row's total is scaled by `coef` in [0, 1] or replaced by a negative `coef`; the compiled
    iteration's in-graph scores give the same totals."""
    cfg = _config(
        "rewards.functions=[{fn: exact_answer, weight: 2.0}]",
        "train.overlong={buffer_length: 2, factor: 0.5}",
        f"train.truncation_penalty={coef}",
    )
    correct = np.array([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    lengths = np.array([4, 4, 4, 2, 1, 3])
    truncated = np.array([True, False, True, False, False, False])
    scores = combine_rewards(cfg, correct[:, None], np.ones(6, bool), lengths, 2, truncated)
    total = 2.0 * correct + _overlong_reference(lengths, 4, 2, 0.5)
    expected = np.where(truncated, coef * total if coef >= 0 else coef, total)
    np.testing.assert_allclose(scores.total, expected, rtol=1e-6)
    in_graph, _ = in_graph_scores(
        jnp.asarray(correct, jnp.float32),
        jnp.asarray(lengths),
        weight=2.0,
        group_size=2,
        overlong=cfg.train.overlong,
        overlong_max_length=cfg.overlong_max_length,
        truncated=jnp.asarray(truncated),
        truncation_penalty=coef,
    )
    np.testing.assert_allclose(in_graph, expected, rtol=1e-6)


def test_a_row_whose_reward_failed_is_not_correct_whatever_its_failure_score():
    """`reward/accuracy` counted a failure score >= 1 as a right answer."""
    cfg = _config("rewards.functions=[{fn: exact_answer}]")
    rewards = np.array([[1.0], [1.0], [0.0], [1.0]], np.float32)
    failed = np.array([[False], [True], [False], [True]])
    scores = combine_rewards(cfg, rewards, np.ones(4, bool), np.full(4, 2), 2, failed=failed)
    assert scores.correct.tolist() == [True, False, False, False]
    np.testing.assert_array_equal(scores.total, rewards[:, 0])  # the score itself still counts


def test_a_stop_token_ends_the_completion_for_the_host_and_the_in_graph_reward():
    """`sampling.stop_tokens` stop the sampler, and both rewards read the text before them (a
    right answer that stopped on a newline scores 1)."""
    from jaxrl_llm.data import TemplateConfig, make_prompt_batch
    from jaxrl_llm.runner.rollout import in_graph_stop_ids

    tok = ByteTokenizer()
    tokens = np.array([[49, 57, 10, 55], [49, 57, 258, 0], [49, 10, 57, 258]])
    mask = np.ones_like(tokens, bool)
    example = {"prompt": "9+10=", "answer": "19"}
    batch = make_prompt_batch([example] * 3, template=TemplateConfig(), tokenizer=tok)
    exact = ["sampling.stop_tokens=[10]", "rewards.functions=[{fn: exact_answer}]"]
    host = _config(*exact)
    functions = host.rewards.resolve()
    rewards, _, _, _ = component_rewards(host, functions, batch, tokens, mask, None, tok, 1)
    np.testing.assert_array_equal(rewards[:, 0], [1.0, 1.0, 0.0])
    native = _config(*exact, "rewards.jax_native=true")
    assert in_graph_stop_ids(native, tok) == scoring.run_stop_ids(native, tok) == (10, 258)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["train.truncation_penalty=1.5"], "must be <= 1"),
        (["train.truncation_penalty=-1", "rewards.combine=decoupled"], "use combine: sum"),
        # a ramp that starts after the longest completion would never apply
        (
            ["sampling.max_new_tokens=4", "train.overlong={buffer_length: 2, max_length: 8}"],
            "starts after max_length − buffer_length = 6 tokens.*it would never apply",
        ),
    ],
)
def test_truncation_penalty_config_errors(extra, message):
    with pytest.raises(ConfigError, match=message):
        _config(*extra)


def test_decoupled_combination_normalises_each_reward_in_its_group():
    cfg = _config(
        "rewards.functions=[{fn: exact_answer, weight: 1.0}, {fn: tag_format, weight: 0.3}]",
        "rewards.combine=decoupled",
        "sampling.num_samples=4",
        "train.eval_pass_k=[1]",
    )
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=(8, 2))
    scores = combine_rewards(cfg, rewards, np.ones(8, bool), np.full(8, 2), 4)
    grouped = rewards.reshape(2, 4, 2)
    normed = (grouped - grouped.mean(1, keepdims=True)) / (
        grouped.std(1, ddof=1, keepdims=True) + 1e-6
    )
    expected = (normed * np.array([1.0, 0.3])).sum(-1).reshape(8)
    np.testing.assert_allclose(scores.signal, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scores.total, rewards @ np.array([1.0, 0.3]), rtol=1e-6)


def test_group_selection_takes_the_first_kept_groups():
    keep = group_has_spread(np.array([1.0, 1.0, 0.0, 1.0, 2.0, 2.0]), np.ones(6, bool), 2)
    assert keep.tolist() == [False, True, False]
    assert not group_has_spread(np.array([0.0, 1.0]), np.array([True, False]), 2)[0]
    parts = [{"keep": np.array([False, True])}, {"keep": np.array([False, True])}]
    rows, kept = _select(parts, 2, 3)
    assert rows.tolist() == [3, 4, 5, 9, 10, 11] and kept == 2
    rows, kept = _select(
        [{"keep": np.array([False, False])}, {"keep": np.array([True, False])}], 2, 1
    )
    assert rows.tolist() == [2, 0] and kept == 1  # one kept group, topped up with the first unkept


def _collect(tmp_path, *overrides):
    config = load_run_config(DAPO, [*TINY, *overrides], run_dir=tmp_path)
    prepared = prepare_run(config)
    prepared.checkpointer.close()
    start = IteratorState(seed=0, epoch=0, position=0)
    return collect(prepared.context, prepared.state, start, jax.random.key(0))


def test_dapo_refills_until_enough_groups_have_a_spread(tmp_path):
    constant = "rewards.functions=[{fn: exact_answer}]"  # a random model: all 0, no spread
    collected, position = _collect(tmp_path / "a", constant, "train.max_refills=2")
    assert collected.metrics["dapo/sampled_batches"] == 3.0  # 1 + 2 refills, none kept
    assert collected.metrics["dapo/kept_groups"] == 0.0
    assert position == IteratorState(seed=0, epoch=0, position=6)  # 3 batches of 2 prompts
    assert np.asarray(collected.sequences.tokens).shape[0] == 4  # still B·G rows

    collected, position = _collect(tmp_path / "b")  # the checksum reward: most groups spread
    batches = collected.metrics["dapo/sampled_batches"]
    assert collected.metrics["dapo/kept_groups"] == 2.0 and batches < 3
    assert position.position == 2 * batches  # stopped as soon as 2 groups were kept
    signal = np.asarray(collected.signal).reshape(2, 2)
    assert np.all(signal.max(1) > signal.min(1))  # the selected groups are the kept ones


def test_warm_start_is_cached_and_reused(tmp_path):
    overrides = [
        *TINY,
        "warm_start={steps: 10, learning_rate: 1.0e-2, batch_size: 2}",
        "train.steps=1",
    ]
    assert main(["train", GRPO, *overrides, "--run-dir", str(tmp_path)]) == 0
    first = json.loads((tmp_path / "summary.json").read_text())
    setup = first["setup"]
    assert setup["warm_start/cached"] == 0.0
    assert setup["warm_start/nll_last"] < setup["warm_start/nll_first"] - 0.5
    # a later run of the same config in this run directory loads the fine-tuned parameters
    for entry in ("checkpoints", "metrics.jsonl", "summary.json", "export"):
        path = tmp_path / entry
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert main(["train", GRPO, *overrides, "--run-dir", str(tmp_path)]) == 0
    second = json.loads((tmp_path / "summary.json").read_text())
    assert second["setup"]["warm_start/cached"] == 1.0
    assert second["setup"]["warm_start/nll_last"] == setup["warm_start/nll_last"]
    assert second["accuracy_before_rl"] == first["accuracy_before_rl"]
    before = [r for r in records(tmp_path) if r["step"] == 0]
    assert before and before[0]["eval/accuracy_greedy"] == first["greedy_accuracy_before_rl"]
    # another warm-start config trains again and replaces the cache
    for entry in ("checkpoints", "metrics.jsonl", "summary.json", "export"):
        path = tmp_path / entry
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    changed = [*overrides, "warm_start.steps=3"]
    assert main(["train", GRPO, *changed, "--run-dir", str(tmp_path)]) == 0
    third = json.loads((tmp_path / "summary.json").read_text())
    assert third["setup"]["warm_start/cached"] == 0.0
    assert len(list((tmp_path / "warm_start").iterdir())) == 1
    # resumed with a config that hashes otherwise (more data): the run keeps its own warm
    # start, its KL reference, instead of training another and deleting its cache
    cache = list((tmp_path / "warm_start").iterdir())
    more = [*changed, "data.arithmetic.train_size=40", "train.steps=2"]
    assert main(["train", GRPO, *more, "--resume", "--run-dir", str(tmp_path)]) == 0
    fourth = json.loads((tmp_path / "summary.json").read_text())
    assert fourth["setup"]["warm_start/cached"] == 1.0
    assert list((tmp_path / "warm_start").iterdir()) == cache


def test_a_packed_warm_start_trains_as_the_padded_one(tmp_path):
    """`warm_start.packing`: the same steps on pairs packed several to a row give the same
    losses (float rounding apart), as the SFT run's packing does."""
    common = [*TINY, "train.steps=1", "train.eval_prompts=0", "export.enabled=false"]
    ws = "warm_start={steps: 6, learning_rate: 1.0e-2, batch_size: 4"
    setups = []
    for name, extra in (("padded", "}"), ("packed", ", packing: true, packing_length: 32}")):
        assert main(["train", GRPO, *common, ws + extra, "--run-dir", str(tmp_path / name)]) == 0
        setups.append(json.loads((tmp_path / name / "summary.json").read_text())["setup"])
    for key in ("warm_start/nll_first", "warm_start/nll_last"):
        np.testing.assert_allclose(setups[1][key], setups[0][key], rtol=1e-5)
    assert setups[0]["warm_start/nll_last"] < setups[0]["warm_start/nll_first"]
    assert "warm_start/packing_fill" not in setups[0]
    # a step's 4 short pairs (prompt, answer, EOS) share one row of 32 slots, most of it filled
    assert setups[1]["warm_start/packed_rows"] == 1.0, setups[1]
    assert 0.5 < setups[1]["warm_start/packing_fill"] <= 1.0, setups[1]


def test_the_warm_start_follows_data_shuffle(tmp_path, monkeypatch):
    """`data.shuffle: false` (file order) holds for the warm start's batches too."""
    from jaxrl_llm.runner import warm_start

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("shuffle", True))
        return warm_start.next_batch.__wrapped__(*args, **kwargs)

    spy.__wrapped__ = warm_start.next_batch
    monkeypatch.setattr(warm_start, "next_batch", spy)
    common = [*TINY, "train.steps=1", "train.eval_prompts=0", "export.enabled=false"]
    ws = "warm_start={steps: 2, learning_rate: 1.0e-2, batch_size: 4}"
    assert main(["train", GRPO, *common, ws, "data.shuffle=false", "--run-dir", str(tmp_path)]) == 0
    assert seen == [False, False]


def test_sft_and_warm_start_share_the_optimizer_settings():
    """The tests' SFT run and warm start compile one SFT step (same optimizer and shapes)."""
    sft = load_run_config(CONFIGS / "sft.yaml", [*TINY, *SFT_OPTIM], run_dir="x")
    from jaxrl_llm.train import OptimConfig

    assert sft.optim == OptimConfig(name="adamw", learning_rate=1e-2, max_grad_norm=1.0)


def test_prompts_over_the_budget_and_answers_over_t_are_left_out(caplog):
    from jaxrl_llm.runner import load_task, prompt_batch
    from jaxrl_llm.tokenizer import ByteTokenizer

    config = load_run_config(
        CONFIGS / "sft.yaml",
        [
            *TINY,
            "data.arithmetic.max_digits=2",
            "data.arithmetic.train_size=64",
            "data.arithmetic.eval_size=8",
            "train.max_prompt_tokens=5",  # BOS + "a+b=": one-digit operands only
            "sampling.max_new_tokens=2",  # answer + EOS: one-digit sums only
        ],
        run_dir="unused",
    )
    tokenizer = ByteTokenizer()
    with caplog.at_level("WARNING", logger="jaxrl_llm"):
        task = load_task(config, tokenizer)
    assert task.prompt_length == 5
    assert all(len(e["prompt"]) == 4 for e in task.train + task.eval)
    assert task.too_long_prompts["train"] + len(task.train) == 64
    assert (
        task.too_long_prompts["train"] > 0
        and "longer than train.max_prompt_tokens=5" in caplog.text
    )
    fits = [len(task.train[i]["answer"]) == 1 for i in task.sft_train]
    assert all(fits) and task.too_long_answers == len(task.train) - len(task.sft_train) > 0
    batch = prompt_batch(task, task.train[:3], config, tokenizer)
    assert batch.prompt_tokens.shape == (3, 5) and batch.prompt_mask.all()


def _none_on_seven(prompts, completions, **_):
    return [None if c.startswith("7") else float(len(c)) for c in completions]


def _as_processes(monkeypatch, num_processes, score):
    """What each of `num_processes` processes returns from `score()` (or the error it
    raises): every process runs it up to the gather, then the gather hands each of them the
    stacked blocks."""
    blocks, gathered = [], {}

    class _StopAtTheGatherError(Exception):
        pass

    def gather(local):
        if not gathered:
            blocks.append(local)
            raise _StopAtTheGatherError
        return gathered

    monkeypatch.setattr(jax, "process_count", lambda: num_processes)
    monkeypatch.setattr(scoring, "gather_from_processes", gather)
    outcomes = []
    for stage in ("score", "join"):
        if stage == "join":
            gathered.update({k: np.stack([b[k] for b in blocks]) for k in blocks[0]})
        for p in range(num_processes):
            monkeypatch.setattr(jax, "process_index", lambda p=p: p)
            try:
                out = score()
            except _StopAtTheGatherError:
                continue
            except RewardFunctionError as err:
                out = err
            outcomes.append(out)
    return outcomes


@pytest.mark.parametrize("num_processes", [2, 4])  # 3 groups: a short block, an empty one
def test_processes_score_their_groups_and_agree_with_one_process(monkeypatch, num_processes):
    functions = [
        resolve_reward_function(RewardFunctionConfig(fn="exact_answer")),
        RewardFunction("none_on_seven", _none_on_seven, 1.0),
    ]
    config = _config("rewards.on_failure=drop_group")
    examples = ({"answer": "2"}, {"answer": "5"}, {"answer": "7"})
    batch = SimpleNamespace(examples=examples, prompts=("1+1=", "2+3=", "3+4="))
    texts = ["2", "2", "5", "55", "7", "77"]  # group 2 fails on the second function
    tokenizer = ByteTokenizer()
    tokens = np.zeros((6, 3), np.int32)
    mask = np.zeros((6, 3), bool)
    for row, text in enumerate(texts):
        ids = tokenizer.encode(text, add_bos=False)
        tokens[row, : len(ids)], mask[row, : len(ids)] = ids, True

    def score():
        return component_rewards(config, functions, batch, tokens, mask, None, tokenizer, 2)

    one = score()
    outcomes = _as_processes(monkeypatch, num_processes, score)
    assert len(outcomes) == num_processes
    for rewards, valid, failed, metrics in outcomes:
        np.testing.assert_array_equal(rewards, one[0])
        np.testing.assert_array_equal(valid, one[1])
        np.testing.assert_array_equal(failed, one[2])
        assert valid.tolist() == [True] * 4 + [False] * 2
        assert metrics.keys() == one[3].keys()
        for key, value in one[3].items():
            assert metrics[key] == pytest.approx(value, rel=1e-6), key  # float32 np.mean
    assert one[3]["reward/exact_answer/mean"] == pytest.approx(4 / 6)
    assert one[2][:, 1].tolist() == [False] * 4 + [True, True]  # "7…" gives None: failed

    config = _config("rewards.on_failure=fail")  # a failure on the last block only
    outcomes = _as_processes(monkeypatch, num_processes, score)
    last = 3 - 1 if num_processes == 4 else 1  # the process that holds group 2
    for p, err in enumerate(outcomes):
        assert isinstance(err, RewardFunctionError)
        if p == last:
            assert "'none_on_seven' returned None on row 0 of 2" in str(err)
        else:
            assert f"scoring the rewards failed on process {last} of the job" in str(err)


def test_the_in_graph_reward_with_a_subword_tokenizer_is_warned_about(caplog):
    """It compares token ids: a right answer in other tokens scores 0 there, 1 on the host."""
    native = ["rewards.jax_native=true", "rewards.functions=[{fn: exact_answer}]"]
    _config(*native)
    assert "rewards.jax_native" not in caplog.text  # the byte tokenizer has one spelling
    _config(*native, "tokenizer.path=/some/tokenizer")
    assert "with a subword tokenizer a right answer written in other tokens" in caplog.text


def test_training_accuracy_counts_the_rows_of_a_dropped_group_as_evaluation_does():
    """`drop_group` leaves a group with a failed row out of the update (`valid` False), but the
    accuracy divides by every row, a failed one counting as not correct (docs/running.md): two
    groups, group 0 dropped for a failure, group 1 one right and one wrong → 1/4, not 1/2. The
    reward's mean and std (ddof 0) stay over the valid rows."""
    from jaxrl_llm.runner.scoring import Scores, reward_metrics

    scores = Scores(
        total=np.array([0.0, 0.0, 1.0, 0.0]),
        signal=np.array([0.0, 0.0, 1.0, 0.0]),
        valid=np.array([False, False, True, True]),
        correct=np.array([False, False, True, False]),
        metrics={},
    )
    metrics = reward_metrics(scores, np.array([3, 3, 3, 3]), np.zeros(4, bool))
    assert metrics["reward/accuracy"] == 0.25
    assert (metrics["reward/mean"], metrics["reward/std"]) == (0.5, 0.5)
    assert metrics["reward/valid_frac"] == 0.5
