"""KL estimators, kl_loss, KL-penalised rewards, controllers and full_kl (ALGORITHMS.md §3)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import losses
from losses.kl import (
    KLControllerState,
    adaptive_kl_controller,
    adaptive_kl_update,
    fixed_kl_controller,
    full_kl,
    kl_estimate,
    kl_loss,
    kl_penalized_rewards,
    kl_penalized_scores,
)
from losses.logprobs import token_logprobs
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, np_aggregate

N, T, V = 7, 11, 13
ESTIMATORS = ("k1", "k2", "k3", "abs")


def jcall(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` under `jax.jit` (arrays traced, keywords closed over)."""
    return jax.jit(lambda *a: fn(*a, **kwargs))(*args)


def jgrad(scalar_fn, x):
    """`jax.grad` under `jax.jit`; `x` is one array, or a tuple of arrays (gradient w.r.t. each)."""
    if isinstance(x, tuple):
        return jax.jit(jax.grad(scalar_fn, argnums=tuple(range(len(x)))))(*x)
    return jax.jit(jax.grad(scalar_fn))(x)


# --------------------------------------------------------------------------------------------------
# float64 references, written from the formulas
# --------------------------------------------------------------------------------------------------


def np_kl(d, estimator, clamp=None, log_ratio_clamp=20.0):
    d = np.asarray(d, np.float64)
    if estimator == "k1":
        v = d
    elif estimator == "abs":
        v = np.abs(d)
    elif estimator == "k2":
        v = 0.5 * d**2
    else:
        dh = d if log_ratio_clamp is None else np.clip(d, -log_ratio_clamp, log_ratio_clamp)
        v = np.exp(-dh) - 1.0 + dh
    return v if clamp is None else np.clip(v, -clamp, clamp)


def np_kl_grad(d, estimator):
    """∂estimator/∂lp (no clamps active)."""
    d = np.asarray(d, np.float64)
    return {"k1": np.ones_like(d), "abs": np.sign(d), "k2": d, "k3": 1.0 - np.exp(-d)}[estimator]


def _data(seed=0):
    rng = np.random.default_rng(seed)
    lp = -rng.uniform(0.05, 4.0, size=(N, T)).astype(np.float32)
    ref = (lp + rng.normal(scale=0.8, size=(N, T))).astype(np.float32)
    m = make_mask(rng, N, T)
    return rng, lp, ref, m


def np_log_softmax(z):
    z = np.asarray(z, np.float64)
    top = z.max(-1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(-1, keepdims=True))


# --------------------------------------------------------------------------------------------------
# kl_estimate
# --------------------------------------------------------------------------------------------------


def test_anchor():
    d = np.array([0.5, -1.0, 0.0], np.float32)
    expected = {
        "k1": [0.5, -1.0, 0.0],
        "abs": [0.5, 1.0, 0.0],
        "k2": [0.125, 0.5, 0.0],
        "k3": [0.106531, 0.718282, 0.0],
    }
    for est, value in expected.items():
        out = jcall(kl_estimate, d, np.zeros(3, np.float32), estimator=est)
        assert out.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(out), value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_matches_reference_masked(estimator):
    rng, lp, ref, m = _data(1)
    out = jcall(kl_estimate, lp, ref, estimator=estimator, mask=m)
    assert_close(out, np.where(m > 0, np_kl(lp - ref.astype(np.float64), estimator), 0.0))
    # gradient w.r.t. logp: the estimator's derivative at each valid token
    w = rng.normal(size=(N, T)).astype(np.float32)
    g = jgrad(lambda a: jnp.sum(kl_estimate(a, ref, estimator=estimator, mask=m) * w), lp)
    assert_close(g, w * m * np_kl_grad(lp - ref.astype(np.float64), estimator))
    assert_nan_safe(
        lambda a, b: jnp.sum(kl_estimate(a, b, estimator=estimator, mask=m) * w),
        (lp, ref),
        m,
        rng,
        argnums=(0, 1),
    )
    if estimator != "k1":
        assert np.all(np.asarray(jcall(kl_estimate, lp, ref, estimator=estimator)) >= 0)


def test_bf16_inputs_are_upcast():
    _, lp, ref, _ = _data(2)
    lpb, refb = jnp.asarray(lp, jnp.bfloat16), jnp.asarray(ref, jnp.bfloat16)
    out = jcall(kl_estimate, lpb, refb, estimator="k3")
    assert out.dtype == jnp.float32
    d = np.asarray(lpb, np.float64) - np.asarray(refb, np.float64)
    assert_close(out, np_kl(d, "k3"))


@pytest.mark.parametrize("estimator", ["k1", "k3", "abs"])
def test_straight_through_value_of_estimator_gradient_of_k2(estimator):
    _, lp, ref, m = _data(3)
    d = lp - ref.astype(np.float64)
    out = jcall(kl_estimate, lp, ref, estimator=estimator, straight_through=True, mask=m)
    assert_close(out, np.where(m > 0, np_kl(d, estimator), 0.0))
    g = jgrad(
        lambda a: jnp.sum(kl_estimate(a, ref, estimator=estimator, straight_through=True, mask=m)),
        lp,
    )
    assert_close(g, d * m)  # ∂/∂lp = d
    # with a clamp, the value is clamped but the gradient is still d (verl's "+")
    clamped = jgrad(
        lambda a: jnp.sum(
            kl_estimate(a, ref, estimator=estimator, straight_through=True, clamp=0.1)
        ),
        lp,
    )
    assert_close(clamped, d)


def test_straight_through_k2_is_plain_k2():
    _, lp, ref, m = _data(4)
    for clamp in (None, 0.3):
        plain = jcall(kl_estimate, lp, ref, estimator="k2", clamp=clamp, mask=m)
        st = jcall(kl_estimate, lp, ref, estimator="k2", clamp=clamp, mask=m, straight_through=True)
        assert_close(st, np.asarray(plain))
        g_plain = jgrad(
            lambda a, c=clamp: jnp.sum(kl_estimate(a, ref, estimator="k2", clamp=c)), lp
        )
        g_st = jgrad(
            lambda a, c=clamp: jnp.sum(
                kl_estimate(a, ref, estimator="k2", clamp=c, straight_through=True)
            ),
            lp,
        )
        assert_close(g_st, np.asarray(g_plain))


def test_clamp_and_log_ratio_clamp():
    d = np.array([15.0, -15.0, -5.0, 0.3, -25.0], np.float32)
    zero = np.zeros_like(d)
    assert_close(jcall(kl_estimate, d, zero, clamp=10.0), [10.0, -10.0, -5.0, 0.3, -10.0])
    k3 = jcall(kl_estimate, d, zero, estimator="k3", clamp=10.0)
    assert_close(k3, np_kl(d, "k3", clamp=10.0))
    assert float(k3[2]) == 10.0  # e^5 − 1 − 5 ≈ 142 is clamped
    # the clamp zeroes the gradient where it binds
    g = jgrad(lambda a: jnp.sum(kl_estimate(a, zero, estimator="k3", clamp=10.0)), d)
    assert_close(g, [0.0, 0.0, 0.0, 1 - np.exp(-0.3), 0.0])  # k3(15) = 14 and k3(−5) ≈ 142 bind
    # log_ratio_clamp bounds only the exponent of k3: |d| = 25 > 20 changes, the rest does not
    k3_20 = np.asarray(jcall(kl_estimate, d, zero, estimator="k3"), np.float64)
    k3_none = np.asarray(jcall(kl_estimate, d, zero, estimator="k3", log_ratio_clamp=None))
    np.testing.assert_allclose(k3_20[4], np.exp(20.0) - 1 - 20.0, rtol=1e-5)
    np.testing.assert_allclose(k3_none[4], np.exp(25.0) - 1 - 25.0, rtol=1e-5)
    np.testing.assert_allclose(k3_20[:4], k3_none[:4], rtol=1e-6)
    # k2's clamp bounds |d| at √(2c), so that ½d² ≤ c: d = 3, c = 2 → 2
    assert_close(
        jcall(kl_estimate, np.array([3.0, -1.0]), np.zeros(2), estimator="k2", clamp=2.0),
        [2.0, 0.5],
    )


def test_k3_without_log_ratio_clamp_keeps_a_clamped_gradient_finite():
    """OpenRLHF's k3 (`clamp=10, log_ratio_clamp=None`) at d = −100: exp(100) overflows float32,
    and the clamped value's discarded derivative was inf · 0 = NaN. The exponent is bounded
    (d ≥ −80): the value is the clamp, its gradient 0; unclamped, the value stays finite."""
    d = jnp.array([-100.0, 0.5])

    def k3(x, clamp):
        return jnp.sum(
            kl_estimate(x, jnp.zeros(2), estimator="k3", clamp=clamp, log_ratio_clamp=None)
        )

    assert_close(k3(d, 10.0), 10.0 + np.expm1(-0.5) + 0.5)
    assert_close(jax.grad(k3)(d, 10.0), [0.0, 1 - np.exp(-0.5)])
    assert np.isfinite(float(k3(d, None)))  # e^80 − 81: finite (the peers' value is inf)


def test_kl_loss_correction_weight_uses_the_clamped_log_ratio():
    """w = exp(clip(logp − old_logp, ±c)): logp − old = 3 with c = 1 weighs the k1 term 0.5
    by e, not e³; token_mean over 2 tokens."""
    lp, ref, old = np.array([[3.0, 0.0]]), np.array([[2.5, 0.0]]), np.zeros((1, 2))
    kw = {"estimator": "k1", "clamp": None, "is_correction": True, "old_logp": old}
    loss, _ = kl_loss(lp, ref, np.ones((1, 2)), log_ratio_clamp=1.0, **kw)
    assert_close(loss, 0.25 * np.e)
    loss, _ = kl_loss(lp, ref, np.ones((1, 2)), log_ratio_clamp=None, **kw)
    assert_close(loss, 0.25 * np.e**3)


def test_monte_carlo_on_a_small_categorical():
    """E_π[k1] = E_π[k3] = KL(π‖ref); mean ∇k2 → ∇KL(π‖ref); mean ∇k1 → 0 (§3.1)."""
    V5, M = 5, 200_000
    theta = np.array([0.3, -1.0, 0.8, 0.0, -0.4], np.float32)
    ref_logits = np.array([0.0, 0.2, -0.5, 0.4, 0.1], np.float32)
    log_pi = np_log_softmax(theta)
    log_ref = np_log_softmax(ref_logits)
    pi = np.exp(log_pi)
    d = log_pi - log_ref
    kl = float((pi * d).sum())
    grad_kl = pi * (d - kl)  # ∂KL(π_θ‖ref)/∂θ
    y = np.asarray(jax.random.categorical(jax.random.key(0), jnp.asarray(theta), shape=(M,)))
    ref_y = log_ref[y].astype(np.float32)

    def mean_estimate(th, estimator):
        lp = jax.nn.log_softmax(th)[y]
        return jnp.mean(kl_estimate(lp, ref_y, estimator=estimator))

    k1_values = d[y]
    k3_values = np.exp(-d[y]) - 1 + d[y]
    for est, values in (("k1", k1_values), ("k3", k3_values)):
        mean = float(jcall(mean_estimate, theta, estimator=est))
        se = values.std() / np.sqrt(M)
        assert abs(mean - kl) < 4 * se, (est, mean, kl, se)
    g2 = np.asarray(jgrad(lambda th: mean_estimate(th, "k2"), theta))
    g1 = np.asarray(jgrad(lambda th: mean_estimate(th, "k1"), theta))
    onehot = np.eye(V5)[y]
    score = onehot - pi  # ∇θ log π(y)
    se2 = (d[y][:, None] * score).std(0) / np.sqrt(M)
    se1 = score.std(0) / np.sqrt(M)
    assert np.all(np.abs(g2 - grad_kl) < 4 * se2 + 1e-6), (g2, grad_kl)
    assert np.all(np.abs(g1) < 4 * se1 + 1e-6), g1
    # the tolerances are meaningful: the k3 gradient estimates ∇KL(ref‖π), which differs here
    g3 = np.asarray(jgrad(lambda th: mean_estimate(th, "k3"), theta))
    assert np.max(np.abs(g3 - grad_kl)) > 10 * np.max(se2)


def test_kl_estimate_bad_input():
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="`estimator` must be one of"):
        kl_estimate(a, a, estimator="low_var_kl")
    with pytest.raises(ValueError, match="`ref_logp` must have the shape of `logp`"):
        kl_estimate(a, a[:, :2])
    with pytest.raises(ValueError, match="`clamp` must be > 0"):
        kl_estimate(a, a, clamp=-1.0)
    with pytest.raises(ValueError, match="`logp` must be a floating-point array"):
        kl_estimate(a.astype(np.int32), a)
    with pytest.raises(ValueError, match="`mask` must have shape"):
        kl_estimate(a, a, mask=np.ones((3, 2)))


# --------------------------------------------------------------------------------------------------
# kl_loss
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("agg", losses.AGG_MODES)
def test_kl_loss_matches_reference(agg):
    rng, lp, ref, m = _data(5)
    loss, metrics = jcall(kl_loss, lp, ref, m, agg=agg)
    k3 = np.where(m > 0, np_kl(lp - ref.astype(np.float64), "k3", clamp=10.0), 0.0)
    assert_close(loss, np_aggregate(k3, m, agg))
    assert_close(metrics["kl/mean"], k3.sum() / m.sum())
    assert_close(metrics["kl/max"], k3[m > 0].max())
    assert set(metrics) == {"kl/mean", "kl/max"}
    assert_nan_safe(lambda a, b, c: kl_loss(a, b, c, agg=agg), (lp, ref, m), m, rng, planted=(0, 1))


def test_kl_loss_k2_gradient_is_d_over_token_count():
    _, lp, ref, m = _data(6)
    g = jgrad(lambda a: kl_loss(a, ref, m, estimator="k2", clamp=None)[0], lp)
    assert_close(g, (lp - ref.astype(np.float64)) * m / m.sum())
    # with a global token count (micro-batching)
    g = jgrad(lambda a: kl_loss(a, ref, m, estimator="k2", clamp=None, num_tokens=1000.0)[0], lp)
    assert_close(g, (lp - ref.astype(np.float64)) * m / 1000.0)
    # no gradient flows into the reference
    g_ref = jgrad(lambda b: kl_loss(lp, b, m)[0], ref)
    assert np.all(np.asarray(g_ref) == 0.0)


def test_kl_loss_is_correction():
    rng, lp, ref, m = _data(7)
    old = (lp + rng.normal(scale=0.3, size=(N, T))).astype(np.float32)
    d = lp - ref.astype(np.float64)
    w = np.exp(lp - old.astype(np.float64))
    k3, dk3 = np_kl(d, "k3"), np_kl_grad(d, "k3")
    loss, metrics = jcall(kl_loss, lp, ref, m, is_correction=True, old_logp=old, clamp=None)
    assert_close(loss, np_aggregate(w * k3, m, "token_mean"))
    assert_close(metrics["kl/mean"], (k3 * m).sum() / m.sum())  # before the weight
    # ∂(w·k3)/∂lp = w·(k3 + k3'), the weight is not detached
    g = jgrad(lambda a: kl_loss(a, ref, m, is_correction=True, old_logp=old, clamp=None)[0], lp)
    assert_close(g, w * (k3 + dk3) * m / m.sum())
    # old_logp=None: w ≡ 1 in value, gradient k3 + k3'
    loss0, _ = jcall(kl_loss, lp, ref, m, is_correction=True, clamp=None)
    assert_close(loss0, np_aggregate(k3, m, "token_mean"))
    g0 = jgrad(lambda a: kl_loss(a, ref, m, is_correction=True, clamp=None)[0], lp)
    assert_close(g0, (k3 + dk3) * m / m.sum())
    assert_nan_safe(
        lambda a, b, c, e: kl_loss(a, b, c, is_correction=True, old_logp=e),
        (lp, ref, m, old),
        m,
        rng,
        planted=(0, 1, 3),
    )


def test_zero_coefficient_leaves_the_policy_gradient_unchanged():
    rng, lp, ref, m = _data(8)
    adv = rng.normal(size=(N, T)).astype(np.float32)

    def actor(a, c_kl):
        return losses.ppo_clip_loss(a, None, adv, m)[0] + c_kl * kl_loss(a, ref, m)[0]

    g0 = jgrad(lambda a: actor(a, 0.0), lp)
    g_ppo = jgrad(lambda a: losses.ppo_clip_loss(a, None, adv, m)[0], lp)
    np.testing.assert_array_equal(np.asarray(g0), np.asarray(g_ppo))
    assert not np.allclose(np.asarray(jgrad(lambda a: actor(a, 0.5), lp)), np.asarray(g_ppo))


def test_kl_loss_bad_input():
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="`logp` must have rank 2"):
        kl_loss(a[0], a[0], np.ones(3))
    with pytest.raises(ValueError, match="`mode` must be one of"):
        kl_loss(a, a, np.ones((2, 3)), agg="seq-mean")
    with pytest.raises(ValueError, match="`old_logp` must have the shape of `logp`"):
        kl_loss(a, a, np.ones((2, 3)), is_correction=True, old_logp=a[:1])
    with pytest.raises(ValueError, match="`estimator` must be one of"):
        kl_loss(a, a, np.ones((2, 3)), estimator="k4")


# --------------------------------------------------------------------------------------------------
# KL in the reward
# --------------------------------------------------------------------------------------------------


def np_t_star(m, position):
    out = []
    for row in m:
        idx = np.flatnonzero(row > 0)
        if idx.size == 0:
            out.append(0)
        elif position == "last":
            out.append(idx[-1])
        else:
            out.append(min(idx[-1] + 1, row.size - 1))
    return np.array(out)


@pytest.mark.parametrize("position", ["last", "after_last"])
@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_penalized_rewards(position, estimator):
    rng, old, ref, m = _data(9)
    m[3, :] = 1.0  # a second full row; row 0 is empty, row 1 full, row 2 has a hole
    m[4, :] = 0.0
    m[4, :2] = 1.0
    scores = rng.normal(size=N).astype(np.float32)
    beta = 0.05
    kl = np.where(m > 0, np_kl(old - ref.astype(np.float64), estimator), 0.0)
    t_star = np_t_star(m, position)
    expected = -beta * kl
    expected[np.arange(N), t_star] += scores
    r = jcall(
        kl_penalized_rewards,
        scores,
        old,
        ref,
        m,
        beta=beta,
        estimator=estimator,
        score_position=position,
    )
    assert_close(r, expected)
    assert_close(np.asarray(r, np.float64).sum(1), scores - beta * kl.sum(1), atol=1e-5)
    # β = 0: the score at t* only
    r0 = np.asarray(
        jcall(kl_penalized_rewards, scores, old, ref, m, beta=0.0, score_position=position)
    )
    onehot = np.eye(T)[t_star]
    assert_close(r0, scores[:, None] * onehot)
    assert t_star[0] == 0 and t_star[1] == T - 1 and t_star[3] == T - 1
    assert t_star[4] == (1 if position == "last" else 2)
    # traced β and no gradient
    r_traced = jax.jit(
        lambda b: kl_penalized_rewards(
            scores, old, ref, m, beta=b, estimator=estimator, score_position=position
        )
    )(jnp.float32(beta))
    assert_close(r_traced, expected)
    g = jgrad(
        lambda o, s: jnp.sum(kl_penalized_rewards(s, o, ref, m, beta=beta)),
        (old, scores),
    )
    assert all(np.all(np.asarray(x) == 0.0) for x in g)
    assert_nan_safe(
        lambda o, b, mm: jnp.sum(
            kl_penalized_rewards(scores, o, b, mm, beta=beta, estimator=estimator)
        ),
        (old, ref, m),
        m,
        rng,
        planted=(0, 1),
    )


def test_kl_penalized_scores():
    rng, old, ref, m = _data(10)
    scores = rng.normal(size=N).astype(np.float32)
    out = jcall(kl_penalized_scores, scores, old, ref, m, beta=0.05)
    expected = scores - 0.05 * np.where(m > 0, old - ref.astype(np.float64), 0.0).sum(1)
    assert out.shape == (N,)
    assert_close(out, expected)
    assert float(out[0]) == pytest.approx(float(scores[0]))  # the empty row
    # equals the sum over t of the per-token k1 rewards
    r = jcall(kl_penalized_rewards, scores, old, ref, m, beta=0.05, log_ratio_clamp=None)
    assert_close(out, np.asarray(r, np.float64).sum(1), atol=1e-5)
    assert_nan_safe(
        lambda o, b, mm: jnp.sum(kl_penalized_scores(scores, o, b, mm, beta=0.05)),
        (old, ref, m),
        m,
        rng,
        planted=(0, 1),
    )


def test_kl_rewards_bad_input():
    a = np.zeros((2, 3), np.float32)
    m = np.ones((2, 3))
    with pytest.raises(ValueError, match=r"`scores` must have shape \(2,\)"):
        kl_penalized_rewards(np.zeros(3, np.float32), a, a, m, beta=0.1)
    with pytest.raises(ValueError, match="`scores` must have rank 1"):
        kl_penalized_scores(a, a, a, m, beta=0.1)
    with pytest.raises(ValueError, match="`score_position` must be one of"):
        kl_penalized_rewards(np.zeros(2, np.float32), a, a, m, beta=0.1, score_position="eos")
    with pytest.raises(ValueError, match="`old_logp` must have rank 2"):
        kl_penalized_rewards(np.zeros(2, np.float32), a[0], a[0], m[0], beta=0.1)
    i = np.zeros((2, 3), np.int32)  # the error names this function and argument, not kl_estimate
    with pytest.raises(ValueError, match="kl_penalized_rewards: `old_logp` must be a floating"):
        kl_penalized_rewards(np.zeros(2, np.float32), i, a, m, beta=0.1)
    with pytest.raises(ValueError, match="kl_penalized_scores: `ref_logp` must be a floating"):
        kl_penalized_scores(np.zeros(2, np.float32), a, i, m, beta=0.1)


# --------------------------------------------------------------------------------------------------
# KL control
# --------------------------------------------------------------------------------------------------


def test_adaptive_update_anchor_and_properties():
    update = jax.jit(lambda b, k, n: adaptive_kl_update(b, k, n))
    assert_close(update(0.001, 0.15, 256), 0.00100512)
    assert_close(update(0.02, 0.1, 256), 0.02)  # kl = target: unchanged
    assert_close(jcall(adaptive_kl_update, 0.5, 3.0, 100, target=3.0, horizon=50), 0.5)
    kls = np.linspace(0.0, 1.0, 41).astype(np.float32)
    betas = np.asarray(jax.vmap(lambda k: adaptive_kl_update(0.01, k, 256))(kls), np.float64)
    assert np.all(np.diff(betas) >= 0)  # monotone in the measured KL
    assert betas[-1] > betas[0]
    rel = np.abs(betas / 0.01 - 1.0)
    assert np.all(rel <= 0.2 * 256 / 10000 + 1e-6)  # bounded relative change
    assert_close(rel.max(), 0.2 * 256 / 10000)
    # a batch over 5 horizons at KL 0: the peers' factor 1 − 0.2·1024/100 makes β negative
    assert_close(jcall(adaptive_kl_update, 0.1, 0.0, 1024, horizon=100), 0.0)
    assert_close(update(0.02, np.nan, 256), 0.02)  # a non-finite KL leaves β as it was
    with pytest.raises(ValueError, match="`target` must be > 0"):
        adaptive_kl_update(0.1, 0.1, 1, target=0.0)
    with pytest.raises(ValueError, match="`horizon` must be > 0"):
        adaptive_kl_update(0.1, 0.1, 1, horizon=-1)


def test_controllers_are_pure_and_jittable():
    ctrl = adaptive_kl_controller(0.001, target=0.1, horizon=10000)
    state = ctrl.init()
    assert isinstance(state, KLControllerState) and state.beta.dtype == jnp.float32
    new = jax.jit(ctrl.update)(state, jnp.float32(0.15), jnp.int32(256))
    assert_close(new.beta, 0.00100512)
    assert float(state.beta) == pytest.approx(0.001)  # the input state is not mutated

    # ten updates in a scan equal ten Python updates
    kls = jnp.linspace(0.0, 0.4, 10)

    def step(s, k):
        s = ctrl.update(s, k, 256)
        return s, s.beta

    final, _ = jax.jit(lambda s: jax.lax.scan(step, s, kls))(state)
    beta = 0.001
    for k in np.asarray(kls, np.float64):
        beta *= 1 + np.clip(k / 0.1 - 1, -0.2, 0.2) * 256 / 10000
    assert_close(final.beta, beta)

    fixed = fixed_kl_controller(0.05)
    s = jax.jit(fixed.update)(fixed.init(), 3.0, 256)
    assert isinstance(s, KLControllerState)
    assert_close(s.beta, 0.05)
    with pytest.raises(ValueError, match="`init_beta` must be >= 0"):
        fixed_kl_controller(-0.1)
    with pytest.raises(ValueError, match="`target` must be > 0"):
        adaptive_kl_controller(0.1, target=0.0)


# --------------------------------------------------------------------------------------------------
# full_kl
# --------------------------------------------------------------------------------------------------


def np_full_kl(zp, zq, tau=1.0):
    lp, lq = np_log_softmax(zp / tau), np_log_softmax(zq / tau)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def test_full_kl_reference_gradient_and_chunks():
    rng = np.random.default_rng(11)
    zp = (2 * rng.normal(size=(N, T, V))).astype(np.float32)
    zq = (2 * rng.normal(size=(N, T, V))).astype(np.float32)
    m = make_mask(rng, N, T)
    w = rng.normal(size=(N, T)).astype(np.float32)

    def both(a, b, c):
        out = full_kl(a, b, m, temperature=1.3, chunk_size=c)
        grads = jax.grad(lambda x, y: jnp.sum(full_kl(x, y, m, chunk_size=c) * w), (0, 1))(a, b)
        return out, grads

    out, (gp, gq) = jax.jit(lambda a, b: both(a, b, None))(zp, zq)
    assert_close(out, np.where(m > 0, np_full_kl(zp, zq, 1.3), 0.0))
    assert np.all(np.asarray(out) >= 0)
    # ∂KL/∂z_p = p·(log p − log q − KL) ; ∂KL/∂z_q = q − p
    lp, lq = np_log_softmax(zp), np_log_softmax(zq)
    p, q = np.exp(lp), np.exp(lq)
    kl = (p * (lp - lq)).sum(-1, keepdims=True)
    wm = (w * m)[..., None]
    assert_close(gp, wm * p * (lp - lq - kl))
    assert_close(gq, wm * (q - p))
    # chunked (4 does not divide T = 11) equals unchunked, values and gradients
    chunked = jax.jit(lambda a, b: both(a, b, 4))(zp, zq)
    for a, b in zip(jax.tree.leaves(chunked), jax.tree.leaves((out, (gp, gq))), strict=True):
        assert_close(a, np.asarray(b, np.float64))
    # NaN/inf logits outside the mask reach neither values nor gradients
    bad = np.array([np.nan, np.inf, -np.inf], np.float32)
    zp_bad, zq_bad = zp.copy(), zq.copy()
    for n, t in np.argwhere(m == 0):
        zp_bad[n, t] = bad[rng.integers(0, 3, size=V)]
        zq_bad[n, t] = bad[rng.integers(0, 3, size=V)]
    out_bad, (gp_bad, gq_bad) = jax.jit(lambda a, b: both(a, b, 4))(zp_bad, zq_bad)
    for clean, dirty in ((out, out_bad), (gp, gp_bad), (gq, gq_bad)):
        dirty = np.asarray(dirty)
        assert np.all(np.isfinite(dirty))
        np.testing.assert_allclose(dirty, np.asarray(clean), rtol=1e-6, atol=1e-7)


def test_full_kl_zero_iff_equal_and_expectation_of_k1():
    rng = np.random.default_rng(12)
    zp = rng.normal(size=(N, T, V)).astype(np.float32)
    zq = rng.normal(size=(N, T, V)).astype(np.float32)
    m = make_mask(rng, N, T)
    same = np.asarray(jcall(full_kl, zp, zp + 3.0, m))  # same distribution, shifted logits
    assert np.all(np.abs(same) < 1e-6)
    diff = np.asarray(jcall(full_kl, zp, zq, m))
    assert np.all(diff[m > 0] > 0) and np.all(diff[m == 0] == 0)

    # E_{y~p}[k1(log p(y), log q(y))] with the library's own log-probs and estimator
    def expected_k1(a, b):
        total = jnp.zeros((N, T))
        p = jax.nn.softmax(a, axis=-1)
        for v in range(V):
            y = jnp.full((N, T), v, jnp.int32)
            k1 = kl_estimate(token_logprobs(a, y), token_logprobs(b, y), estimator="k1", mask=m)
            total = total + p[..., v] * k1
        return total

    assert_close(jax.jit(expected_k1)(zp, zq), diff)
    # entries with p = 0 (−inf logits) contribute 0, also where q = 0 too; gradients stay finite
    zp_inf, zq_inf = zp.copy(), zq.copy()
    zp_inf[..., :2] = -np.inf
    zq_inf[..., 0] = -np.inf
    lp = np_log_softmax(zp[..., 2:])
    lq = np_log_softmax(zq[..., 1:])[..., 1:]
    expected = np.where(m > 0, (np.exp(lp) * (lp - lq)).sum(-1), 0.0)
    assert_close(jcall(full_kl, zp_inf, zq_inf, m), expected)
    g = jgrad(lambda a, b: jnp.sum(full_kl(a, b, m)), (zp_inf, zq_inf))
    assert all(np.all(np.isfinite(np.asarray(x))) for x in g)
