"""Multi-host checkpoints: two JAX processes save their own shards and restore on a new mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.checkpoint import Checkpointer
from tests.checkpoint.two_process_runner import global_values
from tests.simulated_devices import parse_result, run_two_processes


def test_two_processes_write_their_shards_and_restore_anywhere(tmp_path):
    outputs, _, _ = run_two_processes("tests.checkpoint.two_process_runner", str(tmp_path))
    results = [parse_result(stdout) for stdout, _ in outputs]
    expected_key = np.asarray(jax.random.key_data(jax.random.key(11))).tolist()
    for pid, r in enumerate(results):
        assert r["process"] == pid and r["info"][:2] == [pid, 2]
        assert r["shards_checked"] == 8  # 4 local devices x 2 arrays, each compared
        assert r["key_data"] == expected_key and r["meta"] == {"n": 1}
    # the two processes held disjoint rows of `w` ...
    assert not set(results[0]["rows_written"]) & set(results[1]["rows_written"])
    # ... and each wrote its own shard files (orbax's per-process OCDBT layout)
    written = sorted(p.name for p in (tmp_path / "1" / "state").glob("ocdbt.process_*"))
    assert written == ["ocdbt.process_0", "ocdbt.process_1"], written

    # this single process (one device) reads the whole multi-host checkpoint
    values = global_values()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {
        "w": jax.ShapeDtypeStruct(values["w"].shape, jnp.float32, sharding=device),
        "b": jax.ShapeDtypeStruct(values["b"].shape, jnp.int32, sharding=device),
        "key": jax.random.key(0),
    }
    with Checkpointer(tmp_path, save_every=1) as ckpt:
        state, meta = ckpt.restore(target_state=target)
    assert meta == {"n": 1}
    np.testing.assert_array_equal(np.asarray(state["w"]), values["w"])
    np.testing.assert_array_equal(np.asarray(state["b"]), values["b"])
    assert np.asarray(jax.random.key_data(state["key"])).tolist() == expected_key
