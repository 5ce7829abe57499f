"""The step-by-step RL loop runs no eager JAX op and no `device_put` in a steady-state step.

Each eager op or `device_put` between the step's compiled programs is a dispatch of its own
(0.03-0.3 ms on a 2-core CPU; docs/performance.md, "Little host work between the programs of
an RL step"): together they were a quarter of the tiny model's step. The check counts the
primitives JAX evaluates eagerly (its `EvalTrace`) and the calls of `jax.device_put` during
two steps after the first two (which compile), on a mesh of one device.
"""

from __future__ import annotations

import collections
import traceback

import jax
import pytest
from jax._src import core

from jaxrl_llm.runner import load_run_config, loop, prepare_run
from tests.runner.helpers import CONFIGS, TINY

GRPO = str(CONFIGS / "grpo.yaml")


def _caller() -> str:
    """The innermost frame of this project on the stack (file:line)."""
    frames = [f for f in traceback.extract_stack() if "/jaxrl_llm/" in f.filename]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


@pytest.mark.parametrize("in_graph_rewards", [True, False], ids=["in_graph", "host"])
def test_a_steady_state_rl_step_dispatches_only_compiled_programs(
    tmp_path, monkeypatch, in_graph_rewards
):
    overrides = [*TINY, "train.eval_prompts=0", "train.compilation_cache=null"]
    overrides += ["export.enabled=false"]
    if in_graph_rewards:
        overrides = [o for o in overrides if not o.startswith("rewards.")]
        overrides += ["rewards.jax_native=true", "rewards.functions=[{fn: exact_answer}]"]
    prepared = prepare_run(load_run_config(GRPO, overrides, run_dir=tmp_path))
    prepared.checkpointer.close()
    ctx, state, data = prepared.context, prepared.state, prepared.data
    assert ctx.mesh.size == 1
    for step in (1, 2):  # compiles
        state, data, _ = loop._rl_step(ctx, state, data, step)

    eager: collections.Counter[str] = collections.Counter()
    process_primitive = core.EvalTrace.process_primitive  # JAX's eager evaluation of a primitive

    def counted(self, primitive, *args, **kwargs):
        eager[f"{primitive.name} at {_caller()}"] += 1
        return process_primitive(self, primitive, *args, **kwargs)

    device_put = jax.device_put

    def counted_put(*args, **kwargs):
        eager[f"device_put at {_caller()}"] += 1
        return device_put(*args, **kwargs)

    monkeypatch.setattr(core.EvalTrace, "process_primitive", counted)
    monkeypatch.setattr(jax, "device_put", counted_put)
    for step in (3, 4):
        state, data, metrics = loop._rl_step(ctx, state, data, step)
    assert not eager, f"eager dispatches in two RL steps: {dict(eager)}"
    assert metrics["rollout/completion_tokens"] > 0  # the steps ran
