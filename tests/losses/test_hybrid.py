"""`hybrid_ratio_loss` (DHPO, ALGORITHMS.md §11): reductions to PPO-clip and GSPO, a float64
reference of the mixed per-token loss, warnings and errors."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.gspo import gspo_loss
from losses.hybrid import hybrid_ratio_loss
from losses.ppo import ppo_clip_loss
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, np_aggregate, vg

N, T = 7, 11
AGG = "seq_mean_token_mean"
CLIPS = {"clip_low": 0.2, "clip_high": 0.28, "seq_clip_low": 0.04, "seq_clip_high": 0.05}


def random_batch(seed, *, n=N, t=T):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, n, t)
    lp = -rng.uniform(0.1, 3.0, size=(n, t)).astype(np.float32)
    old = (lp + 0.4 * rng.normal(size=(n, t))).astype(np.float32)
    adv = rng.normal(size=(n, t)).astype(np.float32)
    return rng, lp, old, adv, mask


def np_hybrid_tokens(lp, old, adv, mask, w):
    """Per-token `w·ℓ_ppo + (1 − w)·ℓ_gspo` (float64, token ratio and GSPO-token ratio)."""
    valid = np.asarray(mask) > 0
    lp, old, a = (np.where(valid, np.asarray(x, np.float64), 0.0) for x in (lp, old, adv))
    r = np.exp(np.clip(lp - old, -20, 20))
    l_ppo = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.28))
    s = np.exp(
        np.minimum(
            (lp - old).sum(1, keepdims=True) / np.maximum(valid.sum(1, keepdims=True), 1), 10
        )
    )
    l_gspo = np.maximum(-a * s, -a * np.clip(s, 0.96, 1.05))
    return np.where(valid, w * l_ppo + (1 - w) * l_gspo, 0.0)


def test_mix_one_is_ppo_clip_and_mix_zero_is_gspo():
    rng, lp, old, adv, mask = random_batch(0)
    is_w = rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)
    kw = {"agg": AGG, "is_weights": is_w}
    ppo_kw = {"clip_low": CLIPS["clip_low"], "clip_high": CLIPS["clip_high"], **kw}
    gspo_kw = {"clip_low": CLIPS["seq_clip_low"], "clip_high": CLIPS["seq_clip_high"], **kw}

    @jax.jit
    def run(lp, old, adv, mask, traced_one, traced_zero):
        return {
            "ppo": vg(ppo_clip_loss, **ppo_kw)(lp, old, adv, mask),
            "gspo": vg(gspo_loss, **gspo_kw)(lp, old, adv, mask),
            "static_one": vg(hybrid_ratio_loss, mix=1.0, **CLIPS, **kw)(lp, old, adv, mask),
            "static_zero": vg(hybrid_ratio_loss, mix=0, **CLIPS, **kw)(lp, old, adv, mask),
            "traced_one": vg(hybrid_ratio_loss, mix=traced_one, **CLIPS, **kw)(lp, old, adv, mask),
            "traced_zero": vg(hybrid_ratio_loss, mix=traced_zero, **CLIPS, **kw)(
                lp, old, adv, mask
            ),
        }

    out = run(lp, old, adv, mask, jnp.float32(1.0), jnp.float32(0.0))
    for name, ref in (("one", "ppo"), ("zero", "gspo")):
        (ref_loss, ref_metrics), ref_grad = out[ref]
        for kind in ("static", "traced"):
            (loss, metrics), grad = out[f"{kind}_{name}"]
            assert_close(loss, float(ref_loss), rtol=1e-6, atol=1e-7)
            assert_close(grad, np.asarray(ref_grad), rtol=1e-6, atol=1e-7)
            prefix = "policy/" if ref == "ppo" else "policy/seq_"
            for key in ("clip_frac", "clip_frac_high", "clip_frac_low", "ratio_mean", "ratio_max"):
                assert_close(metrics[prefix + key], float(ref_metrics["policy/" + key]))
    assert np.any(np.asarray(out["ppo"][1]) != np.asarray(out["gspo"][1]))


def test_mixed_loss_matches_reference_and_is_linear_in_mix():
    rng, lp, old, adv, mask = random_batch(1)
    w_tok = rng.uniform(0.0, 1.0, size=(N, T)).astype(np.float32)

    @jax.jit
    def run(lp, old, adv, mask, w_tok):
        return {
            "scalar": vg(hybrid_ratio_loss, mix=0.3, agg=AGG, **CLIPS)(lp, old, adv, mask),
            "tokens": vg(hybrid_ratio_loss, mix=w_tok, agg=AGG, **CLIPS)(lp, old, adv, mask),
            "ppo": vg(ppo_clip_loss, clip_low=0.2, clip_high=0.28, agg=AGG)(lp, old, adv, mask),
            "gspo": vg(gspo_loss, clip_low=0.04, clip_high=0.05, agg=AGG)(lp, old, adv, mask),
        }

    out = run(lp, old, adv, mask, w_tok)
    (loss, metrics), grad = out["scalar"]
    assert_close(loss, np_aggregate(np_hybrid_tokens(lp, old, adv, mask, 0.3), mask, AGG))
    (ppo_loss, _), ppo_grad = out["ppo"]
    (gspo_loss_, _), gspo_grad = out["gspo"]
    assert_close(loss, 0.3 * float(ppo_loss) + 0.7 * float(gspo_loss_))
    assert_close(grad, 0.3 * np.asarray(ppo_grad) + 0.7 * np.asarray(gspo_grad))
    assert_close(metrics["policy/mix_mean"], 0.3)
    (loss, metrics), _ = out["tokens"]
    assert_close(loss, np_aggregate(np_hybrid_tokens(lp, old, adv, mask, w_tok), mask, AGG))
    assert_close(metrics["policy/mix_mean"], w_tok[mask > 0].mean())


def test_token_sum_modes_warn_unless_mix_is_statically_one():
    _, lp, old, adv, mask = random_batch(2)
    with pytest.warns(UserWarning, match="hybrid_ratio_loss: agg='token_mean'"):
        jax.eval_shape(lambda *a: hybrid_ratio_loss(*a, agg="token_mean"), lp, old, adv, mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.eval_shape(
            lambda *a: hybrid_ratio_loss(*a, mix=1.0, agg="token_mean"), lp, old, adv, mask
        )
        jax.eval_shape(lambda *a: hybrid_ratio_loss(*a), lp, old, adv, mask)


def test_nan_outside_the_mask_does_not_leak():
    rng, lp, old, adv, mask = random_batch(3)
    w_tok = rng.uniform(0.0, 1.0, size=(N, T)).astype(np.float32)
    tok_w = rng.uniform(0.0, 1.0, size=(N, T)).astype(np.float32)

    def fn(lp, old, adv, w_tok, tok_w):
        return hybrid_ratio_loss(lp, old, adv, mask, mix=w_tok, token_weights=tok_w, **CLIPS)

    assert_nan_safe(fn, (lp, old, adv, w_tok, tok_w), mask, rng)


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((3, 4))
    m = jnp.ones((3, 4))

    def trace(*args, **kw):
        return jax.eval_shape(lambda *a: hybrid_ratio_loss(*a, **kw), *args)

    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"hybrid_ratio_loss: `mix` must be in \[0, 1\]"):
            trace(lp, lp, lp, m, mix=bad)
    with pytest.raises(ValueError, match=r"hybrid_ratio_loss: `mix` must be a scalar or \[N,T\]"):
        trace(lp, lp, lp, m, mix=jnp.ones((3, 1)))
    with pytest.raises(ValueError, match=r"hybrid_ratio_loss: `mix` must be a floating-point"):
        trace(lp, lp, lp, m, mix=jnp.ones((3, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"hybrid_ratio_loss: `token_weights` must have the shape"):
        trace(lp, lp, lp, m, token_weights=jnp.ones((3, 1)))
    with pytest.raises(ValueError, match=r"hybrid_ratio_loss: `seq_clip_low` must be >= 0"):
        trace(lp, lp, lp, m, seq_clip_low=-0.1)
    with pytest.raises(ValueError, match=r"hybrid_ratio_loss: `level` must be one of"):
        trace(lp, lp, lp, m, level="token")
    with pytest.raises(ValueError, match=r"hybrid_ratio_loss: `agg` must be one of"):
        trace(lp, lp, lp, m, agg="mean")
    with pytest.raises(ValueError, match=r"hybrid_ratio_loss: .*broadcast_to_tokens"):
        trace(lp, lp, jnp.zeros(3), m)
    with pytest.raises(ValueError, match=r"hybrid_ratio_loss: `mask` must have shape"):
        trace(lp, lp, lp, jnp.ones((4, 3)))
