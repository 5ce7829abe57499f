"""`dpo_token_rewards`, `tgdpo_loss` (ALGORITHMS.md §8.8, §8.10)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from losses.dpo import dpo_loss
from losses.logprobs import sequence_logprob
from losses.token_dpo import dpo_token_rewards, tgdpo_loss
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, plant_nonfinite

N, TC, TR = 7, 6, 4


def nls(x):
    return np.logaddexp(0.0, -np.asarray(x, np.float64))


def sig(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def token_batch(seed):
    rng = np.random.default_rng(seed)
    lp_c = np.log(rng.uniform(0.05, 1.0, (N, TC))).astype(np.float32)
    ref_c = np.log(rng.uniform(0.05, 1.0, (N, TC))).astype(np.float32)
    lp_r = np.log(rng.uniform(0.05, 1.0, (N, TR))).astype(np.float32)
    ref_r = np.log(rng.uniform(0.05, 1.0, (N, TR))).astype(np.float32)
    m_c, m_r = make_mask(rng, N, TC), make_mask(rng, N, TR, empty_row=False)
    return rng, lp_c, ref_c, m_c, lp_r, ref_r, m_r


# --------------------------------------------------------------------------------------------------
# dpo_token_rewards
# --------------------------------------------------------------------------------------------------


def test_token_rewards_match_reference_and_sum_to_the_sequence_implicit_reward():
    rng, lp_c, ref_c, m_c, lp_r, ref_r, m_r = token_batch(0)
    beta = rng.uniform(0.05, 0.5, N).astype(np.float32)
    r = jax.jit(dpo_token_rewards)(
        plant_nonfinite(lp_c, m_c, rng), plant_nonfinite(ref_c, m_c, rng), m_c, beta=beta
    )
    expected = np.where(m_c > 0, beta[:, None] * (lp_c.astype(np.float64) - ref_c), 0.0)
    assert_close(r, expected)
    # Σ_t r_t = β·(Σ lp − Σ ref): the implicit reward that dpo_loss compares
    seq = sequence_logprob(lp_c, m_c) - sequence_logprob(ref_c, m_c)
    assert_close(np.asarray(r).sum(1), beta * np.asarray(seq, np.float64), atol=1e-5)
    # and with a scalar β the batch means equal dpo_loss's reward metric
    r_c = dpo_token_rewards(lp_c, ref_c, m_c, beta=0.1)
    r_r = dpo_token_rewards(lp_r, ref_r, m_r, beta=0.1)
    _, m = dpo_loss(
        sequence_logprob(lp_c, m_c),
        sequence_logprob(lp_r, m_r),
        sequence_logprob(ref_c, m_c),
        sequence_logprob(ref_r, m_r),
        beta=0.1,
    )
    assert_close(np.asarray(r_c).sum(1).mean(), float(m["pref/reward_chosen"]), atol=1e-6)
    assert_close(np.asarray(r_r).sum(1).mean(), float(m["pref/reward_rejected"]), atol=1e-6)
    g = jax.grad(lambda x: dpo_token_rewards(x, ref_c, m_c, beta=0.1).sum())(lp_c)
    assert_close(g, 0.1 * m_c)
    assert_nan_safe(lambda a, b: dpo_token_rewards(a, b, m_c).sum(), (lp_c, ref_c), m_c, rng)


# --------------------------------------------------------------------------------------------------
# tgdpo_loss
# --------------------------------------------------------------------------------------------------


def np_tgdpo(lr_c, m_c, lr_r, m_r, rw_c, rw_r, beta, alpha, valid):
    lr_c = np.where(m_c > 0, np.asarray(lr_c, np.float64), 0.0)
    lr_r = np.where(m_r > 0, np.asarray(lr_r, np.float64), 0.0)
    h_c = np.sum(beta * (1 + alpha * rw_c) * lr_c, axis=1)
    h_r = np.sum(beta * (1 - alpha * rw_r) * lr_r, axis=1)
    return np.mean(nls(h_c - h_r)[valid]), h_c - h_r


def test_tgdpo_matches_reference_and_gradient():
    rng, lp_c, ref_c, m_c, lp_r, ref_r, m_r = token_batch(1)
    lr_c, lr_r = lp_c - ref_c, lp_r - ref_r
    rw_c = rng.normal(0, 0.5, (N, TC)).astype(np.float32)
    rw_r = rng.normal(0, 0.5, (N, TR)).astype(np.float32)
    valid = np.array([1, 1, 0, 1, 1, 1, 0], bool)
    beta, alpha = 0.3, 0.8

    def fn(lc, lr):
        return tgdpo_loss(lc, m_c, lr, m_r, rw_c, rw_r, beta=beta, alpha=alpha, valid=valid)

    dirty_c = plant_nonfinite(lr_c, m_c * valid[:, None], rng)
    dirty_r = plant_nonfinite(lr_r, m_r * valid[:, None], rng)
    (loss, m), (g_c, g_r) = jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(
        dirty_c, dirty_r
    )
    ref, margin = np_tgdpo(lr_c, m_c, lr_r, m_r, rw_c, rw_r, beta, alpha, valid)
    assert_close(loss, ref)
    n = valid.sum()
    coef = np.where(valid, -sig(-margin) / n, 0.0)[:, None]
    assert_close(g_c, coef * beta * (1 + alpha * rw_c) * m_c, atol=1e-6)
    assert_close(g_r, -coef * beta * (1 - alpha * rw_r) * m_r, atol=1e-6)
    assert_close(m["pref/guided_margin"], margin[valid].mean(), atol=1e-5)
    # the guide rewards carry no gradient
    g = jax.grad(lambda w: tgdpo_loss(lr_c, m_c, lr_r, m_r, w, rw_r, alpha=alpha)[0])(rw_c)
    assert np.all(np.asarray(g) == 0)


def test_tgdpo_without_guidance_is_dpo_on_sequence_sums():
    rng, lp_c, ref_c, m_c, lp_r, ref_r, m_r = token_batch(2)
    rw_c = rng.normal(size=(N, TC)).astype(np.float32)
    rw_r = rng.normal(size=(N, TR)).astype(np.float32)
    a, ma = tgdpo_loss(lp_c - ref_c, m_c, lp_r - ref_r, m_r, rw_c, rw_r, beta=0.2, alpha=0.0)
    b, mb = dpo_loss(
        sequence_logprob(lp_c, m_c),
        sequence_logprob(lp_r, m_r),
        sequence_logprob(ref_c, m_c),
        sequence_logprob(ref_r, m_r),
        beta=0.2,
    )
    assert_close(a, float(b))
    assert_close(ma["pref/accuracy"], float(mb["pref/accuracy"]))
    assert_close(ma["pref/margin"], float(mb["pref/margin"]), atol=1e-6)


x23 = np.zeros((2, 3), np.float32)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="`ref_logp` must have the shape of `logp`"):
        dpo_token_rewards(x23, np.zeros((2, 4), np.float32), np.ones((2, 3)))
    with pytest.raises(ValueError, match="`beta` must be a scalar or have shape \\(2,\\)"):
        dpo_token_rewards(x23, x23, np.ones((2, 3)), beta=np.ones(3))
    with pytest.raises(ValueError, match="`beta` must be > 0"):
        dpo_token_rewards(x23, x23, np.ones((2, 3)), beta=0.0)
    with pytest.raises(ValueError, match="`rejected_token_lr` must have N = 2 rows"):
        tgdpo_loss(
            x23,
            x23,
            np.zeros((3, 3), np.float32),
            x23[:1].repeat(3, 0),
            x23,
            np.zeros((3, 3), np.float32),
            alpha=0.5,
        )
    with pytest.raises(ValueError, match="`chosen_token_rewards` must have the shape"):
        tgdpo_loss(x23, x23, x23, x23, np.zeros((2, 2), np.float32), x23, alpha=0.5)
    with pytest.raises(ValueError, match="`chosen_mask` must have shape"):
        tgdpo_loss(x23, np.ones((2, 2)), x23, x23, x23, x23, alpha=0.5)
    with pytest.raises(ValueError, match="must be scalars"):
        tgdpo_loss(x23, x23, x23, x23, x23, x23, alpha=np.ones(2))
