"""`gspo_loss` (ALGORITHMS.md §5.3) against a float64 reference, anchors and identities."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses import AGG_MODES
from losses.gspo import gspo_loss
from losses.ppo import ppo_clip_loss, reinforce_loss
from tests.losses.helpers import (
    assert_close,
    assert_nan_safe,
    make_mask,
    np_agg_weights,
    np_aggregate,
    vg,
)

N, T = 7, 11
LEVELS = ("sequence_token", "sequence")
SEQ_AGG = "seq_mean_token_mean"
OTHER_AGGS = tuple(a for a in AGG_MODES if a != SEQ_AGG)
WARNING = "weights each sequence by its length"
GSPO_METRICS = {
    "policy/clip_frac",
    "policy/clip_frac_high",
    "policy/clip_frac_low",
    "policy/approx_kl",
    "policy/ratio_mean",
    "policy/ratio_max",
}


# --------------------------------------------------------------------------------------------------
# float64 reference, written from §5.3
# --------------------------------------------------------------------------------------------------


def np_gspo(lp, old, adv, mask, *, clip_low=3e-4, clip_high=4e-4, cap=10.0):
    """Per-token `ℓ`, `∂ℓ_nt/∂log ŝ_n` and the sequence ratio `s_n` (float64)."""
    valid = np.asarray(mask) > 0

    def z(x):
        return np.where(valid, np.asarray(x, np.float64), 0.0)

    a = z(adv)
    logr = z(lp) - z(old)
    seq_logr = logr.sum(1) / np.maximum(valid.sum(1), 1)  # no ±20 clamp
    capped = np.zeros(seq_logr.shape, bool) if cap is None else seq_logr > cap
    s = np.exp(seq_logr if cap is None else np.minimum(seq_logr, cap))[:, None]
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    ell = np.maximum(-a * s, -a * np.clip(s, lo, hi))
    unclipped = ~(((a > 0) & (s > hi)) | ((a < 0) & (s < lo)))
    dell = -a * s * unclipped * ~capped[:, None]
    return np.where(valid, ell, 0.0), np.where(valid, dell, 0.0), s[:, 0]


def np_gspo_grad(dell, upstream, mask, level):
    """∂loss/∂logp from `∂ℓ/∂log ŝ` and the upstream weights `∂loss/∂ℓ` (agg · weights)."""
    valid = np.asarray(mask) > 0
    if level == "sequence_token":  # log ŝ_nt carries the gradient of its own token only
        return upstream * dell
    row = (upstream * dell).sum(1, keepdims=True)  # log ŝ_n = mean_t logr: ∂/∂logp_nt = m/L
    return row * valid / np.maximum(valid.sum(1, keepdims=True), 1)


def random_batch(seed, *, n=N, t=T, spread=0.4, seq_adv=False):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, n, t)
    lp = -rng.uniform(0.1, 3.0, size=(n, t)).astype(np.float32)
    old = (lp + spread * rng.normal(size=(n, t))).astype(np.float32)
    if seq_adv:
        adv = np.repeat(rng.normal(size=(n, 1)), t, axis=1).astype(np.float32)
    else:
        adv = rng.normal(size=(n, t)).astype(np.float32)
    return rng, lp, old, adv, mask


# --------------------------------------------------------------------------------------------------
# anchors
# --------------------------------------------------------------------------------------------------


def test_anchors():
    @jax.jit
    def run():
        out = {}
        for level in LEVELS:
            lp1, m1 = jnp.array([[0.2, -0.1]]), jnp.ones((1, 2))
            lp2, m2 = jnp.array([[0.0, 0.1, -0.1]]), jnp.ones((1, 3))
            out[level] = (
                gspo_loss(lp1, jnp.zeros_like(lp1), m1, m1, level=level),
                gspo_loss(lp2, jnp.zeros_like(lp2), -m2, m2, level=level),
            )
        return out

    for (loss1, metrics1), (loss2, _) in run().values():
        assert_close(loss1, -1.0004)
        assert_close(metrics1["policy/ratio_mean"], 1.051271)
        assert_close(metrics1["policy/clip_frac_high"], 1.0)
        assert_close(loss2, 1.0)


# --------------------------------------------------------------------------------------------------
# float64 reference on random inputs: values, gradients and metrics, every aggregation mode
# --------------------------------------------------------------------------------------------------

CLIPS = {"paper": {}, "wide": {"clip_low": 0.05, "clip_high": 0.08}}


@pytest.mark.parametrize("level", LEVELS)
def test_matches_reference_with_weights(level):
    rng, lp, old, adv, mask = random_batch(0)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)
    tok_w = (rng.uniform(size=(N, T)) > 0.25).astype(np.float32)

    @jax.jit
    def run(*args):
        return {
            (name, agg): vg(
                gspo_loss, level=level, agg=agg, is_weights=is_w, token_weights=tok_w, **clips
            )(*args)
            for name, clips in CLIPS.items()
            for agg in AGG_MODES
        }

    with pytest.warns(UserWarning, match=WARNING) as record:
        out = run(lp, old, adv, mask)
    assert len(record) == len(CLIPS) * len(OTHER_AGGS)  # one per non-sequence mode, at trace time
    w = is_w.astype(np.float64) * tok_w
    valid = mask > 0
    for (name, agg), ((loss, metrics), grad) in out.items():
        ell, dell, s = np_gspo(lp, old, adv, mask, **CLIPS[name])
        assert loss.dtype == jnp.float32 and loss.shape == ()
        assert_close(loss, np_aggregate(ell * w, mask, agg))
        upstream = np_agg_weights(mask, agg) * w
        assert_close(grad, np_gspo_grad(dell, upstream, mask, level))
        # metrics: clip fractions on the sequence ratio, over valid tokens
        lo = 1.0 - CLIPS[name].get("clip_low", 3e-4)
        hi = 1.0 + CLIPS[name].get("clip_high", 4e-4)
        s_nt = np.broadcast_to(s[:, None], mask.shape)[valid]
        a = adv[valid]
        logr = (lp.astype(np.float64) - old)[valid]
        expected = {
            "policy/clip_frac_high": np.mean((a > 0) & (s_nt > hi)),
            "policy/clip_frac_low": np.mean((a < 0) & (s_nt < lo)),
            "policy/clip_frac": np.mean(((a > 0) & (s_nt > hi)) | ((a < 0) & (s_nt < lo))),
            "policy/approx_kl": np.mean(-logr),
            "policy/ratio_mean": np.mean(s_nt),
            "policy/ratio_max": np.max(s_nt),
        }
        assert set(metrics) == GSPO_METRICS
        for key, value in expected.items():
            assert metrics[key].dtype == jnp.float32
            assert_close(metrics[key], value)
    # the data exercises both clip directions and the unclipped branch in the "wide" setting
    _, dell, s = np_gspo(lp, old, adv, mask, **CLIPS["wide"])
    assert np.any(s > 1.08) and np.any(s < 0.95) and np.any(dell != 0)


def test_default_agg_does_not_warn():
    _, lp, old, adv, mask = random_batch(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.eval_shape(lambda *a: gspo_loss(*a), lp, old, adv, mask)


def test_levels_agree_with_sequence_constant_advantages():
    _, lp, old, adv, mask = random_batch(2, seq_adv=True)
    kw = {"clip_low": 0.05, "clip_high": 0.08}

    @jax.jit
    def run(*args):
        return {
            agg: [vg(gspo_loss, level=level, agg=agg, **kw)(*args) for level in LEVELS]
            for agg in (SEQ_AGG, "token_mean")
        }

    with pytest.warns(UserWarning, match=WARNING):
        out = run(lp, old, adv, mask)
    for ((loss_tok, _), grad_tok), ((loss_seq, _), grad_seq) in out.values():
        assert_close(loss_tok, float(loss_seq))
        assert_close(grad_tok, np.asarray(grad_seq))
        assert np.any(np.asarray(grad_tok) != 0)


@pytest.mark.parametrize("old_is_none", [True, False], ids=["old_None", "old_eq_logp"])
def test_on_policy_gradient_is_reinforce_seq_mean_token_mean(old_is_none):
    _, lp, _, adv, mask = random_batch(3)
    seq_adv = np.repeat(adv[:, :1], T, axis=1)

    @jax.jit
    def run(lp, adv, seq_adv, mask):
        old = None if old_is_none else lp
        return (
            vg(gspo_loss, level="sequence_token")(lp, old, adv, mask),
            vg(gspo_loss, level="sequence")(lp, old, seq_adv, mask),
            vg(reinforce_loss, agg=SEQ_AGG)(lp, adv, mask)[1],
            vg(reinforce_loss, agg=SEQ_AGG)(lp, seq_adv, mask)[1],
        )

    ((loss_tok, metrics), grad_tok), ((loss_seq, _), grad_seq), pg, pg_seq = run(
        lp, adv, seq_adv, mask
    )
    assert_close(grad_tok, np.asarray(pg))  # per-token advantages: the token form
    assert_close(grad_seq, np.asarray(pg_seq))  # per-sequence advantages: both forms
    assert_close(loss_tok, np_aggregate(-adv, mask, SEQ_AGG))
    assert_close(loss_seq, np_aggregate(-seq_adv, mask, SEQ_AGG))
    assert_close(metrics["policy/ratio_mean"], 1.0)
    assert float(metrics["policy/clip_frac"]) == 0.0


def test_one_token_sequences_equal_ppo_clip():
    rng, lp, old, adv, mask = random_batch(4, t=1, spread=0.5)
    is_w = rng.uniform(0.3, 2.0, size=(N, 1)).astype(np.float32)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "is_weights": is_w}

    @jax.jit
    def run(*args):
        ppo = vg(ppo_clip_loss, agg=SEQ_AGG, **kw)(*args)
        return ppo, [vg(gspo_loss, level=level, **kw)(*args) for level in LEVELS]

    ((ppo_loss, ppo_metrics), ppo_grad), gspo_out = run(lp, old, adv, mask)
    assert np.any(np.abs(np.asarray(ppo_grad)) > 0) and float(ppo_metrics["policy/clip_frac"]) > 0
    for (loss, metrics), grad in gspo_out:
        assert_close(loss, float(ppo_loss))
        assert_close(grad, np.asarray(ppo_grad))
        for key in GSPO_METRICS:
            assert_close(metrics[key], float(ppo_metrics[key]))


def test_sequence_log_ratio_cap_and_no_token_clamp():
    # row 0: mean log-ratio 12 > 10 (capped: value e^10, no gradient); row 1: token log-ratios ±30
    # average to 0 (no ±20 clamp inside the mean: s = 1)
    old = np.full((2, 2), -40.0, np.float32)
    logr = np.array([[11.0, 13.0], [30.0, -30.0]], np.float32)
    adv = np.array([[-1.0, -1.0], [1.0, 1.0]], np.float32)
    mask = np.ones((2, 2), np.float32)

    @jax.jit
    def run(*args):
        return {
            (level, str(cap)): vg(gspo_loss, level=level, seq_log_ratio_max=cap)(*args)
            for level in LEVELS
            for cap in (10.0, None)
        }

    for (_, cap), ((loss, metrics), grad) in run(old + logr, old, adv, mask).items():
        grad = np.asarray(grad)
        if cap == "10.0":
            assert_close(loss, (np.exp(10.0) - 1.0) / 2)
            assert_close(metrics["policy/ratio_max"], np.exp(10.0))
            assert np.all(grad[0] == 0.0)
        else:
            assert_close(loss, (np.exp(12.0) - 1.0) / 2)
            assert np.all(grad[0] > 0.0)
        # row 1 is on the ratio-1 point of the surrogate: gradient −A/(L·D) per token
        assert_close(grad[1], [-0.25, -0.25])


# --------------------------------------------------------------------------------------------------
# masks, dtypes, errors
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_nan_outside_the_mask_does_not_leak(level):
    rng, lp, old, adv, mask = random_batch(5)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)
    tok_w = rng.uniform(0.0, 1.0, size=(N, T)).astype(np.float32)

    def fn(lp, old, adv, is_w, tok_w):
        return gspo_loss(
            lp, old, adv, mask, level=level, clip_low=0.05, clip_high=0.08, is_weights=is_w,
            token_weights=tok_w,
        )  # fmt: skip

    assert_nan_safe(fn, (lp, old, adv, is_w, tok_w), mask, rng)


def test_bf16_inputs_give_float32_loss():
    _, lp, old, adv, mask = random_batch(6)
    lp16 = jnp.asarray(lp, jnp.bfloat16)
    loss, metrics = jax.jit(gspo_loss)(lp16, old, adv, mask)
    assert loss.dtype == jnp.float32
    assert all(v.dtype == jnp.float32 for v in metrics.values())
    ell, _, _ = np_gspo(np.asarray(lp16.astype(jnp.float32)), old, adv, mask)
    assert_close(loss, np_aggregate(ell, mask, SEQ_AGG))


def _trace(*args, **kw):
    return jax.eval_shape(lambda *a: gspo_loss(*a, **kw), *args)


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((3, 4))
    m = jnp.ones((3, 4))
    with pytest.raises(ValueError, match=r"gspo_loss: `level` must be one of .*got 'token'"):
        _trace(lp, lp, lp, m, level="token")
    with pytest.raises(ValueError, match=r"gspo_loss: `agg` must be one of .*got 'seq-mean'"):
        _trace(lp, lp, lp, m, agg="seq-mean")
    with pytest.raises(ValueError, match="`seq_log_ratio_max` must be > 0"):
        _trace(lp, lp, lp, m, seq_log_ratio_max=0.0)
    with pytest.raises(ValueError, match="`clip_high` must be >= 0"):
        _trace(lp, lp, lp, m, clip_high=-1e-4)
    with pytest.raises(ValueError, match=r"gspo_loss: .*broadcast_to_tokens"):
        _trace(lp, lp, jnp.zeros(3), m)
    with pytest.raises(ValueError, match=r"gspo_loss: `old_logp` must have the shape of `logp`"):
        _trace(lp, jnp.zeros((3, 5)), lp, m)
    with pytest.raises(ValueError, match=r"gspo_loss: `is_weights` must have the shape of `logp`"):
        _trace(lp, lp, lp, m, is_weights=jnp.ones((3, 1)))
    with pytest.raises(ValueError, match=r"gspo_loss: `token_weights` must be a floating-point"):
        _trace(lp, lp, lp, m, token_weights=jnp.ones((3, 4), jnp.int32))
