"""Reward-model and ranking losses (ALGORITHMS.md §9.1, §11) against float64 NumPy references."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.reward_model import (
    bradley_terry_loss,
    debiased_preference,
    infonce_loss,
    log_exp_pairwise_loss,
    plackett_luce_logprob,
    rewards_as_labels_loss,
    soft_bradley_terry_loss,
    verdict_probability,
    win_rate_rewards,
)
from tests.losses.helpers import assert_close, assert_nan_safe

N = 9

_bt = jax.jit(bradley_terry_loss)
_logexp = jax.jit(log_exp_pairwise_loss)
_soft = jax.jit(soft_bradley_terry_loss)
_real = jax.jit(rewards_as_labels_loss)
_infonce = jax.jit(infonce_loss)
_pl = jax.jit(plackett_luce_logprob)
_verdict = jax.jit(verdict_probability, static_argnums=(1, 2))
_win = jax.jit(win_rate_rewards)

PAIR_METRICS = {"rm/accuracy", "rm/margin", "rm/chosen_mean", "rm/rejected_mean"}


# --------------------------------------------------------------------------------------------------
# float64 references, written from the formulas
# --------------------------------------------------------------------------------------------------


def np_neg_log_sigmoid(x):
    """`−logσ(x) = log(1 + e^{−x})` in float64."""
    return np.logaddexp(0.0, -np.asarray(x, np.float64))


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def np_bce(x, y):
    return y * np_neg_log_sigmoid(x) + (1.0 - y) * np_neg_log_sigmoid(-x)


def np_valid_mean(x, v):
    v = np.asarray(v) > 0
    return np.where(v, x, 0.0).sum() / max(v.sum(), 1)


def _pairs(seed):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=N).astype(np.float32)
    r = rng.normal(size=N).astype(np.float32)
    valid = (rng.uniform(size=N) > 0.3).astype(np.float32)
    valid[:2] = [0.0, 1.0]
    return rng, c, r, valid


# --------------------------------------------------------------------------------------------------
# Bradley–Terry family (§9.1)
# --------------------------------------------------------------------------------------------------


def test_bradley_terry_anchor():
    c, r = jnp.array([1.0, 0.2]), jnp.array([0.0, 0.5])
    one_hot = (jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]))  # the mean of one pair = its loss
    assert_close([float(_bt(c, r, valid=v)[0]) for v in one_hot], [0.313262, 0.854355])
    with_margin = [float(_bt(c, r, margin=0.5, valid=v)[0]) for v in one_hot]
    assert_close(with_margin, [0.474077, 1.171101])
    loss, metrics = _bt(c, r)
    assert_close(loss, (0.313262 + 0.854355) / 2)
    assert_close(metrics["rm/accuracy"], 0.5)
    assert_close(metrics["rm/margin"], (1.0 - 0.3) / 2)
    loss16, metrics16 = _bt(c.astype(jnp.bfloat16), r.astype(jnp.bfloat16))
    assert loss16.dtype == jnp.float32 and metrics16["rm/accuracy"].dtype == jnp.float32


def test_bradley_terry_matches_float64_reference_and_gradient():
    _, c, r, valid = _pairs(0)
    margin = np.abs(np.random.default_rng(1).normal(size=N)).astype(np.float32)
    (loss, metrics), (gc, gr) = jax.jit(
        jax.value_and_grad(
            lambda a, b: bradley_terry_loss(a, b, margin=margin, valid=valid),
            argnums=(0, 1),
            has_aux=True,
        )
    )(c, r)
    x = c.astype(np.float64) - r - margin
    count = valid.sum()
    assert_close(loss, np_valid_mean(np_neg_log_sigmoid(x), valid))
    expected = -(1.0 - np_sigmoid(x)) * valid / count  # ∂/∂c = −(1 − σ(c − r − margin))
    assert_close(gc, expected)
    assert_close(gr, -expected)
    assert set(metrics) == PAIR_METRICS
    assert_close(metrics["rm/accuracy"], np_valid_mean((c > r).astype(np.float64), valid))
    assert_close(metrics["rm/margin"], np_valid_mean(c.astype(np.float64) - r, valid))
    assert_close(metrics["rm/chosen_mean"], np_valid_mean(c.astype(np.float64), valid))
    assert all(m.dtype == jnp.float32 and m.shape == () for m in metrics.values())


def test_margin_zero_equals_log_exp_form():
    _, c, r, valid = _pairs(2)
    bt = jax.jit(jax.value_and_grad(lambda a: bradley_terry_loss(a, r, valid=valid)[0]))(c)
    le = jax.jit(jax.value_and_grad(lambda a: log_exp_pairwise_loss(a, r, valid=valid)[0]))(c)
    assert_close(bt[0], float(le[0]))
    assert_close(bt[1], np.asarray(le[1]))
    assert_close(le[0], np_valid_mean(np.log1p(np.exp(r.astype(np.float64) - c)), valid))


def test_invariant_to_a_shared_shift():
    _, c, r, valid = _pairs(3)
    base = float(_bt(c, r, margin=0.2, valid=valid)[0])
    assert_close(_bt(c + 3.0, r + 3.0, margin=0.2, valid=valid)[0], base)
    soft = float(_soft(c, r, 0.7, valid=valid)[0])
    assert_close(_soft(c - 2.0, r - 2.0, 0.7, valid=valid)[0], soft)


def test_soft_bradley_terry_reference_and_prob_one_is_bt():
    rng, c, r, valid = _pairs(4)
    p = rng.uniform(size=N).astype(np.float32)
    loss, metrics = _soft(c, r, p, valid=valid)
    d = c.astype(np.float64) - r
    ref = p * np_neg_log_sigmoid(d) + (1 - p) * np_neg_log_sigmoid(-d)
    assert_close(loss, np_valid_mean(ref, valid))
    assert set(metrics) == PAIR_METRICS
    soft_vg = jax.jit(jax.value_and_grad(lambda a: soft_bradley_terry_loss(a, r, 1.0)[0]))(c)
    bt_vg = jax.jit(jax.value_and_grad(lambda a: bradley_terry_loss(a, r)[0]))(c)
    assert_close(soft_vg[0], float(bt_vg[0]))
    assert_close(soft_vg[1], np.asarray(bt_vg[1]))
    # gradient of the soft loss: −(p − σ(c − r))/n per pair; p carries no gradient
    g = jax.grad(lambda a, q: soft_bradley_terry_loss(a, r, q)[0], argnums=(0, 1))(c, p)
    assert_close(g[0], -(p - np_sigmoid(d)) / N)
    assert np.all(np.asarray(g[1]) == 0)


def test_soft_label_half_is_minimised_at_equal_scores():
    c = jnp.array([0.3, -1.2])
    grad = jax.grad(lambda a: soft_bradley_terry_loss(a, c, 0.5)[0])(c)
    assert_close(grad, [0.0, 0.0])
    at_min = float(_soft(c, c, 0.5)[0])
    assert_close(at_min, np.log(2.0))
    assert float(_soft(c + 0.1, c, 0.5)[0]) > at_min < float(_soft(c - 0.1, c, 0.5)[0])


def test_pairwise_losses_are_nan_safe():
    rng, c, r, valid = _pairs(5)
    assert_nan_safe(
        lambda a, b: bradley_terry_loss(a, b, margin=0.1, valid=valid),
        (c, r),
        valid,
        rng,
        argnums=(0, 1),
    )
    assert_nan_safe(lambda a, b: log_exp_pairwise_loss(a, b, valid=valid), (c, r), valid, rng)
    p = rng.uniform(size=N).astype(np.float32)
    assert_nan_safe(
        lambda a, b, q: soft_bradley_terry_loss(a, b, q, valid=valid), (c, r, p), valid, rng
    )


def test_debiased_preference():
    p = debiased_preference(jnp.array([0.9, 0.2, 0.5]), jnp.array([0.3, 0.2, 0.5]))
    assert_close(p, [0.8, 0.5, 0.5])
    # a judge that always prefers the first-shown response is fully de-biased to ½
    assert_close(debiased_preference(jnp.ones(2), jnp.ones(2)), [0.5, 0.5])


def test_pairwise_errors_name_the_problem():
    x = jnp.zeros(3)
    with pytest.raises(ValueError, match="`chosen_scores` must have rank 1"):
        bradley_terry_loss(jnp.zeros((3, 1)), jnp.zeros((3, 1)))
    with pytest.raises(ValueError, match="`rejected_scores` must have the shape"):
        bradley_terry_loss(x, jnp.zeros(4))
    with pytest.raises(ValueError, match="`margin` must be a scalar or have shape"):
        bradley_terry_loss(x, x, margin=jnp.zeros(2))
    with pytest.raises(ValueError, match="`chosen_scores` must be a floating-point"):
        log_exp_pairwise_loss(jnp.zeros(3, jnp.int32), x)
    with pytest.raises(ValueError, match="`valid` must have shape"):
        soft_bradley_terry_loss(x, x, 0.5, valid=jnp.ones(2))
    with pytest.raises(ValueError, match="`prob` must be a scalar or have shape"):
        soft_bradley_terry_loss(x, x, jnp.ones(2))
    with pytest.raises(ValueError, match="`p_ba` must have the shape"):
        debiased_preference(x, jnp.zeros(2))


# --------------------------------------------------------------------------------------------------
# rewards as labels (REAL)
# --------------------------------------------------------------------------------------------------


def test_rewards_as_labels_reference_and_gradient():
    rng = np.random.default_rng(6)
    B, G = 3, 4
    score = rng.normal(size=(B, G)).astype(np.float32)
    y = (rng.uniform(size=(B, G)) > 0.5).astype(np.float32)
    valid = np.ones((B, G), np.float32)
    valid[0, :] = 0.0
    valid[2, 1] = 0.0
    for anchor in (0.3, rng.normal(size=B).astype(np.float32), rng.normal(size=(B, G))):
        a = np.asarray(anchor, np.float64)
        a = a[:, None] if a.ndim == 1 else a
        x = score.astype(np.float64) - a
        (loss, metrics), grad = jax.value_and_grad(
            lambda s, anchor=anchor: rewards_as_labels_loss(s, y, anchor=anchor, valid=valid),
            has_aux=True,
        )(score)
        assert_close(loss, np_valid_mean(np_bce(x, y), valid))
        assert_close(grad, (np_sigmoid(x) - y) * valid / valid.sum())  # bounded weight σ(x) − y
        assert_close(metrics["rm/accuracy"], np_valid_mean(((x > 0) == (y > 0.5)) * 1.0, valid))
        assert_close(metrics["rm/prob_mean"], np_valid_mean(np_sigmoid(x), valid))
    assert_nan_safe(
        lambda s, t: rewards_as_labels_loss(s, t, anchor=0.1, valid=valid), (score, y), valid, rng
    )
    with pytest.raises(ValueError, match="`anchor` must be a scalar, \\[B\\]"):
        rewards_as_labels_loss(score, y, anchor=jnp.zeros(G + 1))
    with pytest.raises(ValueError, match="`labels` must have the shape of `score`"):
        rewards_as_labels_loss(score, y[:, :2], anchor=0.0)
    with pytest.raises(ValueError, match="`score` must have rank 2"):
        rewards_as_labels_loss(score[0], y[0], anchor=0.0)


# --------------------------------------------------------------------------------------------------
# InfoNCE
# --------------------------------------------------------------------------------------------------


def np_infonce(s, pos, valid, tau):
    """Per-row loss and whether the row counts (float64)."""
    s = np.where(valid > 0, np.asarray(s, np.float64), 0.0) / tau
    losses, counted, grads = [], [], np.zeros_like(s)
    for n in range(s.shape[0]):
        v, p = valid[n] > 0, (pos[n] > 0) & (valid[n] > 0)
        if not p.any():
            losses.append(0.0)
            counted.append(False)
            continue
        e = np.where(v, np.exp(s[n] - s[n][v].max()), 0.0)
        losses.append(-np.log(e[p].sum() / e.sum()))
        counted.append(True)
        grads[n] = (e / e.sum() - np.where(p, e, 0.0) / e[p].sum()) / tau
    return np.array(losses), np.array(counted), grads


def test_infonce_reference_and_gradient():
    rng = np.random.default_rng(7)
    R, C, tau = 6, 5, 0.7
    s = rng.normal(size=(R, C)).astype(np.float32)
    pos = (rng.uniform(size=(R, C)) > 0.6).astype(np.float32)
    valid = (rng.uniform(size=(R, C)) > 0.2).astype(np.float32)
    pos[0] = 0.0  # a row without positives is left out
    pos[1, :2], valid[1, :2] = 1.0, 1.0
    valid[2] = 0.0  # an empty row
    (loss, metrics), grad = jax.jit(
        jax.value_and_grad(
            lambda x: infonce_loss(x, pos, temperature=tau, valid=valid), has_aux=True
        )
    )(s)
    per_row, counted, g = np_infonce(s, pos, valid, tau)
    rows = counted.sum()
    assert_close(loss, per_row[counted].mean())
    assert_close(grad, g / rows)
    assert_close(metrics["rm/rows"], rows)
    assert_close(metrics["rm/pos_prob"], np.exp(-per_row[counted]).mean())
    sv = np.where(valid > 0, s, -np.inf)
    hit = [np.where(pos[n] * valid[n] > 0, sv[n], -np.inf).max() >= sv[n].max() for n in range(R)]
    assert_close(metrics["rm/accuracy"], np.mean(np.array(hit)[counted]))
    assert_nan_safe(lambda x: infonce_loss(x, pos, temperature=tau, valid=valid), (s,), valid, rng)


def test_infonce_one_positive_is_softmax_cross_entropy():
    rng = np.random.default_rng(8)
    s = rng.normal(size=(4, 6)).astype(np.float32)
    target = np.array([0, 3, 5, 1])
    loss, _ = _infonce(s, np.eye(6)[target], temperature=1.0)
    logp = jax.nn.log_softmax(jnp.asarray(s), axis=-1)
    assert_close(loss, -float(jnp.mean(logp[np.arange(4), target])))
    with pytest.raises(ValueError, match="`temperature` must be > 0"):
        infonce_loss(s, np.eye(6)[target], temperature=0.0)
    with pytest.raises(ValueError, match="`pos_mask` must have shape"):
        infonce_loss(s, np.eye(5), temperature=1.0)


# --------------------------------------------------------------------------------------------------
# Plackett–Luce
# --------------------------------------------------------------------------------------------------


def np_plackett_luce(s, ranking, valid):
    """Log-probability and its gradient w.r.t. the scores (float64, one row at a time)."""
    s = np.asarray(s, np.float64)
    out, grad = np.zeros(s.shape[0]), np.zeros_like(s)
    for n in range(s.shape[0]):
        avail = valid[n] > 0
        for item in ranking[n]:
            if not 0 <= item < s.shape[1]:
                continue
            e = np.where(avail, np.exp(s[n] - s[n][avail].max()), 0.0)
            out[n] += np.log(e[item] / e.sum())
            grad[n, item] += 1.0
            grad[n] -= e / e.sum()
            avail[item] = False
    return out, grad


@pytest.mark.parametrize("C", [1, 2, 3, 4])
def test_plackett_luce_permutations_sum_to_one(C):
    rng = np.random.default_rng(C)
    s = rng.normal(size=(1, C)).astype(np.float32) * 2.0
    for K in range(1, C + 1):
        perms = np.array(list(itertools.permutations(range(C), K)), np.int32)
        lp = _pl(np.repeat(s, len(perms), axis=0), perms)
        assert_close(float(jnp.sum(jnp.exp(lp))), 1.0, rtol=1e-5)


def test_plackett_luce_reference_gradient_and_padding():
    rng = np.random.default_rng(9)
    R, C, K = 5, 6, 4
    s = rng.normal(size=(R, C)).astype(np.float32)
    valid = np.ones((R, C), np.float32)
    valid[1, [0, 5]] = 0.0
    ranking = np.stack([rng.permutation(np.flatnonzero(valid[n]))[:K] for n in range(R)])
    ranking = ranking.astype(np.int32)
    ranking[2, 3] = -1  # padding: a shorter (top-3) ranking
    lp = _pl(s, ranking, valid=valid)
    jac = np.asarray(
        jax.jit(jax.jacrev(lambda x: plackett_luce_logprob(x, ranking, valid=valid)))(s)
    )  # [R, R, C]: rows are independent
    expected, grad = np_plackett_luce(s, ranking, valid)
    assert_close(lp, expected)
    assert_close(jac[np.arange(R), np.arange(R)], grad)
    assert np.all(jac[~np.eye(R, dtype=bool)] == 0.0)
    assert np.all(np.asarray(lp) <= 0)
    # padding entries equal the shorter ranking; invalid items never enter a denominator
    assert_close(lp[2], np_plackett_luce(s[2:3], ranking[2:3, :3], valid[2:3])[0][0])
    dirty = s.copy()
    dirty[valid == 0] = np.nan
    assert_close(_pl(dirty, ranking, valid=valid), expected)
    # finite-difference check of one row of the gradient
    eps, x0 = 1e-2, s[3].astype(np.float64)
    fd = [
        (
            np_plackett_luce((x0 + eps * e)[None], ranking[3:4], valid[3:4])[0][0]
            - np_plackett_luce((x0 - eps * e)[None], ranking[3:4], valid[3:4])[0][0]
        )
        / (2 * eps)
        for e in np.eye(C)
    ]
    assert_close(jac[3, 3], fd, rtol=1e-3, atol=1e-4)


def test_plackett_luce_errors():
    s = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="`ranking` must be an integer array"):
        plackett_luce_logprob(s, jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="`ranking` must have shape \\[N, K\\]"):
        plackett_luce_logprob(s, jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="`scores` must have rank 2"):
        plackett_luce_logprob(jnp.zeros(3), jnp.zeros((1, 3), jnp.int32))


# --------------------------------------------------------------------------------------------------
# verdict probability and win-rate rewards
# --------------------------------------------------------------------------------------------------


def test_verdict_probability():
    rng = np.random.default_rng(10)
    z = (3.0 * rng.normal(size=(6, 9))).astype(np.float32)
    p = _verdict(z, 4, 1)
    za, zb = z[:, 4].astype(np.float64), z[:, 1].astype(np.float64)
    assert_close(p, np.exp(za) / (np.exp(za) + np.exp(zb)))
    assert_close(_verdict(z, 1, 4), 1.0 - np.asarray(p))
    # independent of the other tokens' logits
    z2 = z.copy()
    z2[:, [0, 2, 3]] += 50.0
    assert_close(_verdict(z2, 4, 1), np.asarray(p))
    assert _verdict(jnp.asarray(z, jnp.bfloat16), 4, 1).dtype == jnp.float32
    with pytest.raises(ValueError, match="`tok_b` must be a static Python int token id"):
        verdict_probability(z, 0, 9)
    with pytest.raises(ValueError, match="`tok_a` and `tok_b` must differ"):
        verdict_probability(z, 2, 2)
    with pytest.raises(ValueError, match="`logits` must have rank 2"):
        verdict_probability(z[0], 0, 1)


def test_win_rate_rewards():
    rng = np.random.default_rng(11)
    B, G = 3, 4
    upper = rng.uniform(size=(B, G, G))
    pref = np.triu(upper, 1) + np.transpose(1.0 - np.triu(upper, 1), (0, 2, 1)) * np.tril(
        np.ones((G, G)), -1
    )
    pref = pref.astype(np.float32)  # p_gj + p_jg = 1 off the diagonal
    pref[:, np.arange(G), np.arange(G)] = 0.5
    r = _win(pref)
    expected = (pref.astype(np.float64).sum(-1) - 0.5) / (G - 1)
    assert_close(r, expected)
    assert_close(np.asarray(r).mean(axis=1), [0.5] * B)  # a zero-sum game: mean win rate ½
    # the diagonal is never read; invalid samples neither play nor win
    valid = np.ones((B, G), np.float32)
    valid[1, 2] = 0.0
    dirty = pref.copy()
    dirty[:, np.arange(G), np.arange(G)] = np.nan
    dirty[1, 2, :] = np.inf
    dirty[1, :, 2] = np.nan
    rv = np.asarray(_win(dirty, valid=valid))
    keep = [0, 1, 3]
    sub = pref[1][np.ix_(keep, keep)].astype(np.float64)
    assert_close(rv[1, keep], (sub.sum(-1) - 0.5) / 2)
    assert rv[1, 2] == 0.0
    assert_close(rv[[0, 2]], expected[[0, 2]])
    with pytest.raises(ValueError, match="`pref` must have shape \\[B,G,G\\] with G >= 2"):
        win_rate_rewards(jnp.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="`pref` must have rank 3"):
        win_rate_rewards(jnp.zeros((2, 3)))
