"""OptimConfig → optax: schedules, decay mask, clipping, accumulation, every optimizer, errors."""

from __future__ import annotations

import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from jaxrl_llm.config import ConfigError, build, load_yaml
from jaxrl_llm.models import Decoder, ModelConfig
from jaxrl_llm.train import (
    OPTIMIZERS,
    OptimConfig,
    init_train_state,
    learning_rate,
    make_optimizer,
    make_schedule,
    split_models,
    weight_decay_mask,
)
from jaxrl_llm.train.params import param_path
from jaxrl_llm.train.shardings import train_state_shardings
from sharding import MeshConfig, make_mesh, place_global
from tests.train.helpers import tiny_critic, tiny_policy

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def _schedule_values(cfg: OptimConfig, steps: list[int]) -> list[float]:
    sched = make_schedule(cfg)
    return [float(sched(s)) for s in steps]


def test_constant_schedule_with_warmup():
    cfg = OptimConfig(learning_rate=2e-3, warmup_steps=4)
    steps = [0, 1, 2, 4, 5, 100]
    expected = [2e-3 * min(1.0, s / 4) for s in steps]
    np.testing.assert_allclose(_schedule_values(cfg, steps), expected, rtol=1e-6)
    assert _schedule_values(OptimConfig(learning_rate=0.5), [0, 7]) == [0.5, 0.5]


def test_linear_schedule_warmup_then_decay_to_final_ratio():
    lr, w, total, r = 1e-3, 10, 50, 0.1
    cfg = OptimConfig(
        learning_rate=lr, schedule="linear", warmup_steps=w, total_steps=total, final_lr_ratio=r
    )
    steps = [0, 5, 10, 20, 30, 50, 60]

    def formula(s: int) -> float:
        if s < w:
            return lr * s / w
        frac = min(s - w, total - w) / (total - w)
        return lr + (lr * r - lr) * frac

    np.testing.assert_allclose(_schedule_values(cfg, steps), [formula(s) for s in steps], rtol=1e-5)


def test_cosine_schedule_matches_formula():
    lr, w, total, r = 3e-4, 5, 45, 0.2
    cfg = OptimConfig(
        learning_rate=lr, schedule="cosine", warmup_steps=w, total_steps=total, final_lr_ratio=r
    )
    steps = [0, 2, 5, 15, 25, 35, 45, 80]

    def formula(s: int) -> float:
        if s < w:
            return lr * s / w
        frac = min(s - w, total - w) / (total - w)
        return lr * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * frac)))

    np.testing.assert_allclose(_schedule_values(cfg, steps), [formula(s) for s in steps], rtol=1e-5)


def test_learning_rate_reports_the_rate_of_the_last_update():
    cfg = OptimConfig(
        name="sgd",
        learning_rate=1.0,
        schedule="linear",
        warmup_steps=2,
        total_steps=6,
        max_grad_norm=None,
    )
    tx = make_optimizer(cfg)
    params = {"w": jnp.zeros(())}
    state = tx.init(params)
    seen = []
    for _ in range(4):
        updates, state = tx.update({"w": jnp.ones(())}, state, params)
        seen.append((float(-updates["w"]), float(learning_rate(state))))
    assert seen == [(0.0, 0.0), (0.5, 0.5), (1.0, 1.0), (0.75, 0.75)]


def test_weight_decay_mask_skips_norms_and_biases_of_a_real_model():
    # qwen2 has q/k/v biases; qwen3 adds QK-norm scales; the value model adds a head
    for family in ("qwen2", "qwen3"):
        _, params, _ = split_models(tiny_policy(family=family), tiny_critic("model", family=family))
        mask = weight_decay_mask(params)
        flat = {param_path(p): m for p, m in jax.tree_util.tree_leaves_with_path(mask)}
        skipped = {name for name, decay in flat.items() if not decay}
        decayed = {name for name, decay in flat.items() if decay}
        assert skipped == {n for n in flat if "norm" in n or "bias" in n}
        assert "policy.final_norm.scale" in skipped
        assert "policy.layers.attn_norm.scale" in skipped
        assert {"policy.embed", "policy.layers.attn.q", "policy.layers.mlp.down"} <= decayed
        assert "value.head.kernel" in decayed
        if family == "qwen2":
            assert "policy.layers.attn.q_bias" in skipped
        else:
            assert "policy.layers.attn.q_norm.scale" in skipped


def test_decoupled_weight_decay_applies_only_where_the_mask_says():
    lr, wd = 0.1, 0.5
    params = {
        "attn": {"q": jnp.full((2,), 2.0), "q_bias": jnp.full((2,), 2.0)},
        "norm": {"scale": jnp.full((2,), 2.0)},
    }
    zeros = jax.tree.map(jnp.zeros_like, params)
    for name in ("adamw", "lion", "nadamw", "adafactor"):
        tx = make_optimizer(
            OptimConfig(name=name, learning_rate=lr, weight_decay=wd, max_grad_norm=None)
        )
        updates, _ = tx.update(zeros, tx.init(params), params)
        # AdamW-style p ← p − lr·wd·p; optax's adafactor adds wd·p after the lr scaling
        expected_q = -wd * 2.0 if name == "adafactor" else -lr * wd * 2.0
        np.testing.assert_allclose(updates["attn"]["q"], expected_q, rtol=1e-5, err_msg=name)
        np.testing.assert_array_equal(updates["attn"]["q_bias"], 0.0, err_msg=name)
        np.testing.assert_array_equal(updates["norm"]["scale"], 0.0, err_msg=name)


def test_clip_by_global_norm_is_applied_before_the_optimizer():
    tx = make_optimizer(OptimConfig(name="sgd", learning_rate=1.0, max_grad_norm=2.0))
    params = {"a": jnp.zeros(2), "b": jnp.zeros(1)}
    grads = {"a": jnp.array([3.0, 0.0]), "b": jnp.array([4.0])}  # norm 5
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(updates["a"], [-1.2, 0.0], rtol=1e-6)
    np.testing.assert_allclose(updates["b"], [-1.6], rtol=1e-6)


def test_multisteps_accumulation_applies_the_mean_every_k_steps():
    k = 3
    tx = make_optimizer(
        OptimConfig(name="sgd", learning_rate=1.0, max_grad_norm=None, accumulation_steps=k)
    )
    assert isinstance(tx.init({"w": jnp.zeros(2)}), optax.MultiStepsState)
    params = {"w": jnp.zeros(2)}
    state = tx.init(params)
    grads = [jnp.array([1.0, 2.0]), jnp.array([3.0, -2.0]), jnp.array([2.0, 3.0])]
    outs = []
    for g in grads:
        updates, state = tx.update({"w": g}, state, params)
        outs.append(np.asarray(updates["w"]))
    np.testing.assert_array_equal(outs[0], 0.0)
    np.testing.assert_array_equal(outs[1], 0.0)
    np.testing.assert_allclose(outs[2], -np.mean(np.stack(grads), axis=0), rtol=1e-6)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_minimises_a_quadratic(name):
    target = jnp.array([1.0, -2.0, 0.5])
    tx = make_optimizer(OptimConfig(name=name, learning_rate=0.05, max_grad_norm=None))
    params = {"w": jnp.ones(3)}  # away from 0: adafactor scales steps by the parameters' rms

    def loss(p):
        return jnp.sum((p["w"] - target) ** 2)

    @jax.jit
    def run(p):
        def body(carry, _):
            p, s = carry
            u, s = tx.update(jax.grad(loss)(p), s, p)
            return (optax.apply_updates(p, u), s), None

        (p, _), _ = jax.lax.scan(body, (p, tx.init(p)), None, length=40)
        return p

    assert float(loss(run(params))) < 0.9 * float(loss(params))


@pytest.mark.parametrize("name", ["adamw", "adafactor"])
def test_the_optimizer_state_is_placed_like_the_parameters_it_mirrors(name):
    """Adam's moments are copies of the parameters and take their shardings; Adafactor's
    factored statistics (`[L, rows]`, `[L, cols]`, `(1,)`) have other shapes and are replicated
    (they once took the rank-3 specs of their weights, and placing the state failed)."""
    tx = make_optimizer(OptimConfig(name=name, learning_rate=1e-3))
    config = ModelConfig(  # width and MLP >= 128: Adafactor factors their weights
        family="qwen3", vocab_size=64, hidden_size=128, intermediate_size=256, num_layers=1,
        num_heads=2, num_kv_heads=1, head_dim=8,
    )  # fmt: skip
    params, frozen = split_models(Decoder(config, rngs=nnx.Rngs(0)))[1:]
    state = init_train_state(params, frozen, tx, key=jax.random.key(0))
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    shardings = train_state_shardings(state, mesh, tx)
    placed = place_global(state, shardings)
    leaves = jax.tree.leaves(placed.opt_state)
    specs = [s.spec for s in jax.tree.leaves(shardings.opt_state)]
    assert all(len(p) <= x.ndim for x, p in zip(leaves, specs, strict=True))
    param_specs = {s.spec for s in jax.tree.leaves(shardings.params)}
    if name == "adamw":  # `mu` and `nu` of every weight, with its spec
        assert set(specs) - {PartitionSpec()} == param_specs
    else:  # the row and column statistics of the factored weights ([L, rows]...) replicated
        assert any(p == PartitionSpec() and x.ndim >= 2 for x, p in zip(leaves, specs, strict=True))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "adam", "weight_decay": 0.1}, "needs an optimizer with decoupled weight decay"),
        ({"name": "sgd", "b1": 0.9}, "optax.sgd takes no `b1`"),
        ({"learning_rate": 0.0}, "`learning_rate` must be > 0"),
        ({"schedule": "cosine"}, "needs `total_steps` > warmup_steps"),
        ({"schedule": "linear", "warmup_steps": 10, "total_steps": 10}, "needs `total_steps`"),
        ({"total_steps": 100}, "are for the 'linear' and 'cosine' schedules"),
        ({"accumulation_steps": 0}, "`accumulation_steps` must be >= 1"),
        ({"b1": 1.5}, "`b1` must lie in [0, 1), got 1.5"),
        ({"name": "sgd", "momentum": -0.1}, "`momentum` must lie in [0, 1), got -0.1"),
        ({"eps": -1e-8}, "`eps` must be >= 0, got -1e-08"),
        ({"max_grad_norm": 0.0}, "`max_grad_norm` must be > 0"),
        (
            {"final_lr_ratio": 1.5, "schedule": "linear", "total_steps": 5},
            "`final_lr_ratio` must lie in [0, 1]",
        ),
        ({"weight_decay_exclude": ("(",)}, "is not a valid regex"),
    ],
)
def test_bad_configs_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=None) as info:
        OptimConfig(**kwargs)
    assert message in str(info.value)


def test_yaml_rejects_unknown_optimizer_and_keys():
    with pytest.raises(ConfigError, match="name: must be one of"):
        build(OptimConfig, {"name": "adamm"})
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        build(OptimConfig, {"learning_rat": 1e-3})


def test_every_config_file_has_a_loadable_optim_section():
    files = sorted(CONFIGS.glob("*.yaml"))
    loaded = 0
    for path in files:
        data = load_yaml(path)
        if "optim" in data:
            cfg = build(OptimConfig, data["optim"], path="optim")
            make_optimizer(cfg)
            loaded += 1
    assert loaded >= 11
