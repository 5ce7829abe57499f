"""`dppo_loss` (ALGORITHMS.md §5.9) against a float64 reference, invariances and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.aggregation import AGG_MODES
from losses.dppo import dppo_loss
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
DIVERGENCES = ("tv", "binary_kl")
METRICS = {
    "policy/clip_frac",
    "policy/clip_frac_high",
    "policy/clip_frac_low",
    "policy/ratio_cap_frac",
    "policy/divergence_mean",
    "policy/approx_kl",
    "policy/ratio_mean",
    "policy/ratio_max",
}


def np_dppo(lp, old, adv, mask, *, divergence, delta_low=0.2, delta_high=0.2, cap=3.0):
    """Per-token `ℓ`, `∂ℓ/∂logp`, the trust-region flag and the divergence (float64, §5.9)."""
    valid = np.asarray(mask) > 0

    def z(x):
        return np.where(valid, np.asarray(x, np.float64), 0.0)

    a, lp, old = z(adv), z(lp), z(old)
    r = np.exp(np.clip(lp - old, -20.0, 20.0))
    w = r if cap is None else np.minimum(r, cap)
    p, p_old = np.exp(lp), np.exp(old)
    if divergence == "tv":
        ok = np.where(a > 0, p - p_old <= delta_high, p - p_old >= -delta_low)
        div = np.abs(p - p_old)
    else:
        div = p_old * (old - lp) + (1 - p_old) * np.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        ok = np.where(a > 0, (div <= delta_high) | (p <= p_old), (div <= delta_low) | (p >= p_old))
    gate = np.where(ok, w, 0.0)
    return np.where(valid, -a * gate * lp, 0.0), np.where(valid, -a * gate, 0.0), ok, div, r


def random_batch(seed, *, n=N, t=T, spread=0.6):
    """Token probabilities spread over (0.03, 0.97) so that both trust regions bind."""
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, n, t)
    p = rng.uniform(0.03, 0.97, size=(n, t))
    lp = np.log(p).astype(np.float32)
    old = np.minimum(lp + spread * rng.normal(size=(n, t)), -1e-3).astype(np.float32)
    old[1, :2] = lp[1, :2] - 1.5  # ratios e^1.5 > 3: the cap acts (row 1 is full)
    adv = rng.normal(size=(n, t)).astype(np.float32)
    return rng, lp, old, adv, mask


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_matches_reference_in_every_agg_mode(divergence):
    rng, lp, old, adv, mask = random_batch(0)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)
    tok_w = (rng.uniform(size=(N, T)) > 0.25).astype(np.float32)
    configs = {"default": {}, "tight_nocap": {"delta_low": 0.05, "delta_high": 0.1, "cap": None}}

    @jax.jit
    def run(*args):
        out = {}
        for name, cfg in configs.items():
            kw = {k: v for k, v in cfg.items() if k != "cap"}
            kw["ratio_cap"] = cfg.get("cap", 3.0)
            for agg in AGG_MODES:
                out[name, agg] = vg(
                    dppo_loss, divergence=divergence, agg=agg, is_weights=is_w,
                    token_weights=tok_w, **kw,
                )(*args)  # fmt: skip
        return out

    out = run(lp, old, adv, mask)
    w = is_w.astype(np.float64) * tok_w
    valid = mask > 0
    for (name, agg), ((loss, metrics), grad) in out.items():
        ell, dell, ok, div, r = np_dppo(lp, old, adv, mask, divergence=divergence, **configs[name])
        assert loss.dtype == jnp.float32 and loss.shape == ()
        assert_close(loss, np_aggregate(ell * w, mask, agg))
        assert_close(grad, np_agg_weights(mask, agg) * w * dell)
        a = adv[valid]
        cap = configs[name].get("cap", 3.0)
        expected = {
            "policy/clip_frac": np.mean(~ok[valid] & (a != 0)),
            "policy/clip_frac_high": np.mean(~ok[valid] & (a > 0)),
            "policy/clip_frac_low": np.mean(~ok[valid] & (a < 0)),
            "policy/ratio_cap_frac": 0.0 if cap is None else np.mean(r[valid] > cap),
            "policy/divergence_mean": np.mean(div[valid]),
            "policy/approx_kl": np.mean((old.astype(np.float64) - lp)[valid]),
            "policy/ratio_mean": np.mean(r[valid]),
            "policy/ratio_max": np.max(r[valid]),
        }
        assert set(metrics) == METRICS
        for key, value in expected.items():
            assert_close(metrics[key], value, rtol=1e-5, atol=1e-6)
    # the data exercises both sides of the trust region and the ratio cap
    _, _, ok, _, r = np_dppo(lp, old, adv, mask, divergence=divergence)
    assert np.any(~ok & valid & (adv > 0)) and np.any(~ok & valid & (adv < 0))
    assert np.any(ok & valid) and np.any(valid & (r > 3.0))


@pytest.mark.parametrize("old_is_none", [True, False], ids=["old_None", "old_eq_logp"])
def test_on_policy_equals_reinforce(old_is_none):
    _, lp, _, adv, mask = random_batch(1)

    @jax.jit
    def run(lp, adv, mask):
        old = None if old_is_none else lp
        return {
            (div, agg): (
                vg(dppo_loss, divergence=div, agg=agg)(lp, old, adv, mask),
                vg(reinforce_loss, agg=agg)(lp, adv, mask),
            )
            for div in DIVERGENCES
            for agg in ("token_mean", "seq_mean_token_mean")
        }

    for ((loss, metrics), grad), ((pg_loss, _), pg_grad) in run(lp, adv, mask).values():
        assert_close(loss, float(pg_loss))
        assert_close(grad, np.asarray(pg_grad))
        assert float(metrics["policy/clip_frac"]) == 0.0
        assert_close(metrics["policy/ratio_mean"], 1.0)


def test_tokens_outside_the_trust_region_have_zero_gradient():
    # columns: p_old → p, advantage
    p_old = np.array([[0.2, 0.2, 0.9, 0.5, 0.5, 0.6]])
    p = np.array([[0.6, 0.35, 0.3, 0.7, 0.45, 0.6]])
    adv = np.array([[1.0, 1.0, -1.0, -1.0, 2.0, 1.0]], np.float32)
    lp, old = np.log(p).astype(np.float32), np.log(p_old).astype(np.float32)
    mask = np.ones_like(lp)
    run = jax.jit(
        lambda *a: {d: vg(dppo_loss, divergence=d, agg="token_sum")(*a) for d in DIVERGENCES}
    )
    out = run(lp, old, adv, mask)
    r = p / p_old
    # TV 0.2: +0.4 with A>0 leaves; +0.15 stays; −0.6 with A<0 leaves; moves against A stay
    _, grad = out["tv"]
    expected_ok = np.array([[False, True, False, True, True, True]])
    assert_close(grad, np.where(expected_ok, -adv * r, 0.0))
    # binary KL: only moves in the advantage's direction can leave (columns 0 and 2 are far)
    _, grad = out["binary_kl"]
    d = p_old * np.log(p_old / p) + (1 - p_old) * np.log((1 - p_old) / (1 - p))
    assert d[0, 0] > 0.2 and d[0, 2] > 0.2 and d[0, 1] < 0.2
    assert_close(grad, np.where(expected_ok, -adv * r, 0.0))


def test_ratio_cap_truncates_the_weight_and_none_disables_it():
    old = np.log(np.array([[0.1, 0.1]], np.float32))
    lp = np.log(np.array([[0.25, 0.12]], np.float32))  # r = 2.5 and 1.2, TV inside 0.2
    adv = np.ones_like(lp)
    mask = np.ones_like(lp)
    run = jax.jit(
        lambda *a: [vg(dppo_loss, agg="token_sum", ratio_cap=c)(*a)[1] for c in (2.0, None)]
    )
    capped, uncapped = run(lp, old, adv, mask)
    assert_close(capped, [[-2.0, -1.2]])
    assert_close(uncapped, [[-2.5, -1.2]])


@pytest.mark.parametrize("divergence", DIVERGENCES)
def test_nan_outside_the_mask_does_not_leak(divergence):
    rng, lp, old, adv, mask = random_batch(2)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)
    tok_w = rng.uniform(0.0, 1.0, size=(N, T)).astype(np.float32)

    def fn(lp, old, adv, is_w, tok_w):
        return dppo_loss(
            lp, old, adv, mask, divergence=divergence, is_weights=is_w, token_weights=tok_w,
            agg="seq_mean_token_mean",
        )  # fmt: skip

    assert_nan_safe(fn, (lp, old, adv, is_w, tok_w), mask, rng)


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((3, 4))
    m = jnp.ones((3, 4))

    def trace(*args, **kw):
        return jax.eval_shape(lambda *a: dppo_loss(*a, **kw), *args)

    with pytest.raises(ValueError, match=r"dppo_loss: `divergence` must be one of .*got 'kl'"):
        trace(lp, lp, lp, m, divergence="kl")
    with pytest.raises(ValueError, match="dppo_loss: `delta_high` must be >= 0"):
        trace(lp, lp, lp, m, delta_high=-0.1)
    with pytest.raises(ValueError, match="dppo_loss: `ratio_cap` must be > 0"):
        trace(lp, lp, lp, m, ratio_cap=0.0)
    with pytest.raises(ValueError, match=r"dppo_loss: .*broadcast_to_tokens"):
        trace(lp, lp, jnp.zeros(3), m)
    with pytest.raises(ValueError, match=r"dppo_loss: `agg` must be one of"):
        trace(lp, lp, lp, m, agg="mean")
    with pytest.raises(ValueError, match=r"dppo_loss: `is_weights` must have the shape of `logp`"):
        trace(lp, lp, lp, m, is_weights=jnp.ones((3, 1)))
