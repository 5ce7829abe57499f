"""`dro_loss` (ALGORITHMS.md §5.10) against a float64 reference, invariances and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.aggregation import AGG_MODES
from losses.dro import dro_loss
from losses.ppo import reinforce_loss
from tests.losses.helpers import (
    assert_close,
    assert_nan_safe,
    make_mask,
    np_agg_weights,
    np_aggregate,
    vg,
)

N, T = 7, 11
BETA = 0.7


def random_batch(seed, *, n=N, t=T):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, n, t)
    lp = -rng.uniform(0.1, 3.0, size=(n, t)).astype(np.float32)
    old = (lp + 0.5 * rng.normal(size=(n, t))).astype(np.float32)
    adv = rng.normal(size=(n, t)).astype(np.float32)
    return rng, lp, old, adv, mask


def np_dro(lp, old, adv, mask, beta):
    """Per-token `ℓ = −(A·lp − ½β(lp − old)²)` and `∂ℓ/∂lp = −(A − β(lp − old))` (float64)."""
    valid = np.asarray(mask) > 0
    lp, old, a = (np.where(valid, np.asarray(x, np.float64), 0.0) for x in (lp, old, adv))
    d = lp - old
    return -(a * lp - 0.5 * beta * d**2), -(a - beta * d), 0.5 * beta * d**2


def test_matches_reference_in_every_agg_mode():
    rng, lp, old, adv, mask = random_batch(0)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)
    tok_w = (rng.uniform(size=(N, T)) > 0.25).astype(np.float32)

    @jax.jit
    def run(*args):
        return {
            agg: vg(dro_loss, beta=BETA, agg=agg, is_weights=is_w, token_weights=tok_w)(*args)
            for agg in AGG_MODES
        }

    ell, dell, pen = np_dro(lp, old, adv, mask, BETA)
    w = is_w.astype(np.float64) * tok_w
    valid = mask > 0
    logr = (lp.astype(np.float64) - old)[valid]
    for agg, ((loss, metrics), grad) in run(lp, old, adv, mask).items():
        assert loss.dtype == jnp.float32
        assert_close(loss, np_aggregate(ell * w, mask, agg))
        assert_close(grad, np_agg_weights(mask, agg) * w * dell)
        assert_close(metrics["policy/dro_penalty"], pen[valid].mean())
        assert_close(metrics["policy/approx_kl"], np.mean(-logr))
        assert_close(metrics["policy/ratio_mean"], np.mean(np.exp(logr)))


def test_gradient_matches_finite_differences():
    _, lp, old, adv, mask = random_batch(1, n=3, t=4)
    lp64, old64, adv64 = (x.astype(np.float64) for x in (lp, old, adv))

    def ref(x):
        return np_aggregate(np_dro(x, old64, adv64, mask, BETA)[0], mask, "seq_mean_token_mean")

    eps = 1e-6
    fd = np.zeros_like(lp64)
    for idx in np.ndindex(*lp.shape):
        e = np.zeros_like(lp64)
        e[idx] = eps
        fd[idx] = (ref(lp64 + e) - ref(lp64 - e)) / (2 * eps)
    grad = jax.jit(
        jax.grad(lambda x: dro_loss(x, old, adv, mask, beta=BETA, agg="seq_mean_token_mean")[0])
    )(lp)
    assert_close(grad, fd, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("old_is_none", [True, False], ids=["old_None", "old_eq_logp"])
def test_on_policy_equals_reinforce(old_is_none):
    _, lp, _, adv, mask = random_batch(2)

    @jax.jit
    def run(lp, adv, mask):
        old = None if old_is_none else lp
        return {
            agg: (
                vg(dro_loss, beta=BETA, agg=agg)(lp, old, adv, mask),
                vg(reinforce_loss, agg=agg)(lp, adv, mask),
            )
            for agg in ("token_mean", "seq_mean_token_sum_norm")
        }

    for ((loss, metrics), grad), ((pg_loss, _), pg_grad) in run(lp, adv, mask).values():
        assert_close(loss, float(pg_loss))
        assert_close(grad, np.asarray(pg_grad))
        assert float(metrics["policy/dro_penalty"]) == 0.0


def test_penalty_pulls_back_in_proportion_to_the_move():
    # A = 0: the gradient is β·(lp − old) per token (token_sum), pointing back to old
    lp = np.array([[-1.0, -2.0, -0.5]], np.float32)
    old = np.array([[-1.5, -1.0, -0.5]], np.float32)
    grad = jax.jit(
        jax.grad(
            lambda x: dro_loss(
                x, old, np.zeros_like(lp), np.ones_like(lp), beta=2.0, agg="token_sum"
            )[0]
        )
    )(lp)
    assert_close(grad, [[1.0, -2.0, 0.0]])


def test_nan_outside_the_mask_does_not_leak():
    rng, lp, old, adv, mask = random_batch(3)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)

    def fn(lp, old, adv, is_w):
        return dro_loss(lp, old, adv, mask, beta=BETA, is_weights=is_w, agg="seq_mean_token_sum")

    assert_nan_safe(fn, (lp, old, adv, is_w), mask, rng)


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((3, 4))
    m = jnp.ones((3, 4))

    def trace(*args, **kw):
        return jax.eval_shape(lambda *a: dro_loss(*a, **kw), *args)

    with pytest.raises(ValueError, match=r"dro_loss: `beta` is required"):
        trace(lp, lp, lp, m, beta=None)
    with pytest.raises(TypeError, match="beta"):
        trace(lp, lp, lp, m)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="dro_loss: `beta` must be > 0"):
            trace(lp, lp, lp, m, beta=bad)
    with pytest.raises(ValueError, match=r"dro_loss: `old_logp` must have the shape of `logp`"):
        trace(lp, jnp.zeros((3, 5)), lp, m, beta=1.0)
    with pytest.raises(ValueError, match=r"dro_loss: `agg` must be one of"):
        trace(lp, lp, lp, m, beta=1.0, agg="sum")
