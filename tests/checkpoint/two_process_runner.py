"""One of the two processes of `test_two_processes.py` (4 simulated CPU devices each).

Both processes build the same global arrays on a (data=2, fsdp=4, tensor=1) mesh spanning the
8 devices of the job (each process holds only its own shards), save them with one
`Checkpointer` on a shared directory, then restore onto a (data=4, fsdp=1, tensor=2) mesh and
check every addressable shard against the global values. Prints `RESULT {json}`.
"""

from __future__ import annotations

import json
import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

from sharding import MeshConfig, initialize_distributed, make_mesh  # noqa: E402


def global_values():
    """The global arrays (the same on every process), float64-free and exactly representable."""
    import numpy as np

    return {
        "w": np.arange(16 * 12, dtype=np.float32).reshape(16, 12) / 7.0,
        "b": np.arange(8, dtype=np.int32) * 3 - 5,
    }


def place(values, mesh, specs):
    from jax.sharding import NamedSharding

    return {
        name: jax.make_array_from_callback(
            values[name].shape, NamedSharding(mesh, specs[name]), lambda idx, n=name: values[n][idx]
        )
        for name in values
    }


def main() -> None:
    directory = sys.argv[1]
    info = initialize_distributed(initialization_timeout=60)
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxrl_llm.checkpoint import Checkpointer

    values = global_values()
    source_mesh = make_mesh(MeshConfig(data=2, fsdp=4, tensor=1))
    state = place(values, source_mesh, {"w": P(("data", "fsdp"), None), "b": P("fsdp")})
    replicated = NamedSharding(source_mesh, P())
    key = jax.jit(lambda: jax.random.key(11), out_shardings=replicated)()  # a global typed key
    rows_here = sorted(str(s.index) for s in state["w"].addressable_shards)
    with Checkpointer(directory, save_every=1, async_save=True) as ckpt:
        ckpt.save(1, {**state, "key": key}, {"n": 1})
        ckpt.wait()
        target_mesh = make_mesh(MeshConfig(data=4, fsdp=1, tensor=2))
        specs = {"w": P("data", "tensor"), "b": P("tensor"), "key": P()}
        target = {
            name: jax.ShapeDtypeStruct(
                values[name].shape if name != "key" else (),
                values[name].dtype if name != "key" else key.dtype,
                sharding=NamedSharding(target_mesh, specs[name]),
            )
            for name in specs
        }
        restored, meta = ckpt.restore(target_state=target)
    checked = 0
    for name in ("w", "b"):
        assert restored[name].sharding.spec == specs[name], restored[name].sharding
        for shard in restored[name].addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), values[name][shard.index])
            checked += 1
    key_data = np.asarray(jax.random.key_data(restored["key"]).addressable_data(0))
    result = {
        "process": jax.process_index(),
        "info": list(info),
        "shards_checked": checked,
        "rows_written": rows_here,
        "key_data": key_data.tolist(),
        "meta": meta,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
