"""The compiled update step on a real tiny model: presets, accumulation, minibatches, freezing, mesh."""

from __future__ import annotations

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_llm.config import build, load_yaml
from jaxrl_llm.train import (
    PRESETS,
    AlgorithmConfig,
    OptimConfig,
    SFTConfig,
    build_rl_batch,
    count_normalizers,
    init_train_state,
    kl_controller,
    loss_and_grads,
    make_optimizer,
    make_update_step,
    preset,
    reference_params,
    rl_objective,
    sft_objective,
    split_models,
    train_state_shardings,
    update_step,
)
from sharding import MeshConfig, make_mesh
from tests.train.conftest import OPTIM
from tests.train.helpers import (
    UPDATE_LAYERS,
    sequences,
    tiny_critic,
    tiny_policy,
    tree_max_abs_diff,
)

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
G, P, T = 4, 5, 4
N = 2 * G
REWARDS = jnp.array([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 1.0, 1.0])  # group 2 has zero variance
COMMON_KEYS = {
    "loss/total",
    "loss/policy",
    "policy/approx_kl",
    "policy/ratio_mean",
    "policy/ratio_max",
    "entropy/mean",
    "optim/grad_norm",
    "optim/learning_rate",
    "kl/beta",
}


def _copy(tree):
    return jax.tree.map(lambda x: np.array(x), tree)


def fresh_state(algorithm, optimizer, *, seed=0, trainable=()):
    critic = None
    if algorithm.critic:
        critic = tiny_critic(algorithm.critic.kind, seed=seed + 1, layers=UPDATE_LAYERS)
    policy = tiny_policy(seed, layers=UPDATE_LAYERS)
    graphs, params, frozen = split_models(policy, critic, trainable=trainable)
    state = init_train_state(
        params, frozen, optimizer, key=jax.random.key(seed), kl=kl_controller(algorithm.kl).init()
    )
    return graphs, state


def prepare(algorithm, state, seqs, ref, logprob_fn, value_fn=None, rewards=REWARDS):
    old = logprob_fn(state.params["policy"], state.frozen["policy"], seqs)
    ref_logp = logprob_fn(ref, state.frozen["policy"], seqs)
    values = value_fn(state.params, state.frozen, seqs) if algorithm.critic else None
    # eager: its small ops are compiled once per shape and shared by every test
    batch, _ = build_rl_batch(
        algorithm,
        tokens=seqs.tokens,
        attention_mask=seqs.attention_mask,
        completion_mask=seqs.completion_mask,
        rewards=rewards,
        group_size=G,
        old_logp=old,
        ref_logp=ref_logp,
        old_values=values,
        kl_coef=state.kl.beta,
    )
    return batch


def _expected_keys(alg: AlgorithmConfig) -> set[str]:
    keys = set(COMMON_KEYS)
    if alg.policy_loss.name == "online_dpo":  # a preference loss: no ratio, DPO's metrics
        keys -= {"policy/approx_kl", "policy/ratio_mean", "policy/ratio_max"}
        keys |= {"pref/accuracy", "pref/margin"}
    if alg.policy_loss.name in ("ppo_clip", "gspo", "cispo", "gmpo"):
        keys |= {"policy/clip_frac", "policy/clip_frac_high", "policy/clip_frac_low"}
    if alg.kl.mode != "none":
        keys.add("kl/seq_k1")
    if alg.kl.mode == "loss":
        keys |= {"loss/kl", "kl/mean", "kl/max"}
    if alg.critic is not None:
        keys |= {"loss/value", "value/clip_frac", "value/mean"}
        keys |= {"optim/policy_grad_norm", "optim/value_grad_norm"}
    return keys


@pytest.mark.filterwarnings("ignore:gspo_loss")
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_trains(compiled, name):
    alg = preset(name)
    step = compiled.step(name)
    _, state = fresh_state(alg, compiled.optimizer)
    ref = reference_params(state.params)
    initial = _copy(state.params)
    value_fn = compiled.value_fn(alg.critic.kind) if alg.critic else None
    seqs = sequences(jax.random.key(1), N, P, T)
    betas = [float(state.kl.beta)]
    for i in range(3):
        batch = prepare(alg, state, seqs, ref, compiled.logprob_fn(), value_fn)
        state, metrics = step(state, batch)
        betas.append(float(state.kl.beta))
        assert _expected_keys(alg) <= set(metrics), sorted(_expected_keys(alg) - set(metrics))
        assert all(np.isfinite(float(v)) for v in metrics.values()), metrics
        if i == 0 and alg.epochs * alg.minibatches == 1 and alg.policy_loss.name != "online_dpo":
            # old log-probs from the same parameters (a separate jitted forward): the only
            # update sees ratio exactly 1 (bit-identical log-probs on CPU)
            assert float(metrics["policy/ratio_mean"]) == 1.0
            assert float(metrics["policy/ratio_max"]) == 1.0
            assert float(metrics["policy/approx_kl"]) == 0.0
    assert int(state.step) == 3
    changed = jax.tree.map(
        lambda a, b: float(np.max(np.abs(np.asarray(a) - b))), state.params, initial
    )
    assert min(jax.tree.leaves(changed)) > 0, changed
    assert betas == [pytest.approx(alg.kl.coef)] * 4  # fixed controllers keep β


def test_accumulation_equals_the_full_batch_on_the_adaptive_kl_value_head_variant(compiled):
    """`configs/ppo_value_head_adaptive_kl.yaml` (2 epochs × 2 minibatches, value head, adaptive
    k3 KL loss, entropy bonus), with its k = 2 micro-batches per update accumulated by
    optax.MultiSteps, equals the same algorithm without accumulation.

    SGD keeps the update linear in the gradient, so the parameters agree to float32 rounding
    (1e-5); Adam's first steps are ≈ lr·sign(g) and would amplify the rounding of near-zero
    gradients. The metrics, reduced as sums and counts, must equal the unaccumulated ones, and
    β must follow the adaptive controller.
    """
    data = load_yaml(CONFIGS / "ppo_value_head_adaptive_kl.yaml")
    alg = build(AlgorithmConfig, data["algorithm"])
    k = build(OptimConfig, data["optim"]).accumulation_steps
    assert k == 2 and alg.minibatches == 2 and alg.kl.target is not None
    results = []
    for steps_per_update in (1, k):
        optim = OptimConfig(
            name="sgd", learning_rate=0.05, max_grad_norm=None, accumulation_steps=steps_per_update
        )
        tx = make_optimizer(optim)
        graphs, state = fresh_state(alg, tx)
        ref = jax.tree.map(lambda x: x * 1.01, reference_params(state.params))  # KL ≠ 0
        step = make_update_step(
            rl_objective(alg, graphs),
            tx,
            epochs=alg.epochs,
            minibatches=alg.minibatches,
            accumulation_steps=steps_per_update,
            kl_controller=kl_controller(alg.kl),
        )
        for i in range(2):
            seqs = sequences(jax.random.key(7 + i), N, P, T)
            batch = prepare(alg, state, seqs, ref, compiled.logprob_fn(), compiled.value_fn("head"))
            beta = float(state.kl.beta)
            state, metrics = step(state, batch)
            e = np.clip(float(metrics["kl/seq_k1"]) / alg.kl.target - 1.0, -0.2, 0.2)
            np.testing.assert_allclose(
                float(state.kl.beta), beta * (1 + e * N / alg.kl.horizon), rtol=1e-6
            )
            assert _expected_keys(alg) | {"loss/entropy"} <= set(metrics)
        assert step._cache_size() == 1  # no recompilation across steps
        results.append((state, metrics))
    (full_state, full), (acc_state, acc) = results
    assert tree_max_abs_diff(full_state.params, acc_state.params) < 1e-5
    assert set(acc) == set(full)
    for key, value in full.items():
        np.testing.assert_allclose(float(acc[key]), float(value), rtol=1e-4, atol=1e-6, err_msg=key)


def test_a_critic_learning_rate_moves_the_critic_at_its_own_rate(compiled):
    """PPO with a separate `ValueModel`, one update: Adam's first step is lr·m̂/(√v̂ + ε) ≈
    lr·sign(g) per parameter, so with `critic_learning_rate` = 10× the policy's rate the critic
    moves 10× as far as without it, and the policy exactly as far. The step reports the norms
    of both parts of the gradient."""
    alg = dataclasses.replace(preset("ppo"), epochs=1)
    moved = []
    for critic_lr in (None, 1e-2):
        optim = OptimConfig(
            name="adamw", learning_rate=1e-3, critic_learning_rate=critic_lr, max_grad_norm=None
        )
        tx = make_optimizer(optim)
        graphs, state = fresh_state(alg, tx)
        start = _copy(state.params)
        seqs = sequences(jax.random.key(3), N, P, T)
        ref = reference_params(state.params)
        batch = prepare(alg, state, seqs, ref, compiled.logprob_fn(), compiled.value_fn("model"))
        step = make_update_step(rl_objective(alg, graphs), tx, kl_controller=kl_controller(alg.kl))
        state, metrics = step(state, batch)
        whole, parts = (
            float(metrics["optim/grad_norm"]),
            [float(metrics[f"optim/{k}_grad_norm"]) for k in ("policy", "value")],
        )
        np.testing.assert_allclose(whole, np.hypot(*parts), rtol=1e-5)
        assert min(parts) > 0
        moved.append(jax.tree.map(lambda a, b: np.asarray(a) - b, state.params, start))
    (plain, fast) = moved
    assert tree_max_abs_diff(plain["policy"], fast["policy"]) == 0.0
    value_plain = np.concatenate([x.ravel() for x in jax.tree.leaves(plain["value"])])
    value_fast = np.concatenate([x.ravel() for x in jax.tree.leaves(fast["value"])])
    assert np.abs(value_plain).max() > 5e-4
    np.testing.assert_allclose(value_fast, 10.0 * value_plain, rtol=1e-4, atol=1e-9)


def test_minibatches_are_sequential_updates_on_strided_rows(compiled):
    """minibatches=2, no shuffle: two SGD updates, on rows 0,2,4,… then 1,3,5,…, each with its own normalisers."""
    alg = dataclasses.replace(preset("dr_grpo"), minibatches=2, shuffle=False)
    optim = OptimConfig(name="sgd", learning_rate=0.5, max_grad_norm=None)
    tx = make_optimizer(optim)
    graphs, state = fresh_state(alg, tx)
    lp_fn = compiled.logprob_fn()
    batch = prepare(
        alg, state, sequences(jax.random.key(8), N, P, T), reference_params(state.params), lp_fn
    )
    objective = rl_objective(alg, graphs)
    grads_of = jax.jit(functools.partial(loss_and_grads, objective))
    params = _copy(state.params)
    for rows in (slice(0, None, 2), slice(1, None, 2)):
        micro = jax.tree.map(lambda x, rows=rows: x[rows], batch)
        grads, _, _ = grads_of(
            params, state.frozen, micro, count_normalizers(micro.completion_mask), 0.0
        )
        params = jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)
    step = make_update_step(objective, tx, minibatches=2, shuffle=False)
    new_state, metrics = step(state, batch)
    assert tree_max_abs_diff(new_state.params, params) < 1e-5
    assert float(metrics["policy/ratio_max"]) > 1.0  # the second minibatch sees moved parameters


def test_a_shuffled_epoch_takes_the_strided_rows_of_the_drawn_permutation(compiled):
    """minibatches=2 with shuffle: the rows are permuted by `update_unit_orders(state.key)`
    (the order packing must follow), then strided as without the shuffle; the result differs
    from the unshuffled update (mutation testing found the shuffle switch unobserved)."""
    from jaxrl_llm.train.update import update_unit_orders

    alg = dataclasses.replace(preset("dr_grpo"), minibatches=2, shuffle=True)
    optim = OptimConfig(name="sgd", learning_rate=0.5, max_grad_norm=None)
    tx = make_optimizer(optim)
    graphs, state = fresh_state(alg, tx)
    batch = prepare(
        alg,
        state,
        sequences(jax.random.key(8), N, P, T),
        reference_params(state.params),
        compiled.logprob_fn(),
    )
    objective = rl_objective(alg, graphs)
    grads_of = jax.jit(functools.partial(loss_and_grads, objective))
    order = np.asarray(update_unit_orders(state.key, epochs=1, units=N))[0]
    assert sorted(order.tolist()) == list(range(N)) and order.tolist() != list(range(N))
    params = _copy(state.params)
    for rows in (order[0::2], order[1::2]):
        micro = jax.tree.map(lambda x, rows=rows: x[rows], batch)
        grads, _, _ = grads_of(
            params, state.frozen, micro, count_normalizers(micro.completion_mask), 0.0
        )
        params = jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)
    fixed, _ = make_update_step(objective, tx, minibatches=2, shuffle=False)(
        jax.tree.map(jnp.copy, state),
        batch,  # the step donates the state it is given
    )
    assert tree_max_abs_diff(fixed.params, params) > 1e-4
    shuffled, _ = make_update_step(objective, tx, minibatches=2, shuffle=True)(state, batch)
    assert tree_max_abs_diff(shuffled.params, params) < 1e-5


def test_frozen_parameters_stay_under_a_mesh_step(compiled):
    """A trainable subset (attention + MLP), compiled with explicit in/out shardings on a mesh.

    The frozen parameters come back bit-identical, the optimizer state covers the trainable
    subset only, the reference that shares the frozen base keeps the initial log-probs, and the
    returned state has the requested shardings.
    """
    alg = preset("grpo")
    tx = make_optimizer(dataclasses.replace(OPTIM, weight_decay=0.1))
    graphs, state = fresh_state(alg, tx, trainable=(r"policy\.layers\.(attn|mlp)\.",))
    assert "embed" in state.frozen["policy"] and "attn_norm" in state.frozen["policy"]["layers"]
    frozen0, params0 = _copy(state.frozen), _copy(state.params)
    ref = reference_params(state.params)
    lp_fn = compiled.logprob_fn()
    seqs = sequences(jax.random.key(9), N, P, T)
    logp0 = np.asarray(lp_fn(state.params["policy"], state.frozen["policy"], seqs))
    # axis_types="auto": the decoder's embedding gather has no out_sharding yet and fails under
    # Explicit axes (a models-package limitation, see docs/training.md)
    mesh = make_mesh(MeshConfig(axis_types="auto"), devices=jax.devices()[:1])
    shardings = train_state_shardings(state, mesh, tx)
    step = make_update_step(
        rl_objective(alg, graphs),
        tx,
        kl_controller=kl_controller(alg.kl),
        mesh=mesh,
        state_shardings=shardings,
    )
    for _ in range(2):
        state, metrics = step(state, prepare(alg, state, seqs, ref, lp_fn))
    assert np.isfinite(float(metrics["loss/total"]))
    assert tree_max_abs_diff(state.frozen, frozen0) == 0.0  # bit-identical
    assert tree_max_abs_diff(state.params, params0) > 0.0
    np.testing.assert_allclose(lp_fn(ref, state.frozen["policy"], seqs), logp0, atol=1e-6)
    mu = state.opt_state.inner_state[1][0].mu  # clip → (adam, decay mask, lr)
    assert jax.tree.structure(mu) == jax.tree.structure(state.params)
    got = jax.tree.map(lambda x: x.sharding, state)
    assert jax.tree.leaves(got) == jax.tree.leaves(shardings)


def test_sft_steps_lower_the_nll():
    optim = OptimConfig(learning_rate=1e-2, max_grad_norm=1.0)
    tx = make_optimizer(optim)
    graphs, params, frozen = split_models(tiny_policy(3, layers=UPDATE_LAYERS))
    state = init_train_state(params, frozen, tx, key=jax.random.key(3))
    step = make_update_step(sft_objective(SFTConfig(), graphs), tx, minibatches=2)
    seqs = sequences(jax.random.key(10), N, P, T)
    nll = []
    for _ in range(8):
        state, metrics = step(state, seqs)
        nll.append(float(metrics["sft/nll"]))
    assert nll[-1] < 0.5 * nll[0], nll
    assert set(metrics) == {
        "sft/nll",
        "loss/total",
        "optim/grad_norm",
        "optim/learning_rate",
    }


def test_step_input_errors(compiled):
    alg = preset("grpo")
    graphs, state = fresh_state(alg, compiled.optimizer)
    seqs = sequences(jax.random.key(11), N, P, T)
    batch = prepare(alg, state, seqs, reference_params(state.params), compiled.logprob_fn())
    kw = dict(objective=rl_objective(alg, graphs), optimizer=compiled.optimizer)
    with pytest.raises(ValueError, match="not divisible into minibatches"):
        update_step(state, batch, minibatches=3, **kw)
    with pytest.raises(ValueError, match="must match the optimizer"):
        update_step(state, batch, accumulation_steps=2, **kw)
    with pytest.raises(ValueError, match="`old_logp` may be None only"):
        update_step(state, batch._replace(old_logp=None), epochs=2, **kw)
    with pytest.raises(ValueError, match="needs `ref_logp` in the batch"):
        update_step(state, batch._replace(ref_logp=None), **kw)
    with pytest.raises(ValueError, match="`advantages` must be a floating array"):
        update_step(state, batch._replace(advantages=batch.advantages[:, :2]), **kw)
    with pytest.raises(ValueError, match="has a critic"):
        rl_objective(preset("ppo"), graphs)
    with pytest.raises(ValueError, match="needs `state_shardings`"):
        make_update_step(
            kw["objective"],
            compiled.optimizer,
            mesh=make_mesh(MeshConfig(), devices=jax.devices()[:1]),
        )
    assert isinstance(state.opt_state, optax.InjectStatefulHyperparamsState)


# ---------------------------------------------------------------- the non-finite guard and β
# (mutation testing, 2026-12-07: a finite loss with a non-finite gradient, and an adaptive β,
# were never exercised by the guard's tests)


def _toy_step(loss_fn, **kwargs):
    """One `update_step` of a one-parameter toy objective under an adaptive KL controller."""
    import losses
    from jaxrl_llm.train.batch import SequenceBatch, count_normalizers
    from jaxrl_llm.train.objectives import Objective
    from jaxrl_llm.train.state import init_train_state
    from jaxrl_llm.train.update import update_step

    controller = losses.adaptive_kl_controller(0.1, target=1.0, horizon=10.0)
    objective = Objective(
        lambda p, f, b, n, k: loss_fn(p["policy"]["w"]),
        lambda b: count_normalizers(b.completion_mask),
        lambda b, n: None,
    )
    state = init_train_state(
        {"policy": {"w": jnp.zeros(1)}},
        {},
        optax.sgd(0.5),
        key=jax.random.key(0),
        kl=controller.init(),
    )
    batch = SequenceBatch(jnp.zeros((4, 3), jnp.int32), jnp.ones((4, 3)), jnp.ones((4, 1)))
    new, metrics = update_step(
        state,
        batch,
        objective=objective,
        optimizer=optax.sgd(0.5),
        kl_controller=controller,
        **kwargs,
    )
    return state, new, metrics


def test_a_finite_loss_with_a_nonfinite_gradient_is_skipped():
    """sqrt|w| at w = 0: the loss is 0, its gradient inf; the guard must read the gradient's
    norm too, or the update writes w = −inf."""

    def loss(w):
        value = jnp.sum(jnp.sqrt(jnp.abs(w)))
        return value, {"loss/total": value}

    _, new, metrics = _toy_step(loss, skip_nonfinite=True)
    assert float(metrics["optim/skipped"]) == 1.0
    np.testing.assert_array_equal(new.params["policy"]["w"], [0.0])


def test_a_skipped_step_leaves_the_adaptive_kl_coefficient_alone():
    """A NaN loss with a finite KL metric: the step is refused, β stays 0.1 (the controller
    would move it to 0.108 on kl/seq_k1 = 5)."""

    def loss(w):
        value = jnp.sum(w) * jnp.nan
        return value, {"loss/total": value, "kl/seq_k1": jnp.float32(5.0)}

    state, new, metrics = _toy_step(loss, skip_nonfinite=True)
    assert float(metrics["optim/skipped"]) == 1.0
    assert float(new.kl.beta) == float(state.kl.beta) == pytest.approx(0.1)


def test_kl_beta_metric_is_the_coefficient_the_step_used():
    """`kl/beta` reports the β going into the step (0.1); the state carries the controller's
    next one, 0.1 · (1 + clip(5/1 − 1, ±0.2) · n/10) = 0.108 for the batch's n = 4 rows."""
    import losses

    def loss(w):
        value = jnp.sum(w**2)
        return value, {"loss/total": value, "kl/seq_k1": jnp.float32(5.0)}

    _, new, metrics = _toy_step(loss)
    assert float(metrics["kl/beta"]) == pytest.approx(0.1)
    controller = losses.adaptive_kl_controller(0.1, target=1.0, horizon=10.0)
    expected = controller.update(controller.init(), jnp.float32(5.0), 4)
    assert float(new.kl.beta) == pytest.approx(float(expected.beta)) == pytest.approx(0.108)
