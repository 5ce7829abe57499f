"""`cispo_loss` (ALGORITHMS.md §5.5): peers' conventions vs float64, clipped tokens keep gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.cispo import cispo_loss
from losses.ppo import ppo_clip_loss, reinforce_loss
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, np_aggregate

N, T = 7, 11

# §5.1's anchor inputs
ANCHOR_ADV = np.array([[1.0, 1.0, -1.0, -1.0, -1.0]], np.float32)
ANCHOR_LOGR = np.array([[0.5, -0.5, 0.5, -0.5, 1.5]], np.float32)


def _inputs(seed: int, scale: float = 0.7):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, N, T)
    lp = -rng.uniform(0.05, 3.0, size=(N, T)).astype(np.float32)
    old = (lp + scale * rng.normal(size=(N, T))).astype(np.float32)
    adv = rng.normal(size=(N, T)).astype(np.float32)
    return rng, lp, old, adv, mask


def _agg_weights(mask: np.ndarray, mode: str) -> np.ndarray:
    """d aggregate / d per_token (aggregate is linear in it), from the float64 reference."""
    weights = np.zeros(mask.shape)
    for n, t in np.ndindex(*mask.shape):
        onehot = np.zeros(mask.shape)
        onehot[n, t] = 1.0
        weights[n, t] = np_aggregate(onehot, mask, mode)
    return weights


def _np_cispo(lp, old, adv, mask, *, convention, clip_low, clip_high, clamp):
    """Float64 per-token loss, its derivative w.r.t. logp, the weight and the ratio (§5.5)."""
    m = mask > 0
    lp, old, adv = (np.where(m, np.asarray(x, np.float64), 0.0) for x in (lp, old, adv))
    logr = lp - old
    c = np.inf if clamp is None else clamp
    r = np.exp(np.clip(logr, -c, c))
    if convention == "relative":
        w = np.clip(r, 1.0 - clip_low, 1.0 + clip_high)
    else:
        w = np.minimum(r, clip_high)
    per_token = np.where(m, -w * adv * lp, 0.0)
    dper_dlp = np.where(m, -w * adv, 0.0)  # the weight is under stop-gradient
    return per_token, dper_dlp, w, logr, r


# (convention, clip_low, clip_high, log_ratio_clamp): ours, verl `cispo`, TRL `cispo` (5.0 and
# the unset-`epsilon_high` fallback 0.2)
CONVENTIONS = [
    ("relative", 1.0, 4.0, 20.0),
    ("relative", 0.2, 0.2, 20.0),
    ("absolute", 0.2, 5.0, None),
    ("absolute", 0.2, 0.2, None),
]


@pytest.mark.parametrize(("convention", "clip_low", "clip_high", "clamp"), CONVENTIONS)
def test_anchor_gradient_weights(convention, clip_low, clip_high, clamp):
    old = np.full_like(ANCHOR_LOGR, -2.0)
    lp = old + ANCHOR_LOGR
    kw = {
        "convention": convention,
        "clip_low": clip_low,
        "clip_high": clip_high,
        "log_ratio_clamp": clamp,
    }
    grad = jax.jit(
        jax.grad(
            lambda x: cispo_loss(x, old, ANCHOR_ADV, jnp.ones((1, 5)), agg="token_sum", **kw)[0]
        )
    )(lp)
    r = [1.648721, 0.606531, 1.648721, 0.606531, 4.481689]
    expected_w = {
        ("relative", 4.0): r,  # w ∈ [0, 5]: nothing clipped
        ("relative", 0.2): [1.2, 0.8, 1.2, 0.8, 1.2],
        ("absolute", 5.0): r,
        ("absolute", 0.2): [0.2] * 5,  # TRL with `epsilon_high` unset caps every weight at 0.2
    }[convention, clip_high]
    assert_close(np.asarray(grad)[0], -np.asarray(expected_w) * ANCHOR_ADV[0])


@pytest.mark.parametrize(("convention", "clip_low", "clip_high", "clamp"), CONVENTIONS)
def test_matches_float64_reference(convention, clip_low, clip_high, clamp):
    rng, lp, old, adv, mask = _inputs(1)
    old[4, :3] = lp[4, :3] - 3.0  # ratio e³ ≈ 20 above every ceiling
    isw = rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)
    tw = (rng.uniform(size=(N, T)) > 0.2).astype(np.float32)
    kw = {"convention": convention, "clip_low": clip_low, "clip_high": clip_high}
    mode = "token_mean" if convention == "relative" else "seq_mean_token_mean"

    def f(x, o, a, m, w, t):
        return cispo_loss(
            x, o, a, m, agg=mode, is_weights=w, token_weights=t, log_ratio_clamp=clamp, **kw
        )

    (loss, metrics), grad = jax.jit(jax.value_and_grad(f, has_aux=True))(
        lp, old, adv, mask, isw, tw
    )
    per_token, dper, w, logr, r = _np_cispo(lp, old, adv, mask, clamp=clamp, **kw)
    assert_close(loss, np_aggregate(per_token * isw * tw, mask, mode))
    assert_close(grad, dper * isw * tw * _agg_weights(mask, mode))
    valid = mask > 0
    count = mask.sum()
    high = 1.0 + clip_high if convention == "relative" else clip_high
    low = 1.0 - clip_low if convention == "relative" else -np.inf
    assert_close(metrics["policy/clip_frac"], (w != r)[valid].sum() / count)
    assert_close(metrics["policy/clip_frac_high"], (r > high)[valid].sum() / count)
    assert_close(metrics["policy/clip_frac_low"], (r < low)[valid].sum() / count)
    assert float(metrics["policy/clip_frac_high"]) > 0
    assert_close(metrics["policy/approx_kl"], -logr[valid].sum() / count)
    assert_close(metrics["policy/ratio_mean"], r[valid].sum() / count)
    assert_close(metrics["policy/ratio_max"], r[valid].max(), rtol=1e-5)
    assert loss.dtype == jnp.float32
    assert all(v.dtype == jnp.float32 and v.shape == () for v in metrics.values())


@pytest.mark.parametrize(
    ("mode", "on_policy"), [("token_mean", "none"), ("seq_mean_token_sum", "equal")]
)
def test_ratio_one_equals_reinforce(mode, on_policy):
    rng, lp, _, adv, mask = _inputs(2)
    isw = rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)

    def cispo(x):
        old = None if on_policy == "none" else x
        return cispo_loss(x, old, adv, mask, agg=mode, is_weights=isw)[0]

    def reinforce(x):
        return reinforce_loss(x, adv, mask, agg=mode, is_weights=isw)[0]

    value, grad = jax.jit(jax.value_and_grad(cispo))(lp)
    ref_value, ref_grad = jax.jit(jax.value_and_grad(reinforce))(lp)
    assert_close(value, float(ref_value))
    assert_close(grad, np.asarray(ref_grad))


def test_clipped_token_keeps_its_gradient():
    # token 0: A > 0, r = e > 1.2 ; token 1: A < 0, r = e⁻¹ < 0.8: PPO drops both, CISPO keeps both
    lp = jnp.array([[-1.0, -2.0]])
    old = jnp.array([[-2.0, -1.0]])
    adv = jnp.array([[1.5, -0.5]])
    m = jnp.ones((1, 2))
    grad = jax.jit(
        jax.grad(
            lambda x: cispo_loss(x, old, adv, m, clip_low=0.2, clip_high=0.2, agg="token_sum")[0]
        )
    )(lp)
    w_clip = np.array([1.2, 0.8])
    assert_close(grad[0], -w_clip * np.asarray(adv)[0])
    assert np.all(np.asarray(grad) != 0)
    ppo_grad = jax.jit(jax.grad(lambda x: ppo_clip_loss(x, old, adv, m, agg="token_sum")[0]))(lp)
    assert_close(ppo_grad, np.zeros((1, 2)))
    _, metrics = jax.jit(lambda x: cispo_loss(x, old, adv, m, clip_low=0.2, clip_high=0.2))(lp)
    assert_close(metrics["policy/clip_frac"], 1.0)
    assert_close(metrics["policy/clip_frac_high"], 0.5)
    assert_close(metrics["policy/clip_frac_low"], 0.5)


@pytest.mark.parametrize("convention", ["relative", "absolute"])
def test_nan_outside_mask_does_not_leak(convention):
    rng, lp, old, adv, mask = _inputs(3)
    tw = rng.uniform(0.0, 1.0, size=(N, T)).astype(np.float32)
    assert_nan_safe(
        lambda x, o, a, m, t: cispo_loss(x, o, a, m, convention=convention, token_weights=t),
        (lp, old, adv, mask, tw),
        mask,
        rng,
        planted=(0, 1, 2, 4),
    )


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((2, 3))
    m = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="cispo_loss: `convention` must be one of 'relative'"):
        cispo_loss(lp, lp, lp, m, convention="cap")
    with pytest.raises(ValueError, match=r"`clip_high` must be > 0, got 0\.0"):
        cispo_loss(lp, lp, lp, m, convention="absolute", clip_high=0.0)
    with pytest.raises(ValueError, match=r"`clip_low` must be >= 0, got -0\.1"):
        cispo_loss(lp, lp, lp, m, clip_low=-0.1)
    with pytest.raises(ValueError, match="cispo_loss: `mask` must have shape"):
        cispo_loss(lp, lp, lp, jnp.ones((3, 2)))
    with pytest.raises(ValueError, match="cispo_loss: `is_weights` must have the shape"):
        cispo_loss(lp, lp, lp, m, is_weights=jnp.ones((2,)))
