"""The update step across devices and processes equals the single-device step.

Both tests run JAX in subprocesses (the rest of the suite keeps its one device):

- 8 simulated devices (`parallel_runner.py`): the GRPO update step after 3 steps on the jit
  meshes (8,1,1), (1,8,1), (2,2,2), (1,4,2) (Auto axes) and (2,2,2) (Explicit axes) and on
  the data-parallel (`parallel: pmap`) path (and, with units of 2 rows, on (4,1,1) and the
  Explicit (2,2,2)) equals one device, large matrices are split over fsdp · tensor, the sampler draws the same
  tokens on every mesh, and the data-parallel step refuses what it cannot run;
- two processes with 4 simulated devices each (`parallel_two_process_runner.py`,
  `jax.distributed` with CPU collectives), each loading half of the batch: 2 steps of the jit
  and the data-parallel update equal a single-process run computed here.

Tolerance (`parallel_problem.TOLERANCE`, float32): 1e-5 absolute on parameters, Adam moments
and β, 1e-5 relative (to max(1, |value|)) on every metric of every step.

The subprocesses compile with `JAX_DISABLE_MOST_OPTIMIZATIONS=1` (`run_on_devices`,
`run_two_processes`; XLA's backend optimisation level 0): the same computations, compiled about
twice as fast; the 8-device references run under the same setting, the 2-process test's
reference under the suite's own.
"""

from __future__ import annotations

import pickle

import jax
import numpy as np

from tests.simulated_devices import parse_result, run_on_devices, run_two_processes


def test_update_step_and_sampler_on_8_simulated_devices():
    from tests.sharding.parallel_problem import TOLERANCE

    results = parse_result(run_on_devices("tests.sharding.parallel_runner"))
    runs = ["jit(8, 1, 1)", "jit(1, 8, 1)", "jit(2, 2, 2)", "jit(1, 4, 2)", "jit_explicit(2, 2, 2)"]
    runs += ["pmap(8, 1, 1)", "pmap_units(4, 1, 1)", "jit_explicit_units(2, 2, 2)"]
    for run in runs:
        diffs = results[run]
        for key in ("params", "mu", "beta", "metrics"):
            assert diffs[key] <= TOLERANCE, (run, key, diffs)
        assert diffs["params_moved"] > 100 * TOLERANCE, (run, diffs)
    assert results["sampler_tokens"] > 0
    assert results["runner_metrics"] <= TOLERANCE
    assert results["preference_delta"] != 0.0  # BCO's shift after 2 steps on (2,4,1)
    assert results["precomputed_reference_loss"] > 0  # DPO's −log σ(·) on (2,4,1)


def test_two_processes_train_like_one_process(tmp_path):
    from tests.sharding import parallel_problem as problem

    out = tmp_path / "two_process.pkl"

    def reference_run():  # the single-process reference, computed while the job runs
        with jax.default_device(jax.devices("cpu")[0]):
            return problem.reference_run(problem.batch(), steps=2)

    *_, reference = run_two_processes(
        "tests.sharding.parallel_two_process_runner",
        env={"JAXRL_TEST_OUT": str(out)},
        timeout=600,
        while_running=reference_run,
    )
    with open(out, "rb") as f:
        results = pickle.load(f)
    for run in ("jit", "pmap"):
        diffs = problem.compare(results[run], reference)  # raises above the tolerance
        assert diffs["params_moved"] > 100 * problem.TOLERANCE, (run, diffs)
        assert np.isfinite(list(diffs.values())).all(), diffs
        print(f"two processes, {run}: {diffs}")
