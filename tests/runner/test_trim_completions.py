"""`train.trim_completions`: the RL loop cuts each batch's completions to its longest, bucketed
(`jaxrl_llm.runner.completion_width`), with the steps of the full width.

The run: the tiny run of the runner tests with 32 completion slots and half of the byte ids as
stop tokens, so that every row stops within a few tokens and the batch is cut to 4, 8 or 16
slots (`train.trim_minimum=4`), rewarded by its length (the text before the stop token is
often empty). Two steps with and without the cut must give the same
metrics and parameters up to float rounding, for a group-normalised loss (GRPO), Dr. GRPO's
constant length normaliser (kept at `max_new_tokens`, not the cut width), PPO's critic with
GAE, and DAPO's dynamic sampling (the kept rows' lengths). The same for two SFT steps and a
warm start, whose (prompt, answer) batches are cut to the longest answer + EOS.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_llm.runner import load_run_config, loop, prepare_run
from jaxrl_llm.runner.completion_width import completion_width, trim_collected, trim_to_longest
from jaxrl_llm.runner.rollout import Collected
from jaxrl_llm.train import SequenceBatch
from tests.extended import extended
from tests.runner.helpers import CONFIGS, TINY

T = 32
STOPS = "sampling.stop_tokens=[" + ",".join(str(i) for i in range(256) if i % 2) + "]"
RUN = [
    *TINY,
    STOPS,
    # the text before the first stop token is mostly empty: a reward of the lengths differs
    "rewards.functions=[{fn: 'tests.runner.helpers:length_reward'}]",
    f"sampling.max_new_tokens={T}",
    "train.prompts_per_step=4",
    "train.trim_minimum=4",
    "train.compilation_cache=null",
    "export.enabled=false",
]


def _steps(tmp_path, name, trim, *overrides):
    run_dir = tmp_path / f"{name}-{trim}"
    overrides = [*RUN, f"train.trim_completions={str(trim).lower()}", *overrides]
    config = load_run_config(str(CONFIGS / f"{name}.yaml"), overrides, run_dir=run_dir)
    prepared = prepare_run(config)
    prepared.checkpointer.close()
    ctx, state, data = prepared.context, prepared.state, prepared.data
    history, perf = [], []
    for step in (1, 2):
        state, data, metrics = loop._rl_step(ctx, state, data, step)
        perf.append({k: v for k, v in metrics.items() if k.startswith("perf/")})
        history.append({k: v for k, v in metrics.items() if not k.startswith(("time/", "perf/"))})
    return history, perf, jax.tree.leaves(state.params)


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("grpo", ()),
        extended("dr_grpo", ()),
        ("ppo_value_head_adaptive_kl", ()),
        ("dapo", ("train.max_refills=1",)),
    ],
)
def test_trimmed_steps_match_the_full_width(tmp_path, name, overrides):
    history, perf, params = _steps(tmp_path, name, True, *overrides)
    history_full, perf_full, params_full = _steps(tmp_path, name, False, *overrides)
    widths = [p["perf/completion_width"] for p in perf]
    widths_full = [p["perf/completion_width"] for p in perf_full]
    assert widths_full == [T, T]
    assert all(w in (4, 8, 16) for w in widths), widths  # every step was cut
    assert history[0]["adv/std"] > 0 or "adv/std" not in history[0]
    assert_same_steps((history, params), (history_full, params_full), name)


def assert_same_steps(run, other, label):
    """Two runs' `(history, params)`: the same metric keys, metrics and parameters up to float
    rounding."""
    (history, params), (history_other, params_other) = run, other
    assert [h.keys() for h in history] == [h.keys() for h in history_other]
    for metrics, metrics_other in zip(history, history_other, strict=True):
        for key, value in metrics.items():
            np.testing.assert_allclose(
                value, metrics_other[key], rtol=2e-5, atol=1e-6, err_msg=f"{label}: {key}"
            )
    for a, b in zip(params, params_other, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_dr_grpo_keeps_the_generation_budget_as_its_constant(tmp_path):
    config = load_run_config(str(CONFIGS / "dr_grpo.yaml"), RUN, run_dir=tmp_path)
    assert config.trims_completions
    assert config.algorithm.policy_loss.norm_length is None  # the config is unchanged
    assert config.update_objective.policy_loss.norm_length == T
    off = load_run_config(
        str(CONFIGS / "dr_grpo.yaml"), [*RUN, "train.trim_completions=false"], run_dir=tmp_path
    )
    assert not off.trims_completions and off.update_objective is off.algorithm


def test_a_critic_normalised_by_the_width_keeps_the_full_width(tmp_path):
    overrides = [*RUN, "algorithm.critic.agg=seq_mean_token_sum_norm"]
    config = load_run_config(
        str(CONFIGS / "ppo_value_head_adaptive_kl.yaml"), overrides, run_dir=tmp_path
    )
    assert not config.trims_completions


def test_completion_width_buckets_the_longest_row():
    assert completion_width([1, 5, 3], max_width=64, minimum=4) == 8
    assert completion_width([1, 8], max_width=64, minimum=4) == 8
    assert completion_width([9], max_width=64, minimum=4) == 16
    assert completion_width([33], max_width=48, minimum=4) == 48  # capped at T
    assert completion_width([], max_width=48, minimum=4) == 4
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 8\]"):
        completion_width([9], max_width=8, minimum=4)
    with pytest.raises(ValueError, match="`minimum` must be >= 1"):
        completion_width([1], max_width=8, minimum=0)


def test_trim_collected_keeps_the_prompt_and_the_first_slots():
    rng = np.random.default_rng(0)
    P, T_, N = 3, 6, 2
    tokens = rng.integers(0, 9, (N, P + T_)).astype(np.int32)
    attention = np.ones((N, P + T_), np.int32)
    mask = np.zeros((N, T_), np.float32)
    mask[:, :2] = 1.0
    logp = rng.normal(size=(N, T_)).astype(np.float32)
    collected = Collected(
        SequenceBatch(tokens, attention, mask), logp, np.zeros(N), None, {}, logp + 1.0
    )
    cut = trim_collected(collected, 2)
    np.testing.assert_array_equal(cut.sequences.tokens, tokens[:, : P + 2])
    np.testing.assert_array_equal(cut.sequences.attention_mask, attention[:, : P + 2])
    np.testing.assert_array_equal(cut.sequences.completion_mask, mask[:, :2])
    np.testing.assert_array_equal(cut.sampling_logprobs, logp[:, :2])
    np.testing.assert_array_equal(cut.logprobs, logp[:, :2] + 1.0)
    assert trim_collected(collected, T_) is collected
    with pytest.raises(ValueError, match=r"`width` must be in \[1, 6\]"):
        trim_collected(collected, 7)


def _sft_steps(tmp_path, trim):
    overrides = [*RUN, f"train.trim_completions={str(trim).lower()}"]
    config = load_run_config(str(CONFIGS / "sft.yaml"), overrides, run_dir=tmp_path / str(trim))
    assert config.trims_completions == trim
    prepared = prepare_run(config)
    prepared.checkpointer.close()
    ctx, state, data = prepared.context, prepared.state, prepared.data
    history = []
    for step in (1, 2):
        state, data, metrics = loop._sft_step(ctx, state, data, step)
        history.append(metrics)
    return history, jax.tree.leaves(state.params)


def test_sft_steps_cut_to_the_longest_answer_match_the_full_width(tmp_path):
    history, params = _sft_steps(tmp_path, True)
    history_full, params_full = _sft_steps(tmp_path, False)
    assert [h["perf/completion_width"] for h in history] == [4, 4]  # "d" or "dd" + EOS
    assert "perf/completion_width" not in history_full[0]
    for metrics, metrics_full in zip(history, history_full, strict=True):
        np.testing.assert_allclose(metrics["sft/nll"], metrics_full["sft/nll"], rtol=2e-5)
    for a, b in zip(params, params_full, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_the_warm_start_cut_to_the_longest_answer_matches_the_full_width(tmp_path, monkeypatch):
    from jaxrl_llm.runner import warm_start

    widths = []

    def spy(batch, *, minimum):
        cut = trim_to_longest(batch, minimum=minimum)
        widths.append(cut.completion_mask.shape[1])
        return cut

    monkeypatch.setattr(warm_start, "trim_to_longest", spy)
    params = {}
    for trim in (True, False):
        overrides = [*RUN, "warm_start={steps: 2, batch_size: 4}"]
        overrides.append(f"train.trim_completions={str(trim).lower()}")
        config = load_run_config(
            str(CONFIGS / "grpo.yaml"), overrides, run_dir=tmp_path / str(trim)
        )
        prepared = prepare_run(config)
        prepared.checkpointer.close()
        assert prepared.info["warm_start/cached"] == 0.0
        params[trim] = jax.tree.leaves(prepared.state.params)
    for a, b in zip(params[True], params[False], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)
    assert widths == [4, 4]  # the trimmed run's two steps; the full run's none
