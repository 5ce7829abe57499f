"""Online DPO (`policy_loss: online_dpo`): each prompt's two samples, ranked by their advantage,
through `losses.dpo_loss`, checked against a float64 NumPy reference (value and gradient),
with ties left out of the mean, and its configuration errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.train import (
    AdvantageConfig,
    AlgorithmConfig,
    KLConfig,
    PolicyLossConfig,
    RLBatch,
    preset,
    rl_loss,
)
from jaxrl_llm.train.algorithms import online_dpo_normalizers, online_dpo_pairs

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
        (
            lambda: AlgorithmConfig(policy_loss=PolicyLossConfig(name="online_dpo"), minibatches=2),
            "minibatches 1",
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
    from jaxrl_llm.train import build_rl_batch

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
