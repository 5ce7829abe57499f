"""`nll_loss`, `rpo_loss`, `xpo_loss`, `step_apo_loss` (ALGORITHMS.md §8.7, §8.9, §11)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from losses.aggregation import AGG_MODES
from losses.dpo import dpo_loss
from losses.dpo_variants import nll_loss, rpo_loss, step_apo_loss, xpo_loss
from tests.losses.helpers import (
    assert_close,
    assert_nan_safe,
    make_mask,
    np_agg_weights,
    np_aggregate,
    plant_nonfinite,
)

N, T = 7, 5


def nls(x):
    return np.logaddexp(0.0, -np.asarray(x, np.float64))


def sig(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def pair_batch(seed, n=N):
    rng = np.random.default_rng(seed)
    pc = -rng.uniform(2.0, 12.0, n).astype(np.float32)
    pr = -rng.uniform(2.0, 12.0, n).astype(np.float32)
    rc = (pc + rng.normal(0.0, 2.0, n)).astype(np.float32)
    rr = (pr + rng.normal(0.0, 2.0, n)).astype(np.float32)
    return rng, pc, pr, rc, rr


# --------------------------------------------------------------------------------------------------
# nll_loss
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("agg", AGG_MODES)
def test_nll_loss_every_aggregation(agg):
    rng = np.random.default_rng(0)
    mask = make_mask(rng, N, T)
    lp = np.log(rng.uniform(0.05, 1.0, (N, T))).astype(np.float32)

    @jax.jit
    def run(lp):
        return jax.value_and_grad(lambda x: nll_loss(x, mask, agg=agg), has_aux=True)(lp)

    (loss, m), grad = run(plant_nonfinite(lp, mask, rng))
    assert_close(loss, np_aggregate(-lp.astype(np.float64), mask, agg))
    assert_close(grad, -np_agg_weights(mask, agg))
    assert_close(m["policy/nll"], float(loss))
    assert_close(m["policy/nll_token_mean"], -lp[mask > 0].astype(np.float64).mean())
    glob, _ = nll_loss(lp, mask, agg=agg, num_tokens=100.0, num_seqs=20.0, norm_length=9.0)
    ref = np_aggregate(
        -lp.astype(np.float64), mask, agg, num_tokens=100.0, num_seqs=20.0, norm_length=9.0
    )
    assert_close(glob, ref)
    assert_nan_safe(lambda x: nll_loss(x, mask, agg=agg), (lp,), mask, rng)


# --------------------------------------------------------------------------------------------------
# rpo_loss / xpo_loss
# --------------------------------------------------------------------------------------------------


def test_rpo_adds_the_nll_term_and_is_dpo_at_zero_coef():
    rng, pc, pr, rc, rr = pair_batch(1)
    mask = make_mask(rng, N, T, empty_row=False)
    lp = np.log(rng.uniform(0.05, 1.0, (N, T))).astype(np.float32)
    nll, _ = nll_loss(lp, mask)
    for kw in ({}, {"loss_type": ("sigmoid", "bco_pair"), "loss_weights": (0.8, 0.2)}):
        dpo, dm = dpo_loss(pc, pr, rc, rr, beta=0.2, **kw)
        loss, m = rpo_loss(pc, pr, rc, rr, nll, nll_coef=0.7, beta=0.2, **kw)
        assert_close(loss, float(dpo) + 0.7 * float(nll))
        assert_close(m["pref/nll"], float(nll))
        assert_close(m["pref/margin"], float(dm["pref/margin"]))
        zero, _ = rpo_loss(pc, pr, rc, rr, nll, nll_coef=0.0, beta=0.2, **kw)
        assert_close(zero, float(dpo))

    # the gradient reaches the token log-probs through the NLL term
    def total(lp):
        return rpo_loss(pc, pr, rc, rr, nll_loss(lp, mask)[0], nll_coef=0.5)[0]

    g = jax.grad(total)(lp)
    assert_close(g, -0.5 * np_agg_weights(mask, "token_mean"))


def test_xpo_adds_the_exploration_bonus_and_is_dpo_at_zero_alpha():
    rng, pc, pr, rc, rr = pair_batch(2)
    samples = -rng.uniform(5.0, 30.0, 6).astype(np.float32)
    sv = np.array([1, 1, 0, 1, 0, 1], bool)
    dpo, _ = dpo_loss(pc, pr, rc, rr, loss_type="ipo")

    def fn(s):
        return xpo_loss(pc, pr, rc, rr, s, alpha=0.1, sample_valid=sv, loss_type="ipo")

    (loss, m), g = jax.jit(jax.value_and_grad(fn, has_aux=True))(plant_nonfinite(samples, sv, rng))
    bonus = samples[sv].astype(np.float64).mean()
    assert_close(loss, float(dpo) + 0.1 * bonus)
    assert_close(g, np.where(sv, 0.1 / sv.sum(), 0.0))
    assert_close(m["pref/ref_sample_logp"], bonus)
    zero, _ = xpo_loss(pc, pr, rc, rr, samples, alpha=0.0, loss_type="ipo")
    assert_close(zero, float(dpo))


# --------------------------------------------------------------------------------------------------
# step_apo_loss (CPL)
# --------------------------------------------------------------------------------------------------


def test_step_apo_matches_reference_and_gradient():
    rng = np.random.default_rng(3)
    lr_w, lr_l = rng.normal(size=N).astype(np.float32), rng.normal(size=N).astype(np.float32)
    a_w, a_l = rng.uniform(0, 1, N).astype(np.float32), rng.uniform(-1, 0.5, N).astype(np.float32)
    valid = np.array([1, 0, 1, 1, 1, 0, 1], bool)
    w = rng.uniform(0.5, 1.5, N).astype(np.float32)
    beta = 0.7

    def fn(lw, ll):
        return step_apo_loss(lw, ll, a_w, a_l, beta=beta, valid=valid, pair_weights=w)

    (loss, m), (g_w, g_l) = jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(
        plant_nonfinite(lr_w, valid, rng), plant_nonfinite(lr_l, valid, rng)
    )
    x = beta * (a_w * lr_w.astype(np.float64) - a_l * lr_l)
    n = valid.sum()
    assert_close(loss, np.sum(np.where(valid, w * nls(x), 0.0)) / n)
    # ∂/∂lr_w = −σ(−x)·β·a_w·w/n, ∂/∂lr_l = +σ(−x)·β·a_l·w/n
    assert_close(g_w, np.where(valid, -sig(-x) * beta * a_w * w / n, 0.0))
    assert_close(g_l, np.where(valid, sig(-x) * beta * a_l * w / n, 0.0))
    assert_close(m["pref/accuracy"], np.mean((x > 0)[valid]))


def test_step_apo_with_unit_advantages_is_dpo_on_the_steps():
    rng = np.random.default_rng(4)
    lr_w, lr_l = rng.normal(size=N).astype(np.float32), rng.normal(size=N).astype(np.float32)
    ones = np.ones(N, np.float32)
    a, _ = step_apo_loss(lr_w, lr_l, ones, ones, beta=0.3)
    b, _ = dpo_loss(lr_w, lr_l, None, None, beta=0.3, reference_free=True)
    assert_close(a, float(b))


x3 = np.zeros(3, np.float32)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="`agg` must be one of"):
        nll_loss(np.zeros((2, 3), np.float32), np.ones((2, 3)), agg="mean")
    with pytest.raises(ValueError, match="`token_logp` must have rank 2"):
        nll_loss(x3, x3)
    with pytest.raises(ValueError, match="`mask` must have shape"):
        nll_loss(np.zeros((2, 3), np.float32), np.ones((2, 2)))
    with pytest.raises(ValueError, match="`chosen_nll` must be a scalar"):
        rpo_loss(x3, x3, x3, x3, x3)
    with pytest.raises(ValueError, match="`nll_coef` must be >= 0"):
        rpo_loss(x3, x3, x3, x3, 1.0, nll_coef=-1.0)
    with pytest.raises(ValueError, match="`loss_type` must be one of"):
        rpo_loss(x3, x3, x3, x3, 1.0, loss_type="sft")
    with pytest.raises(ValueError, match="`ref_sample_logp` must have rank 1"):
        xpo_loss(x3, x3, x3, x3, np.zeros((2, 2)))
    with pytest.raises(ValueError, match="`alpha` must be >= 0"):
        xpo_loss(x3, x3, x3, x3, x3, alpha=-0.1)
    with pytest.raises(ValueError, match="`beta` must be > 0"):
        step_apo_loss(x3, x3, x3, x3, beta=0.0)
    with pytest.raises(ValueError, match="`a_l` must have shape"):
        step_apo_loss(x3, x3, x3, np.zeros(2), beta=0.1)
