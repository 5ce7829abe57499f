"""The model's sharding helpers in-process: no mesh, and one-device Explicit / Auto meshes.

The 8-device comparisons are in `test_explicit_mesh.py`; here the same code paths run on a
1-device mesh, where every layout is trivially valid, so the types (`jax.typeof`) and the
values can be checked cheaply.
"""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

import losses
from jaxrl_llm.models import Decoder, ModelConfig
from jaxrl_llm.models._sharded_ops import (
    compute_layout,
    compute_weight,
    einsum,
    own_names,
    reshape,
    take_rows,
)
from jaxrl_llm.models.layers import make_param
from jaxrl_llm.parallel import param_shardings
from sharding import MeshConfig, make_mesh, shard

ROWS = ("data", "fsdp")
CFG = ModelConfig(
    family="qwen3",
    vocab_size=11,
    hidden_size=8,
    intermediate_size=12,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=4,
)


def one_device_mesh(axis_types: str):
    return make_mesh(MeshConfig(axis_types=axis_types), devices=jax.devices()[:1])


def test_without_a_mesh_the_ops_are_the_plain_ones():
    x = jax.random.normal(jax.random.key(0), (2, 3, 4))
    w = jax.random.normal(jax.random.key(1), (4, 5))
    names = ("batch", "length", "mlp")
    np.testing.assert_array_equal(einsum("nsd,df->nsf", x, w, names=names), x @ w)
    table, ids = jnp.arange(12.0).reshape(4, 3), jnp.array([[3, 0], [1, 1]])
    np.testing.assert_array_equal(take_rows(table, ids, (*names[:2], "embed")), table[ids])
    np.testing.assert_array_equal(
        reshape(x, (2, 3, 2, 2), ("batch", "length", "kv_heads", None)), x.reshape(2, 3, 2, 2)
    )
    param = make_param(jax.random.key(2), (4, 5), ("embed", "mlp"), jnp.float32, "normal")
    assert compute_weight(param, jnp.bfloat16).dtype == jnp.bfloat16
    state = nnx.state(nnx.eval_shape(lambda: Decoder(CFG, rngs=nnx.Rngs(0))))
    assert compute_layout(state) is state


def test_einsum_rejects_an_ellipsis():
    with pytest.raises(ValueError, match="no ellipsis"):
        einsum("...d,df->...f", jnp.ones((2, 4)), jnp.ones((4, 5)), names=("batch", "mlp"))


def test_own_names_are_the_trailing_names_of_a_stacked_parameter():
    q = nnx.eval_shape(lambda: Decoder(CFG, rngs=nnx.Rngs(0))).layers.attn.q
    assert own_names(q, 4) == ("layers", "embed", "heads", "head_dim")
    assert own_names(q, 3) == ("embed", "heads", "head_dim")  # one layer of the scan
    with pytest.raises(ValueError, match="rank 5"):
        own_names(q, 5)


def test_explicit_mesh_types_follow_the_logical_names():
    mesh = one_device_mesh("explicit")
    param = make_param(jax.random.key(0), (8, 12), ("embed", "mlp"), jnp.float32, "normal")
    x = jax.random.normal(jax.random.key(1), (2, 3, 8))

    def f(x):
        w = compute_weight(param, jnp.float32)
        hidden = einsum("nsd,df->nsf", x, w, names=("batch", "length", "mlp"))
        return w, hidden, reshape(hidden, (2, 3, 4, 3), ("batch", "length", "heads", None))

    with jax.set_mesh(mesh):
        w, hidden, heads = jax.jit(f)(x)
    types = [a.sharding.spec for a in (w, hidden, heads)]
    assert types[0] == PartitionSpec(None, "tensor")  # fsdp gathered, tensor kept
    assert types[1] == PartitionSpec(ROWS, None, "tensor")
    assert types[2] == PartitionSpec(ROWS, None, "tensor", None)
    np.testing.assert_allclose(hidden, x @ param[...], atol=1e-6)
    np.testing.assert_allclose(heads, (x @ param[...]).reshape(2, 3, 4, 3), atol=1e-6)


@pytest.fixture(scope="module")
def decoder_case():
    """A decoder's state, a forward + cached-decode function of it and its no-mesh logits."""
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Decoder(CFG, rngs=nnx.Rngs(0))))
    state = jax.jit(lambda: nnx.state(Decoder(CFG, rngs=nnx.Rngs(0))))()  # one compile, not eager
    tokens = jax.random.randint(jax.random.key(3), (2, 5), 0, CFG.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(5), (2, 5))

    def forward_and_decode(state):
        model = nnx.merge(graphdef, state)
        logits = model(tokens, positions)
        cache = model.init_cache(batch=2, max_len=5)
        head, cache = model.decode(tokens[:, :3], positions[:, :3], cache)
        tail, _ = model.decode(tokens[:, 3:], positions[:, 3:], cache)
        return logits, jnp.concatenate([head, tail], axis=1)

    want, _ = jax.jit(forward_and_decode)(state)
    return graphdef, state, forward_and_decode, want


@pytest.mark.parametrize("axis_types", ["explicit", "auto"])
def test_decoder_on_a_one_device_mesh_equals_no_mesh(decoder_case, axis_types):
    _, state, forward_and_decode, want = decoder_case
    with jax.set_mesh(one_device_mesh(axis_types)):
        logits, decoded = jax.jit(forward_and_decode)(state)
    np.testing.assert_allclose(logits, want, atol=1e-5)
    np.testing.assert_allclose(decoded, want, atol=1e-5)
    if axis_types == "explicit":
        assert jax.typeof(logits).sharding.spec == PartitionSpec(ROWS, None, "tensor")


def _dot_shapes(jaxpr: jax.extend.core.Jaxpr) -> list[tuple[tuple[int, ...], ...]]:
    """The operand shapes of every `dot_general` in `jaxpr`, sub-jaxprs (scan, remat) included."""
    shapes = [
        tuple(tuple(v.aval.shape) for v in eqn.invars)
        for eqn in jaxpr.eqns
        if eqn.primitive.name == "dot_general"
    ]
    for sub in jax.extend.core.subjaxprs(jaxpr):
        shapes += _dot_shapes(sub)
    return shapes


@pytest.mark.parametrize("axis_types", ["explicit", "auto"])
def test_a_one_device_mesh_builds_the_plain_program(decoder_case, axis_types):
    """On one device the model takes the no-mesh forms (`plain_layout`): the same matmuls,
    2-D projections and heads-first attention, not the mesh's token-major einsums."""
    _, state, forward_and_decode, _ = decoder_case
    plain = _dot_shapes(jax.make_jaxpr(forward_and_decode)(state).jaxpr)
    with jax.set_mesh(one_device_mesh(axis_types)):
        meshed = _dot_shapes(jax.make_jaxpr(forward_and_decode)(state).jaxpr)
    assert meshed == plain
    D, H, Hd = CFG.hidden_size, CFG.num_heads, CFG.head_dim
    assert ((10, D), (D, H * Hd)) in plain  # the query projection of 2 x 5 tokens, 2-D


def test_explicit_sharded_weights_without_a_mesh_context_fail_clearly(decoder_case):
    """Traced without `jax.set_mesh`, weights typed on an Explicit mesh are refused by name."""
    _, state, forward_and_decode, _ = decoder_case
    mesh = one_device_mesh("explicit")
    shardings = param_shardings(state, mesh)  # e.g. embed [V@tensor, D@fsdp]
    abstract = jax.tree.map(
        lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), state, shardings
    )
    with pytest.raises(ValueError, match=r"jax\.set_mesh\(mesh\)"):
        jax.jit(forward_and_decode).trace(abstract)  # a trace-time error: nothing compiles


def test_token_logprobs_of_vocabulary_split_logits_on_an_explicit_mesh():
    """The training log-prob of logits typed `[N@batch, T, V@tensor]` (the model's output).

    A gather along a split `V` is ambiguous under Explicit axes; `losses.token_logprobs` picks
    the target's logit by a one-hot masked sum there. Value and gradient against float64 NumPy:
    `lp = z'[y] − LSE(z')`, `∂(Σ w·lp)/∂z = w·(onehot(y) − softmax(z'))/τ`, `z' = z/τ`.
    """
    rng = np.random.default_rng(0)
    N, T, V, tau = 3, 5, 7, 0.5
    z = (2.0 * rng.normal(size=(N, T, V))).astype(np.float32)
    y = rng.integers(0, V, (N, T)).astype(np.int32)
    w = rng.normal(size=(N, T)).astype(np.float32)
    seen = []

    def objective(z):
        z = shard(z, ("batch", None, "vocab"))
        seen.append(jax.typeof(z).sharding.spec)
        lp = losses.token_logprobs(z, y, temperature=tau, chunk_size=2)
        return jnp.sum(w * lp), lp

    with jax.set_mesh(one_device_mesh("explicit")):
        (_, lp), grad = jax.jit(jax.value_and_grad(objective, has_aux=True))(z)
    assert seen[0] == PartitionSpec(ROWS, None, "tensor")

    zs = z.astype(np.float64) / tau
    zs = zs - zs.max(axis=-1, keepdims=True)
    log_softmax = zs - np.log(np.exp(zs).sum(axis=-1, keepdims=True))
    onehot = np.eye(V)[y]
    want_lp = np.take_along_axis(log_softmax, y[..., None], axis=-1)[..., 0]
    want_grad = w[..., None] * (onehot - np.exp(log_softmax)) / tau
    np.testing.assert_allclose(lp, want_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
