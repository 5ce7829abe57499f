"""`ratio_variance_loss` and `dual_ascent_update` (R²VPO, ALGORITHMS.md §11)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.aggregation import AGG_MODES
from losses.ppo import reinforce_loss
from losses.ratio_variance import dual_ascent_update, ratio_variance_loss
from tests.losses.helpers import (
    assert_close,
    assert_nan_safe,
    make_mask,
    np_agg_weights,
    np_aggregate,
    vg,
)

N, T = 7, 11
LAM, TARGET = 0.8, 0.05


def random_batch(seed, *, n=N, t=T):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, n, t)
    lp = -rng.uniform(0.1, 3.0, size=(n, t)).astype(np.float32)
    old = (lp + 0.4 * rng.normal(size=(n, t))).astype(np.float32)
    adv = rng.normal(size=(n, t)).astype(np.float32)
    return rng, lp, old, adv, mask


def np_r2vpo(lp, old, adv, mask, upstream, *, lam, target, ddof):
    """Loss parts and `∂loss/∂lp` (float64): surrogate `−A·r` plus `λ(var(r) − target)`."""
    valid = np.asarray(mask) > 0
    lp, old, a = (np.where(valid, np.asarray(x, np.float64), 0.0) for x in (lp, old, adv))
    r = np.where(valid, np.exp(lp - old), 0.0)
    count = valid.sum()
    mu = r[valid].mean()
    var = ((r[valid] - mu) ** 2).sum() / max(count - ddof, 1)
    # ∂var/∂r_nt = 2(r − μ)/(count − ddof) (the μ term sums to 0); ∂r/∂lp = r
    dvar = np.where(valid, 2 * (r - mu) / max(count - ddof, 1) * r, 0.0)
    grad = upstream * (-a * r) + lam * dvar
    return -a * r, var, grad


@pytest.mark.parametrize("ddof", [0, 1])
def test_matches_reference_in_every_agg_mode(ddof):
    rng, lp, old, adv, mask = random_batch(0)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)
    tok_w = (rng.uniform(size=(N, T)) > 0.25).astype(np.float32)

    @jax.jit
    def run(*args):
        kw = {
            "lam": LAM,
            "target": TARGET,
            "ddof": ddof,
            "is_weights": is_w,
            "token_weights": tok_w,
        }
        return {agg: vg(ratio_variance_loss, agg=agg, **kw)(*args) for agg in AGG_MODES}

    w = is_w.astype(np.float64) * tok_w
    for agg, ((loss, metrics), grad) in run(lp, old, adv, mask).items():
        upstream = np_agg_weights(mask, agg) * w
        ell, var, ref_grad = np_r2vpo(
            lp, old, adv, mask, upstream, lam=LAM, target=TARGET, ddof=ddof
        )
        surrogate = np_aggregate(ell * w, mask, agg)
        assert loss.dtype == jnp.float32
        assert_close(loss, surrogate + LAM * (var - TARGET))
        assert_close(grad, ref_grad)
        assert_close(metrics["policy/ratio_var"], var)
        assert_close(metrics["policy/surrogate"], surrogate)
        assert_close(metrics["policy/lambda"], LAM)


@pytest.mark.parametrize("old_is_none", [True, False], ids=["old_None", "old_eq_logp"])
def test_on_policy_variance_vanishes_and_gradient_is_reinforce(old_is_none):
    _, lp, _, adv, mask = random_batch(1)

    @jax.jit
    def run(lp, adv, mask):
        old = None if old_is_none else lp
        return (
            vg(ratio_variance_loss, lam=3.0, target=TARGET)(lp, old, adv, mask),
            vg(reinforce_loss)(lp, adv, mask)[1],
        )

    ((loss, metrics), grad), pg_grad = run(lp, adv, mask)
    assert float(metrics["policy/ratio_var"]) == 0.0
    assert_close(loss, np_aggregate(-adv, mask, "token_mean") - 3.0 * TARGET)
    assert_close(grad, np.asarray(pg_grad))


def test_lambda_is_not_differentiated():
    _, lp, old, adv, mask = random_batch(2)
    g = jax.jit(
        jax.grad(lambda lam: ratio_variance_loss(lp, old, adv, mask, lam=lam, target=TARGET)[0])
    )(jnp.float32(0.5))
    assert float(g) == 0.0


def test_dual_ascent_update_is_projected_gradient_ascent():
    lam = np.array([0.0, 0.5, 0.1, 2.0], np.float32)
    var = np.array([0.3, 0.3, 0.0, 0.01], np.float32)
    step = jax.jit(jax.vmap(lambda lam, var: dual_ascent_update(lam, var, lr=2.0, target=0.1)))
    out = np.asarray(step(lam, var))
    expected = np.maximum(lam + 2.0 * (var.astype(np.float64) - 0.1), 0.0)
    assert_close(out, expected)
    assert out.dtype == np.float32 and out[2] == 0.0  # projected onto λ ≥ 0
    # a few steps drive λ up while the constraint is violated and back to 0 once it holds
    lam_t = jnp.float32(0.0)
    for _ in range(3):
        lam_t = dual_ascent_update(lam_t, 0.3, lr=1.0, target=0.1)
    assert_close(lam_t, 0.6)
    for _ in range(10):
        lam_t = dual_ascent_update(lam_t, 0.0, lr=1.0, target=0.1)
    assert float(lam_t) == 0.0


def test_nan_outside_the_mask_does_not_leak():
    rng, lp, old, adv, mask = random_batch(3)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)

    def fn(lp, old, adv, is_w):
        return ratio_variance_loss(
            lp, old, adv, mask, lam=LAM, target=TARGET, is_weights=is_w, agg="seq_mean_token_mean"
        )

    assert_nan_safe(fn, (lp, old, adv, is_w), mask, rng)


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((3, 4))
    m = jnp.ones((3, 4))

    def trace(*args, **kw):
        return jax.eval_shape(lambda *a: ratio_variance_loss(*a, **kw), *args)

    with pytest.raises(TypeError, match="lam"):
        trace(lp, lp, lp, m, target=0.1)
    with pytest.raises(ValueError, match="ratio_variance_loss: `lam` is required"):
        trace(lp, lp, lp, m, lam=None, target=0.1)
    with pytest.raises(ValueError, match="ratio_variance_loss: `lam` must be >= 0"):
        trace(lp, lp, lp, m, lam=-1.0, target=0.1)
    with pytest.raises(ValueError, match="ratio_variance_loss: `lam` must be a scalar"):
        trace(lp, lp, lp, m, lam=jnp.ones(2), target=0.1)
    with pytest.raises(ValueError, match="ratio_variance_loss: `target` must be >= 0"):
        trace(lp, lp, lp, m, lam=1.0, target=-0.1)
    with pytest.raises(ValueError, match=r"ratio_variance_loss: `ddof` must be one of"):
        trace(lp, lp, lp, m, lam=1.0, target=0.1, ddof=2)
    with pytest.raises(ValueError, match=r"ratio_variance_loss: .*broadcast_to_tokens"):
        trace(lp, lp, jnp.zeros(3), m, lam=1.0, target=0.1)
    with pytest.raises(ValueError, match="dual_ascent_update: `lr` must be > 0"):
        dual_ascent_update(0.1, 0.2, lr=0.0, target=0.1)
    with pytest.raises(ValueError, match="dual_ascent_update: `ratio_var` must be a scalar"):
        dual_ascent_update(0.1, jnp.ones(3), lr=1.0, target=0.1)
    with pytest.raises(ValueError, match="dual_ascent_update: `lam` must be >= 0"):
        dual_ascent_update(-0.1, 0.2, lr=1.0, target=0.1)
