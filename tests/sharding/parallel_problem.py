"""One tiny GRPO problem shared by the multi-device and multi-process update-step tests.

A one-layer Qwen3-style decoder (width 32, 4 query / 2 KV heads, MLP 64, vocabulary 64: sizes
that split over 8 devices), host-drawn weights, and one fixed batch of `N = 32` rows (8 prompts
× 4 samples) with old-policy log-probs of the initial weights and reference log-probs of a
second model (so the KL term and the adaptive KL controller see a non-zero KL). The algorithm
is the GRPO preset with 2 epochs × 2 minibatches (shuffled) × 2 accumulation steps and an
adaptive KL target, so the checks cover the global row permutation, `optax.MultiSteps`, the
global normalisers and the controller's global `N`.

Everything is deterministic, so every process of a multi-process job builds the same batch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl_llm.models import Decoder
from jaxrl_llm.parallel import param_shardings
from jaxrl_llm.sampler import SamplingConfig, jit_sample_tokens, left_pad
from jaxrl_llm.train import (
    KLConfig,
    OptimConfig,
    batch_sharding,
    build_rl_batch,
    init_train_state,
    kl_controller,
    make_logprob_fn,
    make_optimizer,
    make_update_step,
    preset,
    rl_objective,
    split_models,
)
from sharding import MeshConfig, make_mesh
from tests.train.helpers import sequences, tiny_config

# Float32 parameters, Adam moments, β and metrics after the steps agree with one device within
# this (max abs difference; measured: see docs/scaling.md). The differences come only from the
# order of float additions in the sharded reductions.
TOLERANCE = 1e-5
STEPS = 3
B, G, P, T = 8, 4, 5, 4
LARGE = 512  # matrices with at least this many elements must be split over fsdp · tensor
LARGE_MATRICES = 9  # embed, lm_head, q, k, v, o, gate, up, down
CONFIG = tiny_config(vocab=64, layers=1)
ALGORITHM = dataclasses.replace(
    preset("grpo"),
    epochs=2,
    minibatches=2,
    kl=KLConfig(mode="loss", coef=0.04, estimator="k3", target=0.01, horizon=64.0),
)
ACCUMULATION = 2
OPTIMIZER = make_optimizer(
    OptimConfig(
        name="adamw", learning_rate=3e-3, max_grad_norm=1.0, accumulation_steps=ACCUMULATION
    )
)
SCHEDULE = {
    "epochs": ALGORITHM.epochs,
    "minibatches": ALGORITHM.minibatches,
    "accumulation_steps": ACCUMULATION,
    "shuffle": ALGORITHM.shuffle,
    "kl_controller": kl_controller(ALGORITHM.kl),
}


@functools.cache
def _host_weights(seed: int) -> tuple[nnx.GraphDef, dict]:
    """N(0, 0.1²) weights drawn with NumPy (eager init on 8 devices is slow), norms at 1."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(CONFIG, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)

    def draw(path, x):
        if "norm" in jax.tree_util.keystr(path):
            return np.ones(x.shape, x.dtype)
        return (0.1 * rng.standard_normal(x.shape)).astype(x.dtype)

    return graphdef, jax.tree_util.tree_map_with_path(draw, nnx.to_pure_dict(state))


def model(seed: int = 0) -> Decoder:
    graphdef, weights = _host_weights(seed)
    state = nnx.state(nnx.eval_shape(lambda: Decoder(CONFIG, rngs=nnx.Rngs(0))))
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, weights))
    return nnx.merge(graphdef, state)


@functools.cache
def _graphs():
    return split_models(model(0))[0]


def initial_state():
    """A fresh `TrainState` (on the default device) of the seed-0 model."""
    _, params, frozen = split_models(model(0))
    return init_train_state(
        params, frozen, OPTIMIZER, key=jax.random.key(7), kl=SCHEDULE["kl_controller"].init()
    )


def objective():
    return rl_objective(ALGORITHM, _graphs())


def batch():
    """The fixed `RLBatch` as host NumPy arrays (every process builds the same one)."""
    seqs = sequences(jax.random.key(1), B * G, P, T, vocab=CONFIG.vocab_size)
    logprob = make_logprob_fn(_graphs().policy)
    _, params, frozen = split_models(model(0))
    _, ref_params, ref_frozen = split_models(model(1))
    old = logprob(params["policy"], frozen["policy"], seqs)
    ref = logprob(ref_params["policy"], ref_frozen["policy"], seqs)
    rewards = jnp.asarray(np.random.default_rng(2).integers(0, 3, B * G) / 2.0, jnp.float32)
    build = jax.jit(functools.partial(build_rl_batch, ALGORITHM, group_size=G))
    rl_batch, _ = build(
        tokens=seqs.tokens,
        attention_mask=seqs.attention_mask,
        completion_mask=seqs.completion_mask,
        rewards=rewards,
        old_logp=old,
        ref_logp=ref,
        kl_coef=ALGORITHM.kl.coef,
    )
    return jax.tree.map(np.asarray, rl_batch)


def rows_on(mesh) -> NamedSharding:
    return batch_sharding(mesh)


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def adam_moments(opt_state):
    """Adam's first moments (a tree like the parameters) inside the optimizer state."""
    return optax.tree.get(opt_state, "mu")


def train(step, state, placed_batch, steps: int = STEPS):
    """`steps` updates on the same batch; the metrics of each step as Python floats."""
    history = []
    for _ in range(steps):
        state, metrics = step(state, placed_batch)
        history.append({k: float(to_host(v)) for k, v in metrics.items()})
    return state, history


def to_host(x) -> np.ndarray:
    """A (global) array as NumPy; gathered from every process in multi-process jobs."""
    if jax.process_count() > 1 and not x.is_fully_replicated:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    if jax.process_count() > 1:
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)


def summary(state, history) -> dict:
    """What the runs are compared on: parameters, Adam moments, β, metrics (NumPy / floats)."""
    return {
        "params": jax.tree.map(to_host, state.params),
        "mu": jax.tree.map(to_host, adam_moments(state.opt_state)),
        "beta": float(to_host(state.kl.beta)),
        "metrics": history,
    }


def reference_run(host_batch, steps: int = STEPS) -> dict:
    """The single-device run: `make_update_step` without a mesh."""
    step = make_update_step(objective(), OPTIMIZER, **SCHEDULE)
    return summary(*train(step, initial_state(), jax.tree.map(jnp.asarray, host_batch), steps))


def _max_abs(a, b) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def differences(state, history, reference: dict) -> dict[str, float]:
    """Max abs differences to the reference (metrics: relative to max(1, |value|)); raises if
    any exceeds `TOLERANCE`."""
    return compare(summary(state, history), reference)


def compare(got: dict, reference: dict) -> dict[str, float]:
    """`differences` between two `summary` dicts."""
    assert [sorted(m) for m in got["metrics"]] == [sorted(m) for m in reference["metrics"]]
    diffs = {
        "params": _max_abs(got["params"], reference["params"]),
        "mu": _max_abs(got["mu"], reference["mu"]),
        "beta": abs(got["beta"] - reference["beta"]),
        "metrics": max(
            abs(m[k] - r[k]) / max(1.0, abs(r[k]))
            for m, r in zip(got["metrics"], reference["metrics"], strict=True)
            for k in r
        ),
        "params_moved": _max_abs(got["params"], jax.tree.map(np.asarray, initial_params())),
    }
    bad = {k: v for k, v in diffs.items() if k != "params_moved" and not v <= TOLERANCE}
    assert not bad, f"differences above {TOLERANCE}: {bad}"
    assert diffs["params_moved"] > 100 * TOLERANCE, diffs  # the steps did change the weights
    assert reference["beta"] != ALGORITHM.kl.coef  # the adaptive controller moved β
    return diffs


def initial_params():
    return split_models(model(0))[1]


def sample(sizes: tuple[int, int, int] | None) -> dict[str, np.ndarray]:
    """Tokens, lengths and log-probs of the compiled sampler on one device (None) or on the
    (data, fsdp, tensor) mesh `sizes` (automatic axes) with the parameters placed by their
    logical axes and the prompts over the batch axes."""
    graphdef, state = nnx.split(model(0))
    prompts = [[1 + (3 * i + j) % 60 for j in range(1 + i % 5)] for i in range(B)]
    tokens, mask = left_pad(prompts, length=P, pad_id=0)
    config = SamplingConfig(max_new_tokens=6, num_samples=2, temperature=1.0, stop_tokens=(0,))
    key = jax.random.key(5)
    if sizes is None:
        out = jit_sample_tokens(graphdef, state, tokens, mask, key, config=config)
    else:
        data, fsdp, tensor = sizes
        mesh = make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor, axis_types="auto"))
        state = jax.device_put(state, param_shardings(state, mesh))
        rows = rows_on(mesh)
        with jax.set_mesh(mesh):
            out = jit_sample_tokens(
                graphdef,
                state,
                jax.device_put(tokens, rows),
                jax.device_put(mask, rows),
                key,
                config=config,
            )
    return {
        "tokens": np.asarray(out.tokens),
        "lengths": np.asarray(out.lengths),
        "logprobs": np.asarray(out.logprobs),
    }
