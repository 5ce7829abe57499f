"""Run by `test_sharded.py` with 8 simulated CPU devices: `python -m tests.sampler.sharded_runner`.

Places a tiny model's parameters on a (data=2, fsdp=2, tensor=2) mesh by their logical axes
(heads and MLP over `tensor`, the width over `fsdp`) and the prompts over the batch axes, runs
the compiled sampler under that mesh, and checks that it returns the single-device rollout,
with stop tokens and with stop strings (`sampler.stop_strings`, on a stand-in byte per token).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_llm.sampler import SamplingConfig, jit_sample_tokens, left_pad
from jaxrl_llm.sampler.stop_strings import stop_string_table
from sharding import ACTIVATION_AXIS_RULES, MeshConfig, logical_to_sharding, make_mesh
from tests.sampler.helpers import tiny_model

PROMPTS = [[1, 2, 3, 4, 5], [6], [7, 8, 9], [10, 3]]


def place(state, mesh):
    def one(var):
        value = var.get_value()
        names = var.get_metadata().get("out_sharding")
        spec = logical_to_sharding(names, mesh, shape=value.shape) if names else None
        return var.replace(jax.device_put(value, spec or NamedSharding(mesh, PartitionSpec())))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def main() -> None:
    if jax.device_count() != 8:
        raise SystemExit(f"expected 8 devices, got {jax.device_count()}")
    model = tiny_model(vocab=13, seed=0, layers=1, num_heads=4, num_kv_heads=2)
    graphdef, state = nnx.split(model)
    config = SamplingConfig(
        max_new_tokens=9, num_samples=2, stop_tokens=(0,), temperature=0.8, steps_per_loop=1
    )
    strings = ("BC", "DE", "HI", "F")  # token i spells the letter chr(65 + i)
    table = stop_string_table(strings, [bytes([65 + i]) for i in range(13)])
    with_strings = SamplingConfig(
        max_new_tokens=9, num_samples=2, temperature=0.8, stop_strings=strings, stop_table=table
    )
    tokens, mask = left_pad(PROMPTS, length=16, pad_id=0)
    key = jax.random.key(3)
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, axis_types="auto"))
    sharded_state = place(state, mesh)
    q = sharded_state["layers"]["attn"]["q"].get_value()
    assert tuple(q.sharding.spec) == (None, "fsdp", "tensor", None), q.sharding.spec
    rows = logical_to_sharding(("batch", "length"), mesh, rules=ACTIVATION_AXIS_RULES)
    for cfg in (config, with_strings):
        single = jit_sample_tokens(graphdef, state, tokens, mask, key, config=cfg)
        with jax.set_mesh(mesh):
            out = jit_sample_tokens(
                graphdef,
                sharded_state,
                jax.device_put(tokens, rows),
                jax.device_put(mask, rows),
                key,
                config=cfg,
            )
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(single.tokens))
        np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(single.lengths))
        np.testing.assert_array_equal(np.asarray(out.truncated), np.asarray(single.truncated))
        np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(single.logprobs), atol=1e-5)
    stopped = ~np.asarray(out.truncated)
    assert stopped.any() and (~stopped).any(), np.asarray(out.lengths)  # some rows matched
    print("output sharding:", out.tokens.sharding)
    print("sharded sampler: ok")


if __name__ == "__main__":
    main()
