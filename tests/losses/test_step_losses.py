"""Step losses (ALGORITHMS.md §11: SPA-RL, OREO, DAPO-step, AWR) vs float64 NumPy references."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from losses.step_losses import (
    awr_loss,
    direct_advantage_step_loss,
    progress_attribution_loss,
    soft_bellman_losses,
)
from tests.losses.helpers import (
    assert_close,
    assert_nan_safe,
    make_mask,
    np_agg_weights,
    np_aggregate,
    plant_nonfinite,
)

N, M, T = 6, 5, 8


def step_batch(seed, n=N, m_=M):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, n, m_)
    x = rng.normal(size=(n, m_)).astype(np.float32)
    adv = rng.normal(size=(n, m_)).astype(np.float32)
    return rng, x, adv, mask


# --------------------------------------------------------------------------------------------------
# progress_attribution_loss
# --------------------------------------------------------------------------------------------------


def test_progress_attribution_value_gradient_and_nan_safety():
    rng, c, _, mask = step_batch(0)
    R = rng.normal(size=N).astype(np.float32)
    R[0] = np.nan  # row 0 has no valid step: not counted, NaN never read
    (loss, metrics), grad = jax.jit(jax.value_and_grad(progress_attribution_loss, has_aux=True))(
        plant_nonfinite(c, mask, rng), mask, R
    )
    rows = mask.sum(1) > 0
    resid = np.where(mask > 0, c, 0.0).sum(1) - np.where(rows, R, 0.0)
    assert_close(loss, np.sum(resid[rows] ** 2) / rows.sum())
    assert_close(grad, 2 * resid[:, None] * mask / rows.sum())
    assert_close(metrics["rm/progress_abs_error"], np.abs(resid[rows]).mean())
    assert_nan_safe(lambda c: progress_attribution_loss(c, mask, np.nan_to_num(R)), (c,), mask, rng)
    # global row count (micro-batching)
    part, _ = progress_attribution_loss(c, mask, np.nan_to_num(R), num_seqs=10.0)
    assert_close(part, np.sum(resid[rows] ** 2) / 10.0)


def test_progress_attribution_is_zero_for_an_exact_decomposition():
    _, c, _, mask = step_batch(1)
    R = np.where(mask > 0, c, 0.0).sum(1)
    loss, _ = progress_attribution_loss(c, mask, R)
    assert_close(loss, 0.0, atol=1e-10)


# --------------------------------------------------------------------------------------------------
# soft_bellman_losses (OREO)
# --------------------------------------------------------------------------------------------------


def np_soft_bellman(lp, ref, v, R, mask, beta, agg):
    """Residual δ_t = V_t − R + β Σ_{u≥t}(lp − ref) and both gradients (float64)."""
    valid = mask > 0
    lr = np.where(valid, lp.astype(np.float64) - ref, 0.0)
    S = np.flip(np.cumsum(np.flip(lr, 1), 1), 1)
    delta = np.where(valid, np.where(valid, v, 0.0) - R[:, None] + beta * S, 0.0)
    loss = np_aggregate(delta**2, mask, agg)
    w = np_agg_weights(mask, agg)
    grad_v = 2 * w * delta  # value loss (policy side under sg)
    # policy loss: ∂/∂lp_u Σ_t w_t δ_t² = Σ_{t≤u} 2 w_t δ_t β, on valid u
    grad_lp = np.where(valid, beta * np.cumsum(2 * w * delta, 1), 0.0)
    return loss, grad_lp, grad_v


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_soft_bellman_values_and_both_gradients(agg):
    rng = np.random.default_rng(2)
    mask = make_mask(rng, N, T)
    lp = -rng.uniform(0.1, 2.0, size=(N, T)).astype(np.float32)
    ref = (lp + 0.3 * rng.normal(size=(N, T))).astype(np.float32)
    v = rng.normal(size=(N, T)).astype(np.float32)
    R = rng.integers(0, 2, size=N).astype(np.float32)
    beta, coef = 0.2, 0.5

    def total(lp, v):
        return soft_bellman_losses(lp, ref, v, R, mask, beta=beta, value_coef=coef, agg=agg)

    (loss, metrics), (g_lp, g_v) = jax.jit(jax.value_and_grad(total, argnums=(0, 1), has_aux=True))(
        lp, v
    )
    part, ref_g_lp, ref_g_v = np_soft_bellman(lp, ref, v, R, mask, beta, agg)
    assert_close(loss, (1 + coef) * part)
    assert_close(metrics["policy/soft_bellman_loss"], part)
    assert_close(metrics["value/soft_bellman_loss"], part)
    assert_close(g_lp, ref_g_lp, atol=1e-5)  # policy side: only through ℓ_π
    assert_close(g_v, coef * ref_g_v, atol=1e-5)  # value side: only through ℓ_V
    assert_nan_safe(lambda lp, ref, v: total(lp, v), (lp, ref, v), mask, rng, argnums=(0, 2))


def test_soft_bellman_residual_vanishes_at_the_soft_bellman_fixed_point():
    rng = np.random.default_rng(3)
    mask = make_mask(rng, N, T)
    lp = -rng.uniform(0.1, 2.0, size=(N, T))
    ref = lp + 0.3 * rng.normal(size=(N, T))
    R = rng.normal(size=N)
    lr = np.where(mask > 0, lp - ref, 0.0)
    v = R[:, None] - 0.1 * np.flip(np.cumsum(np.flip(lr, 1), 1), 1)  # V_t = R − β·KL-to-go
    args = [x.astype(np.float32) for x in (lp, ref, v, R)]
    loss, _ = soft_bellman_losses(*args[:3], args[3], mask, beta=0.1)
    assert_close(loss, 0.0, atol=1e-10)


# --------------------------------------------------------------------------------------------------
# direct_advantage_step_loss / awr_loss
# --------------------------------------------------------------------------------------------------


def test_direct_advantage_step_loss_value_gradient_and_nan_safety():
    rng, lr, adv, mask = step_batch(4)
    beta = 0.5
    fn = jax.jit(
        jax.value_and_grad(direct_advantage_step_loss, has_aux=True), static_argnames="agg"
    )
    (loss, _), grad = fn(lr, adv, mask, beta=beta)
    resid = np.where(mask > 0, beta * lr.astype(np.float64) - adv, 0.0)
    count = mask.sum()
    assert_close(loss, np.sum(resid**2) / count)
    assert_close(grad, 2 * beta * resid / count)
    (loss_sum, _), _ = fn(lr, adv, mask, beta=beta, agg="token_sum")
    assert_close(loss_sum, np.sum(resid**2), rtol=1e-5)
    assert_nan_safe(
        lambda lr, adv: direct_advantage_step_loss(lr, adv, mask, beta=beta), (lr, adv), mask, rng
    )


@pytest.mark.parametrize("max_weight", [None, 1.5])
def test_awr_loss_value_gradient_and_nan_safety(max_weight):
    rng, lp, adv, mask = step_batch(5)
    beta = 0.7
    (loss, metrics), grad = jax.jit(
        jax.value_and_grad(awr_loss, has_aux=True), static_argnames="max_weight"
    )(lp, adv, mask, beta=beta, max_weight=max_weight)
    w = np.exp(adv.astype(np.float64) / beta)
    if max_weight is not None:
        w = np.minimum(w, max_weight)
    w = np.where(mask > 0, w, 0.0)
    count = mask.sum()
    assert_close(loss, -np.sum(w * np.where(mask > 0, lp, 0.0)) / count)
    assert_close(grad, -w / count)  # weights under stop-gradient
    assert_close(metrics["policy/awr_weight_max"], w[mask > 0].max())
    assert_nan_safe(
        lambda lp, adv: awr_loss(lp, adv, mask, beta=beta, max_weight=max_weight),
        (lp, adv),
        mask,
        rng,
    )


def test_awr_with_zero_advantages_is_behaviour_cloning():
    _, lp, _, mask = step_batch(6)
    loss, _ = awr_loss(lp, np.zeros_like(lp), mask, beta=1.0)
    assert_close(loss, -np.sum(np.where(mask > 0, lp, 0.0)) / mask.sum())


# --------------------------------------------------------------------------------------------------
# bad inputs
# --------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    x = np.zeros((2, 3), np.float32)
    m = np.ones((2, 3))
    with pytest.raises(ValueError, match="progress_attribution_loss: `returns` must hold one"):
        progress_attribution_loss(x, m, np.zeros(3))
    with pytest.raises(
        ValueError, match="progress_attribution_loss: `contributions` must be a floating"
    ):
        progress_attribution_loss(x.astype(np.int32), m, np.zeros(2))
    with pytest.raises(ValueError, match="soft_bellman_losses: `beta` must be > 0"):
        soft_bellman_losses(x, x, x, np.zeros(2), m, beta=0.0)
    with pytest.raises(
        ValueError, match="soft_bellman_losses: `values` must have the shape of `logp`"
    ):
        soft_bellman_losses(x, x, np.zeros((2, 4), np.float32), np.zeros(2), m, beta=0.1)
    with pytest.raises(ValueError, match="soft_bellman_losses: `agg` must be one of"):
        soft_bellman_losses(x, x, x, np.zeros(2), m, beta=0.1, agg="mean")
    with pytest.raises(
        ValueError, match="direct_advantage_step_loss: `step_adv` must have the shape"
    ):
        direct_advantage_step_loss(x, x[:1], m, beta=1.0)
    with pytest.raises(
        ValueError, match=r"direct_advantage_step_loss: `mask` must have shape \(2, 3\)"
    ):
        direct_advantage_step_loss(x, x, m[:1], beta=1.0)
    with pytest.raises(ValueError, match="awr_loss: `max_weight` must be > 0"):
        awr_loss(x, x, m, beta=1.0, max_weight=0.0)
    with pytest.raises(ValueError, match="awr_loss: `step_logp` must have rank 2"):
        awr_loss(x[0], x[0], m[0], beta=1.0)
