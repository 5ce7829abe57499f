"""The update step in row groups (`jaxrl_llm.train.row_groups`) equals the whole-batch step."""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_llm.train import (
    KLConfig,
    OptimConfig,
    kl_controller,
    make_optimizer,
    make_update_step,
    preset,
    reference_params,
    rl_objective,
    train_state_shardings,
)
from jaxrl_llm.train.row_groups import make_row_group_update_step
from sharding import MeshConfig, make_mesh
from tests.extended import extended
from tests.train.helpers import sequences, tree_max_abs_diff
from tests.train.test_update import P, T, fresh_state, prepare

N = 8  # two GRPO groups of G = 4 (REWARDS of test_update)
# SGD keeps the update linear in the gradient (Adam's first step, ≈ lr·sign(g), would amplify
# the rounding of near-zero gradients), clipping at a norm the gradients exceed
SGD = OptimConfig(name="sgd", learning_rate=0.5, max_grad_norm=0.05)
ADAPTIVE_GRPO = dataclasses.replace(
    preset("grpo"), kl=KLConfig(mode="loss", coef=0.04, target=1e-4, horizon=100.0)
)


def _run(step, alg, tx, compiled, steps=2):
    graphs, state = fresh_state(alg, tx)
    ref = jax.tree.map(lambda x: x * 1.01, reference_params(state.params))  # KL ≠ 0
    value_fn = compiled.value_fn(alg.critic.kind) if alg.critic else None
    history = []
    for i in range(steps):
        seqs = sequences(jax.random.key(20 + i), N, P, T)
        batch = prepare(alg, state, seqs, ref, compiled.logprob_fn(), value_fn)
        state, metrics = step(graphs)(state, batch)
        history.append({k: float(v) for k, v in metrics.items()})
    return state, history


def _steps(alg, tx, groups):
    def whole(graphs):
        return make_update_step(
            rl_objective(alg, graphs), tx, kl_controller=kl_controller(alg.kl), skip_nonfinite=True
        )

    def split(graphs):
        return make_row_group_update_step(
            rl_objective(alg, graphs),
            tx,
            groups=groups,
            kl_controller=kl_controller(alg.kl),
            skip_nonfinite=True,
        )

    return whole, split


@pytest.mark.parametrize(
    ("name", "alg", "groups"),
    [
        ("grpo-adaptive-kl", ADAPTIVE_GRPO, 2),
        extended(
            "dapo", preset("dapo"), 2
        ),  # token-mean over the whole batch: global counts matter
        extended("gspo", preset("gspo"), 4),  # sequence-level ratios, 4 groups of 2 rows
        ("dr_grpo", preset("dr_grpo"), 8),  # one row per group
        # a value head (GAE returns, clipped value loss) and a KL penalty in the reward
        ("ppo-one-epoch", dataclasses.replace(preset("ppo"), epochs=1), 2),
    ],
)
@pytest.mark.filterwarnings("ignore:gspo_loss")
def test_row_groups_equal_the_whole_batch_step(compiled, name, alg, groups):
    """Two steps: the same parameters (to float32 rounding), step, key, β and metrics."""
    tx = make_optimizer(SGD)
    whole, split = _steps(alg, tx, groups)
    expected_state, expected = _run(whole, alg, tx, compiled)
    state, got = _run(split, alg, tx, compiled)
    assert tree_max_abs_diff(state.params, expected_state.params) < 1e-6
    assert int(state.step) == int(expected_state.step) == 2
    assert (jax.random.key_data(state.key) == jax.random.key_data(expected_state.key)).all()
    np.testing.assert_allclose(float(state.kl.beta), float(expected_state.kl.beta), rtol=1e-6)
    if alg.kl.target is not None:
        assert float(state.kl.beta) != alg.kl.coef  # the adaptive controller moved β
    for before, after in zip(expected, got, strict=True):
        assert set(after) == set(before)
        for key, value in before.items():
            # atol 1e-6: PPO's first-step policy loss is a near-zero sum (whitened advantages
            # at ratio 1) whose float32 rounding moved it by 3.4e-7 between hosts
            np.testing.assert_allclose(after[key], value, rtol=2e-5, atol=1e-6, err_msg=key)
    assert expected[0]["optim/grad_norm"] > SGD.max_grad_norm  # clipping was active


def test_adamw_row_groups_follow_the_whole_batch_step(compiled):
    """The runner's optimizer (AdamW with clipping) on GRPO: within Adam's rounding."""
    alg = preset("grpo")
    tx = make_optimizer(OptimConfig(name="adamw", learning_rate=1e-3, max_grad_norm=1.0))
    whole, split = _steps(alg, tx, 2)
    expected_state, expected = _run(whole, alg, tx, compiled, steps=1)
    state, got = _run(split, alg, tx, compiled, steps=1)
    assert tree_max_abs_diff(state.params, expected_state.params) < 2e-4  # ≤ 0.2 × lr
    # the first GRPO loss is ≈ 0 (ratio 1, advantages summing to 0 per group): its value,
    # ~1e-7, is rounding noise, so only an absolute tolerance means anything
    np.testing.assert_allclose(
        got[0]["loss/total"], expected[0]["loss/total"], rtol=1e-4, atol=1e-6
    )


def test_a_non_finite_group_skips_the_whole_step(compiled):
    alg = preset("grpo")
    tx = make_optimizer(SGD)
    graphs, state = fresh_state(alg, tx)
    batch = prepare(
        alg, state, sequences(jax.random.key(3), N, P, T), reference_params(state.params),
        compiled.logprob_fn(),
    )  # fmt: skip
    batch = batch._replace(advantages=batch.advantages.at[5].set(jnp.nan))  # row 5: group 2
    before = jax.tree.map(np.asarray, state.params)
    step = make_row_group_update_step(
        rl_objective(alg, graphs), tx, groups=2, kl_controller=kl_controller(alg.kl),
        skip_nonfinite=True,
    )  # fmt: skip
    state, metrics = step(state, batch)
    assert float(metrics["optim/skipped"]) == 1.0
    assert float(metrics["nonfinite/policy"]) == 1.0
    assert tree_max_abs_diff(state.params, before) == 0.0
    assert int(state.step) == 1


def test_row_group_step_errors(compiled):
    alg = preset("grpo")
    tx = make_optimizer(SGD)
    graphs, state = fresh_state(alg, tx)
    objective = rl_objective(alg, graphs)
    batch = prepare(
        alg, state, sequences(jax.random.key(4), N, P, T), reference_params(state.params),
        compiled.logprob_fn(),
    )  # fmt: skip
    with pytest.raises(ValueError, match="not divisible into 3 equal row groups"):
        make_row_group_update_step(objective, tx, groups=3)(state, batch)
    with pytest.raises(ValueError, match="`groups` must be an int >= 1"):
        make_row_group_update_step(objective, tx, groups=0)
    with pytest.raises(ValueError, match="accumulation is not supported"):
        make_row_group_update_step(objective, optax.MultiSteps(tx, 2), groups=2)
    # OptimConfig's accumulation is a plain GradientTransformation: caught by its state
    accumulating = make_optimizer(dataclasses.replace(SGD, accumulation_steps=2))
    _, acc_state = fresh_state(alg, accumulating)
    step = make_row_group_update_step(objective, accumulating, groups=2)
    with pytest.raises(ValueError, match="build it with accumulation_steps = 1"):
        step(acc_state, batch)
    with pytest.raises(ValueError, match="the mesh has 2"):
        make_row_group_update_step(objective, tx, groups=2, mesh=types.SimpleNamespace(size=2))
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    with pytest.raises(ValueError, match="needs `state_shardings`"):
        make_row_group_update_step(objective, tx, groups=2, mesh=mesh)
    with pytest.raises(ValueError, match="needs `ref_logp` in the batch"):
        make_row_group_update_step(objective, tx, groups=2)(state, batch._replace(ref_logp=None))


def test_row_groups_under_a_one_device_mesh(compiled):
    """With the runner's mesh and state shardings: the same update as the whole-batch step."""
    alg = preset("grpo")
    tx = make_optimizer(SGD)
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    results = []
    for groups in (None, 2):
        graphs, state = fresh_state(alg, tx)
        shardings = train_state_shardings(state, mesh, tx)
        state = jax.device_put(state, shardings)
        with jax.set_mesh(mesh):
            batch = prepare(
                alg, state, sequences(jax.random.key(5), N, P, T),
                reference_params(state.params), compiled.logprob_fn(),
            )  # fmt: skip
        kw = dict(kl_controller=kl_controller(alg.kl), mesh=mesh, state_shardings=shardings)
        objective = rl_objective(alg, graphs)
        if groups is None:
            step = make_update_step(objective, tx, **kw)
        else:
            step = make_row_group_update_step(objective, tx, groups=groups, **kw)
        state, _ = step(state, batch)
        assert jax.tree.leaves(state.params)[0].sharding == jax.tree.leaves(shardings.params)[0]
        results.append(state.params)
    assert tree_max_abs_diff(*results) < 1e-6
