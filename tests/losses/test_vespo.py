"""`vespo_loss` (ALGORITHMS.md §5.13) against a float64 reference, invariances and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.aggregation import AGG_MODES
from losses.ppo import reinforce_loss
from losses.vespo import vespo_loss
from tests.losses.helpers import (
    assert_close,
    assert_nan_safe,
    make_mask,
    np_agg_weights,
    np_aggregate,
    vg,
)

N, T = 7, 11
SHAPES = {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}


def random_batch(seed, *, n=N, t=T):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, n, t)
    lp = -rng.uniform(0.1, 3.0, size=(n, t)).astype(np.float32)
    old = (lp + 0.08 * rng.normal(size=(n, t))).astype(np.float32)  # sequence ratios ~ e^{±0.3}
    adv = np.repeat(rng.normal(size=(n, 1)), t, axis=1).astype(np.float32)
    return rng, lp, old, adv, mask


def np_vespo(lp, old, adv, mask, *, is_w=None, k_pos, lambda_pos, k_neg, lambda_neg):
    """Per-token `ℓ = −φ·A·lp`, `∂ℓ/∂lp = −φ·A`, and `w_n` (float64, §5.13)."""
    valid = np.asarray(mask) > 0
    lp, old, a = (np.where(valid, np.asarray(x, np.float64), 0.0) for x in (lp, old, adv))
    log_w = np.clip(lp - old, -20, 20).sum(1, keepdims=True)
    if is_w is not None:
        with np.errstate(divide="ignore"):
            log_is = np.clip(np.log(np.asarray(is_w, np.float64)), np.log(1e-8), 20)
        log_w = log_w + np.where(valid, log_is, 0.0).sum(1, keepdims=True)
    log_w = np.clip(log_w, np.log(1e-8), 20)
    w = np.exp(log_w)
    k = np.where(a >= 0, k_pos, k_neg)
    lam = np.where(a >= 0, lambda_pos, lambda_neg)
    with np.errstate(over="ignore"):
        phi = np.exp(lam + k * log_w - lam * w)
    phi = np.where(np.isfinite(phi) & valid, phi, 0.0)
    return -phi * a * lp, -phi * a, phi, w[:, 0]


def test_matches_reference_in_every_agg_mode():
    rng, lp, old, adv, mask = random_batch(0)
    is_w = rng.uniform(0.7, 1.4, size=(N, T)).astype(np.float32)
    tok_w = (rng.uniform(size=(N, T)) > 0.25).astype(np.float32)
    shapes = {"k_pos": 1.5, "lambda_pos": 2.5, "k_neg": 4.0, "lambda_neg": 3.0}

    @jax.jit
    def run(*args):
        return {
            agg: vg(vespo_loss, agg=agg, is_weights=is_w, token_weights=tok_w, **shapes)(*args)
            for agg in AGG_MODES
        }

    ell, dell, phi, w = np_vespo(lp, old, adv, mask, is_w=is_w, **shapes)
    valid = mask > 0
    for agg, ((loss, metrics), grad) in run(lp, old, adv, mask).items():
        assert loss.dtype == jnp.float32
        # rollout IS weights enter through w only: no extra factor is_w on ℓ
        assert_close(loss, np_aggregate(ell * tok_w, mask, agg))
        assert_close(grad, np_agg_weights(mask, agg) * tok_w * dell)
        assert_close(metrics["policy/vespo_weight_mean"], phi[valid].mean())
        assert_close(metrics["policy/seq_ratio_mean"], w[valid.any(1)].mean(), rtol=1e-4)
    assert np.ptp(phi[valid]) > 0.1  # the weights really vary on this data


@pytest.mark.parametrize("old_is_none", [True, False], ids=["old_None", "old_eq_logp"])
def test_on_policy_weight_is_one_and_equals_reinforce(old_is_none):
    _, lp, _, adv, mask = random_batch(1)

    @jax.jit
    def run(lp, adv, mask):
        old = None if old_is_none else lp
        return {
            agg: (
                vg(vespo_loss, agg=agg)(lp, old, adv, mask),
                vg(reinforce_loss, agg=agg)(lp, adv, mask),
            )
            for agg in ("token_mean", "seq_mean_token_mean")
        }

    for ((loss, metrics), grad), ((pg_loss, _), pg_grad) in run(lp, adv, mask).values():
        assert_close(metrics["policy/vespo_weight_mean"], 1.0)
        assert_close(loss, float(pg_loss))
        assert_close(grad, np.asarray(pg_grad))


def test_weight_peaks_at_k_over_lambda_for_each_sign():
    # one-token sequences with w on a grid; token_sum gradient = −φ(w)·A
    grid = np.linspace(0.3, 2.5, 221)
    old = np.full((grid.size, 1), -2.0, np.float32)
    lp = (old + np.log(grid)[:, None]).astype(np.float32)
    mask = np.ones_like(lp)
    run = jax.jit(
        lambda lp, adv: jax.grad(lambda x: vespo_loss(x, old, adv, mask, agg="token_sum")[0])(lp)
    )
    for sign, k, lam in ((1.0, 2.0, 3.0), (-1.0, 3.0, 2.0)):
        phi = -np.asarray(run(lp, np.full_like(lp, sign)))[:, 0] / sign
        w = np.exp(lp.astype(np.float64) - old)[:, 0]
        assert abs(w[np.argmax(phi)] - k / lam) < 0.011
        assert_close(phi, w**k * np.exp(lam * (1 - w)), rtol=1e-4)


def test_far_off_policy_sequences_get_zero_weight():
    # Σ logr = 30 > 20: w = e^20, φ = exp(λ + k·20 − λ·e^20) = 0 (finite value and gradient)
    old = np.full((2, 3), -20.0, np.float32)
    lp = old + np.array([[10.0, 10.0, 10.0], [0.0, 0.0, 0.0]], np.float32)
    adv = np.ones_like(lp)
    (loss, metrics), grad = jax.jit(vg(vespo_loss, agg="token_sum"))(lp, old, adv, np.ones_like(lp))
    assert np.all(np.asarray(grad)[0] == 0.0) and np.all(np.isfinite(np.asarray(grad)))
    assert_close(grad[1], [-1.0, -1.0, -1.0])
    assert_close(loss, 60.0)
    assert_close(metrics["policy/vespo_weight_mean"], 0.5)


def test_nan_outside_the_mask_does_not_leak():
    rng, lp, old, adv, mask = random_batch(2)
    is_w = rng.uniform(0.7, 1.4, size=(N, T)).astype(np.float32)
    tok_w = rng.uniform(0.0, 1.0, size=(N, T)).astype(np.float32)

    def fn(lp, old, adv, is_w, tok_w):
        return vespo_loss(lp, old, adv, mask, is_weights=is_w, token_weights=tok_w)

    assert_nan_safe(fn, (lp, old, adv, is_w, tok_w), mask, rng)


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((3, 4))
    m = jnp.ones((3, 4))

    def trace(*args, **kw):
        return jax.eval_shape(lambda *a: vespo_loss(*a, **kw), *args)

    for name in SHAPES:
        with pytest.raises(ValueError, match=f"vespo_loss: `{name}` must be > 0"):
            trace(lp, lp, lp, m, **{name: 0.0})
    with pytest.raises(ValueError, match=r"vespo_loss: `is_weights` must have the shape of `logp`"):
        trace(lp, lp, lp, m, is_weights=jnp.ones((3, 1)))
    with pytest.raises(ValueError, match=r"vespo_loss: `is_weights` must be a floating-point"):
        trace(lp, lp, lp, m, is_weights=jnp.ones((3, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"vespo_loss: .*broadcast_to_tokens"):
        trace(lp, lp, jnp.zeros(3), m)
    with pytest.raises(ValueError, match=r"vespo_loss: `agg` must be one of"):
        trace(lp, lp, lp, m, agg="seq")
