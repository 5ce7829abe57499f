"""One of the two processes of `test_parallel.py` (4 simulated CPU devices each).

Starts the distributed runtime from the `JAXRL_*` environment, loads only this host's rows of
the shared GRPO batch (`host_batch_slice`), assembles the global batch (`make_global_batch`)
and runs 2 update steps twice over all 8 devices of the job: the jit update on a
(data=2, fsdp=2, tensor=2) mesh and the data-parallel update (`parallel: pmap`) on (8, 1, 1).
Process 0 writes both runs' parameters, Adam moments, β and metrics (gathered from every
process) to `$JAXRL_TEST_OUT`, which the test compares with a single-process run.
"""

from __future__ import annotations

import os
import pickle

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

from jaxrl_llm.train import make_update_step, train_state_shardings  # noqa: E402
from jaxrl_llm.train.parallel import make_data_parallel_update_step  # noqa: E402
from sharding import (  # noqa: E402
    MeshConfig,
    host_batch_slice,
    initialize_distributed,
    make_global_batch,
    make_mesh,
)
from sharding.distributed import place_global  # noqa: E402
from tests.sharding import parallel_problem as problem  # noqa: E402

STEPS = 2


def global_batch(mesh, host_batch):
    rows = host_batch_slice(problem.B * problem.G, mesh=mesh)
    assert rows.stop - rows.start == problem.B * problem.G // 2, rows  # half the rows per host
    return make_global_batch(jax.tree.map(lambda x: x[rows], host_batch), mesh)


def jit_run(host_batch):
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, axis_types="auto"))
    state = problem.initial_state()
    shardings = train_state_shardings(state, mesh, problem.OPTIMIZER)
    state = place_global(state, shardings)
    step = make_update_step(
        problem.objective(),
        problem.OPTIMIZER,
        **problem.SCHEDULE,
        mesh=mesh,
        state_shardings=shardings,
    )
    return problem.summary(*problem.train(step, state, global_batch(mesh, host_batch), STEPS))


def pmap_run(host_batch):
    mesh = make_mesh(MeshConfig(data=8))
    step = make_data_parallel_update_step(
        problem.objective(), problem.OPTIMIZER, **problem.SCHEDULE, mesh=mesh
    )
    state = place_global(problem.initial_state(), problem.replicated(mesh))
    return problem.summary(*problem.train(step, state, global_batch(mesh, host_batch), STEPS))


def main() -> None:
    info = initialize_distributed(initialization_timeout=120)
    assert info.num_processes == 2 and jax.device_count() == 8, (info, jax.device_count())
    host_batch = problem.batch()  # every process can build it; each keeps only its rows
    results = {"jit": jit_run(host_batch), "pmap": pmap_run(host_batch)}
    if info.process_id == 0:
        with open(os.environ["JAXRL_TEST_OUT"], "wb") as f:
            pickle.dump(results, f)
    print(f"process {info.process_id}: done", flush=True)


if __name__ == "__main__":
    main()
