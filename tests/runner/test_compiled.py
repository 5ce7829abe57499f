"""The fully compiled RL iteration (`train.compiled_iterations`) against the step-by-step loop.

The run: GRPO on a 1-layer width-16 model with the in-graph exact-answer reward and DAPO's
overlong punishment; half of the byte ids are extra stop tokens, so completion lengths vary
and the punishment gives the advantages a real spread (a random model never answers right).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.experimental.compilation_cache.compilation_cache import reset_cache

from jaxrl_llm.cli import main
from jaxrl_llm.config import ConfigError
from jaxrl_llm.runner import SkipTracker, TrainingDivergedError, load_run_config, loop, prepare_run
from jaxrl_llm.runner.compilation_cache import enable_compilation_cache
from jaxrl_llm.runner.compiled import compiled_steps
from jaxrl_llm.runner.config import TrainConfig
from jaxrl_llm.runner.in_graph import in_graph_scores, rollout_metrics, task_arrays
from jaxrl_llm.runner.keys import SAMPLE_STREAM, stream_key
from jaxrl_llm.runner.task import prompt_batch
from tests.runner.helpers import CONFIGS, TINY, records, train_records, tree_equal

GRPO = str(CONFIGS / "grpo.yaml")
STOPS = "sampling.stop_tokens=[" + ",".join(str(i) for i in range(0, 256, 2)) + "]"
IN_GRAPH = [
    *(o for o in TINY if not o.startswith("rewards.")),
    "rewards.jax_native=true",
    "rewards.functions=[{fn: exact_answer}]",
    "train.overlong={buffer_length: 3}",
    STOPS,
    "train.eval_prompts=0",
    "train.compilation_cache=null",
    "export.enabled=false",
]
STEPS = 2


def _host(tree):
    leaves = jax.tree.leaves(tree)
    return [
        np.asarray(
            jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
        )
        for x in leaves
    ]


def _comparable(metrics):
    return {k: v for k, v in metrics.items() if not k.startswith(("time/", "perf/"))}


def _prepared(run_dir, *extra, config=GRPO):
    return prepare_run(load_run_config(config, [*IN_GRAPH, *extra], run_dir=run_dir))


def _loop_steps(prepared):
    """`STEPS` steps of the step-by-step loop: final state, data state, per-step metrics."""
    prepared.checkpointer.close()
    ctx, state, data = prepared.context, prepared.state, prepared.data
    history = []
    for step in range(1, STEPS + 1):
        state, data, metrics = loop._rl_step(ctx, state, data, step)
        history.append(_comparable(metrics))
    return state, data, history


@pytest.fixture(scope="module")
def loop_run(tmp_path_factory):
    """The loop's final state (host arrays), data state and per-step metrics."""
    state, data, history = _loop_steps(_prepared(tmp_path_factory.mktemp("loop")))
    return _host(state), data, history


def _compiled_run(run_dir, K, *extra, config=GRPO):
    prepared = _prepared(run_dir, f"train.compiled_iterations={K}", *extra, config=config)
    prepared.checkpointer.close()
    key = stream_key(0, SAMPLE_STREAM)
    out = list(compiled_steps(prepared.context, prepared.state, prepared.data, 0, STEPS, key))
    steps = [r[0] for r in out]
    ends = [r[4] for r in out]
    _, state, data, _, _ = out[-1]
    return steps, ends, _host(state), data, [_comparable(r[3]) for r in out]


def test_one_iteration_per_call_equals_the_loop_to_the_last_bit(loop_run, tmp_path):
    state_loop, data_loop, metrics_loop = loop_run
    steps, ends, state, data, metrics = _compiled_run(tmp_path, 1)
    assert steps == ends == [1, 2]
    assert data == data_loop
    assert metrics == metrics_loop  # every reward, advantage and update metric, exactly
    # step, key and KL state exactly; parameters and optimizer moments to the last bit: these
    # tests compile with most optimisations off (conftest), where the iteration's program and
    # the loop's update step may fuse one element's arithmetic differently (observed: 1 ulp in
    # one of 512 entries of one second moment after a gradient-preserving change to the clip)
    for a, b in zip(state, state_loop, strict=True):
        if np.issubdtype(a.dtype, np.floating):
            np.testing.assert_array_max_ulp(a, b, maxulp=2)
        else:
            np.testing.assert_array_equal(a, b)
    assert metrics[0]["adv/std"] > 0  # the batch has a learning signal


def test_chunks_of_two_match_the_loop_to_the_last_bit(loop_run, tmp_path):
    state_loop, data_loop, metrics_loop = loop_run
    steps, ends, state, data, metrics = _compiled_run(tmp_path, 2)
    assert steps == [1, 2] and ends == [2, 2]
    assert data == data_loop
    assert metrics == metrics_loop  # every metric of both steps, exactly
    # With XLA's default optimisations the parameters are bit for bit those of the loop (checked
    # by hand); these tests compile with most optimisations off (conftest), where the scan's loop
    # body may round the update's last bit differently: observed <= 1.5e-8 on weights ~0.1.
    for a, b in zip(state, state_loop, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_reference_sync_inside_the_compiled_iteration_matches_the_loop(tmp_path):
    """`train.reference_sync` runs inside the scan (a `lax.cond` on the step) as the loop runs
    it after each update: the same reference, restarted optimizer, KL and parameters."""
    sync = "train.reference_sync={every: 1, alpha: 0.5, reset_optimizer: true}"
    prepared = _prepared(tmp_path / "loop", sync)
    prepared.checkpointer.close()
    ctx, state, data = prepared.context, prepared.state, prepared.data
    history = []
    for step in range(1, STEPS + 1):
        state, data, metrics = loop._rl_step(ctx, state, data, step)
        state = loop._sync_reference(ctx, state, step, metrics)
        history.append(_comparable(metrics))
    _, _, compiled_state, _, compiled = _compiled_run(tmp_path / "compiled", 2, sync)
    assert [m["ref/synced"] for m in compiled] == [m["ref/synced"] for m in history] == [1.0] * 2
    assert compiled[1]["kl/mean"] > 0  # step 2 reads the synced reference, not the policy
    for ours, theirs in zip(compiled, history, strict=True):
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            # a KL between near-equal policies is a difference of log-probs: its error is the
            # log-probs' rounding (observed 1.8e-7 on an AVX2 host), not relative to its value
            atol = 1e-6 if key.startswith("kl/") else 1e-7
            np.testing.assert_allclose(ours[key], value, rtol=1e-5, atol=atol, err_msg=key)
    host = _host(state)
    assert len(compiled_state) == len(host)  # the reference is part of both states
    for a, b in zip(compiled_state, host, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# 4 prompts × 4 samples in 2 minibatches × 2 accumulated micro-batches
GROUPS_OF_FOUR = (
    "sampling.num_samples=4",
    "train.prompts_per_step=4",
    "algorithm.minibatches=2",
    "optim.accumulation_steps=2",
)


def _compiled_matches_loop(tmp_path, config, *extra):
    """One iteration per call against the loop: every metric and parameter to float32 rounding
    (reward/std: the in-graph and host stds round apart); the loop's per-step metrics."""
    state, _, history = _loop_steps(_prepared(tmp_path / "loop", *extra, config=config))
    _, _, compiled_state, _, compiled = _compiled_run(tmp_path / "c", 1, *extra, config=config)
    for ours, theirs in zip(compiled, history, strict=True):
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            np.testing.assert_allclose(ours[key], value, rtol=1e-6, atol=1e-7, err_msg=key)
    for a, b in zip(compiled_state, _host(state), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    return history


def test_online_dpo_with_groups_of_four_matches_the_loop(tmp_path):
    """Online DPO with G = 4 keeps each prompt's best and worst sample (`online_dpo_select`) in
    the loop and inside the compiled iteration alike, and splits the 4 pairs into 2 minibatches
    × 2 micro-batches of whole pairs: the same metrics and parameters."""
    history = _compiled_matches_loop(tmp_path, str(CONFIGS / "online_dpo.yaml"), *GROUPS_OF_FOUR)
    assert all("online_dpo/valid_pairs" in m for m in history)


def test_dapo_filter_minibatches_and_accumulation_match_the_loop(tmp_path):
    """DAPO (zero-variance groups dropped, token-mean loss, asymmetric clip) with 2 minibatches
    × 2 accumulated micro-batches: the compiled scan drops the same groups and takes the same
    optimizer steps as the loop. Fewer stop tokens than the other tests use: a group whose four
    rows all run to the end has equal rewards, and is dropped."""
    few_stops = "sampling.stop_tokens=[" + ",".join(str(i) for i in range(0, 256, 12)) + "]"
    extra = ("train.max_refills=0", few_stops, *GROUPS_OF_FOUR)
    history = _compiled_matches_loop(tmp_path, str(CONFIGS / "dapo.yaml"), *extra)
    assert any(0 < m["adv/kept_frac"] < 1 for m in history)  # the filter drops some groups


def _final_state(run_dir, overrides):
    prepared = prepare_run(load_run_config(GRPO, overrides, run_dir=run_dir), resume=True)
    prepared.checkpointer.close()
    return prepared.start_step, prepared.data, _host(prepared.state)


def test_resume_at_a_chunk_end_continues_bit_for_bit(tmp_path):
    overrides = [*IN_GRAPH, "train.compiled_iterations=2", "checkpoint.every=2", "train.steps=4"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", GRPO, *overrides, "--run-dir", str(straight)]) == 0
    assert main(["train", GRPO, *overrides, "train.steps=2", "--run-dir", str(split)]) == 0
    assert main(["train", GRPO, *overrides, "--resume", "--run-dir", str(split)]) == 0
    step_a, data_a, state_a = _final_state(straight, overrides)
    step_b, data_b, state_b = _final_state(split, overrides)
    assert step_a == step_b == 4 and data_a == data_b
    assert tree_equal(state_a, state_b)
    records = train_records(straight)
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # every step of a chunk is logged
    assert records == train_records(split)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["rewards.jax_native=false"], "needs rewards.jax_native: true"),
        (
            ["algorithm.advantage.drop_zero_variance=true", "train.max_refills=2"],
            "set train.max_refills: 0",
        ),
        (["train.eval_every=3", "train.eval_prompts=2"], "train.eval_every: must be a multiple of"),
        (["checkpoint.every=5"], "checkpoint.every: must be a multiple of"),
        (["train.compiled_iterations=0"], "train.compiled_iterations: must be >= 1"),
    ],
)
def test_configs_that_need_the_host_are_rejected(extra, message):
    overrides = [*IN_GRAPH, "train.compiled_iterations=2", *extra]
    if "rewards.jax_native=false" in extra:
        overrides.append("rewards.functions=[{fn: 'tests.runner.helpers:checksum_reward'}]")
    with pytest.raises(ConfigError, match=message):
        load_run_config(GRPO, overrides, run_dir="unused")


def test_a_divergence_inside_a_chunk_stops_at_its_end_with_every_step_counted(tmp_path):
    """A NaN reference skips every step. With `max_consecutive_skips` 1 the run diverges at
    step 1, but its chunk ran steps 1 and 2: both are logged and counted before the stop, and
    the checkpoint holds the chunk's end with those counts."""
    extra = ["train.compiled_iterations=2", "train.max_consecutive_skips=1"]
    prepared = _prepared(tmp_path, *extra)
    poisoned = jax.tree.map(lambda x: x * np.nan, prepared.context.reference)
    prepared = prepared._replace(context=prepared.context._replace(reference=poisoned))
    with pytest.raises(TrainingDivergedError, match="stopped at step 1: 1 consecutive") as err:
        loop.run_training(prepared)
    assert "latest checkpoint: step 2 in" in str(err.value)
    steps = [r for r in records(tmp_path) if "loss/total" in r]
    assert [(r["step"], r["optim/skipped"]) for r in steps] == [(1, 1.0), (2, 1.0)]
    resumed = _prepared_resume(tmp_path, *extra)
    assert resumed.start_step == 2 and resumed.skips == SkipTracker(2, 2)


def _prepared_resume(run_dir, *extra):
    config = load_run_config(GRPO, [*IN_GRAPH, *extra], run_dir=run_dir)
    prepared = prepare_run(config, resume=True)
    prepared.checkpointer.close()
    return prepared


def test_eval_every_is_free_when_evaluation_is_off():
    overrides = [*IN_GRAPH, "train.compiled_iterations=2", "train.eval_every=3"]
    config = load_run_config(GRPO, [*overrides, "train.eval_prompts=0"], run_dir="unused")
    assert config.train.eval_every == 3


def test_sft_runs_have_no_iteration_to_compile():
    overrides = [*TINY, "train.compiled_iterations=2"]
    with pytest.raises(ConfigError, match="a sft run has none"):
        load_run_config(str(CONFIGS / "sft.yaml"), overrides, run_dir="unused")


def test_task_arrays_hold_the_rows_of_prompt_batch(tmp_path):
    prepared = _prepared(tmp_path)
    prepared.checkpointer.close()
    ctx = prepared.context
    arrays = task_arrays(ctx)
    assert arrays.prompt_tokens.shape == (len(ctx.task.train), ctx.task.prompt_length)
    rows = [7, 0, 31]
    batch = prompt_batch(ctx.task, [ctx.task.train[i] for i in rows], ctx.config, ctx.tokenizer)
    for name in arrays._fields:
        np.testing.assert_array_equal(np.asarray(getattr(arrays, name))[rows], getattr(batch, name))


def test_in_graph_scores_follow_the_formulas():
    """w·r + overlong ramp, and GDPO's per-component group normalisation (float64 NumPy)."""
    correct = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0], np.float32)
    lengths = np.array([2, 8, 6, 5, 3, 7])
    total, signal = in_graph_scores(
        correct,
        lengths,
        weight=2.0,
        group_size=3,
        combine="decoupled",
        overlong=type("Overlong", (), {"buffer_length": 4, "factor": 0.5})(),
        overlong_max_length=8,
    )
    start = 8 - 4
    penalty = -0.5 * np.clip((lengths - start) / 4.0, 0.0, 1.0)
    np.testing.assert_allclose(total, 2.0 * correct + penalty, rtol=1e-6)

    def groupnorm(x):
        g = x.reshape(-1, 3).astype(np.float64)
        return ((g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-6)).ravel()

    expected = 2.0 * groupnorm(correct) + groupnorm(penalty)
    np.testing.assert_allclose(signal, expected, rtol=1e-5, atol=1e-6)


def test_rollout_metrics_follow_the_formulas():
    total = np.array([1.0, -0.5, 0.0, 2.0], np.float32)
    correct = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
    lengths = np.array([3, 1, 4, 2], np.int32)
    truncated = np.array([False, False, True, False])
    m = rollout_metrics(total, correct, lengths, truncated)
    expected = {
        "reward/mean": total.astype(np.float64).mean(),
        "reward/std": total.astype(np.float64).std(),
        "reward/accuracy": 0.5,
        "reward/nonfinite": 0.0,
        "reward/valid_frac": 1.0,
        "response/length_mean": 2.5,
        "response/length_max": 4.0,
        "response/truncated_frac": 0.25,
        "response/empty_frac": 0.25,  # row 1: only its stop token
        "rollout/completion_tokens": 10.0,
    }
    assert sorted(m) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(float(m[key]), value, rtol=1e-6, err_msg=key)


@pytest.fixture
def fresh_compilation_cache():
    """No persistent cache configured in this process; the previous settings restored after."""
    keys = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    saved = {key: getattr(jax.config, key) for key in keys}
    reset_cache()
    jax.config.update("jax_compilation_cache_dir", None)
    yield
    reset_cache()
    for key, value in saved.items():
        jax.config.update(key, value)


def test_the_compilation_cache_is_on_by_default_and_fills(tmp_path, fresh_compilation_cache):
    assert TrainConfig().compilation_cache is not None
    overrides = [o for o in IN_GRAPH if not o.startswith("train.compilation_cache")]
    cache = tmp_path / "cache"
    overrides.append(f"train.compilation_cache={cache}")
    prepare_run(load_run_config(GRPO, overrides, run_dir=tmp_path / "run")).checkpointer.close()
    assert jax.config.jax_compilation_cache_dir == str(cache)
    program = jax.jit(lambda x: in_graph_scores(x, x, weight=0.5, group_size=2)[1])
    program(jax.numpy.arange(4.0)).block_until_ready()  # a program no test compiled before
    assert any(cache.iterdir())  # its executable was written
    other = str(tmp_path / "other")
    assert enable_compilation_cache(other) == str(cache)  # a configured directory is kept
    assert enable_compilation_cache(None) is None
