"""`ppo_clip_loss` and `reinforce_loss` (ALGORITHMS.md §5.1, §5.7) against float64 references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses import AGG_MODES
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
CLIP_LOW, CLIP_HIGH = 0.2, 0.28

PPO_METRICS = {
    "policy/clip_frac",
    "policy/clip_frac_high",
    "policy/clip_frac_low",
    "policy/dual_clip_frac",
    "policy/approx_kl",
    "policy/ratio_mean",
    "policy/ratio_max",
}


# --------------------------------------------------------------------------------------------------
# float64 references, written from the formulas of §5.1 / §5.7
# --------------------------------------------------------------------------------------------------


def np_ppo(
    lp, old, adv, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, ratio_cap=None, clamp=20.0
):
    """Per-token `ℓ` and `∂ℓ/∂logp` (float64, 0 outside the mask)."""
    valid = np.asarray(mask) > 0

    def z(x):
        return np.where(valid, np.asarray(x, np.float64), 0.0)

    a = z(adv)
    logr = z(lp) - z(old)
    if clamp is None:
        lc, dlc = logr, np.ones_like(logr)
    else:
        lc, dlc = np.clip(logr, -clamp, clamp), (np.abs(logr) < clamp).astype(np.float64)
    r = np.exp(lc)
    dr = r * dlc  # ∂r/∂logp
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    l2 = -a * np.clip(r, lo, hi)
    d2 = -a * dr * ((r > lo) & (r < hi))
    if ratio_cap is None:
        l1, d1 = -a * r, -a * dr
    else:
        l1, d1 = -a * np.minimum(r, ratio_cap), -a * dr * (r < ratio_cap)
    loss = np.maximum(l1, l2)
    grad = np.where(l1 >= l2, d1, d2)
    if dual_clip is not None:
        floor = -dual_clip * a
        hit = (a < 0) & (floor < loss)
        loss = np.where(hit, floor, loss)
        grad = np.where(hit, 0.0, grad)
    return np.where(valid, loss, 0.0), np.where(valid, grad, 0.0)


def np_ppo_metrics(lp, old, adv, mask, *, clip_low, clip_high, dual_clip=None, clamp=20.0):
    valid = np.asarray(mask) > 0
    a = np.asarray(adv, np.float64)[valid]
    logr = (np.asarray(lp, np.float64) - np.asarray(old, np.float64))[valid]
    r = np.exp(logr if clamp is None else np.clip(logr, -clamp, clamp))
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    count = max(valid.sum(), 1)
    return {
        "policy/clip_frac": np.sum(-a * np.clip(r, lo, hi) > -a * r) / count,
        "policy/clip_frac_high": np.sum((a > 0) & (r > hi)) / count,
        "policy/clip_frac_low": np.sum((a < 0) & (r < lo)) / count,
        "policy/dual_clip_frac": 0.0
        if dual_clip is None
        else np.sum((a < 0) & (r > dual_clip)) / count,
        "policy/approx_kl": np.sum(-logr) / count,
        "policy/ratio_mean": np.sum(r) / count,
        "policy/ratio_max": r.max() if r.size else 0.0,
    }


def random_batch(seed, *, n=N, t=T, spread=0.4):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, n, t)
    lp = -rng.uniform(0.1, 3.0, size=(n, t)).astype(np.float32)
    old = (lp + spread * rng.normal(size=(n, t))).astype(np.float32)
    adv = rng.normal(size=(n, t)).astype(np.float32)
    return rng, lp, old, adv, mask


def per_token(fn, *args, mask, **kw):
    """ℓ_nt via `agg="token_sum"` on one-hot masks (vmapped; 0 outside the mask)."""
    n, t = mask.shape
    onehots = jnp.eye(n * t, dtype=jnp.float32).reshape(n * t, n, t) * mask[None]
    values = jax.vmap(lambda m: fn(*args, m, agg="token_sum", **kw)[0])(onehots)
    return values.reshape(n, t)


# --------------------------------------------------------------------------------------------------
# §5.1 anchor
# --------------------------------------------------------------------------------------------------

ANCHOR_CONFIGS = {
    "plain": ({}, [-1.2, -0.606531, 1.648721, 0.8, 4.481689]),
    "dual_clip3": ({"dual_clip": 3.0}, [-1.2, -0.606531, 1.648721, 0.8, 3.0]),
    "ratio_cap3": ({"ratio_cap": 3.0}, [-1.2, -0.606531, 1.648721, 0.8, 3.0]),
}


def test_anchor_per_token_values():
    adv = np.array([[1.0], [1.0], [-1.0], [-1.0], [-1.0]], np.float32)
    logr = np.array([[0.5], [-0.5], [0.5], [-0.5], [1.5]], np.float32)
    old = np.full((5, 1), -1.0, np.float32)
    lp = old + logr
    mask = np.ones((5, 1), np.float32)

    @jax.jit
    def run(lp, old, adv, mask):
        out = {}
        for name, (kw, _) in ANCHOR_CONFIGS.items():
            tokens = per_token(ppo_clip_loss, lp, old, adv, mask=mask, **kw)
            # the same five tokens as one row: token_sum is their sum
            row = ppo_clip_loss(lp.T, old.T, adv.T, mask.T, agg="token_sum", **kw)[0]
            out[name] = (tokens[:, 0], row)
        return out

    out = run(lp, old, adv, mask)
    for name, (kw, expected) in ANCHOR_CONFIGS.items():
        tokens, row = out[name]
        assert_close(tokens, np.array(expected))
        reference, _ = np_ppo(lp, old, adv, mask, **kw)
        assert_close(tokens, reference[:, 0])
        assert_close(row, reference.sum())


# --------------------------------------------------------------------------------------------------
# float64 reference on random inputs: value and gradient, every aggregation mode
# --------------------------------------------------------------------------------------------------

CONFIGS = {
    "plain": {},
    "dual_clip": {"dual_clip": 2.0},
    "ratio_cap": {"ratio_cap": 1.5},
    "no_clamp": {"log_ratio_clamp": None},
}


@pytest.mark.parametrize("config", CONFIGS)
def test_matches_reference_with_weights_in_every_agg_mode(config):
    rng, lp, old, adv, mask = random_batch(0, spread=0.6)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)
    tok_w = (rng.uniform(size=(N, T)) > 0.25).astype(np.float32)
    kw = {"clip_low": CLIP_LOW, "clip_high": CLIP_HIGH, **CONFIGS[config]}

    @jax.jit
    def run(*args):
        return {
            agg: vg(ppo_clip_loss, agg=agg, is_weights=is_w, token_weights=tok_w, **kw)(*args)
            for agg in AGG_MODES
        }

    out = run(lp, old, adv, mask)
    clamp = kw.pop("log_ratio_clamp", 20.0)
    ell, dell = np_ppo(lp, old, adv, mask, clamp=clamp, **kw)
    w = is_w.astype(np.float64) * tok_w
    for agg, ((loss, _), grad) in out.items():
        assert loss.dtype == jnp.float32 and loss.shape == ()
        assert_close(loss, np_aggregate(ell * w, mask, agg))
        assert_close(grad, np_agg_weights(mask, agg) * w * dell)


def test_global_normalisers_are_forwarded_to_aggregate():
    _, lp, old, adv, mask = random_batch(1)
    cases = [
        ("token_mean", {"num_tokens": 97.0}),
        ("seq_mean_token_mean", {"num_seqs": 13.0}),
        ("seq_mean_token_sum_norm", {"num_seqs": 13.0, "norm_length": 17.0}),
    ]
    run = jax.jit(lambda *a: [vg(ppo_clip_loss, agg=agg, **kw)(*a) for agg, kw in cases])
    ell, dell = np_ppo(lp, old, adv, mask)
    for (agg, kw), ((loss, _), grad) in zip(cases, run(lp, old, adv, mask), strict=True):
        assert_close(loss, np_aggregate(ell, mask, agg, **kw))
        assert_close(grad, np_agg_weights(mask, agg, **kw) * dell)


# --------------------------------------------------------------------------------------------------
# invariances and properties of §5.1
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("old_is_none", [True, False], ids=["old_None", "old_eq_logp"])
def test_ratio_one_is_plain_policy_gradient(old_is_none):
    _, lp, _, adv, mask = random_batch(2)

    @jax.jit
    def run(lp, adv, mask):
        old = None if old_is_none else lp
        kw = {"clip_low": CLIP_LOW, "clip_high": CLIP_HIGH}
        return {
            agg: (
                vg(ppo_clip_loss, agg=agg, **kw)(lp, old, adv, mask),
                vg(reinforce_loss, agg=agg)(lp, adv, mask)[1],
            )
            for agg in AGG_MODES
        }

    for agg, (((loss, metrics), grad), pg_grad) in run(lp, adv, mask).items():
        assert_close(loss, np_aggregate(-adv, mask, agg))
        assert_close(grad, pg_grad)
        assert_close(grad, -np_agg_weights(mask, agg) * np.where(mask > 0, adv, 0.0))
        assert float(metrics["policy/clip_frac"]) == 0.0
        assert_close(metrics["policy/ratio_mean"], 1.0)
        assert_close(metrics["policy/approx_kl"], 0.0)


def test_zero_gradient_outside_the_trust_region():
    # columns: (A>0, r>1+ε_h), (A<0, r<1−ε_l) -> no gradient; (A>0, r<1−ε_l), (A<0, r>1+ε_h) and
    # r inside the range -> gradient −A·r/D.
    logr = np.log(np.array([[1.5, 0.6, 0.6, 1.5, 1.1, 0.9]] * 3, np.float32))
    adv = np.array([[1.0, -1.0, 2.0, -0.5, 1.5, -2.0]] * 3, np.float32)
    old = np.full(logr.shape, -2.0, np.float32)
    mask = np.ones(logr.shape, np.float32)
    run = jax.jit(vg(ppo_clip_loss, clip_low=CLIP_LOW, clip_high=CLIP_HIGH))
    _, grad = run(old + logr, old, adv, mask)
    grad = np.asarray(grad)
    assert np.all(grad[:, :2] == 0.0)
    assert_close(grad[:, 2:], -adv[:, 2:] * np.exp(logr[:, 2:]) / mask.size)


def test_dual_clip_changes_only_negative_advantages_with_ratio_above_c():
    _, lp, old, adv, mask = random_batch(3, spread=1.0)
    c = 2.0
    r = np.exp(lp.astype(np.float64) - old)
    target = (mask > 0) & (adv < 0) & (r > c)
    assert target.sum() >= 3  # the data exercises the dual clip
    kw = {"clip_low": CLIP_LOW, "clip_high": CLIP_HIGH}

    @jax.jit
    def run(lp, old, adv, mask):
        plain = per_token(ppo_clip_loss, lp, old, adv, mask=mask, **kw)
        dual = per_token(ppo_clip_loss, lp, old, adv, mask=mask, dual_clip=c, **kw)
        return plain, dual

    plain, dual = map(np.asarray, run(lp, old, adv, mask))
    changed = ~np.isclose(plain, dual, rtol=1e-6, atol=0.0)
    np.testing.assert_array_equal(changed, target)
    assert_close(dual[target], -c * adv[target])


def test_ratio_cap_equals_dual_clip_when_cap_at_least_one_plus_eps_high():
    _, lp, old, adv, mask = random_batch(4, spread=1.0)
    deltas = (1.28, 2.0, 3.0)  # 1 + ε_high = 1.28
    common = {"clip_low": CLIP_LOW, "clip_high": CLIP_HIGH, "agg": "seq_mean_token_mean"}

    @jax.jit
    def run(*a):
        return [
            (
                vg(ppo_clip_loss, ratio_cap=d, **common)(*a),
                vg(ppo_clip_loss, dual_clip=d, **common)(*a),
            )
            for d in deltas
        ]

    r = np.exp(lp.astype(np.float64) - old)
    for delta, (((cap_loss, _), cap_grad), ((dual_loss, _), dual_grad)) in zip(
        deltas, run(lp, old, adv, mask), strict=True
    ):
        assert_close(cap_loss, float(dual_loss))
        assert_close(cap_grad, np.asarray(dual_grad))
        # and the cap really acts on this data
        assert np.sum((mask > 0) & (r > delta) & (adv < 0)) >= 2


def test_metrics_match_numpy_and_carry_no_gradient():
    _, lp, old, adv, mask = random_batch(8, n=13, t=17, spread=0.8)
    kw = {"clip_low": CLIP_LOW, "clip_high": CLIP_HIGH, "dual_clip": 2.0}
    # the data distinguishes ε_low from ε_high on both sides (asymmetric clip)
    r = np.exp(lp.astype(np.float64) - old)
    valid = mask > 0
    assert np.any(valid & (adv < 0) & (r > 1 - CLIP_HIGH) & (r < 1 - CLIP_LOW))
    assert np.any(valid & (adv > 0) & (r > 1 + CLIP_LOW) & (r < 1 + CLIP_HIGH))

    @jax.jit
    def run(lp, old, adv, mask):
        _, metrics = ppo_clip_loss(lp, old, adv, mask, **kw)
        metrics_grads = {
            k: jax.grad(lambda x, k=k: ppo_clip_loss(x, old, adv, mask, **kw)[1][k])(lp)
            for k in PPO_METRICS
        }
        return metrics, metrics_grads, ppo_clip_loss(lp, old, adv, mask)[1]

    metrics, metrics_grads, no_dual = run(lp, old, adv, mask)
    assert set(metrics) == PPO_METRICS
    expected = np_ppo_metrics(lp, old, adv, mask, **kw)
    for key, value in expected.items():
        assert metrics[key].dtype == jnp.float32 and metrics[key].shape == ()
        assert_close(metrics[key], value)
        assert np.all(np.asarray(metrics_grads[key]) == 0.0), key
    assert_close(
        metrics["policy/clip_frac"],
        expected["policy/clip_frac_high"] + expected["policy/clip_frac_low"],
    )
    assert expected["policy/dual_clip_frac"] > 0.0
    assert expected["policy/clip_frac_high"] > 0.0 and expected["policy/clip_frac_low"] > 0.0
    # without dual clip the fraction is reported as 0
    assert float(no_dual["policy/dual_clip_frac"]) == 0.0


def test_log_ratio_clamp_bounds_the_value_and_zeroes_the_gradient_beyond_it():
    old = np.full((1, 3), -30.0, np.float32)
    logr = np.array([[25.0, 19.5, -25.0]], np.float32)
    adv = np.array([[-1.0, -1.0, 1.0]], np.float32)
    mask = np.ones((1, 3), np.float32)

    @jax.jit
    def run(lp, old, adv, mask):
        return {
            str(clamp): (
                per_token(ppo_clip_loss, lp, old, adv, mask=mask, log_ratio_clamp=clamp),
                vg(ppo_clip_loss, agg="token_sum", log_ratio_clamp=clamp)(lp, old, adv, mask)[1],
            )
            for clamp in (20.0, None)
        }

    out = run(old + logr, old, adv, mask)
    tokens, grad = out["20.0"]
    assert_close(tokens[0], [np.exp(20.0), np.exp(19.5), -np.exp(-20.0)])
    assert grad[0, 0] == 0.0 and grad[0, 2] == 0.0
    assert_close(grad[0, 1], np.exp(19.5))
    # None: no clamp (TRL)
    tokens, grad = out["None"]
    assert_close(tokens[0], [np.exp(25.0), np.exp(19.5), -np.exp(-25.0)])
    assert_close(grad[0], [np.exp(25.0), np.exp(19.5), -np.exp(-25.0)])


def test_no_clamp_still_keeps_exp_finite_so_a_clipped_ratio_has_zero_gradient():
    """`log_ratio_clamp=None` (TRL) on a token 90 nats off-policy: float32's exp overflows at
    88.7, and the clipped branch's discarded derivative was inf · 0 = NaN for the whole batch.
    The exponent is bounded above at 80: the value is the clipped one, its gradient 0."""
    lp = jnp.array([[0.0, -0.5]])
    old = jnp.array([[-90.0, -0.5]])
    mask = jnp.ones((1, 2))
    for adv, kw, value in ((1.0, {}, -1.1), (-1.0, {"dual_clip": 3.0}, 2.0)):

        def loss(x, adv=adv, kw=kw):
            return ppo_clip_loss(x, old, adv * mask, mask, log_ratio_clamp=None, **kw)[0]

        assert_close(loss(lp), value)  # mean of the clipped 1.2 (or dual-clipped 3) and 1
        assert_close(jax.grad(loss)(lp), [[0.0, -0.5 * adv]])
    # and the advantages carry no gradient (they are data: stop-gradient inside the loss)
    grad_adv = jax.grad(lambda a: ppo_clip_loss(lp, lp - 0.1, a, mask)[0])(jnp.ones((1, 2)))
    assert_close(grad_adv, [[0.0, 0.0]])


# --------------------------------------------------------------------------------------------------
# reinforce_loss (§5.7)
# --------------------------------------------------------------------------------------------------


def test_reinforce_matches_reference_in_every_agg_mode():
    rng, lp, _, adv, mask = random_batch(7)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)
    tok_w = (rng.uniform(size=(N, T)) > 0.25).astype(np.float32)

    @jax.jit
    def run(*args):
        return {
            agg: vg(reinforce_loss, agg=agg, is_weights=is_w, token_weights=tok_w)(*args)
            for agg in AGG_MODES
        }

    w = is_w.astype(np.float64) * tok_w
    count = mask.sum()
    for agg, ((loss, metrics), grad) in run(lp, adv, mask).items():
        assert_close(loss, np_aggregate(-adv.astype(np.float64) * lp * w, mask, agg))
        # gradient −A·w/D·∇logp
        assert_close(grad, -np_agg_weights(mask, agg) * w * np.where(mask > 0, adv, 0.0))
        assert_close(metrics["policy/advantage_mean"], np.sum(adv * mask, dtype=np.float64) / count)
        assert_close(metrics["policy/logp_mean"], np.sum(lp * mask, dtype=np.float64) / count)


# --------------------------------------------------------------------------------------------------
# masks, dtypes, errors
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [{}, {"dual_clip": 3.0, "agg": "seq_mean_token_mean"}])
def test_ppo_nan_outside_the_mask_does_not_leak(kw):
    rng, lp, old, adv, mask = random_batch(8)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)
    tok_w = rng.uniform(0.0, 1.0, size=(N, T)).astype(np.float32)

    def fn(lp, old, adv, is_w, tok_w):
        return ppo_clip_loss(lp, old, adv, mask, is_weights=is_w, token_weights=tok_w, **kw)

    assert_nan_safe(fn, (lp, old, adv, is_w, tok_w), mask, rng)


def test_reinforce_nan_outside_the_mask_does_not_leak():
    rng, lp, _, adv, mask = random_batch(9)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)

    def fn(lp, adv, is_w):
        return reinforce_loss(lp, adv, mask, is_weights=is_w, agg="seq_mean_token_sum")

    assert_nan_safe(fn, (lp, adv, is_w), mask, rng)


def test_all_masked_batch_gives_zero_loss_and_gradient():
    nan = np.full((3, 5), np.nan, np.float32)
    zeros = np.zeros((3, 5), np.float32)
    run = jax.jit(lambda *a: {agg: vg(ppo_clip_loss, agg=agg)(*a) for agg in AGG_MODES})
    for (loss, metrics), grad in run(nan, nan, nan, zeros).values():
        assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)
        assert all(float(v) == 0.0 for v in metrics.values())


def test_bf16_inputs_give_float32_loss():
    _, lp, old, adv, mask = random_batch(10)
    lp16 = jnp.asarray(lp, jnp.bfloat16)
    adv16 = jnp.asarray(adv, jnp.bfloat16)

    @jax.jit
    def run(lp16, old, adv16, mask):
        return (
            ppo_clip_loss(lp16, old, adv16, mask),
            jax.grad(lambda x: ppo_clip_loss(x, old, adv16, mask)[0])(lp16),
            reinforce_loss(lp16, adv16, mask)[0],
        )

    (loss, metrics), grad, pg_loss = run(lp16, old, adv16, mask)
    assert loss.dtype == jnp.float32 and pg_loss.dtype == jnp.float32
    assert all(v.dtype == jnp.float32 for v in metrics.values())
    lp_up = np.asarray(lp16.astype(jnp.float32))
    adv_up = np.asarray(adv16.astype(jnp.float32))
    ell, _ = np_ppo(lp_up, old, adv_up, mask)
    assert_close(loss, np_aggregate(ell, mask, "token_mean"))
    assert_close(pg_loss, np_aggregate(-adv_up.astype(np.float64) * lp_up, mask, "token_mean"))
    assert grad.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(grad, np.float32)))


def test_bool_mask_equals_float_mask():
    _, lp, old, adv, mask = random_batch(11)
    run = jax.jit(
        lambda m1, m2: (ppo_clip_loss(lp, old, adv, m1)[0], ppo_clip_loss(lp, old, adv, m2)[0])
    )
    a, b = run(mask, mask.astype(bool))
    assert float(a) == float(b)


@pytest.mark.parametrize(("clip_low", "clip_high"), [(0.0, 0.0), (0.0, 0.2), (0.2, 0.0)])
def test_a_zero_clip_keeps_the_on_policy_gradient(clip_low, clip_high):
    """Ratio ≡ 1 sits on a zero clip's bound: the gradient is still REINFORCE's (torch's clamp
    passes it on the bound; `jnp.clip` halved it, giving 0.625×)."""
    lp = jnp.log(jnp.array([[0.5, 0.4, 0.3]]))
    adv, m = jnp.array([[1.0, -1.0, 2.0]]), jnp.ones((1, 3))
    want = jax.grad(lambda x: reinforce_loss(x, adv, m)[0])(lp)
    got = jax.grad(
        lambda x: ppo_clip_loss(x, None, adv, m, clip_low=clip_low, clip_high=clip_high)[0]
    )(lp)
    assert_close(got, want)


def _trace(fn, *args, **kw):
    """Trace without compiling: shape/dtype/option errors are raised at trace time."""
    return jax.eval_shape(lambda *a: fn(*a, **kw), *args)


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((3, 4))
    m = jnp.ones((3, 4))
    for bad in (1.0, 0.5):
        with pytest.raises(ValueError, match="`dual_clip` must be > 1"):
            _trace(ppo_clip_loss, lp, lp, lp, m, dual_clip=bad)
    with pytest.raises(ValueError, match="`ratio_cap` must be > 1"):
        _trace(ppo_clip_loss, lp, lp, lp, m, ratio_cap=1.0)
    # concrete arrays are checked like numbers; NaN passes no comparison and is refused
    with pytest.raises(ValueError, match="`dual_clip` must be > 1"):
        _trace(ppo_clip_loss, lp, lp, lp, m, dual_clip=jnp.array(0.5))
    with pytest.raises(ValueError, match="`clip_high` must be >= 0, got nan"):
        _trace(ppo_clip_loss, lp, lp, lp, m, clip_high=float("nan"))
    with pytest.raises(ValueError, match="`clip_low` must be >= 0"):
        _trace(ppo_clip_loss, lp, lp, lp, m, clip_low=-0.1)
    with pytest.raises(
        ValueError, match=r"`advantages` must be per token \[N,T\].*broadcast_to_tokens"
    ):
        _trace(ppo_clip_loss, lp, lp, jnp.zeros(3), m)
    with pytest.raises(ValueError, match=r"reinforce_loss: .*broadcast_to_tokens"):
        _trace(reinforce_loss, lp, jnp.zeros(3), m)
    with pytest.raises(ValueError, match=r"`old_logp` must have the shape of `logp` \(3, 4\)"):
        _trace(ppo_clip_loss, lp, jnp.zeros((3, 5)), lp, m)
    with pytest.raises(ValueError, match="`is_weights` must have the shape of `logp`"):
        _trace(ppo_clip_loss, lp, lp, lp, m, is_weights=jnp.ones((3, 1)))
    with pytest.raises(ValueError, match="`mask` must have shape"):
        _trace(ppo_clip_loss, lp, lp, lp, jnp.ones((4, 3)))
    with pytest.raises(ValueError, match="`logp` must have rank 2"):
        _trace(ppo_clip_loss, jnp.zeros(4), None, jnp.zeros(4), jnp.ones(4))
    with pytest.raises(ValueError, match="`advantages` must be a floating-point array"):
        _trace(ppo_clip_loss, lp, lp, jnp.zeros((3, 4), jnp.int32), m)
    with pytest.raises(ValueError, match=r"must be one of .*'token_mean'.*got 'token-mean'"):
        _trace(ppo_clip_loss, lp, lp, lp, m, agg="token-mean")
    with pytest.raises(ValueError, match=r"must be one of .*got 'tokens'"):
        _trace(reinforce_loss, lp, lp, m, agg="tokens")


def test_bad_agg_error_names_the_agg_argument():
    lp = jnp.zeros((3, 4))
    with pytest.raises(ValueError, match="ppo_clip_loss: `agg` must be one of"):
        _trace(ppo_clip_loss, lp, lp, lp, jnp.ones((3, 4)), agg="token-mean")
