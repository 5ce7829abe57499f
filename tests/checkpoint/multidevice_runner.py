"""Run by `test_multidevice.py` with 8 simulated CPU devices (`python -m` this module).

A train state (tiny Decoder policy + reference, adamw moments, typed key, KL state) is placed on
a (data=8, fsdp=1, tensor=1) mesh with every parameter and moment split 8 ways along its first
divisible axis, saved asynchronously, and restored onto

- a (data=2, fsdp=2, tensor=2) mesh with the library's logical shardings (`param_shardings`,
  `optimizer_shardings`: FSDP + tensor parallel),
- a single device,

checking each time that every leaf has the requested sharding and is bit-for-bit the saved
value (including the PRNG key), and that the restored key draws the same numbers.
"""

from __future__ import annotations

import sys
import tempfile

import jax
import numpy as np
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from jaxrl_llm.checkpoint import Checkpointer
from jaxrl_llm.parallel import param_shardings
from jaxrl_llm.train.state import TrainState
from sharding import MeshConfig, make_mesh, optimizer_shardings
from tests.checkpoint.helpers import assert_bitwise_equal, make_state, train_step


def split_8_ways(leaf, mesh) -> NamedSharding:
    """Split the first axis divisible by 8 over `data`; replicate scalars and the rest."""
    for axis, size in enumerate(leaf.shape):
        if size % 8 == 0:
            return NamedSharding(mesh, P(*([None] * axis), "data"))
    return NamedSharding(mesh, P())


def logical_layout(state: TrainState, mesh) -> TrainState:
    """The shardings the training loop would use on `mesh` (FSDP + tensor parallel)."""
    replicated = NamedSharding(mesh, P())
    policy = param_shardings(state.params["policy"], mesh)
    params = {"policy": policy}
    frozen = {"policy": param_shardings(state.frozen["policy"], mesh)}
    return TrainState(
        step=replicated,
        params=params,
        frozen=frozen,
        opt_state=optimizer_shardings(state.opt_state, state.params, params, mesh),
        key=replicated,
        kl=jax.tree.map(lambda _: replicated, state.kl),
    )


def abstract_on(state, shardings):
    return jax.tree.map(
        lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s), state, shardings
    )


def main() -> None:
    assert jax.device_count() == 8, f"expected 8 devices, got {jax.device_count()}"
    saved = train_step(train_step(make_state(0)))
    source_mesh = make_mesh(MeshConfig(data=8, fsdp=1, tensor=1))
    source = jax.device_put(saved, jax.tree.map(lambda a: split_8_ways(a, source_mesh), saved))
    embed = source.params["policy"]["embed"].get_value()
    assert len({str(s.index) for s in embed.addressable_shards}) == 8, (
        embed.sharding
    )  # really split
    directory = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    with Checkpointer(directory, save_every=1, async_save=True) as ckpt:
        ckpt.save(2, source, {"mesh": [8, 1, 1]})
        ckpt.wait()

        target_mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
        layout = logical_layout(saved, target_mesh)
        restored, meta = ckpt.restore(target_state=abstract_on(saved, layout))
        assert meta == {"mesh": [8, 1, 1]}
        for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(layout), strict=True):
            assert got.sharding == want, (got.sharding, want)
        q = restored.params["policy"]["layers"]["attn"]["q"].get_value()
        assert tuple(q.sharding.spec) == (None, "fsdp", "tensor", None), q.sharding
        assert q.addressable_shards[0].data.shape != q.shape  # really sharded on the new mesh
        assert_bitwise_equal(restored, saved)
        np.testing.assert_array_equal(
            jax.random.uniform(restored.key, (5,)), jax.random.uniform(saved.key, (5,))
        )

        one = SingleDeviceSharding(jax.devices()[5])
        single, _ = ckpt.restore(
            target_state=abstract_on(saved, jax.tree.map(lambda _: one, saved))
        )
        assert all(leaf.sharding == one for leaf in jax.tree.leaves(single))
        assert_bitwise_equal(single, saved)
    print("checkpoint multidevice: ok")


if __name__ == "__main__":
    main()
