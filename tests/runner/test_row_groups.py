"""`sampling.row_groups` and `train.shared_prompt_forward` in the runner: the same training
steps and evaluation as one call over the plain forward.

The run: the tiny GRPO run of the runner tests with 4 prompts per step (2 samples each), half of
the byte ids as stop tokens so that completion lengths vary; steps, metrics and the final state
with the rows sampled, forwarded and updated (the gradient, `jaxrl_llm.train.row_groups`) as 1
call and as 2 groups (one thread each) must agree.
"""

from __future__ import annotations

from types import SimpleNamespace

import jax
import numpy as np
import pytest

from jaxrl_llm.runner import evaluate_policy, load_run_config, loop, prepare_run
from jaxrl_llm.runner.programs import prompt_group_size
from jaxrl_llm.runner.setup import update_row_groups
from tests.runner.helpers import CONFIGS, TINY

GRPO = str(CONFIGS / "grpo.yaml")
STOPS = "sampling.stop_tokens=[" + ",".join(str(i) for i in range(0, 256, 2)) + "]"
RUN = [
    *TINY,
    STOPS,
    "train.prompts_per_step=4",
    "train.eval_prompts=4",
    "train.compilation_cache=null",
    "export.enabled=false",
]


def _steps(tmp_path, groups, *overrides):
    run_dir = tmp_path / f"groups{groups}"
    config = load_run_config(
        GRPO, [*RUN, f"sampling.row_groups={groups}", *overrides], run_dir=run_dir
    )
    prepared = prepare_run(config)
    prepared.checkpointer.close()
    ctx, state, data = prepared.context, prepared.state, prepared.data
    assert update_row_groups(config, ctx.task, state.params["policy"], ctx.mesh) == groups
    history = []
    for step in (1, 2):
        state, data, metrics = loop._rl_step(ctx, state, data, step)
        history.append({k: v for k, v in metrics.items() if not k.startswith(("time/", "perf/"))})
    policy = state.params["policy"]
    evaluation = evaluate_policy(ctx, policy, state.frozen["policy"], jax.random.key(5))
    evaluation = {k: v for k, v in evaluation.items() if not k.startswith("time/")}
    return history, jax.tree.leaves(policy), evaluation


@pytest.fixture(scope="module")
def one_call(tmp_path_factory):
    return _steps(tmp_path_factory.mktemp("one"), 1)


def _assert_same_run(run, run_1):
    history, params, evaluation = run
    history_1, params_1, evaluation_1 = run_1
    assert history[0]["rollout/completion_tokens"] < 4 * 2 * 4  # some rows stopped early
    assert history[0]["adv/std"] > 0  # the batch has a learning signal
    assert [h.keys() for h in history] == [h.keys() for h in history_1]
    for metrics, metrics_1 in zip(history, history_1, strict=True):
        for key, value in metrics.items():  # the same tokens, rewards and advantages
            np.testing.assert_allclose(value, metrics_1[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for a, b in zip(params, params_1, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert evaluation == evaluation_1  # greedy and sampled accuracies, pass@k: exactly


def test_two_groups_train_and_evaluate_like_one_call(one_call, tmp_path):
    _assert_same_run(_steps(tmp_path, 2), one_call)


def test_the_shared_prompt_forward_trains_like_the_plain_forward(one_call, tmp_path):
    config = load_run_config(GRPO, RUN, run_dir=tmp_path)
    mesh = SimpleNamespace(size=1)
    assert prompt_group_size(config, mesh, update=True) == 2  # `one_call` shares the prompts
    assert prompt_group_size(config, SimpleNamespace(size=2), update=False) == 1
    plain = _steps(tmp_path, 1, "train.shared_prompt_forward=false")
    _assert_same_run(plain, one_call)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], 2),
        (["algorithm.epochs=2"], 1),  # several optimizer updates per batch
        (["optim.accumulation_steps=2"], 1),
    ],
)
def test_the_update_uses_row_groups_only_where_they_apply(tmp_path, overrides, expected):
    config = load_run_config(GRPO, [*RUN, "sampling.row_groups=2", *overrides], run_dir=tmp_path)
    task = SimpleNamespace(prompt_length=8, completion_length=4)
    mesh = SimpleNamespace(size=1)
    assert update_row_groups(config, task, {"w": np.ones(10)}, mesh) == expected
    assert update_row_groups(config, task, {"w": np.ones(10)}, SimpleNamespace(size=2)) == 1


def test_minibatches_of_whole_prompts_share_the_prompt_in_the_update(tmp_path):
    # algorithm.minibatch_unit: prompt keeps each prompt's rows in one micro-batch, so the
    # update keeps the shared-prompt forward under 2 minibatches × 2 micro-batches
    unit = ["algorithm.minibatch_unit=prompt", "algorithm.minibatches=2"]
    unit += ["optim.accumulation_steps=2"]
    one_device = SimpleNamespace(size=1)
    config = load_run_config(GRPO, [*RUN, *unit], run_dir=tmp_path)
    assert config.update_unit == prompt_group_size(config, one_device, update=True) == 2
    rows = load_run_config(GRPO, [*RUN, *unit[1:]], run_dir=tmp_path)
    assert rows.update_unit == prompt_group_size(rows, one_device, update=True) == 1
    shared = _steps(tmp_path / "shared", 1, *unit)
    plain = _steps(tmp_path / "plain", 1, *unit, "train.shared_prompt_forward=false")
    _assert_same_run(shared, plain)
