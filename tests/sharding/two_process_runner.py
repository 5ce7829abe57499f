"""One of the two processes of `test_distributed.py` (4 simulated CPU devices each).

Starts the distributed runtime from the `JAXRL_*` environment, loads this host's slice of a
16-row batch, assembles the global array over a (data=2, fsdp=4, tensor=1) mesh and computes
a jitted global reduction whose result every process prints (`RESULT {json}`), and uses the
job-wide host helpers the training loop uses: `fetch_global` of the batch-sharded batch and
of typed PRNG keys split over both processes, `gather_from_processes` and
`from_main_process` of values that differ per process (int32, bool, a float64 that 32 bits
cannot hold), `any_process` of a flag set on process 1 only, and the barrier
`wait_for_all_processes`.
"""

from __future__ import annotations

import json
import logging
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

from sharding import (  # noqa: E402  (the config update must come first)
    MeshConfig,
    any_process,
    fetch_global,
    from_main_process,
    gather_from_processes,
    host_batch_slice,
    initialize_distributed,
    log_main,
    make_global_batch,
    make_mesh,
    place_global,
    wait_for_all_processes,
)


def main() -> None:
    info = initialize_distributed(initialization_timeout=60)
    pid = info.process_id
    again = initialize_distributed()
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
    log_main("main says hello")
    mesh = make_mesh(MeshConfig(data=2, fsdp=4))
    x = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)  # every host can build the batch
    rows = host_batch_slice(16, mesh=mesh)
    batch = make_global_batch({"x": x[rows]}, mesh)
    assert batch["x"].shape == (16, 3), batch["x"].shape
    replicated = NamedSharding(mesh, PartitionSpec())

    @jax.jit
    def reduce(a):
        per_row = jnp.sum(a, axis=1) ** 2  # stays sharded over (data, fsdp)
        return jnp.sum(a * a), jax.sharding.reshard(per_row, replicated)

    total, per_row = reduce(batch["x"])
    mine = {
        "ids": np.full(3, jax.process_index(), np.int32),
        "flag": np.array([pid == 1]),
        "exact": np.float64(1.0 + 2.0**-40 * (pid + 1)),  # lost in float32
    }
    keys = jax.random.split(jax.random.key(0), 8)  # typed keys, split over both processes
    keys = place_global(keys, NamedSharding(mesh, PartitionSpec(("data", "fsdp"))))
    try:  # a value without a sharding cannot become a global array
        empty = place_global({"w": np.ones(2), "u": None}, {"w": replicated, "u": None})
        assert empty["u"] is None  # nothing to place: as on one process
        place_global({"w": np.ones(2), "v": np.ones(3)}, {"w": replicated, "v": None})
        none_error = ""
    except ValueError as err:
        none_error = str(err)
    wait_for_all_processes("two_process_runner: before the helpers")
    result = {
        "process": jax.process_index(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "slice": [rows.start, rows.stop],
        "sum_sq": float(total.addressable_data(0)),
        "rows": np.asarray(per_row.addressable_data(0)).astype(float).tolist(),
        "info": list(info),
        "again": list(again),
        "fetched": fetch_global(batch["x"]).tolist(),  # the whole 16 rows on each process
        "fetched_keys": np.asarray(jax.random.key_data(fetch_global(keys))).tolist(),
        "from_main": {k: v.tolist() for k, v in from_main_process(mine).items()},
        "gathered": {k: v.tolist() for k, v in gather_from_processes(mine).items()},
        "any_on_1": any_process(jax.process_index() == 1),
        "any_none": any_process(False),
        "none_error": none_error,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
