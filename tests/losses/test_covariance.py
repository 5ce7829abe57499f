"""`clip_cov_loss` and `kl_cov_loss` (ALGORITHMS.md §5.8): float64 reference with the selection."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.covariance import clip_cov_loss, kl_cov_loss
from losses.ppo import ppo_clip_loss, reinforce_loss
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, np_aggregate

N, T = 7, 11


def _inputs(seed: int):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, N, T)
    lp = -rng.uniform(0.05, 4.0, size=(N, T)).astype(np.float32)
    old = (lp + 0.3 * rng.normal(size=(N, T))).astype(np.float32)
    adv = (2.0 * rng.normal(size=(N, T))).astype(np.float32)
    return rng, lp, old, adv, mask


def _agg_weights(mask: np.ndarray, mode: str) -> np.ndarray:
    """d aggregate / d per_token (aggregate is linear in it), from the float64 reference."""
    weights = np.zeros(mask.shape)
    for n, t in np.ndindex(*mask.shape):
        onehot = np.zeros(mask.shape)
        onehot[n, t] = 1.0
        weights[n, t] = np_aggregate(onehot, mask, mode)
    return weights


def _np_k(ratio: float, mask: np.ndarray) -> int:
    """`k = max(⌊ratio·Σm⌋, 1)`; the inputs keep `ratio·Σm` away from an integer (float32 k)."""
    product = ratio * mask.sum()
    assert abs(product - round(product)) > 1e-3 or product < 1
    return max(int(np.floor(product)), 1)


def _np_cov(lp, adv, m):
    count = max(m.sum(), 1.0)
    adv_c = adv - np.where(m, adv, 0.0).sum() / count
    lp_c = lp - np.where(m, lp, 0.0).sum() / count
    return np.where(m, adv_c * lp_c, 0.0)


def _np_select(scores: np.ndarray, candidates: np.ndarray, k: int) -> np.ndarray:
    """The `k` candidates with the largest scores, ties by flat index (stable argsort)."""
    idx = np.flatnonzero(candidates)  # increasing flat index
    order = np.argsort(-scores.ravel()[idx], kind="stable")
    selected = np.zeros(candidates.size, bool)
    selected[idx[order[:k]]] = True
    return selected.reshape(candidates.shape)


def _f64(lp, old, adv, mask):
    m = mask > 0
    return m, *(np.where(m, np.asarray(x, np.float64), 0.0) for x in (lp, old, adv))


def _np_clip_cov(lp, old, adv, mask, *, ratio, lb=1.0, ub=5.0, eps=0.2, u=None):
    """Float64 per-token loss, d/dlogp, and the masks of §5.8 Clip-Cov (no ratio clamp)."""
    m, lp, old, adv = _f64(lp, old, adv, mask)
    r = np.exp(lp - old)
    l1, l2 = -adv * r, -adv * np.clip(r, 1.0 - eps, 1.0 + eps)
    clipped = m & (l2 > l1)
    cov = _np_cov(lp, adv, m)
    cand = m & ~clipped & (cov > lb) & (cov < ub)
    k = _np_k(ratio, mask)
    selected = _np_select(cov if u is None else -np.asarray(u, np.float64), cand, k)
    keep = m & ~selected
    per_token = np.where(keep, np.maximum(l1, l2), 0.0)
    dper = np.where(keep & ~clipped, -adv * r, 0.0)
    return per_token, dper, {"clipped": clipped, "cand": cand, "selected": selected, "r": r, "k": k}


def _np_kl_cov(lp, old, adv, mask, *, ratio, coef, clamp=None):
    """Float64 per-token loss and d/dlogp of §5.8 KL-Cov."""
    m, lp, old, adv = _f64(lp, old, adv, mask)
    logr = lp - old
    c = np.inf if clamp is None else clamp
    r = np.exp(np.clip(logr, -c, c))
    dr = np.where(np.abs(logr) < c, r, 0.0)
    selected = _np_select(_np_cov(lp, adv, m), m, _np_k(ratio, mask))
    per_token = np.where(m, -adv * r + coef * np.abs(logr) * selected, 0.0)
    dper = np.where(m, -adv * dr + coef * np.sign(logr) * selected, 0.0)
    return per_token, dper, selected, logr, r


def _value_and_grad(fn, *args):
    return jax.jit(jax.value_and_grad(fn, has_aux=True))(*args)


# ---------------------------------------------------------------------------------------------
# Clip-Cov
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
def test_clip_cov_matches_reference_deterministic(mode):
    rng, lp, old, adv, mask = _inputs(0)
    isw = rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)
    ratio = 0.1

    def f(x, o, a, m, w):
        return clip_cov_loss(x, o, a, m, clip_cov_ratio=ratio, agg=mode, is_weights=w)

    (loss, metrics), grad = _value_and_grad(f, lp, old, adv, mask, isw)
    per_token, dper, ref = _np_clip_cov(lp, old, adv, mask, ratio=ratio)
    # the inputs exercise every branch: clipped tokens, more candidates than k, selections
    assert ref["clipped"].sum() > 0 and ref["cand"].sum() > ref["k"] > 1
    assert_close(loss, np_aggregate(per_token * isw, mask, mode))
    assert_close(grad, dper * isw * _agg_weights(mask, mode))
    g = np.asarray(grad)
    assert np.all(g[ref["selected"]] == 0)  # selected tokens lose their gradient
    assert np.all(g[ref["cand"] & ~ref["selected"]] != 0)  # the other candidates keep theirs
    valid, count, r = mask > 0, mask.sum(), ref["r"]
    a = np.where(valid, adv, 0.0)
    assert_close(metrics["policy/clip_frac"], ref["clipped"].sum() / count)
    assert_close(metrics["policy/clip_frac_high"], (valid & (a > 0) & (r > 1.2)).sum() / count)
    assert_close(metrics["policy/clip_frac_low"], (valid & (a < 0) & (r < 0.8)).sum() / count)
    assert_close(metrics["policy/cov_selected_frac"], ref["k"] / count)
    assert_close(metrics["policy/approx_kl"], -(lp - old)[valid].astype(np.float64).sum() / count)
    assert_close(metrics["policy/ratio_mean"], r[valid].sum() / count)


def test_clip_cov_random_selection_matches_reference():
    _, lp, old, adv, mask = _inputs(0)
    ratio = 0.1
    value_and_grad = jax.jit(
        jax.value_and_grad(
            lambda x, o, a, m, key: clip_cov_loss(x, o, a, m, clip_cov_ratio=ratio, key=key)[0]
        )
    )
    grads = []
    for seed in range(3):
        key = jax.random.key(seed)
        u = np.asarray(jax.random.uniform(key, (N, T), jnp.float32))  # the documented draw
        per_token, dper, ref = _np_clip_cov(lp, old, adv, mask, ratio=ratio, u=u)
        assert ref["cand"].sum() > ref["k"]
        value, grad = value_and_grad(lp, old, adv, mask, key)
        assert_close(value, np_aggregate(per_token, mask, "token_mean"))
        assert_close(grad, dper * _agg_weights(mask, "token_mean"))
        # the same key gives the same result
        value2, grad2 = value_and_grad(lp, old, adv, mask, jax.random.key(seed))
        assert float(value2) == float(value) and np.array_equal(grad2, grad)
        grads.append(np.asarray(grad))
    # different keys select different tokens when |cand| > k
    assert any(not np.array_equal(grads[0], g) for g in grads[1:])


def test_clip_cov_selects_every_candidate_when_k_covers_them():
    _, lp, old, adv, mask = _inputs(1)
    ratio = 0.999  # k = Σm − 1 ≥ |cand|
    _, _, ref = _np_clip_cov(lp, old, adv, mask, ratio=ratio)
    assert 0 < ref["cand"].sum() <= ref["k"]

    def f(x, key):
        return clip_cov_loss(x, old, adv, mask, clip_cov_ratio=ratio, key=key)

    with_key = jax.jit(jax.value_and_grad(f, has_aux=True))
    without_key = jax.jit(jax.value_and_grad(lambda x: f(x, None), has_aux=True))
    results = []
    for (loss, metrics), grad in (
        without_key(lp),
        with_key(lp, jax.random.key(0)),
        with_key(lp, jax.random.key(1)),
    ):
        assert np.all(np.asarray(grad)[ref["cand"]] == 0)
        assert_close(metrics["policy/cov_selected_frac"], ref["cand"].sum() / mask.sum())
        results.append((float(loss), np.asarray(grad)))
    for loss, grad in results[1:]:
        assert_close(loss, results[0][0])
        assert_close(grad, results[0][1])


@pytest.mark.parametrize("key", [None, 3])
def test_clip_cov_without_candidates_equals_ppo(key):
    _, lp, old, adv, mask = _inputs(2)
    key = None if key is None else jax.random.key(key)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "agg": "seq_mean_token_sum"}

    def cov(x):
        return clip_cov_loss(x, old, adv, mask, clip_cov_lb=50.0, clip_cov_ub=60.0, key=key, **kw)

    def ppo(x):
        return ppo_clip_loss(x, old, adv, mask, log_ratio_clamp=None, **kw)

    (loss, metrics), grad = jax.jit(jax.value_and_grad(cov, has_aux=True))(lp)
    (ref_loss, ref_metrics), ref_grad = jax.jit(jax.value_and_grad(ppo, has_aux=True))(lp)
    assert_close(loss, float(ref_loss))
    assert_close(grad, np.asarray(ref_grad))
    assert float(metrics["policy/cov_selected_frac"]) == 0.0
    for name in ("clip_frac", "clip_frac_high", "clip_frac_low", "approx_kl", "ratio_mean"):
        assert_close(metrics[f"policy/{name}"], float(ref_metrics[f"policy/{name}"]))


def test_clip_cov_ratio_may_be_traced():
    _, lp, old, adv, mask = _inputs(0)
    static = jax.jit(lambda: clip_cov_loss(lp, old, adv, mask, clip_cov_ratio=0.1)[0])()
    traced = jax.jit(lambda ratio: clip_cov_loss(lp, old, adv, mask, clip_cov_ratio=ratio)[0])
    assert_close(traced(0.1), float(static))
    assert float(traced(0.01)) != float(static)  # a smaller k selects fewer tokens


def test_ties_are_broken_by_flat_index():
    # cov = (A − Ā)(lp − mean lp): tokens 0 and 3 tie at cov = 2, inside (1, 5); k = 1
    lp = jnp.array([[-1.0, -2.0, -2.0, -3.0]])
    adv = jnp.array([[2.0, 0.0, 0.0, -2.0]])
    m = jnp.ones((1, 4))
    grad = jax.jit(jax.grad(lambda x: clip_cov_loss(x, x, adv, m, clip_cov_ratio=0.3)[0]))(lp)
    assert_close(grad, [[0.0, 0.0, 0.0, 0.5]])  # token 0 selected; token 3 keeps −A·r/4
    old = lp - 0.25
    grad = jax.jit(
        jax.grad(lambda x: kl_cov_loss(x, old, adv, m, kl_cov_ratio=0.3, ppo_kl_coef=1.0)[0])
    )(lp)
    r = np.exp(0.25)
    assert_close(grad, [[(-2.0 * r + 1.0) / 4, 0.0, 0.0, 2.0 * r / 4]])


# ---------------------------------------------------------------------------------------------
# KL-Cov
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "clamp"), [("token_mean", None), ("seq_mean_token_sum_norm", 0.3)]
)
def test_kl_cov_matches_reference(mode, clamp):
    rng, lp, old, adv, mask = _inputs(3)
    tw = rng.uniform(0.0, 1.0, size=(N, T)).astype(np.float32)
    ratio, coef = 0.15, 0.7

    def f(x, o, a, m, t):
        return kl_cov_loss(
            x,
            o,
            a,
            m,
            kl_cov_ratio=ratio,
            ppo_kl_coef=coef,
            agg=mode,
            token_weights=t,
            log_ratio_clamp=clamp,
        )

    (loss, metrics), grad = _value_and_grad(f, lp, old, adv, mask, tw)
    per_token, dper, selected, logr, r = _np_kl_cov(
        lp, old, adv, mask, ratio=ratio, coef=coef, clamp=clamp
    )
    assert 1 < selected.sum() < mask.sum()
    assert_close(loss, np_aggregate(per_token * tw, mask, mode))
    assert_close(grad, dper * tw * _agg_weights(mask, mode))
    valid, count = mask > 0, mask.sum()
    assert_close(metrics["policy/approx_kl"], np.abs(logr)[valid].sum() / count)
    assert_close(metrics["policy/cov_selected_frac"], selected.sum() / count)
    assert_close(metrics["policy/ratio_mean"], r[valid].sum() / count)
    assert_close(metrics["policy/ratio_max"], r[valid].max())
    assert all(v.dtype == jnp.float32 and v.shape == () for v in metrics.values())


@pytest.mark.parametrize("on_policy", ["none", "equal"])
def test_kl_cov_ratio_one_gradient_equals_reinforce(on_policy):
    _, lp, _, adv, mask = _inputs(4)
    mode = "seq_mean_token_mean"

    def kl_cov(x):
        old = None if on_policy == "none" else x
        return kl_cov_loss(x, old, adv, mask, kl_cov_ratio=0.2, agg=mode)[0]

    def reinforce(x):
        return reinforce_loss(x, adv, mask, agg=mode)[0]

    value, grad = jax.jit(jax.value_and_grad(kl_cov))(lp)
    assert_close(grad, np.asarray(jax.jit(jax.grad(reinforce))(lp)))
    assert_close(value, np_aggregate(-adv, mask, mode))  # r = 1, |logr| = 0


def test_kl_cov_ratio_may_be_traced():
    _, lp, old, adv, mask = _inputs(3)
    static = jax.jit(lambda: kl_cov_loss(lp, old, adv, mask, kl_cov_ratio=0.15)[0])()
    traced = jax.jit(lambda ratio: kl_cov_loss(lp, old, adv, mask, kl_cov_ratio=ratio)[0])
    assert_close(traced(0.15), float(static))


# ---------------------------------------------------------------------------------------------
# shared
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["clip_cov", "clip_cov_key", "kl_cov"])
def test_nan_outside_mask_does_not_leak(which):
    rng, lp, old, adv, mask = _inputs(5)
    if which == "kl_cov":
        fn = lambda x, o, a, m: kl_cov_loss(x, o, a, m, kl_cov_ratio=0.1)  # noqa: E731
    else:
        key = jax.random.key(1) if which == "clip_cov_key" else None
        fn = lambda x, o, a, m: clip_cov_loss(x, o, a, m, clip_cov_ratio=0.1, key=key)  # noqa: E731
    assert_nan_safe(fn, (lp, old, adv, mask), mask, rng, planted=(0, 1, 2))


def test_the_log_ratio_is_clamped_at_20_by_default():
    # ALGORITHMS.md §5.0: log_ratio_clamp=20.0; verl (no clamp) is log_ratio_clamp=None
    import inspect

    for fn in (clip_cov_loss, kl_cov_loss):
        assert inspect.signature(fn).parameters["log_ratio_clamp"].default == 20.0
    lp, old = jnp.array([[25.0, 0.0]]), jnp.zeros((1, 2))
    adv, m = -jnp.ones((1, 2)), jnp.ones((1, 2))
    loss = float(kl_cov_loss(lp, old, adv, m, kl_cov_ratio=1e-4)[0])
    assert loss == float(kl_cov_loss(lp, old, adv, m, kl_cov_ratio=1e-4, log_ratio_clamp=20.0)[0])
    assert loss != float(kl_cov_loss(lp, old, adv, m, kl_cov_ratio=1e-4, log_ratio_clamp=None)[0])


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((2, 3))
    m = jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"clip_cov_loss: `clip_cov_ratio` must be > 0, got 0\.0"):
        clip_cov_loss(lp, lp, lp, m, clip_cov_ratio=0.0)
    with pytest.raises(ValueError, match=r"`clip_cov_ratio` must be in \(0, 1\], got 1\.5"):
        clip_cov_loss(lp, lp, lp, m, clip_cov_ratio=1.5)
    with pytest.raises(
        ValueError,
        match=r"`clip_cov_lb` must be < `clip_cov_ub` \(neither NaN\), got 5\.0 and 1\.0",
    ):
        clip_cov_loss(lp, lp, lp, m, clip_cov_lb=5.0, clip_cov_ub=1.0)
    with pytest.raises(ValueError, match="`key` must be None or a single PRNG key"):
        clip_cov_loss(lp, lp, lp, m, key=0)
    with pytest.raises(ValueError, match="`key` must be None or a single PRNG key"):
        clip_cov_loss(lp, lp, lp, m, key=jax.random.split(jax.random.key(0), 2))
    with pytest.raises(ValueError, match=r"`clip_high` must be >= 0, got -0\.2"):
        clip_cov_loss(lp, lp, lp, m, clip_high=-0.2)
    with pytest.raises(ValueError, match="clip_cov_loss: `advantages` must have the shape"):
        clip_cov_loss(lp, lp, jnp.zeros((3, 2)), m)
    with pytest.raises(ValueError, match=r"kl_cov_loss: `kl_cov_ratio` must be > 0, got -0\.1"):
        kl_cov_loss(lp, lp, lp, m, kl_cov_ratio=-0.1)
    with pytest.raises(ValueError, match=r"`ppo_kl_coef` must be >= 0, got -1\.0"):
        kl_cov_loss(lp, lp, lp, m, ppo_kl_coef=-1.0)
    with pytest.raises(ValueError, match="kl_cov_loss: `logp` must have rank 2"):
        kl_cov_loss(jnp.zeros((3,)), None, jnp.zeros((3,)), jnp.ones((3,)))
    # a raw uint32 key (`jax.random.PRNGKey`) is accepted
    jax.jit(lambda k: clip_cov_loss(lp, lp, lp, m, key=k)[0])(jax.random.PRNGKey(0))
