"""Online DPO (`policy_loss: online_dpo`): each prompt's two samples (with more, its best and
worst), ranked by their advantage, through `losses.dpo_loss`, checked against a float64 NumPy
reference (value and gradient), with ties left out of the mean, and its configuration errors."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.train import (
    AdvantageConfig,
    AlgorithmConfig,
    KLConfig,
    OptimConfig,
    PolicyLossConfig,
    RLBatch,
    SequenceBatch,
    build_rl_batch,
    keeps_row_subset,
    loss_and_grads,
    make_logprob_fn,
    make_optimizer,
    make_update_step,
    preset,
    reference_params,
    rl_loss,
    rl_objective,
)
from jaxrl_llm.train.algorithms import (
    online_dpo_normalizers,
    online_dpo_pairs,
    online_dpo_select,
)
from jaxrl_llm.train.update import _unit_rows, update_unit_orders
from tests.train.helpers import sequences, tree_max_abs_diff
from tests.train.test_update import P, fresh_state, prepare

B, T = 5, 4  # prompts, completion tokens


def _batch(rng, rewards):
    """Two rows per prompt with ragged masks; advantages = reward − the pair's mean."""
    mask = (np.arange(T) < rng.integers(1, T + 1, size=(2 * B, 1))).astype(np.float32)
    pair_mean = rewards.reshape(B, 2).mean(axis=1).repeat(2)
    adv = (rewards - pair_mean)[:, None] * mask
    ref = -rng.uniform(0.1, 2.0, size=(2 * B, T)).astype(np.float32)
    batch = RLBatch(
        np.zeros((2 * B, T + 1), np.int32),
        np.ones((2 * B, T + 1), np.int32),
        mask,
        advantages=adv.astype(np.float32),
        ref_logp=ref,
    )
    return batch, mask, ref


def _reference(logp, ref, mask, rewards, beta):
    """float64: −mean over pairs with different rewards of log σ(β(Δπ_c − Δπ_r))."""
    seq = (np.where(mask > 0, logp, 0.0).sum(1) - np.where(mask > 0, ref, 0.0).sum(1)).reshape(B, 2)
    r = rewards.reshape(B, 2)
    valid = r[:, 0] != r[:, 1]
    sign = np.where(r[:, 0] > r[:, 1], 1.0, -1.0)
    z = beta * sign * (seq[:, 0] - seq[:, 1])
    per_pair = np.logaddexp(0.0, -z)  # −log σ(z)
    return per_pair[valid].sum() / max(valid.sum(), 1), valid, sign, z


def test_online_dpo_loss_and_gradient_equal_the_float64_reference():
    rng = np.random.default_rng(0)
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.3, 0.7, 0.0, 0.0], np.float64)
    batch, mask, ref = _batch(rng, rewards)
    logp = -rng.uniform(0.1, 2.0, size=(2 * B, T)).astype(np.float32)
    config = preset("online_dpo")
    beta = config.policy_loss.beta
    norms = online_dpo_normalizers(batch)
    expected, valid, sign, z = _reference(logp, ref, mask, rewards, beta)
    assert float(norms.num_seqs) == valid.sum() == 3

    def loss(lp):
        return rl_loss(config, batch, norms, logp=lp, entropy=jnp.zeros_like(lp))

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(logp))
    np.testing.assert_allclose(value, expected, rtol=1e-6)
    # d/dΔπ_row of −log σ(z): −β·σ(−z)·(±1) / D on every masked token of the row
    sig = 1.0 / (1.0 + np.exp(z))
    row_grad = np.stack([-beta * sign * sig, beta * sign * sig], axis=1) * valid[:, None]
    expected_grad = (row_grad.reshape(-1) / valid.sum())[:, None] * mask
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert "pref/accuracy" in metrics and "entropy/mean" in metrics


def test_the_order_of_a_pair_does_not_matter_and_ties_give_no_gradient():
    rng = np.random.default_rng(1)
    rewards = np.array([1.0, 0.0, 0.5, 0.5, 0.0, 2.0, 1.0, 1.0, 3.0, 1.0])
    batch, _, _ = _batch(rng, rewards)
    logp = jnp.asarray(-rng.uniform(0.1, 2.0, size=(2 * B, T)), jnp.float32)
    config = preset("online_dpo")

    def value(b, lp):
        out, _ = rl_loss(config, b, online_dpo_normalizers(b), logp=lp, entropy=jnp.zeros_like(lp))
        return out

    swap = np.arange(2 * B).reshape(B, 2)[:, ::-1].reshape(-1)  # each pair's rows swapped
    swapped = jax.tree.map(lambda x: None if x is None else x[swap], batch)
    np.testing.assert_allclose(value(batch, logp), value(swapped, logp[swap]), rtol=1e-6)
    grad = jax.grad(lambda lp: value(batch, lp))(logp)
    tied = np.repeat(rewards.reshape(B, 2)[:, 0] == rewards.reshape(B, 2)[:, 1], 2)
    assert np.all(np.asarray(grad)[tied] == 0.0) and np.any(np.asarray(grad)[~tied] != 0.0)


def test_online_dpo_pairs_rank_by_the_mean_advantage():
    adv = jnp.array([[0.5, 0.5, 0.0], [-0.5, -0.5, 0.0], [-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 0, 0]])
    first, valid = online_dpo_pairs(adv, mask)
    assert first.tolist() == [True, False] and valid.tolist() == [True, True]
    with pytest.raises(ValueError, match="rows come in pairs, got N = 3"):
        online_dpo_pairs(adv[:3], mask[:3])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: AlgorithmConfig(
                advantage=AdvantageConfig(estimator="gae"),
                policy_loss=PolicyLossConfig(name="online_dpo"),
            ),
            "needs a `critic`",
        ),
        (
            lambda: AlgorithmConfig(
                advantage=AdvantageConfig(estimator="reinforce_pp"),
                policy_loss=PolicyLossConfig(name="online_dpo"),
            ),
            "a grouped advantage estimator",
        ),
        (
            lambda: AlgorithmConfig(
                policy_loss=PolicyLossConfig(name="online_dpo"), kl=KLConfig(mode="loss", coef=0.1)
            ),
            "kl.mode 'none'",
        ),
        (lambda: PolicyLossConfig(name="online_dpo", beta=0.0), "`beta` must be > 0"),
        (
            lambda: PolicyLossConfig(name="online_dpo", loss_type="dpo"),
            "`loss_type` must be one of",
        ),
        (lambda: PolicyLossConfig(name="online_dpo", agg="token_mean"), "`agg` is not used"),
        (lambda: PolicyLossConfig(beta=0.1), "`beta` is not used by loss 'ppo_clip'"),
    ],
)
def test_online_dpo_config_errors_name_the_problem(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_the_batch_reports_the_share_of_pairs_whose_rewards_differ():

    arrays = {
        "tokens": jnp.ones((8, 5), jnp.int32),
        "attention_mask": jnp.ones((8, 5), jnp.int32),
        "completion_mask": jnp.ones((8, 3)),
        "rewards": jnp.array([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]),
        "group_size": 2,
    }
    _, metrics = build_rl_batch(preset("online_dpo"), **arrays, ref_logp=jnp.zeros((8, 3)))
    assert float(metrics["online_dpo/valid_pairs"]) == 0.5
    with pytest.raises(ValueError, match="policy_loss 'online_dpo' needs `ref_logp`"):
        build_rl_batch(preset("online_dpo"), **arrays)


def test_larger_groups_pair_each_prompts_best_and_worst_sample():
    # G = 4: NumPy picks the first row of the highest and of the lowest mean advantage
    rng = np.random.default_rng(2)
    G, N = 4, 4 * B
    mask = (np.arange(T) < rng.integers(1, T + 1, size=(N, 1))).astype(np.float32)
    adv = rng.integers(-2, 3, size=(N, 1)).astype(np.float32) * mask  # ties within groups
    adv[8:12] = 0.0  # group 2: every score equal -> a tied pair of one row
    fields = dict(
        tokens=rng.integers(0, 9, (N, T + 1)).astype(np.int32),
        attention_mask=np.ones((N, T + 1), np.int32),
        completion_mask=mask,
        advantages=adv,
        ref_logp=-rng.uniform(0.1, 2.0, (N, T)).astype(np.float32),
    )
    picked = online_dpo_select(RLBatch(**fields), G)
    score = adv.sum(1) / mask.sum(1)
    best = [b * G + int(np.argmax(score[b * G : (b + 1) * G])) for b in range(B)]
    worst = [b * G + int(np.argmin(score[b * G : (b + 1) * G])) for b in range(B)]
    rows = np.stack([best, worst], 1).reshape(-1)
    assert rows[4] == rows[5] == 8  # the tied group gives its first row twice
    for name, value in fields.items():
        np.testing.assert_array_equal(np.asarray(getattr(picked, name)), value[rows])
    first, valid = online_dpo_pairs(picked.advantages, picked.completion_mask)
    differ = [bool(score[b] > score[w]) for b, w in zip(best, worst, strict=True)]
    assert valid.tolist() == differ and not all(differ)  # the tied group is no pair
    assert first.tolist() == differ  # the best comes first wherever the pair is valid
    with pytest.raises(ValueError, match="not whole groups of group_size = 3"):
        online_dpo_select(RLBatch(**fields), 3)
    with pytest.raises(ValueError, match="`group_size` must be an int >= 2"):
        online_dpo_select(RLBatch(**fields), 1)


def test_a_g4_batch_trains_on_best_against_worst_by_reward():
    # build_rl_batch keeps 2 rows per prompt; the loss is DPO of the best against the worst

    rng = np.random.default_rng(3)
    G, N = 4, 4 * B
    rewards = rng.integers(0, 3, size=N).astype(np.float32)
    rewards[4:8] = 1.0  # a prompt whose samples all score the same
    mask = (np.arange(T) < rng.integers(1, T + 1, size=(N, 1))).astype(np.float32)
    ref = -rng.uniform(0.1, 2.0, size=(N, T)).astype(np.float32)
    config = preset("online_dpo")
    batch, metrics = build_rl_batch(
        config,
        tokens=jnp.zeros((N, T + 1), jnp.int32),
        attention_mask=jnp.ones((N, T + 1), jnp.int32),
        completion_mask=jnp.asarray(mask),
        rewards=jnp.asarray(rewards),
        group_size=G,
        ref_logp=jnp.asarray(ref),
    )
    assert batch.tokens.shape[0] == 2 * B
    r = rewards.reshape(B, G)
    best, worst = np.argmax(r, 1) + np.arange(0, N, G), np.argmin(r, 1) + np.arange(0, N, G)
    valid = r.max(1) > r.min(1)
    assert float(metrics["online_dpo/valid_pairs"]) == pytest.approx(valid.mean())
    assert not valid.all()
    logp = -rng.uniform(0.1, 2.0, size=(N, T))
    seq = np.where(mask > 0, logp - ref, 0.0).sum(1)  # float64 Δ of every sampled row
    z = config.policy_loss.beta * (seq[best] - seq[worst])
    expected = np.logaddexp(0.0, -z)[valid].sum() / valid.sum()
    rows = np.stack([best, worst], 1).reshape(-1)
    lp = jnp.asarray(logp[rows], jnp.float32)
    value, _ = rl_loss(config, batch, online_dpo_normalizers(batch), logp=lp, entropy=0 * lp)
    np.testing.assert_allclose(value, expected, rtol=1e-5)


def test_minibatches_and_accumulation_keep_each_pair_in_one_micro_batch():
    """2 minibatches × 2 micro-batches, no shuffle, SGD, 4 pairs (G = 4, best against worst):
    two sequential updates, on pairs 0, 2 and then 1, 3 (units of a pair's 2 rows; a strided
    split of rows would take 2 rows of different pairs), each the gradient of the DPO mean over
    its minibatch's pairs, accumulated from one pair per micro-batch. Online DPO has no ratio:
    the batch needs no old log-probs however often it is reused."""
    alg = dataclasses.replace(preset("online_dpo"), minibatches=2, shuffle=False)
    assert not alg.needs_old_logprobs and alg.needs_reference
    graphs, state = fresh_state(alg, make_optimizer(OptimConfig(name="sgd", learning_rate=0.5)))
    ref = jax.tree.map(lambda x: x * 1.05, reference_params(state.params))  # Δ ≠ 0 at start
    rewards = jnp.array([0.0, 1.0, 0.5, 0.2] * 4) * jnp.repeat(jnp.arange(1.0, 5.0), 4)
    seqs = sequences(jax.random.key(5), 16, P, T)
    batch = prepare(alg, state, seqs, ref, make_logprob_fn(graphs.policy), rewards=rewards)
    batch = batch._replace(old_logp=None)
    assert batch.tokens.shape[0] == 8  # 4 prompts' pairs, every pair valid
    objective = rl_objective(alg, graphs)
    assert objective.row_unit == objective.unit == 2
    grads_of = jax.jit(functools.partial(loss_and_grads, objective))
    params = jax.tree.map(jnp.copy, state.params)
    for rows in ([0, 1, 4, 5], [2, 3, 6, 7]):  # pairs 0, 2 then 1, 3
        minibatch = jax.tree.map(lambda x, rows=rows: x[jnp.array(rows)], batch)
        norms = online_dpo_normalizers(minibatch)
        assert float(norms.num_seqs) == 2.0
        grads, _, _ = grads_of(params, state.frozen, minibatch, norms, 0.0)
        params = jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)
    optim = OptimConfig(name="sgd", learning_rate=0.5, max_grad_norm=None, accumulation_steps=2)
    tx = make_optimizer(optim)
    state = fresh_state(alg, tx)[1]
    initial = jax.tree.map(np.asarray, state.params)  # the step donates the state
    step = make_update_step(objective, tx, minibatches=2, accumulation_steps=2, shuffle=False)
    new_state, metrics = step(state, batch)
    assert tree_max_abs_diff(new_state.params, params) < 1e-5
    assert tree_max_abs_diff(new_state.params, initial) > 1e-3
    assert float(metrics["pref/accuracy"]) >= 0.0
    with pytest.raises(ValueError, match="each of whole units of the objective's 2 rows"):
        make_update_step(objective, tx, minibatches=4, accumulation_steps=2)(new_state, batch)


def test_a_shuffled_epoch_moves_whole_pairs():
    key = jax.random.key(3)
    units = update_unit_orders(key, epochs=2, units=6)
    order = np.asarray(_unit_rows(units[0], 2))
    assert sorted(order.tolist()) == list(range(12))
    pairs = order.reshape(6, 2)
    np.testing.assert_array_equal(pairs[:, 1], pairs[:, 0] + 1)
    assert (pairs[:, 0] % 2 == 0).all() and pairs[:, 0].tolist() != list(range(0, 12, 2))
    assert units[0].tolist() != units[1].tolist()  # a new order every epoch
    # units of one row: each epoch's plain permutation of the rows, from the step's key
    epoch_keys = jax.random.split(jax.random.split(key)[0], 2)
    np.testing.assert_array_equal(
        np.asarray(update_unit_orders(key, epochs=2, units=12)),
        np.stack([np.asarray(jax.random.permutation(k, 12)) for k in epoch_keys]),
    )


def test_the_reference_forward_of_the_kept_rows_equals_the_full_forward():
    # G = 4: build_rl_batch without ref_logp keeps the best and worst rows; the reference
    # forward on those 2B rows gives the gathered log-probs of the forward on all B·G rows
    alg = preset("online_dpo")
    assert keeps_row_subset(alg, 4) and not keeps_row_subset(alg, 2)
    graphs, state = fresh_state(alg, make_optimizer(OptimConfig(name="sgd", learning_rate=0.1)))
    ref = jax.tree.map(lambda x: x * 1.05, reference_params(state.params))
    seqs = sequences(jax.random.key(6), 16, P, T)
    logprob = make_logprob_fn(graphs.policy)
    full_ref = logprob(ref, state.frozen["policy"], seqs)
    arrays = dict(
        tokens=seqs.tokens,
        attention_mask=seqs.attention_mask,
        completion_mask=seqs.completion_mask,
        rewards=jnp.array([0.0, 1.0, 0.5, 0.2] * 4),
        group_size=4,
    )
    full, full_metrics = build_rl_batch(alg, **arrays, ref_logp=full_ref)
    kept, metrics = build_rl_batch(alg, **arrays)
    assert kept.ref_logp is None and kept.tokens.shape[0] == 8
    for key, value in full_metrics.items():
        np.testing.assert_array_equal(np.asarray(metrics[key]), np.asarray(value), err_msg=key)
    pairs = SequenceBatch(kept.tokens, kept.attention_mask, kept.completion_mask)
    kept_ref = logprob(ref, state.frozen["policy"], pairs)
    mask = np.asarray(full.completion_mask) > 0
    assert mask.any(axis=1).all()
    np.testing.assert_allclose(
        np.where(mask, np.asarray(kept_ref), 0.0),
        np.where(mask, np.asarray(full.ref_logp), 0.0),
        rtol=1e-6,
        atol=1e-6,
    )
    with pytest.raises(ValueError, match="needs `ref_logp`"):  # G = 2: every row is kept
        build_rl_batch(alg, **{**arrays, "group_size": 2})
