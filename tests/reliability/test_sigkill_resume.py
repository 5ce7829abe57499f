"""SIGKILL of the training process during a step and during a save, then `--resume`: the
final parameters, optimizer state, data position and every logged train metric equal those
of the uninterrupted reference run with the same seed, bit for bit (CPU).

The kills come from the runner's fault-injection hook (`jaxrl_llm.runner.faults`, inert unless
`JAXRL_LLM_FAULT` is set): the `jaxrl-llm train` subprocess SIGKILLs itself at an exact point,
so the test is deterministic while covering the three outcomes a kill can have:

    kill 1  step:1   during step 1, before any checkpoint: `--resume` starts again from 0
    kill 2  save:4   during the asynchronous save of step 4 (its files half written): the
                     unfinished save is ignored, `--resume` restores step 2 and redoes 3, 4
    resume  to the end (step 6), in the test process

The atomicity of a save killed at an arbitrary moment of its write, outside the runner, is
`tests/checkpoint/test_crash.py`.
"""

from __future__ import annotations

import signal

from jaxrl_llm.checkpoint import IncompleteCheckpointWarning
from tests.reliability.helpers import GRPO, RUN, final_state, run_cli, train
from tests.runner.helpers import records, train_records, tree_equal


def _killed(result, point):
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert f"JAXRL_LLM_FAULT: SIGKILL at {point}" in result.stderr, result.stderr[-3000:]


def test_sigkill_during_a_step_and_during_a_save_then_resume_is_exact(
    tmp_path, compile_cache, reference_run, recwarn
):
    killed = tmp_path / "killed"
    argv = ["train", GRPO, *RUN, "--run-dir", str(killed)]
    result = run_cli(argv, cache_dir=compile_cache, env={"JAXRL_LLM_FAULT": "step:1"})
    _killed(result, "step 1")
    assert [r["step"] for r in records(killed)] == [0]  # the setup line; step 1 never logged
    assert not any((killed / "checkpoints").iterdir())

    result = run_cli(
        [*argv, "--resume"], cache_dir=compile_cache, env={"JAXRL_LLM_FAULT": "save:4"}
    )
    _killed(result, "save 4")
    assert "stopped before its first checkpoint; starting again from step 0" in result.stderr
    names = sorted(p.name for p in (killed / "checkpoints").iterdir())
    assert "2" in names and "4" not in names, names  # step 4's save never completed ...
    assert any(n.startswith("4.orbax-checkpoint-tmp") for n in names), names  # ... mid-write
    assert max(r["step"] for r in records(killed)) == 4  # logged, then lost with the save

    assert train(killed, RUN, resume=True) == 0  # restores step 2, redoes 3 .. 6
    assert any(
        issubclass(w.category, IncompleteCheckpointWarning) and "save of step 4" in str(w.message)
        for w in recwarn
    )

    step_a, data_a, state_a = final_state(reference_run)
    step_b, data_b, state_b = final_state(killed)
    assert step_a == step_b == 6
    assert data_a == data_b  # the same prompts were drawn, in the same order
    assert tree_equal(state_a, state_b)  # parameters, optimizer state, key: bit for bit
    assert train_records(killed) == train_records(reference_run)  # every train metric, exactly
    assert [r["step"] for r in records(killed)] == [r["step"] for r in records(reference_run)]
