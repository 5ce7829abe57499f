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
        ({"critic_learning_rate": 0.0}, "`critic_learning_rate` must be > 0 or null"),
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


def _ppo_tree(policy, value):
    return {"policy": {"w": jnp.asarray(policy, jnp.float32)}, "value": {"v": jnp.asarray(value)}}


CRITIC_CASES = [
    OptimConfig(
        name="adamw",
        learning_rate=1e-2,
        critic_learning_rate=5e-2,
        weight_decay=0.1,
        schedule="cosine",
        warmup_steps=2,
        total_steps=6,
        final_lr_ratio=0.1,
        max_grad_norm=1.0,
    ),
    OptimConfig(name="sgd", learning_rate=0.1, critic_learning_rate=0.02, momentum=0.9),
    OptimConfig(name="lion", learning_rate=1e-3, critic_learning_rate=3e-3, weight_decay=0.5),
    OptimConfig(name="adamw", learning_rate=1e-2, critic_learning_rate=2e-2, accumulation_steps=2),
]


@pytest.mark.parametrize("cfg", CRITIC_CASES, ids=lambda c: f"{c.name}-k{c.accumulation_steps}")
def test_a_critic_learning_rate_steps_each_subtree_as_its_own_optimizer(cfg):
    """Policy and critic under one optimizer with `critic_learning_rate` = two optimizers: the
    policy's config on the policy alone, and the same config at the critic's rate on the critic
    alone (each clipped by its own norm). The critic's gradient is 40× the policy's, so a joint
    clip would shrink the policy's step; here the policy's updates do not see it."""
    import dataclasses

    policy_only = dataclasses.replace(cfg, critic_learning_rate=None)
    critic_only = dataclasses.replace(
        cfg, critic_learning_rate=None, learning_rate=cfg.critic_learning_rate
    )
    joint, alone_p, alone_v = (make_optimizer(c) for c in (cfg, policy_only, critic_only))
    params = _ppo_tree([0.5, -1.0, 2.0], [1.0, -3.0])
    p, v = params["policy"], params["value"]
    state, state_p, state_v = joint.init(params), alone_p.init(p), alone_v.init(v)
    rng = np.random.default_rng(0)
    for _ in range(6):
        grads = _ppo_tree(rng.normal(size=3), 40.0 * rng.normal(size=2))
        updates, state = joint.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        up, state_p = alone_p.update(grads["policy"], state_p, p)
        uv, state_v = alone_v.update(grads["value"], state_v, v)
        p, v = optax.apply_updates(p, up), optax.apply_updates(v, uv)
        np.testing.assert_allclose(params["policy"]["w"], p["w"], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(params["value"]["v"], v["v"], rtol=1e-6, atol=1e-7)
    moved = np.abs(np.asarray(params["value"]["v"]) - np.array([1.0, -3.0]))
    assert moved.min() > 1e-4  # the critic trained
    # the scheduled (policy's) rate is what learning_rate(state) reports
    assert float(learning_rate(state)) == pytest.approx(float(learning_rate(state_p)))


def test_without_a_critic_learning_rate_one_clip_covers_policy_and_critic():
    """The default (TRL's form): the joint norm clips both, so a large critic gradient shrinks
    the policy's SGD step; with `critic_learning_rate` set the policy's step is untouched."""
    grads = _ppo_tree([0.3, 0.4, 0.0], [30.0, 40.0])
    params = _ppo_tree([0.0, 0.0, 0.0], [0.0, 0.0])
    shared = make_optimizer(OptimConfig(name="sgd", learning_rate=1.0, max_grad_norm=1.0))
    own = make_optimizer(
        OptimConfig(name="sgd", learning_rate=1.0, critic_learning_rate=1.0, max_grad_norm=1.0)
    )
    u_shared, _ = shared.update(grads, shared.init(params), params)
    u_own, _ = own.update(grads, own.init(params), params)
    norm = math.hypot(0.3, 0.4, 30.0, 40.0)
    np.testing.assert_allclose(u_shared["policy"]["w"], [-0.3 / norm, -0.4 / norm, 0.0], rtol=1e-6)
    np.testing.assert_allclose(u_own["policy"]["w"], [-0.3, -0.4, 0.0], rtol=1e-6)
    np.testing.assert_allclose(u_own["value"]["v"], [-0.6, -0.8], rtol=1e-6)


def test_a_critic_learning_rate_keeps_the_optimizer_state_layout():
    """The state has the same tree with and without the setting, so checkpoints of a PPO run
    resume under either."""
    params = _ppo_tree([1.0, 2.0, 3.0], [4.0, 5.0])
    for base in (OptimConfig(weight_decay=0.1), OptimConfig(accumulation_steps=3)):
        with_critic = OptimConfig(**{**vars(base), "critic_learning_rate": 1e-4})
        plain = jax.tree.structure(make_optimizer(base).init(params))
        assert jax.tree.structure(make_optimizer(with_critic).init(params)) == plain


def test_a_critic_learning_rate_state_is_placed_as_without_it():
    """`train_state_shardings` walks the optimizer state with optax's `map_params`, which calls
    `init` on a placeholder instead of the parameters (the run's first resume of a PPO run with
    the setting once failed there)."""
    params, frozen = split_models(tiny_policy(), tiny_critic("model"))[1:]
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    specs = []
    for critic_lr in (None, 1e-3):
        tx = make_optimizer(OptimConfig(critic_learning_rate=critic_lr))
        state = init_train_state(params, frozen, tx, key=jax.random.key(0))
        shardings = train_state_shardings(state, mesh, tx)
        place_global(state, shardings)
        specs.append([s.spec for s in jax.tree.leaves(shardings.opt_state)])
    assert specs[0] == specs[1]


def test_a_critic_learning_rate_needs_a_critic_in_the_parameters():
    tx = make_optimizer(OptimConfig(critic_learning_rate=1e-4))
    with pytest.raises(ValueError, match="hold no critic"):
        tx.init({"policy": {"w": jnp.ones(2)}})
    with pytest.raises(ValueError, match="hold no critic"):
        tx.init({"w": jnp.ones(2)})
