"""A small but complete train state (tiny Decoder, adamw moments, typed key, KL state) and checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import losses
from jaxrl_llm.models import Decoder, ModelConfig
from jaxrl_llm.train.state import TrainState, init_train_state

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
OPTIMIZER = optax.adamw(1e-2)


def decoder_params(seed: int, cfg: ModelConfig = CFG) -> nnx.State:
    """The Decoder's `nnx.Param` state with N(0, 0.02²) weights drawn on the host (fast)."""
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    state = nnx.state(abstract, nnx.Param)
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda a: jnp.asarray(0.02 * rng.standard_normal(a.shape), a.dtype), state)


def make_state(seed: int = 0, cfg: ModelConfig = CFG, *, impl: str = "threefry2x32") -> TrainState:
    """A TrainState with a Decoder policy, a frozen copy as reference, adamw, β = 0.05."""
    params = {"policy": decoder_params(seed, cfg)}
    frozen = {"policy": decoder_params(seed + 100, cfg)}  # a reference to pull towards
    kl = losses.KLControllerState(beta=jnp.float32(0.05))
    key = jax.random.key(seed, impl=impl)
    return init_train_state(params, frozen, OPTIMIZER, key=key, kl=kl)


def _loss(params, frozen, key):
    """Σ (p − r)² over the leaves, each weighted by a random factor drawn from `key`."""
    pairs = jax.tree.leaves(jax.tree.map(lambda p, r: jnp.sum((p - r) ** 2), params, frozen))
    weights = 1.0 + 0.5 * jax.random.uniform(key, (len(pairs),))
    return jnp.dot(jnp.stack(pairs), weights)


@jax.jit
def train_step(state: TrainState) -> TrainState:
    """One deterministic update that consumes the key (so a resumed run must restore it)."""
    key, sub = jax.random.split(state.key)
    grads = jax.grad(_loss)(state.params, state.frozen, sub)
    updates, opt_state = OPTIMIZER.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return state._replace(step=state.step + 1, params=params, opt_state=opt_state, key=key)


def leaf_bytes(leaf) -> tuple[str, tuple[int, ...], bytes]:
    """dtype name, shape and raw bytes of a leaf (typed keys: impl name and key data)."""
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        data = np.asarray(jax.random.key_data(leaf))
        return f"key:{jax.random.key_impl(leaf)}", leaf.shape, data.tobytes()
    value = np.asarray(leaf)
    return str(value.dtype), value.shape, value.tobytes()


def assert_bitwise_equal(got, expected) -> None:
    """Same tree structure, and every leaf has the same dtype, shape and bytes."""
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected)
    got_leaves = jax.tree_util.tree_flatten_with_path(got)[0]
    for (path, a), b in zip(got_leaves, jax.tree.leaves(expected), strict=True):
        assert leaf_bytes(a) == leaf_bytes(b), jax.tree_util.keystr(path)
