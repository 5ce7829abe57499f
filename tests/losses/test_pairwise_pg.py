"""`pairwise_ppo_loss`, `relative_regression_loss`, `contrastive_pg_loss` (ALGORITHMS.md §11)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.pairwise_pg import contrastive_pg_loss, pairwise_ppo_loss, relative_regression_loss
from tests.losses.helpers import assert_close, assert_nan_safe, plant_nonfinite

B = 9


def fd_grad(f, x, h=1e-6):
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(*x.shape):
        up, dn = x.copy(), x.copy()
        up[i] += h
        dn[i] -= h
        g[i] = (f(up) - f(dn)) / (2 * h)
    return g


# --------------------------------------------------------------------------------------------------
# P3O
# --------------------------------------------------------------------------------------------------


def np_p3o(lp, old, r, valid, eps, den=None):
    lp, old, r = (np.asarray(x, np.float64)[valid] for x in (lp, old, r))
    gap = r[:, 0] - r[:, 1]
    adv = np.stack([gap, -gap], 1)
    ratio = np.exp(np.clip(lp - old, -20, 20))
    per = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - eps, 1 + eps))
    den = den if den is not None else max(valid.sum(), 1)
    return 0.5 * per.sum() / den, per


def p3o_batch(seed):
    rng = np.random.default_rng(seed)
    lp = -rng.uniform(5.0, 20.0, (B, 2)).astype(np.float32)
    old = (lp + rng.normal(0, 0.3, (B, 2))).astype(np.float32)
    r = rng.normal(size=(B, 2)).astype(np.float32)
    valid = rng.uniform(size=B) > 0.25
    valid[:2] = [True, False]
    return rng, lp, old, r, valid


def test_pairwise_ppo_matches_reference_with_clipping_active():
    rng, lp, old, r, valid = p3o_batch(0)
    eps = 0.1
    rows = np.broadcast_to(valid[:, None], (B, 2)).astype(np.float32)

    def fn(lp):
        return pairwise_ppo_loss(lp, old, r, clip=eps, valid=valid)

    (loss, m), g = jax.jit(jax.value_and_grad(fn, has_aux=True))(plant_nonfinite(lp, rows, rng))
    ref, per = np_p3o(lp, old, r, valid, eps)
    assert_close(loss, ref)
    assert_close(g, fd_grad(lambda x: np_p3o(x, old, r, valid, eps)[0], lp), rtol=1e-4, atol=1e-7)
    unclipped = (
        -np.stack([r[:, 0] - r[:, 1], r[:, 1] - r[:, 0]], 1)[valid]
        * np.exp(lp.astype(np.float64) - old)[valid]
    )
    frac = np.mean(per > unclipped + 1e-12)
    assert 0 < frac < 1
    assert_close(m["policy/clip_frac"], frac)
    assert_nan_safe(
        lambda a, b: pairwise_ppo_loss(a, b, r, clip=eps, valid=valid), (lp, old), rows, rng
    )
    glob, _ = pairwise_ppo_loss(lp, old, r, clip=eps, valid=valid, num_pairs=30.0)
    assert_close(glob, np_p3o(lp, old, r, valid, eps, den=30.0)[0])


def test_pairwise_ppo_on_policy_gradient_and_invariances():
    rng, lp, _, r, _ = p3o_batch(1)
    grad = jax.grad(lambda x: pairwise_ppo_loss(x, x, r, clip=0.2)[0])(lp)
    gap = r[:, 0].astype(np.float64) - r[:, 1]
    assert_close(grad, np.stack([-0.5 * gap, 0.5 * gap], 1) / B)
    _, _, old, _, _ = p3o_batch(2)
    old = (lp + rng.normal(0, 0.3, (B, 2))).astype(np.float32)
    base = float(pairwise_ppo_loss(lp, old, r, clip=0.2)[0])
    # a reward shift common to the pair changes nothing; swapping the two responses neither
    shift = rng.normal(size=(B, 1)).astype(np.float32) * 10
    assert_close(pairwise_ppo_loss(lp, old, r + shift, clip=0.2)[0], base, atol=1e-5)
    assert_close(pairwise_ppo_loss(lp[:, ::-1], old[:, ::-1], r[:, ::-1], clip=0.2)[0], base)


# --------------------------------------------------------------------------------------------------
# REFUEL / REBEL
# --------------------------------------------------------------------------------------------------


def test_relative_regression_matches_reference_and_minimiser():
    rng = np.random.default_rng(3)
    la, lb = rng.normal(size=B).astype(np.float32), rng.normal(size=B).astype(np.float32)
    qa, qb = rng.normal(size=B).astype(np.float32), rng.normal(size=B).astype(np.float32)
    valid = rng.uniform(size=B) > 0.3
    eta = 0.5

    def fn(a, b):
        return relative_regression_loss(a, b, qa, qb, eta=eta, valid=valid)

    (loss, m), (ga, gb) = jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(
        plant_nonfinite(la, valid, rng), plant_nonfinite(lb, valid, rng)
    )
    e = (la.astype(np.float64) - lb) / eta - (qa.astype(np.float64) - qb)
    n = valid.sum()
    assert_close(loss, np.mean(e[valid] ** 2))
    assert_close(ga, np.where(valid, 2 * e / eta / n, 0.0))
    assert_close(gb, np.where(valid, -2 * e / eta / n, 0.0))
    assert_close(m["policy/residual_abs_mean"], np.abs(e[valid]).mean())
    # the minimiser: lr_a − lr_b = η·(q_a − q_b)
    la_opt = (lb + eta * (qa.astype(np.float64) - qb)).astype(np.float32)
    assert_close(relative_regression_loss(la_opt, lb, qa, qb, eta=eta)[0], 0.0, atol=1e-10)


# --------------------------------------------------------------------------------------------------
# CoPG
# --------------------------------------------------------------------------------------------------


def copg_batch(seed):
    rng = np.random.default_rng(seed)
    la, lb = -rng.uniform(5, 15, B).astype(np.float32), -rng.uniform(5, 15, B).astype(np.float32)
    ra_, rb_ = (
        (la + rng.normal(size=B)).astype(np.float32),
        (lb + rng.normal(size=B)).astype(np.float32),
    )
    wa, wb = rng.normal(size=B).astype(np.float32), rng.normal(size=B).astype(np.float32)
    valid = rng.uniform(size=B) > 0.3
    return rng, la, lb, ra_, rb_, wa, wb, valid


def test_contrastive_pg_gradient_is_the_copg_direction():
    rng, la, lb, ra_, rb_, wa, wb, valid = copg_batch(4)
    beta = 0.2

    def fn(a, b):
        return contrastive_pg_loss(a, b, ra_, rb_, wa, wb, beta=beta, valid=valid)

    (loss, m), (ga, gb) = jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(
        plant_nonfinite(la, valid, rng), plant_nonfinite(lb, valid, rng)
    )
    gap = (wa - beta * (la.astype(np.float64) - ra_)) - (wb - beta * (lb.astype(np.float64) - rb_))
    n = valid.sum()
    assert_close(loss, -np.mean((gap * (la.astype(np.float64) - lb))[valid]), rtol=1e-5, atol=1e-5)
    assert_close(ga, np.where(valid, -gap / n, 0.0), atol=1e-6)
    assert_close(gb, np.where(valid, gap / n, 0.0), atol=1e-6)
    assert_close(m["policy/regularized_reward_gap"], gap[valid].mean(), atol=1e-5)

    # for β > 0 the gradient equals that of the regression loss mean(ΔR²)/(2β)
    def regression(a, b):
        g = (wa - beta * (a - ra_)) - (wb - beta * (b - rb_))
        return jnp.sum(jnp.where(valid, g**2, 0.0)) / n / (2 * beta)

    ra2, rb2 = jax.grad(regression, argnums=(0, 1))(la, lb)
    assert_close(ga, np.asarray(ra2, np.float64), atol=1e-6)
    assert_close(gb, np.asarray(rb2, np.float64), atol=1e-6)


def test_contrastive_pg_at_zero_beta_is_contrastive_reinforce():
    _, la, lb, ra_, rb_, wa, wb, _ = copg_batch(5)
    ga, gb = jax.grad(
        lambda a, b: contrastive_pg_loss(a, b, ra_, rb_, wa, wb, beta=0.0)[0], argnums=(0, 1)
    )(la, lb)
    gap = wa.astype(np.float64) - wb
    assert_close(ga, -gap / B)
    assert_close(gb, gap / B)


x3 = np.zeros(3, np.float32)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="must have shape \\[B,2\\]"):
        pairwise_ppo_loss(
            np.zeros((3, 3), np.float32), np.zeros((3, 3)), np.zeros((3, 3)), clip=0.2
        )
    with pytest.raises(ValueError, match="`rewards` must have shape"):
        pairwise_ppo_loss(np.zeros((3, 2), np.float32), np.zeros((3, 2)), np.zeros(3), clip=0.2)
    with pytest.raises(ValueError, match="`clip` must be >= 0"):
        pairwise_ppo_loss(
            np.zeros((3, 2), np.float32), np.zeros((3, 2)), np.zeros((3, 2)), clip=-0.1
        )
    with pytest.raises(ValueError, match="`eta` must be > 0"):
        relative_regression_loss(x3, x3, x3, x3, eta=0.0)
    with pytest.raises(ValueError, match="`q_b` must have shape"):
        relative_regression_loss(x3, x3, x3, np.zeros(4), eta=1.0)
    with pytest.raises(ValueError, match="`beta` must be >= 0"):
        contrastive_pg_loss(x3, x3, x3, x3, x3, x3, beta=-1.0)
    with pytest.raises(ValueError, match="`seq_logp_a` must have rank 1"):
        contrastive_pg_loss(np.zeros((3, 1)), x3, x3, x3, x3, x3, beta=0.1)
