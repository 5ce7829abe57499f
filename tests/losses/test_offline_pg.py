"""`mirror_descent_loss`, `alol_loss`, `shaped_offpolicy_loss`, `gated_sft_loss` (ALGORITHMS.md §11)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.aggregation import AGG_MODES
from losses.offline_pg import alol_loss, gated_sft_loss, mirror_descent_loss, shaped_offpolicy_loss
from losses.ppo import reinforce_loss
from tests.losses.helpers import (
    assert_close,
    assert_nan_safe,
    make_mask,
    np_agg_weights,
    np_aggregate,
    plant_nonfinite,
    vg,
)

B, G = 5, 4
TAU = 0.3


def group_batch(seed):
    rng = np.random.default_rng(seed)
    seq_lp = -rng.uniform(5.0, 30.0, size=(B, G)).astype(np.float32)
    seq_old = (seq_lp + rng.normal(size=(B, G))).astype(np.float32)
    rewards = rng.integers(0, 2, size=(B, G)).astype(np.float32)
    valid = rng.uniform(size=(B, G)) > 0.2
    valid[0] = [True, False, False, False]  # a group with a single valid sample
    valid[1] = True
    return rng, seq_lp, seq_old, rewards, valid


# --------------------------------------------------------------------------------------------------
# mirror_descent_loss (Kimi k1.5)
# --------------------------------------------------------------------------------------------------


def np_mirror(seq_lp, seq_old, rewards, valid, tau, num_seqs=None):
    v = np.asarray(valid, np.float64)
    lp, old, r = (
        np.where(v > 0, np.asarray(x, np.float64), 0.0) for x in (seq_lp, seq_old, rewards)
    )
    base = (r * v).sum(1, keepdims=True) / np.maximum(v.sum(1, keepdims=True), 1)
    e = np.where(v > 0, r - base - tau * (lp - old), 0.0)
    d = num_seqs if num_seqs is not None else max(v.sum(), 1)
    return (e**2).sum() / d, -2 * tau * e / d, e


def test_mirror_descent_matches_reference():
    rng, seq_lp, seq_old, rewards, valid = group_batch(0)
    dirty = [plant_nonfinite(x, valid, rng) for x in (seq_lp, seq_old, rewards)]

    @jax.jit
    def run(*args):
        return [
            vg(mirror_descent_loss, tau=TAU, valid=valid, **kw)(*args)
            for kw in ({}, {"num_seqs": 40.0})
        ] + [vg(mirror_descent_loss, tau=TAU)(args[0], args[1], args[2])]

    out = run(*dirty)
    for ((loss, metrics), grad), ns in zip(out[:2], (None, 40.0), strict=True):
        ref_loss, ref_grad, e = np_mirror(seq_lp, seq_old, rewards, valid, TAU, ns)
        assert_close(loss, ref_loss)
        assert_close(grad, ref_grad)
        assert_close(metrics["policy/residual_abs_mean"], np.abs(e)[valid].mean())
        d = (seq_old.astype(np.float64) - seq_lp)[valid].mean()
        assert_close(metrics["policy/seq_approx_kl"], d, rtol=1e-5, atol=1e-5)
    # the singleton group: baseline = r itself, residual = −τ·log-ratio
    singleton_grad = -2 * TAU * (-TAU * (seq_lp[0, 0] - seq_old[0, 0].astype(np.float64)))
    assert_close(np.asarray(out[0][1])[0, 0], singleton_grad / valid.sum())
    # without `valid` every sample counts
    (loss, _), grad = run(seq_lp, seq_old, rewards)[2]
    ref_loss, ref_grad, _ = np_mirror(seq_lp, seq_old, rewards, np.ones((B, G)), TAU)
    assert_close(loss, ref_loss)
    assert_close(grad, ref_grad)


def test_mirror_descent_on_policy_gradient_is_centred_reward_reinforce():
    _, seq_lp, _, rewards, _ = group_batch(1)
    grad = jax.jit(jax.grad(lambda x: mirror_descent_loss(x, x, rewards, tau=TAU)[0]))(seq_lp)
    centred = rewards - rewards.mean(1, keepdims=True)
    assert_close(grad, -2 * TAU * centred / (B * G))


def test_mirror_descent_minimiser_sets_tau_log_ratio_to_centred_reward():
    _, _, seq_old, rewards, _ = group_batch(2)
    centred = rewards - rewards.mean(1, keepdims=True)
    seq_lp = (seq_old + centred / TAU).astype(np.float32)
    (loss, _), grad = jax.jit(vg(mirror_descent_loss, tau=TAU))(seq_lp, seq_old, rewards)
    assert_close(loss, 0.0, atol=1e-9)
    assert_close(grad, np.zeros((B, G)), atol=1e-6)


# --------------------------------------------------------------------------------------------------
# alol_loss (A-LoL)
# --------------------------------------------------------------------------------------------------


def np_alol(seq_lp, ref, r, v_, valid, eps):
    m = np.asarray(valid, bool)
    lp, ref, r, v_ = (np.where(m, np.asarray(x, np.float64), 0.0) for x in (seq_lp, ref, r, v_))
    a = r - v_
    w = np.clip(np.exp(np.clip(lp - ref, -20, 20)), 1 - eps, 1 + eps)
    keep = m & (a > 0)
    d = max(m.sum(), 1)
    return np.where(keep, -a * w * lp, 0.0).sum() / d, np.where(keep, -a * w, 0.0) / d, keep, w


def test_alol_matches_reference_and_filters_negative_advantages():
    rng = np.random.default_rng(3)
    n = 16
    seq_lp = -rng.uniform(5.0, 20.0, size=n).astype(np.float32)
    ref = (seq_lp + 0.5 * rng.normal(size=n)).astype(np.float32)
    rewards = rng.normal(size=n).astype(np.float32)
    values = rng.normal(size=n).astype(np.float32)
    valid = rng.uniform(size=n) > 0.2

    (loss, metrics), grad = jax.jit(vg(alol_loss, clip=0.2, valid=valid))(
        seq_lp, ref, rewards, values
    )
    ref_loss, ref_grad, keep, w = np_alol(seq_lp, ref, rewards, values, valid, 0.2)
    assert_close(loss, ref_loss)
    assert_close(grad, ref_grad)
    assert np.all(np.asarray(grad)[~keep] == 0.0) and np.all(np.asarray(grad)[keep] < 0.0)
    assert_close(metrics["policy/positive_adv_frac"], keep.sum() / valid.sum())
    assert_close(metrics["policy/is_weight_mean"], w[keep].mean())
    ratio = np.exp(seq_lp.astype(np.float64) - ref)
    assert_close(metrics["policy/clip_frac"], np.mean(np.abs(ratio[keep] - w[keep]) > 0))
    assert 0 < float(metrics["policy/clip_frac"]) < 1  # the clip acts on part of the data

    def fn(seq_lp, ref, rewards, values):
        return alol_loss(seq_lp, ref, rewards, values, clip=0.2, valid=valid)

    assert_nan_safe(fn, (seq_lp, ref, rewards, values), valid.astype(np.float32), rng)


# --------------------------------------------------------------------------------------------------
# shaped_offpolicy_loss
# --------------------------------------------------------------------------------------------------


def token_batch(seed, n=7, t=11):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, n, t)
    lp = np.log(rng.uniform(0.01, 0.99, size=(n, t))).astype(np.float32)
    adv = rng.normal(size=(n, t)).astype(np.float32)
    return rng, lp, adv, mask


def test_shaped_offpolicy_matches_reference_and_reweights_reinforce():
    rng, lp, adv, mask = token_batch(4)
    is_w = rng.uniform(0.3, 2.0, size=lp.shape).astype(np.float32)
    tok_w = (rng.uniform(size=lp.shape) > 0.25).astype(np.float32)
    gamma = 0.1
    valid = mask > 0
    p = np.where(valid, np.exp(lp.astype(np.float64)), 0.0)
    a = np.where(valid, adv, 0.0)
    shaping = gamma * p / (p + gamma) ** 2

    @jax.jit
    def run(lp, adv, mask):
        out = {
            agg: vg(
                shaped_offpolicy_loss, gamma=gamma, agg=agg, is_weights=is_w, token_weights=tok_w
            )(lp, adv, mask)
            for agg in AGG_MODES
        }
        pg = vg(
            reinforce_loss, is_weights=jnp.asarray(shaping * is_w, jnp.float32), token_weights=tok_w
        )
        return out, pg(lp, adv, mask)[1]

    out, pg_grad = run(lp, adv, mask)
    w = is_w.astype(np.float64) * tok_w
    for agg, ((loss, metrics), grad) in out.items():
        assert_close(loss, np_aggregate(-a * p / (p + gamma) * w, mask, agg))
        assert_close(grad, np_agg_weights(mask, agg) * w * (-a * shaping))
        assert_close(metrics["policy/shaped_prob_mean"], (p / (p + gamma))[valid].mean())
        assert_close(metrics["policy/shaping_grad_weight_mean"], shaping[valid].mean())
    # the gradient is REINFORCE's with the extra weight γπ/(π + γ)²
    assert_close(out["token_mean"][1], np.asarray(pg_grad))

    def fn(lp, adv, is_w):
        return shaped_offpolicy_loss(
            lp, adv, mask, gamma=gamma, is_weights=is_w, agg="seq_mean_token_mean"
        )

    assert_nan_safe(fn, (lp, adv, is_w), mask, rng)


# --------------------------------------------------------------------------------------------------
# gated_sft_loss (AHPO)
# --------------------------------------------------------------------------------------------------


def test_gated_sft_matches_reference():
    rng = np.random.default_rng(5)
    b, e, t = 3, 2, 7
    mask = make_mask(rng, b * e, t)
    lp = -rng.uniform(0.1, 3.0, size=(b * e, t)).astype(np.float32)
    n_correct = np.array([0, 3, 1], np.int32)

    @jax.jit
    def run(lp, mask, n_correct):
        return {
            (thr, agg): vg(gated_sft_loss, threshold=thr, coef=0.7, agg=agg)(lp, mask, n_correct)
            for thr in (1, 2, 0)
            for agg in AGG_MODES
        }

    valid = mask > 0
    for (thr, agg), ((loss, metrics), grad) in run(lp, mask, n_correct).items():
        gate = np.repeat(n_correct < thr, e)[:, None] * 1.0
        ell = -np.where(valid, lp, 0.0) * gate
        assert_close(loss, 0.7 * np_aggregate(ell, mask, agg))
        assert_close(grad, -0.7 * np_agg_weights(mask, agg) * gate * valid)
        assert_close(metrics["policy/sft_gate_frac"], np.mean(n_correct < thr))
        assert_close(metrics["policy/expert_nll"], -lp[valid].mean())
        if thr == 0:  # every gate closed
            assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)

    def fn(lp):
        return gated_sft_loss(lp, mask, n_correct, threshold=2)

    assert_nan_safe(fn, (lp,), mask, rng)


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------


def _trace(fn, *args, **kw):
    return jax.eval_shape(lambda *a: fn(*a, **kw), *args)


def test_bad_input_errors_name_the_problem():
    s = jnp.zeros((3, 4))
    with pytest.raises(TypeError, match="tau"):
        _trace(mirror_descent_loss, s, s, s)
    with pytest.raises(ValueError, match="mirror_descent_loss: `tau` must be > 0"):
        _trace(mirror_descent_loss, s, s, s, tau=0.0)
    with pytest.raises(
        ValueError, match=r"mirror_descent_loss: `rewards` must have the shape of `seq_logp`"
    ):
        _trace(mirror_descent_loss, s, s, jnp.zeros((3, 5)), tau=1.0)
    with pytest.raises(
        ValueError, match=r"mirror_descent_loss: `seq_logp` must be \[B,G\] with G >= 2"
    ):
        _trace(
            mirror_descent_loss, jnp.zeros((3, 1)), jnp.zeros((3, 1)), jnp.zeros((3, 1)), tau=1.0
        )
    with pytest.raises(
        ValueError, match="mirror_descent_loss: `seq_logp` must be a floating-point"
    ):
        _trace(mirror_descent_loss, jnp.zeros((3, 4), jnp.int32), s, s, tau=1.0)
    with pytest.raises(ValueError, match="mirror_descent_loss: `valid` must have shape"):
        _trace(mirror_descent_loss, s, s, s, tau=1.0, valid=jnp.ones(3, bool))
    v = jnp.zeros(6)
    with pytest.raises(ValueError, match="alol_loss: `seq_logp` must have rank 1"):
        _trace(alol_loss, s, s, s, s, clip=0.2)
    with pytest.raises(ValueError, match="alol_loss: `clip` must be >= 0"):
        _trace(alol_loss, v, v, v, v, clip=-0.2)
    with pytest.raises(ValueError, match=r"alol_loss: `values` must have the shape of `seq_logp`"):
        _trace(alol_loss, v, v, v, jnp.zeros(5), clip=0.2)
    with pytest.raises(ValueError, match="shaped_offpolicy_loss: `gamma` must be > 0"):
        _trace(shaped_offpolicy_loss, s, s, s, gamma=0.0)
    with pytest.raises(ValueError, match=r"shaped_offpolicy_loss: .*broadcast_to_tokens"):
        _trace(shaped_offpolicy_loss, s, jnp.zeros(3), s, gamma=0.1)
    with pytest.raises(ValueError, match=r"gated_sft_loss: `expert_logp` must have E·B rows"):
        _trace(gated_sft_loss, jnp.zeros((5, 4)), jnp.ones((5, 4)), jnp.zeros(2))
    with pytest.raises(ValueError, match="gated_sft_loss: `expert_mask` must have shape"):
        _trace(gated_sft_loss, s, jnp.ones((3, 5)), jnp.zeros(3))
    with pytest.raises(ValueError, match="gated_sft_loss: `n_correct` must have rank 1"):
        _trace(gated_sft_loss, s, s, jnp.zeros((3, 1)))
    with pytest.raises(ValueError, match="gated_sft_loss: `coef` must be >= 0"):
        _trace(gated_sft_loss, s, s, jnp.zeros(3), coef=-1.0)
    with pytest.raises(ValueError, match=r"gated_sft_loss: `agg` must be one of"):
        _trace(gated_sft_loss, s, s, jnp.zeros(3), agg="mean")
    with pytest.raises(ValueError, match="gated_sft_loss: `expert_logp` must be a floating-point"):
        _trace(gated_sft_loss, jnp.zeros((3, 4), jnp.int32), s, jnp.zeros(3))
