"""Run by `test_multidevice.py` with 8 simulated CPU devices (`python -m` this module).

Checks, on a (data=2, fsdp=2, tensor=2) mesh:

- `shard` changes the sharding type under Explicit axes (`reshard`), constrains under Auto
  axes, drops Manual axes inside `shard_map`, keeps values, and is transparent to gradients;
- `batch_shardings` / `make_global_batch` place rows over (data, fsdp);
- `optimizer_shardings` equals the shardings JAX itself propagates through `tx.init` on
  sharded parameters (Explicit mode), and a jitted init with them as `out_shardings` runs;
- `param_shardings` of a Decoder places every weight like `from_pretrained(mesh=...)` does, the
  sharded forward equals the single-device one, `check_replication` accepts it and rejects a
  rule table that replicates the embeddings;
- `cache_shardings` of a KV cache (per-row and shared lengths);
- the in-graph exact-answer reward of the rollout program (answers repeated over the group,
  then compacted row by row) runs on rows split over the batch axes under Explicit axes and
  scores as on one device (a scatter into a replicated buffer was refused there);
- `fn: reward_model` on meshes of the 8 devices (FSDP by default, data × fsdp × tensor in
  bfloat16 and under Auto axes, data only): its weights split as the rules say and its scores
  equal the one-device forward of each text alone.
"""

from __future__ import annotations

import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxrl_llm.models import Decoder, KVCache, ModelConfig, ValueModel, save_pretrained
from jaxrl_llm.parallel import cache_shardings, param_shardings
from jaxrl_llm.rewards import exact_answer_reward, reward_model
from jaxrl_llm.sampler.core import repeat_rows
from jaxrl_llm.tokenizer import ByteTokenizer
from jaxrl_llm.train import SequenceBatch, sequence_scores
from jaxrl_llm.train.shardings import place_batch
from sharding import (
    LOGICAL_AXIS_RULES,
    MeshConfig,
    batch_shardings,
    check_replication,
    host_batch_slice,
    logical_to_spec,
    make_global_batch,
    make_mesh,
    optimizer_shardings,
    shard,
)

CFG = ModelConfig(
    family="qwen2",
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=4,
)


def random_model(seed: int) -> Decoder:
    """A Decoder with N(0, 0.02²) weights drawn on the host (eager init is slow on 8 devices)."""
    abstract = nnx.eval_shape(lambda: Decoder(CFG, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    rng = np.random.default_rng(seed)
    state = jax.tree.map(lambda a: jnp.asarray(0.02 * rng.standard_normal(a.shape), a.dtype), state)
    return nnx.merge(graphdef, state)


def check_shard() -> None:
    x = jnp.arange(8 * 6, dtype=jnp.float32).reshape(8, 6)
    explicit = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    with jax.set_mesh(explicit):
        xs = jax.device_put(x, P(None, "tensor"))

        def f(a):
            y = shard(a * 2.0, ("batch", "embed"))
            assert jax.typeof(y).sharding.spec == P(("data", "fsdp"), None), jax.typeof(y)
            return y

        y = jax.jit(f)(xs)
        assert y.sharding.spec == P(("data", "fsdp"), None), y.sharding
        np.testing.assert_array_equal(np.asarray(y), 2 * np.asarray(x))
        loss = lambda a: jnp.sum(shard(a, ("batch", "mlp")) ** 2)  # noqa: E731
        grad = jax.jit(jax.grad(loss))(xs)
        np.testing.assert_allclose(np.asarray(grad), 2 * np.asarray(x))
        # eager, outside jit, with the concrete mesh given explicitly
        eager = shard(x, ("batch", "mlp"), mesh=explicit)
        assert eager.sharding.spec == P(("data", "fsdp"), "tensor"), eager.sharding

        # inside shard_map over `data`: the manual axis is dropped, fsdp still applies
        def local(a):
            return shard(a + 1.0, ("batch", "embed"))

        out = jax.jit(
            jax.shard_map(local, in_specs=P("data"), out_specs=P("data"), axis_names={"data"})
        )(jax.device_put(x, P("data")))
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x) + 1)

    auto = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, axis_types="auto"))
    with jax.set_mesh(auto):
        y = jax.jit(lambda a: shard(a - 1.0, ("batch", "vocab")))(x)
    assert y.sharding.spec == P(("data", "fsdp"), "tensor"), y.sharding
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x) - 1)


def check_batches() -> None:
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    tokens = np.arange(8 * 5, dtype=np.int32).reshape(8, 5)
    assert host_batch_slice(8, mesh=mesh) == slice(0, 8)  # one process holds every row
    batch = make_global_batch({"tokens": tokens, "reward": tokens[:, 0].astype(np.float32)}, mesh)
    assert batch["tokens"].sharding.spec == P(("data", "fsdp"), None)
    np.testing.assert_array_equal(np.asarray(batch["tokens"]), tokens)
    placed = jax.device_put(tokens, batch_shardings(tokens, mesh))
    assert placed.sharding == batch["tokens"].sharding
    for shard_ in batch["tokens"].addressable_shards:
        assert shard_.data.shape == (2, 5)
    rows = place_batch({"tokens": tokens, "count": np.float32(8)}, mesh)  # a scalar replicated
    assert (
        rows["tokens"].sharding.spec == P(("data", "fsdp")) and rows["count"].sharding.spec == P()
    )
    for bad, message in (
        (lambda: make_global_batch({"x": np.zeros((6, 2))}, mesh), "into the 4 row blocks"),
        (lambda: host_batch_slice(6, mesh=mesh), "(4 ways)"),
    ):
        try:
            bad()
        except ValueError as err:
            assert message in str(err), err
        else:
            raise AssertionError(f"accepted: {message}")


def check_optimizer_state() -> None:
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    model = random_model(0)
    state = nnx.state(model, nnx.Param)
    shardings = param_shardings(state, mesh)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    with jax.set_mesh(mesh):
        params = jax.device_put(state, shardings)
        abstract = jax.eval_shape(tx.init, params)  # Explicit mode: JAX propagates shardings
        derived = optimizer_shardings(abstract, params, shardings, mesh)
        pairs = zip(
            jax.tree_util.tree_flatten_with_path(abstract)[0], jax.tree.leaves(derived), strict=True
        )
        for path, leaf in ((p, (l, o)) for (p, l), o in pairs):
            leaf, ours = leaf
            if leaf.sharding is None:  # eval_shape leaves unsharded scalars (the step count) bare
                assert leaf.ndim == 0 and ours.spec == P(), jax.tree_util.keystr(path)
            else:
                assert leaf.sharding.spec == ours.spec, (jax.tree_util.keystr(path), leaf, ours)
        opt_state = jax.jit(tx.init, out_shardings=derived)(params)
        for leaf, ours in zip(jax.tree.leaves(opt_state), jax.tree.leaves(derived), strict=True):
            assert leaf.sharding.spec == ours.spec


def check_params() -> None:
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, axis_types="auto"))
    model = random_model(1)
    graphdef, state = nnx.split(model)
    shardings = param_shardings(state, mesh)
    got = dict(nnx.to_flat_state(shardings))
    for key, var in nnx.to_flat_state(state):  # as hf_io places each parameter
        value = var.get_value()
        names = var.get_metadata()["out_sharding"]
        expected = logical_to_spec(names, LOGICAL_AXIS_RULES, mesh, shape=value.shape)
        assert got[key].get_value().spec == expected, key
    assert tuple(shardings["layers"]["attn"]["q"].get_value().spec) == (
        None,
        "fsdp",
        "tensor",
        None,
    )
    placed = jax.device_put(state, shardings)
    report = check_replication(placed, max_replicated_fraction=0.05)  # leaves' own shardings
    assert report.fraction < 0.05, report
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (4, 6)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(6), (4, 6))
    with jax.set_mesh(mesh):
        logits = jax.jit(lambda s, t, p: nnx.merge(graphdef, s)(t, p))(placed, tokens, positions)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(model(tokens, positions)), atol=1e-5)
    lazy_rules = tuple(
        (n, None) if n in ("vocab", "embed") else (n, a) for n, a in LOGICAL_AXIS_RULES
    )
    try:
        check_replication(state, param_shardings(state, mesh, rules=lazy_rules))
    except ValueError as err:
        assert "embed.value (64, 16)" in str(err), err
    else:
        raise AssertionError("check_replication accepted replicated embeddings")


def check_cache() -> None:
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    for shared in (False, True):
        cache = KVCache.init(CFG, batch=4, max_len=6, shared_length=shared)
        shardings = cache_shardings(cache, mesh)
        placed = jax.device_put(cache, shardings)
        # k [L, N, K, T, Hd]: rows over the batch axes, KV heads over tensor
        assert placed.k.sharding.spec == P(None, ("data", "fsdp"), "tensor", None, None)
        assert placed.positions.sharding.spec == P(("data", "fsdp"), None)
        assert placed.lengths.sharding.spec == (P() if shared else P(("data", "fsdp")))
    try:
        cache_shardings(KVCache.init(CFG, batch=6, max_len=6), mesh)
    except ValueError as err:
        assert "has size 6" in str(err), err
    else:
        raise AssertionError("6 rows were accepted on data·fsdp = 4")


def check_in_graph_reward() -> None:
    rng = np.random.default_rng(0)
    B, G, T, A, stop = 4, 2, 6, 3, 9
    completions = rng.integers(0, 4, (B * G, T)).astype(np.int32)
    completions[::3, 2] = stop  # some rows stop early
    mask = rng.random((B * G, T)) < 0.8
    answers = rng.integers(0, 4, (B, A)).astype(np.int32)
    answers[1] = completions[2, :3]  # a row whose valid tokens may match
    lengths = np.array([3, 2, 1, 3], np.int32)

    def score(c, m, a, n):
        a, n = repeat_rows(a, G, 0, ("batch", None)), repeat_rows(n, G, 0, ("batch",))
        return exact_answer_reward(c, m, a, n, stop_ids=stop)

    reference = np.asarray(jax.jit(score)(completions, mask, answers, lengths))
    for axis_types in ("explicit", "auto"):
        mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, axis_types=axis_types))
        with jax.set_mesh(mesh):
            rows = lambda x: jax.device_put(x, P(("data", "fsdp"), *[None] * (x.ndim - 1)))  # noqa: E731
            out = jax.jit(score)(*(rows(x) for x in (completions, mask, answers, lengths)))
        np.testing.assert_array_equal(np.asarray(out), reference, err_msg=axis_types)


def check_reward_model() -> None:
    cfg = ModelConfig(
        family="qwen3",
        vocab_size=259,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
    )
    path = tempfile.mkdtemp()
    with jax.default_device(jax.devices()[0]):
        model = ValueModel(cfg, rngs=nnx.Rngs(3))
    save_pretrained(model, path)
    prompts = ["1+1=", "12+30=", "7+8=", "", "99+99=", "3*4="]
    completions = ["2", "42 and more", "15", "x", "198" * 7, "12"]
    tok = ByteTokenizer()  # the reference: one device, the texts right-padded in one batch
    ids = [tok.encode(p + c, add_eos=True) for p, c in zip(prompts, completions, strict=True)]
    tokens = np.zeros((len(ids), max(map(len, ids))), np.int32)
    mask = np.zeros_like(tokens)
    for i, row in enumerate(ids):
        tokens[i, : len(row)], mask[i, : len(row)] = row, 1
    graphdef, state = nnx.split(model)
    forward = jax.jit(
        lambda s, t, m: sequence_scores(nnx.merge(graphdef, s), SequenceBatch(t, m, m))
    )
    with jax.default_device(jax.devices()[0]):
        reference = np.asarray(forward(state, tokens, mask))
    cases = [
        (None, "float32"),
        ({"data": 2, "fsdp": 2, "tensor": 2}, "bfloat16"),
        ({"data": 2, "fsdp": 2, "tensor": 2, "axis_types": "auto"}, "float32"),
        ({"data": -1}, "float32"),
    ]
    for mesh, dtype in cases:  # batch_size 3 → 8 rows per forward: one batch of one bucket
        score = reward_model(
            checkpoint=path, tokenizer="byte", batch_size=3, mesh=mesh, dtype=dtype
        )
        assert dict(score.mesh.shape) == (
            {"data": 1, "fsdp": 8, "tensor": 1} if mesh is None else dict(score.mesh.shape)
        )
        if mesh != {"data": -1}:  # the weights are split (259 rows of embeddings stay whole
            check_replication(score.state, max_replicated_fraction=0.15)  # over `tensor`)
        got = score(prompts, completions)
        tol = 2e-2 if dtype == "bfloat16" else 1e-5
        np.testing.assert_allclose(got, reference, atol=tol, rtol=tol, err_msg=f"{mesh} {dtype}")
    try:
        reward_model(checkpoint=path, tokenizer="byte", mesh={"data": 3})
    except ValueError as err:
        assert "does not fit this process's 8 devices" in str(err), err
    else:
        raise AssertionError("a mesh of 3 devices was accepted on 8")


def main() -> None:
    assert jax.device_count() == 8, f"expected 8 devices, got {jax.device_count()}"
    check_shard()
    check_batches()
    check_optimizer_state()
    check_params()
    check_cache()
    check_in_graph_reward()
    check_reward_model()
    print("multidevice: ok")


if __name__ == "__main__":
    main()
