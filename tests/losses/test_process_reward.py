"""Process reward models (ALGORITHMS.md §9.2, §9.4, §11) against float64 NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.process_reward import (
    STEP_AGGREGATIONS,
    aggregate_step_scores,
    implicit_prm_loss,
    implicit_process_rewards,
    mc_step_labels,
    prm_bce_loss,
    prm_mse_loss,
    scatter_step_rewards,
)
from tests.losses.helpers import (
    assert_close,
    assert_nan_safe,
    make_mask,
    np_agg_weights,
    np_aggregate,
    plant_nonfinite,
)

N, M, T, K = 6, 5, 9, 4

_labels = jax.jit(mc_step_labels, static_argnames=("mode",))
_agg_scores = jax.jit(aggregate_step_scores, static_argnames=("how",))
_scatter = jax.jit(scatter_step_rewards, static_argnums=(2,))
_implicit = jax.jit(implicit_process_rewards, static_argnames=("num_segments",))


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def np_bce(x, y):
    x = np.asarray(x, np.float64)
    return y * np.logaddexp(0.0, -x) + (1.0 - y) * np.logaddexp(0.0, x)


def _steps(seed):
    rng = np.random.default_rng(seed)
    z = (2.0 * rng.normal(size=(N, M))).astype(np.float32)
    y = rng.uniform(size=(N, M)).astype(np.float32)
    y[:, :2] = np.round(y[:, :2])  # hard and soft labels mixed
    return rng, z, y, make_mask(rng, N, M)


# --------------------------------------------------------------------------------------------------
# Monte-Carlo labels (§9.2)
# --------------------------------------------------------------------------------------------------


def test_mc_step_labels_hard_and_soft():
    rng = np.random.default_rng(0)
    correct = (rng.uniform(size=(N, M, K)) > 0.7).astype(np.int32)
    valid = (rng.uniform(size=(N, M, K)) > 0.25).astype(np.float32)
    valid[0, 0] = 0.0  # a step without continuations
    hard, soft = _labels(correct, valid=valid), _labels(correct, mode="soft", valid=valid)
    ok = (correct > 0) & (valid > 0)
    assert_close(hard, ok.any(-1).astype(np.float64))
    assert_close(soft, ok.sum(-1) / np.maximum(valid.sum(-1), 1))
    assert float(hard[0, 0]) == 0.0 and float(soft[0, 0]) == 0.0
    assert_close(_labels(correct), (correct > 0).any(-1) * 1.0)
    assert_close(_labels(correct.astype(bool), mode="soft"), correct.mean(-1))
    with pytest.raises(ValueError, match="`mode` must be one of 'hard', 'soft'"):
        mc_step_labels(correct, mode="any")
    with pytest.raises(ValueError, match="`rollout_correct` must have rank 3"):
        mc_step_labels(correct[..., 0])


# --------------------------------------------------------------------------------------------------
# PRM losses (§9.2)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_prm_bce_loss_reference_and_gradient(agg):
    rng, z, y, m = _steps(1)
    (loss, metrics), grad = jax.jit(
        jax.value_and_grad(lambda x: prm_bce_loss(x, y, m, agg=agg), has_aux=True)
    )(z)
    assert_close(loss, np_aggregate(np_bce(z, y), m, agg))
    assert_close(grad, (np_sigmoid(z) - y) * np_agg_weights(m, agg))
    valid = m > 0
    assert_close(metrics["rm/step_accuracy"], ((z > 0) == (y > 0.5))[valid].mean())
    assert_close(metrics["rm/step_prob_mean"], np_sigmoid(z)[valid].mean())
    assert_close(metrics["rm/step_label_mean"], y[valid].astype(np.float64).mean())
    assert_nan_safe(lambda a, b: prm_bce_loss(a, b, m, agg=agg), (z, y), m, rng)


def test_prm_bce_soft_label_half_is_minimised_at_zero():
    m = np.ones((1, 3), np.float32)
    half = np.full((1, 3), 0.5, np.float32)
    loss_and_grad = jax.jit(jax.value_and_grad(lambda x: prm_bce_loss(x, half, m)[0]))
    at_zero, grad = loss_and_grad(jnp.zeros((1, 3)))
    assert_close(grad, np.zeros((1, 3)))
    assert_close(at_zero, np.log(2.0))
    for shift in (-0.3, 0.3):
        assert float(loss_and_grad(jnp.full((1, 3), shift))[0]) > float(at_zero)


def test_prm_mse_loss_reference_and_gradient():
    rng, v, y, m = _steps(2)
    (loss, metrics), grad = jax.jit(
        jax.value_and_grad(lambda x: prm_mse_loss(x, y, m), has_aux=True)
    )(v)
    err = v.astype(np.float64) - y
    assert_close(loss, np_aggregate(err**2, m, "token_mean"))
    assert_close(grad, 2.0 * err * m / m.sum())  # no ½ factor
    assert_close(metrics["rm/value_mean"], v[m > 0].astype(np.float64).mean())
    assert_close(metrics["rm/target_mean"], y[m > 0].astype(np.float64).mean())
    assert_nan_safe(lambda a, b: prm_mse_loss(a, b, m), (v, y), m, rng)
    # the targets carry no gradient
    assert np.all(np.asarray(jax.grad(lambda t: prm_mse_loss(v, t, m)[0])(y)) == 0)


def test_prm_loss_errors_name_the_problem():
    z = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="`labels` must have the shape of `step_logits`"):
        prm_bce_loss(z, jnp.zeros((2, 2)), z)
    with pytest.raises(ValueError, match="`step_logits` must be a floating-point"):
        prm_bce_loss(jnp.zeros((2, 3), jnp.int32), z, z)
    with pytest.raises(ValueError, match="`mask` must have shape"):
        prm_mse_loss(z, z, jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="`agg` must be one of"):
        prm_mse_loss(z, z, z, agg="mean")


# --------------------------------------------------------------------------------------------------
# aggregation and scattering of step scores
# --------------------------------------------------------------------------------------------------


def np_aggregate_steps(s, m, how):
    out = np.zeros(s.shape[0])
    for n in range(s.shape[0]):
        x = np.asarray(s[n], np.float64)[m[n] > 0]
        if x.size:
            out[n] = {"min": x.min(), "last": x[-1], "prod": x.prod(), "mean": x.mean()}[how]
    return out


def test_aggregate_step_scores_reference_and_gradient():
    rng, z, _, m = _steps(3)
    s = np_sigmoid(z).astype(np.float32)
    dirty = plant_nonfinite(s, m, rng)
    for how in STEP_AGGREGATIONS:
        out = _agg_scores(dirty, m, how=how)
        assert_close(out, np_aggregate_steps(s, m, how))
        assert float(out[0]) == 0.0  # the empty row
    grad = jax.grad(lambda x: jnp.sum(aggregate_step_scores(x, m, how="min")))(dirty)
    expected = np.zeros_like(s)
    for n in range(1, N):
        idx = np.flatnonzero(m[n])
        expected[n, idx[np.argmin(s[n, idx])]] = 1.0
    assert_close(grad, expected)
    grad = jax.grad(lambda x: jnp.sum(aggregate_step_scores(x, m, how="prod")))(dirty)
    prod = np_aggregate_steps(s, m, "prod")[:, None]
    assert_close(grad, np.where(m > 0, prod / np.where(m > 0, s, 1.0), 0.0), rtol=1e-5)
    with pytest.raises(ValueError, match="`how` must be one of"):
        aggregate_step_scores(s, m, how="max")


def test_scatter_step_rewards():
    rng = np.random.default_rng(4)
    score = rng.normal(size=(N, M)).astype(np.float32)
    end = np.sort(rng.integers(-1, T + 1, size=(N, M)), axis=1).astype(np.int32)
    end[1] = [0, 2, 2, 5, T - 1]  # two steps ending on one token add up
    step_mask = make_mask(rng, N, M)
    out, vjp = jax.vjp(lambda s: scatter_step_rewards(s, end, T, step_mask=step_mask), score)
    expected = np.zeros((N, T))
    for n, k in np.ndindex(N, M):
        if step_mask[n, k] > 0 and 0 <= end[n, k] < T:
            expected[n, end[n, k]] += score[n, k]
    assert_close(out, expected)
    cot = rng.normal(size=(N, T)).astype(np.float32)
    kept = (step_mask > 0) & (end >= 0) & (end < T)
    gathered = np.take_along_axis(cot, np.clip(end, 0, T - 1), axis=1)
    assert_close(vjp(cot)[0], np.where(kept, gathered, 0.0))
    assert_close(_scatter(score, end, T), _np_all(score, end))  # no step mask
    with pytest.raises(ValueError, match="`T` must be a static Python int >= 1"):
        scatter_step_rewards(score, end, 0)
    with pytest.raises(ValueError, match="`end` must be an integer array"):
        scatter_step_rewards(score, end.astype(np.float32), T)


def _np_all(score, end):
    """`scatter_step_rewards` without a step mask: every in-range step counts."""
    out = np.zeros((score.shape[0], T))
    for n, k in np.ndindex(*score.shape):
        if 0 <= end[n, k] < T:
            out[n, end[n, k]] += score[n, k]
    return out


# --------------------------------------------------------------------------------------------------
# implicit PRM (§9.4)
# --------------------------------------------------------------------------------------------------


def _implicit_inputs(seed):
    rng = np.random.default_rng(seed)
    lp = -rng.uniform(0.1, 3.0, size=(N, T)).astype(np.float32)
    ref = (lp + 0.4 * rng.normal(size=(N, T))).astype(np.float32)
    mask = make_mask(rng, N, T)
    is_end = rng.uniform(size=(N, T)) > 0.6
    seg = np.concatenate([np.zeros((N, 1), int), np.cumsum(is_end * mask, axis=1)[:, :-1]], 1)
    seg = np.where(mask > 0, np.minimum(seg, M - 1), -1).astype(np.int32)
    return rng, lp, ref, mask, seg


def test_implicit_process_rewards_sum_to_the_sequence_reward():
    rng, lp, ref, mask, seg = _implicit_inputs(5)
    beta = 0.05
    dirty_lp, dirty_ref = plant_nonfinite(lp, mask, rng), plant_nonfinite(ref, mask, rng)
    r = np.asarray(_implicit(dirty_lp, dirty_ref, seg, mask, beta=beta, num_segments=M))
    token_r = beta * np.where(mask > 0, lp.astype(np.float64) - ref, 0.0)
    expected = np.zeros((N, M))
    for n, t in np.ndindex(N, T):
        if mask[n, t] > 0:
            expected[n, seg[n, t]] += token_r[n, t]
    assert_close(r, expected)
    assert_close(r.sum(1), token_r.sum(1))  # Σ_m r = β·Σ_t (lp − ref)·m
    # step reward = prefix value q at the step's end minus q at the previous step's end
    q = np.cumsum(token_r, axis=1)
    for n in range(1, N):
        ends = [np.flatnonzero(seg[n] == k).max() for k in range(M) if (seg[n] == k).any()]
        q_end = np.concatenate([[0.0], q[n, ends]])
        assert_close(r[n, : len(ends)], np.diff(q_end))
    assert_nan_safe(
        lambda a, b: jnp.sum(
            implicit_process_rewards(a, b, seg, mask, beta=beta, num_segments=M) ** 2
        ),
        (lp, ref),
        mask,
        rng,
    )


def test_implicit_prm_loss_reference_and_gradient():
    rng, lp, ref, mask, _ = _implicit_inputs(6)
    labels = (rng.uniform(size=N) > 0.5).astype(np.float32)
    valid = np.ones(N, np.float32)
    valid[3] = 0.0
    beta = 0.5
    (loss, metrics), grad = jax.jit(
        jax.value_and_grad(
            lambda x: implicit_prm_loss(x, ref, mask, labels, beta=beta, valid=valid),
            has_aux=True,
        )
    )(lp)
    r = beta * np.where(mask > 0, lp.astype(np.float64) - ref, 0.0).sum(1)
    n_valid = valid.sum()
    assert_close(loss, (np_bce(r, labels) * valid).sum() / n_valid)
    expected = beta * ((np_sigmoid(r) - labels) * valid / n_valid)[:, None] * mask
    assert_close(grad, expected)
    assert_close(metrics["rm/reward_mean"], (r * valid).sum() / n_valid)
    assert_close(metrics["rm/accuracy"], (((r > 0) == (labels > 0.5)) * valid).sum() / n_valid)
    assert_nan_safe(
        lambda a, b: implicit_prm_loss(a, b, mask, labels, beta=beta), (lp, ref), mask, rng
    )
    assert np.all(
        np.asarray(jax.grad(lambda b: implicit_prm_loss(lp, b, mask, labels, beta=beta)[0])(ref))
        == 0
    )


def test_implicit_process_rewards_per_row_beta_scales_its_own_row():
    rng, lp, ref, mask, seg = _implicit_inputs(7)
    beta = np.linspace(0.1, 0.9, N).astype(np.float32)
    r = np.asarray(implicit_process_rewards(lp, ref, seg, mask, beta=beta, num_segments=M))
    token_r = beta[:, None] * np.where(mask > 0, lp.astype(np.float64) - ref, 0.0)
    assert_close(r.sum(1), token_r.sum(1))  # Σ_m r_n = β_n·Σ_t (lp − ref)·m
    one = np.asarray(implicit_process_rewards(lp, ref, seg, mask, beta=1.0, num_segments=M))
    assert_close(r, beta[:, None] * one)
    labels = (rng.uniform(size=N) > 0.5).astype(np.float32)
    loss = implicit_prm_loss(lp, ref, mask, labels, beta=beta)[0]
    assert_close(loss, np_bce(token_r.sum(1), labels).mean())


def test_implicit_prm_errors_name_the_problem():
    x = jnp.zeros((2, 3))
    seg = jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match="`beta` must be > 0"):
        implicit_process_rewards(x, x, seg, x, beta=0.0, num_segments=2)
    with pytest.raises(ValueError, match="`num_segments` must be a static Python int"):
        implicit_process_rewards(x, x, seg, x, beta=0.1, num_segments=None)
    with pytest.raises(
        ValueError, match=r"`beta` must be a scalar or have one value per row \(2,\)"
    ):
        implicit_process_rewards(x, x, seg, x, beta=jnp.ones(3), num_segments=2)
    with pytest.raises(ValueError, match="`beta` must be a scalar or have one value per row"):
        implicit_prm_loss(x, x, x, jnp.zeros(2), beta=jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="`segment_ids` must be an integer array"):
        implicit_process_rewards(x, x, x, x, beta=0.1, num_segments=2)
    with pytest.raises(ValueError, match="`segment_ids` must have the shape of `logp`"):
        implicit_process_rewards(x, x, seg[:, :2], x, beta=0.1, num_segments=2)
    with pytest.raises(ValueError, match="`labels` must have one value per row"):
        implicit_prm_loss(x, x, x, jnp.zeros(3), beta=0.1)
    with pytest.raises(ValueError, match="`ref_logp` must have the shape of `logp`"):
        implicit_prm_loss(x, jnp.zeros((2, 2)), x, jnp.zeros(2), beta=0.1)
