"""Run by `test_sharded_load.py` with 8 simulated CPU devices: `python -m ... CHECKPOINT_DIR`.

Loads the checkpoint onto a (data=2, fsdp=2, tensor=2) mesh, checks that every parameter got
the sharding its logical axis names ask for, that the values equal a single-device load, and
that the sharded model (Auto axes, jitted) gives the single-device logits.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models import from_pretrained
from sharding import LOGICAL_AXIS_RULES, MeshConfig, logical_to_spec, make_mesh


def main(path: str) -> None:
    assert jax.device_count() == 8, f"expected 8 devices, got {jax.device_count()}"
    single = from_pretrained(path)
    for axis_types in ("explicit", "auto"):
        mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, axis_types=axis_types))
        model = from_pretrained(path, mesh=mesh)
        flat_single = dict(nnx.to_flat_state(nnx.state(single)))
        for key, var in nnx.to_flat_state(nnx.state(model)):
            value = var.get_value()
            names = var.get_metadata()["out_sharding"]
            expected = logical_to_spec(names, LOGICAL_AXIS_RULES, mesh, shape=value.shape)
            assert value.sharding.spec == expected, (key, value.sharding.spec, expected)
            want = np.asarray(flat_single[key].get_value())
            np.testing.assert_array_equal(np.asarray(value), want, err_msg=str(key))
        q_spec = tuple(model.layers.attn.q[...].sharding.spec)
        assert q_spec == (None, "fsdp", "tensor", None), q_spec
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 131, (4, 8)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(8), (4, 8))
    graphdef, state = nnx.split(model)  # the Auto-axes model
    with jax.set_mesh(mesh):
        logits = jax.jit(lambda s, t, p: nnx.merge(graphdef, s)(t, p))(state, tokens, positions)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(single(tokens, positions)), atol=1e-4)
    print("sharded load: ok")


if __name__ == "__main__":
    main(sys.argv[1])
