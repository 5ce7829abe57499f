"""`disco_loss` (ALGORITHMS.md §5.12) against a float64 reference with an analytic gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.disco import disco_loss
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask

B, G, T = 4, 4, 5
N = B * G
# group 0: its only positive is row 0, which is empty (make_mask) -> degenerate; group 1: all
# positive -> degenerate; groups 2, 3: mixed
LABELS = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [1, 0, 1, 0], [0, 1, 0, 0]], np.int32)


def random_batch(seed):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, N, T)
    lp = -rng.uniform(0.1, 2.0, size=(N, T)).astype(np.float32)
    old = (lp + 0.3 * rng.normal(size=(N, T)) + 0.1).astype(np.float32)  # kl ≈ 0.1 > δ
    return rng, lp, old, mask


def np_disco(lp, old, correct, mask, *, score, tau, objective, delta, penalty, tok_w=None):
    """Loss, ∂loss/∂lp and metrics in float64, written from §5.12."""
    valid = np.asarray(mask) > 0
    lp, old = (np.where(valid, np.asarray(x, np.float64), 0.0) for x in (lp, old))
    w = valid * (1.0 if tok_w is None else np.asarray(tok_w, np.float64))
    logr = lp - old
    r = np.exp(np.clip(logr, -20, 20))
    x, dx = (lp, np.ones_like(lp)) if score == "log_l" else (r, r * (np.abs(logr) < 20))
    has = w.sum(1) > 0  # a sample with no valid (or no selected) token has no score
    den = np.where(has, w.sum(1), 1.0)
    s = (w * x).sum(1) / den
    ds = w * dx / den[:, None]  # ∂s_n/∂lp_nt
    pos = (np.asarray(correct).reshape(-1) > 0) & has
    neg = ~(np.asarray(correct).reshape(-1) > 0) & has
    j = np.zeros(B)
    dj_ds = np.zeros(N)  # ∂(Σ_b J_b)/∂s_n
    for b in range(B):
        rows = np.arange(b * G, (b + 1) * G)
        p, q = rows[pos[rows]], rows[neg[rows]]
        if len(p) == 0 or len(q) == 0:
            continue
        if objective == "mean":
            j[b] = s[p].mean() - s[q].mean()
            dj_ds[q] = -1.0 / len(q)
        else:
            e = np.exp(s[q] / tau)
            j[b] = s[p].mean() - tau * np.log(e.mean())
            dj_ds[q] = -e / e.sum()
        dj_ds[p] = 1.0 / len(p)
    count = max(valid.sum(), 1)
    kl = (-logr)[valid].sum() / count
    hinge = max(kl - delta, 0.0)
    loss = -j.sum() / B + penalty * hinge**2
    grad = -(dj_ds / B)[:, None] * ds + 2 * penalty * hinge * (-1.0 * valid / count)
    metrics = {
        "policy/objective": j.sum() / B,
        "policy/score_pos_mean": s[pos].mean(),
        "policy/score_neg_mean": s[neg].mean(),
        "policy/informative_group_frac": np.mean([j_ != 0 for j_ in j]),
        "kl/mean": kl,
        "kl/penalty": penalty * hinge**2,
        "policy/approx_kl": kl,
    }
    return loss, grad, metrics


CONFIGS = {
    "log_l_lse": {"score": "log_l", "objective": "log_sum_exp"},
    "l_ratio_mean": {"score": "l_ratio", "objective": "mean", "delta": 0.01, "penalty": 5.0},
    "l_ratio_lse_tau": {"score": "l_ratio", "objective": "log_sum_exp", "tau": 0.5, "penalty": 2.0},
}


def _full(cfg):
    tau = cfg.get("tau", 10.0 if cfg["score"] == "log_l" else 1.0)
    return {"delta": 1e-4, "penalty": 1e3, **cfg, "tau": tau}


def test_matches_reference():
    rng, lp, old, mask = random_batch(0)
    tok_w = (rng.uniform(size=(N, T)) > 0.2).astype(np.float32)

    @jax.jit
    def run(lp, old, correct, mask, tok_w):
        out = {}
        for name, cfg in CONFIGS.items():
            kw = {"token_weights": tok_w} if name == "l_ratio_lse_tau" else {}
            out[name] = jax.value_and_grad(
                lambda x, cfg=cfg, kw=kw: disco_loss(x, old, correct, mask, **cfg, **kw),
                has_aux=True,
            )(lp)
        return out

    for name, ((loss, metrics), grad) in run(lp, old, LABELS, mask, tok_w).items():
        tw = tok_w if name == "l_ratio_lse_tau" else None
        ref_loss, ref_grad, ref_metrics = np_disco(
            lp, old, LABELS, mask, tok_w=tw, **_full(CONFIGS[name])
        )
        assert loss.dtype == jnp.float32 and loss.shape == ()
        assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
        assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)
        for key, value in ref_metrics.items():
            assert_close(metrics[key], value, rtol=1e-5, atol=1e-6)
        assert float(metrics["policy/informative_group_frac"]) == 0.5
        assert float(metrics["kl/penalty"]) > 0.0  # the constraint is active on this data


def test_token_weights_are_a_weighted_mean_and_an_unselected_sample_drops_out():
    """Weights scaled by 0.3 give the same scores (a weighted mean, not divided by max(Σw, 1));
    a sample whose weights are all 0 leaves its set as if it had no valid token (not a score
    of 0, the highest possible log-likelihood), for a negative and for a positive."""
    rng, lp, old, mask = random_batch(2)
    tok_w = (rng.uniform(size=(N, T)) > 0.3).astype(np.float32)
    kw = {"score": "log_l", "penalty": 0.0}  # the KL term keeps every valid token: left out
    base, _ = disco_loss(lp, old, LABELS, mask, token_weights=tok_w, **kw)
    scaled, _ = disco_loss(lp, old, LABELS, mask, token_weights=0.3 * tok_w, **kw)
    assert_close(scaled, base, rtol=1e-6, atol=1e-7)
    for row in (9, 8):  # group 2: row 9 a negative, row 8 a positive (one of two)
        assert mask[row].sum() > 0 and tok_w[row].sum() > 0
        unselected = tok_w.copy()
        unselected[row] = 0.0
        removed = mask.copy()
        removed[row] = 0
        loss, _ = disco_loss(lp, old, LABELS, mask, token_weights=unselected, **kw)
        reference, _ = disco_loss(lp, old, LABELS, removed, token_weights=unselected, **kw)
        assert_close(loss, reference, rtol=1e-6, atol=1e-7)
        assert abs(float(loss) - float(base)) > 1e-3  # the sample mattered


def test_one_negative_per_group_makes_both_objectives_equal():
    _, lp, old, mask = random_batch(1)
    labels = np.array([[1, 0, 1, 1], [1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 0]])
    assert mask[0].sum() == 0  # row 0 is empty, so group 0 keeps exactly one valid negative (row 1)

    @jax.jit
    def run(lp):
        return {
            (score, obj): jax.value_and_grad(
                lambda x, s=score, o=obj: disco_loss(x, old, labels, mask, score=s, objective=o)[0]
            )(lp)
            for score in ("log_l", "l_ratio")
            for obj in ("log_sum_exp", "mean")
        }

    out = run(lp)
    for score in ("log_l", "l_ratio"):
        (v1, g1), (v2, g2) = out[score, "log_sum_exp"], out[score, "mean"]
        assert_close(v1, float(v2))
        assert_close(g1, np.asarray(g2))


def test_kl_within_budget_gives_no_penalty_value_or_gradient():
    _, lp, old, mask = random_batch(2)

    @jax.jit
    def run(lp):
        return [
            jax.value_and_grad(
                lambda x, p=p: disco_loss(x, old, LABELS, mask, delta=10.0, penalty=p), has_aux=True
            )(lp)
            for p in (1e3, 0.0)
        ]

    ((loss, metrics), grad), ((loss0, _), grad0) = run(lp)
    assert float(metrics["kl/penalty"]) == 0.0 and float(metrics["kl/mean"]) < 10.0
    assert float(loss) == float(loss0)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(grad0))
    # degenerate groups (0 and 1) and empty rows get no gradient without the KL term
    assert np.all(np.asarray(grad)[: 2 * G] == 0.0)
    assert np.any(np.asarray(grad)[2 * G :] != 0.0)


def test_on_policy_has_zero_kl_and_old_none_matches_old_equal_logp():
    _, lp, _, mask = random_batch(3)

    @jax.jit
    def run(lp):
        return [
            jax.value_and_grad(
                lambda x, o=o: disco_loss(x, o, LABELS, mask, score="l_ratio"), has_aux=True
            )(lp)
            for o in (None, lp)
        ]

    ((loss_a, metrics), grad_a), ((loss_b, _), grad_b) = run(lp)
    assert float(metrics["kl/mean"]) == 0.0
    assert_close(loss_a, 0.0)  # every score is 1: mean_pos 1 − τ log e^{1/τ} = 0
    assert_close(loss_b, float(loss_a))
    assert_close(grad_a, np.asarray(grad_b))


def test_nan_outside_the_mask_does_not_leak():
    rng, lp, old, mask = random_batch(4)
    tok_w = rng.uniform(0.0, 1.0, size=(N, T)).astype(np.float32)

    def fn(lp, old, tok_w):
        return disco_loss(lp, old, LABELS, mask, score="l_ratio", penalty=3.0, token_weights=tok_w)

    assert_nan_safe(fn, (lp, old, tok_w), mask, rng)


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((6, 4))
    m = jnp.ones((6, 4))
    c = jnp.ones((3, 2))

    def trace(*args, **kw):
        return jax.eval_shape(lambda *a: disco_loss(*a, **kw), *args)

    with pytest.raises(ValueError, match=r"disco_loss: `score` must be one of .*got 'logL'"):
        trace(lp, lp, c, m, score="logL")
    with pytest.raises(ValueError, match=r"disco_loss: `objective` must be one of"):
        trace(lp, lp, c, m, objective="max")
    with pytest.raises(ValueError, match="disco_loss: `tau` must be > 0"):
        trace(lp, lp, c, m, tau=0.0)
    with pytest.raises(ValueError, match="disco_loss: `delta` must be >= 0"):
        trace(lp, lp, c, m, delta=-1.0)
    with pytest.raises(ValueError, match=r"disco_loss: `correct` .* one label per row"):
        trace(lp, lp, jnp.ones((2, 2)), m)
    with pytest.raises(ValueError, match=r"disco_loss: `correct` must be \[B,G\] with G >= 2"):
        trace(lp, lp, jnp.ones((6, 1)), m)
    with pytest.raises(ValueError, match=r"disco_loss: `correct` must have rank 2"):
        trace(lp, lp, jnp.ones(6), m)
    with pytest.raises(ValueError, match=r"disco_loss: `mask` must have shape"):
        trace(lp, lp, c, jnp.ones((6, 3)))
