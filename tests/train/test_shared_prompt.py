"""RL forwards and updates with each prompt run once per group (`group_size`): the same
log-probs, losses and parameters as the plain forward, and clear errors where rows are not
grouped by prompt."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.train import (
    OptimConfig,
    kl_controller,
    make_logprob_fn,
    make_optimizer,
    make_update_step,
    make_value_fn,
    preset,
    reference_params,
    rl_objective,
)
from jaxrl_llm.train.batch import SequenceBatch
from jaxrl_llm.train.row_groups import make_row_group_update_step
from tests.train.helpers import sequences, tree_max_abs_diff
from tests.train.test_row_groups import ADAPTIVE_GRPO, SGD
from tests.train.test_update import G, P, T, fresh_state, prepare

N = 8  # two groups of G = 4 rows with one prompt each


def grouped_sequences(key: jax.Array) -> SequenceBatch:
    """`sequences` with each group's prompt (tokens and padding) copied from its first row."""
    seqs = sequences(key, N, P, T)
    first = jnp.repeat(jnp.arange(0, N, G), G)
    tokens = seqs.tokens.at[:, :P].set(seqs.tokens[first, :P])
    mask = seqs.attention_mask.at[:, :P].set(seqs.attention_mask[first, :P])
    return SequenceBatch(tokens, mask, seqs.completion_mask)


def test_logprobs_of_shared_prompts_equal_the_plain_forward():
    alg = preset("grpo")
    graphs, state = fresh_state(alg, make_optimizer(SGD))
    seqs = grouped_sequences(jax.random.key(3))
    assert len({tuple(np.asarray(seqs.tokens[n, :P])) for n in range(N)}) == N // G
    args = (state.params["policy"], state.frozen["policy"], seqs)
    plain = make_logprob_fn(graphs.policy)(*args)
    shared = make_logprob_fn(graphs.policy, group_size=G)(*args)
    np.testing.assert_allclose(np.asarray(shared), np.asarray(plain), rtol=1e-5, atol=1e-6)
    assert float(jnp.min(plain)) < -1.0  # log-probs of a random policy, not all ≈ 0


@pytest.mark.parametrize("kind", ["head", "model"])
def test_critic_values_of_shared_prompts_equal_the_plain_forward(kind):
    ppo = preset("ppo")
    alg = dataclasses.replace(ppo, critic=dataclasses.replace(ppo.critic, kind=kind))
    graphs, state = fresh_state(alg, make_optimizer(SGD))
    seqs = grouped_sequences(jax.random.key(4))
    plain = make_value_fn(graphs)(state.params, state.frozen, seqs)
    shared = make_value_fn(graphs, group_size=G)(state.params, state.frozen, seqs)
    np.testing.assert_allclose(np.asarray(shared), np.asarray(plain), rtol=1e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(plain))) > 1e-3  # values of a random critic, not all 0


def _two_steps(alg, group_size, groups=1):
    tx = make_optimizer(SGD)
    graphs, state = fresh_state(alg, tx)
    objective = rl_objective(alg, graphs, group_size=group_size)
    kw = dict(kl_controller=kl_controller(alg.kl), skip_nonfinite=True)
    if groups == 1:
        step = make_update_step(objective, tx, **kw)
    else:
        step = make_row_group_update_step(objective, tx, groups=groups, **kw)
    logprob_fn = make_logprob_fn(graphs.policy, group_size=group_size)
    value_fn = make_value_fn(graphs) if alg.critic else None
    ref = jax.tree.map(lambda x: x * 1.01, reference_params(state.params))  # KL ≠ 0
    history = []
    for i in range(2):
        batch = prepare(
            alg, state, grouped_sequences(jax.random.key(20 + i)), ref, logprob_fn, value_fn
        )
        state, metrics = step(state, batch)
        history.append({k: float(v) for k, v in metrics.items()})
    return state, history


@pytest.mark.parametrize(
    ("name", "alg", "groups"),
    [
        ("grpo-adaptive-kl", ADAPTIVE_GRPO, 1),
        ("grpo-row-groups", ADAPTIVE_GRPO, 2),  # each row group holds one prompt's G rows
        ("ppo-value-head", dataclasses.replace(preset("ppo"), epochs=2), 1),  # one minibatch
    ],
)
def test_updates_with_shared_prompts_equal_the_plain_updates(name, alg, groups):
    expected_state, expected = _two_steps(alg, 1)
    state, got = _two_steps(alg, G, groups)
    assert tree_max_abs_diff(state.params, expected_state.params) < 1e-6
    assert tree_max_abs_diff(state.params, fresh_state(alg, make_optimizer(SGD))[1].params) > 1e-4
    for metrics, metrics_1 in zip(got, expected, strict=True):
        for key in metrics_1:
            np.testing.assert_allclose(
                metrics[key], metrics_1[key], rtol=2e-5, atol=1e-6, err_msg=key
            )


def test_minibatches_keep_whole_groups_and_partial_groups_are_refused():
    # 2 minibatches of the 2 groups (the update splits the batch in units of G rows): the
    # shared-prompt objective equals the plain one split in the same units
    alg = dataclasses.replace(preset("grpo"), minibatches=2)
    tx = make_optimizer(OptimConfig(name="sgd", learning_rate=0.1))
    graphs, state = fresh_state(alg, tx)
    objective = rl_objective(alg, graphs, group_size=G)
    batch = prepare(
        alg,
        state,
        grouped_sequences(jax.random.key(1)),
        reference_params(state.params),
        make_logprob_fn(graphs.policy),
    )
    plain = rl_objective(alg, graphs)._replace(row_unit=G)
    assert objective.unit == plain.unit == G
    results = []
    for obj in (objective, plain):
        step = make_update_step(obj, tx, minibatches=2, kl_controller=kl_controller(alg.kl))
        results.append(step(fresh_state(alg, tx)[1], batch)[0].params)
    assert tree_max_abs_diff(*results) < 1e-6
    assert tree_max_abs_diff(results[0], state.params) > 1e-4
    with pytest.raises(ValueError, match="each of whole groups of the objective's group_size = 4"):
        make_update_step(objective, tx, minibatches=4)(state, batch)
    split = make_row_group_update_step(objective, tx, groups=4)
    with pytest.raises(
        ValueError, match="has 2 rows, not whole groups of the objective's group_size = 4"
    ):
        split(state, batch)
    three = rl_objective(alg, graphs, group_size=3)
    with pytest.raises(ValueError, match="8 rows do not form groups of group_size = 3"):
        three.check(batch, 1)
