"""Packed rollout groups (`jaxrl_llm.train.group_packing`): the layout against a hand-built
oracle, the same log-probs, entropies, losses, gradients and updates as the padded forward, and
the refusals."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_llm.train import (
    PackedSequences,
    RLBatch,
    SequenceBatch,
    best_fit_decreasing,
    check_packing_parts,
    completion_logprobs,
    completion_row_count,
    count_normalizers,
    group_rows_part,
    init_train_state,
    join_group_parts,
    make_logprob_fn,
    make_update_step,
    make_value_fn,
    pack_groups,
    packed_completion_logprobs,
    packing_part,
    preset,
    rl_objective,
    split_models,
    update_unit_orders,
)
from jaxrl_llm.train.row_groups import make_row_group_update_step
from tests.extended import extended, split_cases
from tests.train.helpers import (
    V,
    tiny_critic,
    tiny_policy,
    tiny_sliding_window_policy,
    tree_max_abs_diff,
)

B, G, P, T = 3, 4, 6, 7


def grouped_batch(seed: int = 0, prompts: int = B) -> SequenceBatch:
    """`prompts` prompts (left-padded, 2..P real tokens) × `G` completions of 1..T real tokens
    (one full), one row invalid (its completion mask zeroed, its tokens real)."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((prompts * G, P + T), np.int32)
    attention = np.zeros((prompts * G, P + T), np.int32)
    mask = np.zeros((prompts * G, T), np.float32)
    for b in range(prompts):
        p = int(rng.integers(2, P + 1))
        prompt = rng.integers(1, V, p)
        for k in range(G):
            n = b * G + k
            c = T if n == 1 else int(rng.integers(1, T + 1))
            tokens[n, P - p : P] = prompt
            tokens[n, P : P + c] = rng.integers(1, V, c)
            attention[n, P - p : P + c] = 1
            mask[n, :c] = 1.0
    mask[5] = 0.0  # an invalid row: attended to, no target
    return SequenceBatch(jnp.asarray(tokens), jnp.asarray(attention), jnp.asarray(mask))


def _packed(batch, **kw):
    return jax.tree.map(jnp.asarray, pack_groups(jax.tree.map(np.asarray, batch), G, **kw))


def test_layout_matches_a_hand_built_oracle():
    """Two groups of 2: real lengths 1 + (1, 2) and 2 + (1, 0), completion rows of 3 slots:
    each prompt once, left-padded; group 0's completions share a row, group 1's empty one is
    not placed; each completion continues its prompt's positions; slots point at the
    predicting state of tokens t ≥ 1 (token 0 reads the prompt's last state)."""
    b = SequenceBatch(
        np.array([[0, 3, 1, 0], [0, 3, 2, 2], [5, 6, 1, 0], [5, 6, 0, 0]]),
        np.array([[0, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]),
        np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]),
    )
    p = pack_groups(b, 2, width=3, pad_id=9)
    assert p.prompt_tokens.tolist() == [[0, 3], [5, 6]]
    assert p.prompt_positions.tolist() == [[0, 0], [0, 1]]
    assert p.prompt_mask.tolist() == [[0, 1], [1, 1]]
    assert p.tokens.tolist() == [[1, 2, 2], [1, 9, 9]]
    assert p.positions.tolist() == [[1, 1, 2], [2, 0, 0]]
    assert p.roles.tolist() == [[1, 2, 2], [1, 0, 0]]
    assert p.prompt_row.tolist() == p.batch_prompt_row.tolist() == [0, 1]
    assert p.row.tolist()[:3] == p.batch_row.tolist()[:3] == [0, 0, 1]
    assert p.slots.tolist() == [[0, 0], [0, 1], [0, 0], [0, 0]]
    # rows of 2 slots: group 0's completions in a row each; the default row step (⌈4 / 8⌉)
    split = pack_groups(b, 2)
    assert split.tokens.shape == (3, 2) and split.row.tolist()[:3] == [1, 0, 2]  # longest first
    # two micro-batches: group 1 (micro-batch 1) in prompt row 1 and completion rows ≡ 1
    parts = pack_groups(b, 2, parts=2, width=3)
    assert parts.tokens.shape == (2, 3) and parts.batch_row.tolist()[:3] == [0, 0, 1]
    assert parts.prompt_row.tolist() == [0, 0] and parts.batch_prompt_row.tolist() == [0, 1]


def test_the_row_count_is_rounded_to_few_shapes():
    batch = jax.tree.map(np.asarray, grouped_batch())
    lengths = batch.attention_mask[:, P:].sum(axis=1).reshape(B, G)
    W = 2 * T  # room for two or more completions per row
    bins = sum(len(best_fit_decreasing([int(c) for c in group], W)) for group in lengths)
    assert B < bins < B * G  # the case is not degenerate
    assert pack_groups(batch, G, width=W, row_step=1).tokens.shape == (bins, W)
    assert pack_groups(batch, G, width=W, row_step=4).tokens.shape[0] == 4 * -(-bins // 4)
    assert pack_groups(batch, G, width=W, row_step=64).tokens.shape[0] == B * G  # at most N
    whole = pack_groups(batch, G)  # rows of T slots, row step ⌈N / 8⌉ = 2
    assert whole.tokens.shape[1] == T and whole.tokens.shape[0] % 2 == 0


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_logprobs_and_entropies_match_the_padded_forward(family):
    """Every completion token's log-prob and entropy, also with sliding-window layers (window 3:
    the window is in positions, which continue the prompt in every completion)."""
    model = tiny_sliding_window_policy() if family == "gemma2" else tiny_policy()
    batch = grouped_batch()
    packed = _packed(batch)
    assert packed.tokens.shape[1] == T and packed.tokens.shape[0] < B * G  # rows shared
    logp, entropy, _ = completion_logprobs(model, batch, with_entropy=True)
    packed_logp, packed_entropy = packed_completion_logprobs(
        model, batch, packed, with_entropy=True
    )
    mask = np.asarray(batch.completion_mask) > 0
    np.testing.assert_allclose(np.asarray(packed_logp), np.asarray(logp), atol=2e-5)
    np.testing.assert_allclose(
        np.asarray(packed_entropy)[mask], np.asarray(entropy)[mask], atol=2e-5
    )
    assert np.all(np.asarray(packed_logp)[~mask] == 0.0)
    # the jitted forward of the loop's old-policy and reference log-probs
    graphs, params, frozen = split_models(model)
    fn = make_logprob_fn(graphs.policy)
    np.testing.assert_allclose(
        np.asarray(fn(params["policy"], frozen["policy"], PackedSequences(batch, packed))),
        np.asarray(fn(params["policy"], frozen["policy"], batch)),
        atol=2e-5,
    )


def _rl_batch(batch, packed=None):
    rng = np.random.default_rng(1)
    advantages = jnp.asarray(rng.normal(size=batch.completion_mask.shape), jnp.float32)
    old = jnp.asarray(rng.normal(size=batch.completion_mask.shape) * 0.1 - 3.0, jnp.float32)
    ref = old + 0.05
    return RLBatch(
        batch.tokens,
        batch.attention_mask,
        batch.completion_mask,
        advantages=advantages * batch.completion_mask,
        old_logp=old * batch.completion_mask,
        ref_logp=ref * batch.completion_mask,
        packed=packed,
    )


@pytest.mark.parametrize("name", split_cases(["grpo", "dr_grpo", "dapo", "gspo"], {"grpo", "gspo"}))
def test_rl_losses_and_gradients_match_the_padded_batch(name):
    alg = preset(name)
    graphs, params, frozen = split_models(tiny_policy())
    objective = rl_objective(alg, graphs)
    batch = grouped_batch()
    norms = count_normalizers(batch.completion_mask)

    def value_and_grad(rl_batch):
        def loss(p):
            return objective.loss(p, frozen, rl_batch, norms, jnp.float32(0.04))

        return jax.value_and_grad(loss, has_aux=True)(params)

    (loss, metrics), grads = value_and_grad(_rl_batch(batch))
    (packed_loss, packed_metrics), packed_grads = value_and_grad(_rl_batch(batch, _packed(batch)))
    np.testing.assert_allclose(float(packed_loss), float(loss), rtol=1e-5, atol=1e-6)
    for key, value in metrics.items():
        np.testing.assert_allclose(packed_metrics[key], value, rtol=1e-4, atol=1e-6, err_msg=key)
    assert tree_max_abs_diff(packed_grads, grads) < 1e-5
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) > 1e-3


@pytest.mark.parametrize("kind", ["model", "head"])
def test_a_critic_reads_the_packed_states(kind):
    """PPO with a `ValueModel` critic (its own packed forward) or a value head on the policy's
    packed states: the same values, loss and gradients as the padded batch."""
    alg = preset("ppo")
    alg = dataclasses.replace(alg, critic=dataclasses.replace(alg.critic, kind=kind))
    graphs, params, frozen = split_models(tiny_policy(), tiny_critic(kind))
    batch = grouped_batch()
    packed = _packed(batch)
    value_fn = make_value_fn(graphs)
    values = value_fn(params, frozen, batch)
    np.testing.assert_allclose(
        np.asarray(value_fn(params, frozen, PackedSequences(batch, packed))),
        np.asarray(values),
        atol=2e-5,
    )
    objective = rl_objective(alg, graphs)
    norms = count_normalizers(batch.completion_mask)
    rng = np.random.default_rng(2)
    targets = jnp.asarray(rng.normal(size=values.shape), jnp.float32) * batch.completion_mask

    def value_and_grad(rl_batch):
        rl_batch = rl_batch._replace(old_values=values, returns=targets)

        def loss(p):
            return objective.loss(p, frozen, rl_batch, norms, jnp.float32(0.0))

        return jax.value_and_grad(loss, has_aux=True)(params)

    (loss, metrics), grads = value_and_grad(_rl_batch(batch))
    (packed_loss, packed_metrics), packed_grads = value_and_grad(_rl_batch(batch, packed))
    np.testing.assert_allclose(float(packed_loss), float(loss), rtol=1e-5, atol=1e-6)
    assert metrics["loss/value"] > 0
    for key, value in metrics.items():
        np.testing.assert_allclose(packed_metrics[key], value, rtol=1e-4, atol=1e-6, err_msg=key)
    assert tree_max_abs_diff(packed_grads, grads) < 1e-5


def test_an_update_step_on_packed_groups_matches_the_padded_one():
    alg = preset("grpo")
    graphs, params, frozen = split_models(tiny_policy())
    tx = optax.adam(1e-2)
    step = make_update_step(rl_objective(alg, graphs, group_size=G), tx)
    batch = grouped_batch()
    states = {}
    for form, packed in (("padded", None), ("packed", _packed(batch))):
        fresh = jax.tree.map(jnp.copy, params)  # the step donates its state
        state = init_train_state(fresh, frozen, tx, key=jax.random.key(0))
        for _ in range(2):
            state, _ = step(state, _rl_batch(batch, packed))
        states[form] = state.params
    assert tree_max_abs_diff(states["packed"], states["padded"]) < 2e-5


@pytest.mark.parametrize(
    ("epochs", "minibatches", "accumulation", "shuffle"),
    [(1, 1, 2, True), extended(2, 2, 1, False), extended(2, 2, 1, True), (2, 2, 2, True)],
)
def test_micro_batches_of_packed_groups_match_the_padded_ones(
    epochs, minibatches, accumulation, shuffle
):
    """PPO-style reuse: 4 prompts in micro-batches of whole groups, reshuffled every epoch
    (one packing per epoch, in the orders `update_unit_orders` draws from the state's key):
    the parameters and metrics of two steps match the padded batch's."""
    alg = dataclasses.replace(preset("grpo"), epochs=epochs, minibatches=minibatches)
    graphs, params, frozen = split_models(tiny_policy())
    tx = optax.sgd(0.5)  # (Adam would turn rounding in near-zero gradients into steps of lr)
    if accumulation > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=accumulation).gradient_transformation()
    objective = rl_objective(alg, graphs, group_size=G)
    kw = dict(epochs=epochs, minibatches=minibatches, accumulation_steps=accumulation)
    step = make_update_step(objective, tx, shuffle=shuffle, **kw)
    batch = grouped_batch(seed=3, prompts=4)
    host = jax.tree.map(np.asarray, batch)
    results = {}
    for form in ("padded", "packed"):
        state = init_train_state(jax.tree.map(jnp.copy, params), frozen, tx, key=jax.random.key(5))
        for _ in range(2):
            packed = None
            if form == "packed":
                orders = None
                if shuffle and minibatches > 1:
                    orders = update_unit_orders(state.key, epochs=epochs, units=4)
                packed = pack_groups(host, G, parts=minibatches * accumulation, orders=orders)
                packed = jax.tree.map(jnp.asarray, packed)
            state, metrics = step(state, _rl_batch(batch, packed))
        results[form] = state.params, metrics
    (params_packed, packed_metrics), (params_padded, metrics) = results["packed"], results["padded"]
    assert tree_max_abs_diff(params_packed, params_padded) < 1e-5
    assert tree_max_abs_diff(params_padded, params) > 1e-3
    for key, value in metrics.items():
        np.testing.assert_allclose(packed_metrics[key], value, rtol=1e-4, atol=2e-6, err_msg=key)


@pytest.mark.parametrize(("parts", "orders"), [(1, None), (2, None), (2, [[1, 0, 3, 2]])])
def test_the_row_count_is_the_packings(parts, orders):
    """`completion_row_count` from the lengths alone gives the rows `pack_groups` lays out."""
    for seed in range(3):
        batch = jax.tree.map(np.asarray, grouped_batch(seed=seed, prompts=4))
        lengths = (batch.attention_mask[:, P:] > 0).sum(axis=1).reshape(4, G)
        for width in (T, T + 3):
            packed = pack_groups(batch, G, parts=parts, orders=orders, width=width)
            rows = completion_row_count(lengths, width=width, parts=parts, orders=orders)
            assert rows == packed.tokens.shape[-2]


def test_parts_are_packings_of_their_own_groups():
    """Each part of a packing for 2 parts is the packing of its own groups: its forward gives
    the log-probs of those rows, and the parts' outputs join back into the batch's."""
    graphs, params, frozen = split_models(tiny_policy())
    logprob = functools.partial(make_logprob_fn(graphs.policy), params["policy"])
    frozen = frozen["policy"]
    batch = grouped_batch(seed=4, prompts=4)
    host = jax.tree.map(np.asarray, batch)
    packed = pack_groups(host, G, parts=2)
    whole = logprob(frozen, batch)
    outs = []
    for j in range(2):
        rows = jax.tree.map(lambda x, j=j: group_rows_part(x, j, 2, G), host)
        part = packing_part(packed, j, 2)
        check_packing_parts(part, 1, where="test")  # a packing of its rows alone
        outs.append(logprob(frozen, jax.tree.map(jnp.asarray, PackedSequences(rows, part))))
        alone = logprob(frozen, jax.tree.map(jnp.asarray, rows))
        np.testing.assert_allclose(np.asarray(outs[-1]), np.asarray(alone), atol=2e-5)
    np.testing.assert_allclose(np.asarray(join_group_parts(outs, G)), np.asarray(whole), atol=2e-5)
    # a traced part index takes the same rows (the row groups' one program for every part)
    traced = jax.jit(lambda p, j: packing_part(p, j, 2))(packed, jnp.int32(1))
    assert all(
        np.array_equal(a, b) for a, b in zip(traced, packing_part(packed, 1, 2), strict=True)
    )


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_row_groups_of_packed_groups_match_the_padded_update(name):
    """The update's gradient in 2 row groups (one thread each) over a packing for 2 parts:
    two steps give the parameters and metrics of the padded batch's one-program update (GRPO;
    PPO with a value head reading the packed states)."""
    alg = preset(name)
    if name == "ppo":
        alg = dataclasses.replace(
            alg, epochs=1, minibatches=1, critic=dataclasses.replace(alg.critic, kind="head")
        )
    models = (tiny_policy(), tiny_critic("head")) if name == "ppo" else (tiny_policy(),)
    graphs, params, frozen = split_models(*models)
    tx = optax.sgd(0.5)
    objective = rl_objective(alg, graphs, group_size=G)
    batch = grouped_batch(seed=6, prompts=4)
    host = jax.tree.map(np.asarray, batch)
    rng = np.random.default_rng(1)
    extra = {}
    if name == "ppo":
        extra = {
            k: jnp.asarray(rng.normal(size=batch.completion_mask.shape), jnp.float32)
            * batch.completion_mask
            for k in ("old_values", "returns")
        }
    packed = jax.tree.map(jnp.asarray, pack_groups(host, G, parts=2))
    results = {}
    for form, step, packing in (
        ("padded", make_update_step(objective, tx), None),
        ("packed", make_row_group_update_step(objective, tx, groups=2), packed),
    ):
        state = init_train_state(jax.tree.map(jnp.copy, params), frozen, tx, key=jax.random.key(5))
        for _ in range(2):
            state, metrics = step(state, _rl_batch(batch, packing)._replace(**extra))
        results[form] = state.params, metrics
    (params_packed, packed_metrics), (params_padded, metrics) = results["packed"], results["padded"]
    assert tree_max_abs_diff(params_packed, params_padded) < 1e-5
    assert tree_max_abs_diff(params_padded, params) > 1e-3
    assert set(packed_metrics) == set(metrics)
    for key, value in metrics.items():
        np.testing.assert_allclose(packed_metrics[key], value, rtol=1e-4, atol=2e-6, err_msg=key)
    one_part = jax.tree.map(jnp.asarray, pack_groups(host, G))  # laid out for one call
    state = init_train_state(jax.tree.map(jnp.copy, params), frozen, tx, key=jax.random.key(5))
    with pytest.raises(ValueError, match="not laid out for 2 micro-batches"):
        make_row_group_update_step(objective, tx, groups=2)(
            state, _rl_batch(batch, one_part)._replace(**extra)
        )


def test_an_update_refuses_packing_it_cannot_split():
    alg = preset("grpo")
    graphs, params, frozen = split_models(tiny_policy())
    tx = optax.adam(1e-2)
    batch = grouped_batch(prompts=4)
    host = jax.tree.map(np.asarray, batch)

    def run(packed, objective, **kw):
        step = make_update_step(objective, tx, **kw)
        state = init_train_state(jax.tree.map(jnp.copy, params), frozen, tx, key=jax.random.key(0))
        step(state, _rl_batch(batch, jax.tree.map(jnp.asarray, packed)))

    strided = rl_objective(alg, graphs)  # micro-batches of strided rows, not whole groups
    with pytest.raises(ValueError, match=r"split into 2 micro-batches need micro-batches of whole"):
        run(pack_groups(host, G, parts=2), strided, minibatches=2)
    whole = rl_objective(alg, graphs, group_size=G)
    with pytest.raises(ValueError, match=r"a shuffled update takes one packing per epoch"):
        run(pack_groups(host, G, parts=2), whole, minibatches=2)
    with pytest.raises(ValueError, match=r"a fixed-order update takes one packing \(no epoch"):
        run(
            pack_groups(host, G, parts=2, orders=[[0, 1, 2, 3]]),
            whole,
            minibatches=2,
            shuffle=False,
        )
    with pytest.raises(ValueError, match=r"completion rows do not split into 2 micro-batches"):
        odd = pack_groups(host, G, row_step=1)  # packed for one micro-batch: 11 rows
        run(odd, whole, minibatches=2, shuffle=False)


def test_refusals_name_the_problem():
    batch = jax.tree.map(np.asarray, grouped_batch())
    with pytest.raises(ValueError, match="12 rows do not form groups of group_size = 5"):
        pack_groups(batch, 5)
    other = batch._replace(tokens=batch.tokens.copy())
    other.tokens[2, P - 1] += 1
    with pytest.raises(ValueError, match="rows 0 and 2 of group 0 hold different prompts"):
        pack_groups(other, G)
    target_on_pad = batch._replace(completion_mask=batch.completion_mask.copy())
    short = int(np.flatnonzero(batch.attention_mask[:, -1] == 0)[0])  # a row that stopped
    target_on_pad.completion_mask[short, :] = 1.0
    with pytest.raises(ValueError, match="completion has a target on a padding slot"):
        pack_groups(target_on_pad, G)
    with pytest.raises(ValueError, match="a completion of 7 tokens does not fit in `width` = 5"):
        pack_groups(batch, G, width=5)
    wrong = _packed(grouped_batch())._replace(slots=jnp.zeros((B * G, T + 1), jnp.int32))
    rl = _rl_batch(grouped_batch(), wrong)
    with pytest.raises(ValueError, match="`packed` must hold the N = 12 rows"):
        rl_objective(preset("grpo"), split_models(tiny_policy())[0]).check(rl, 1)
