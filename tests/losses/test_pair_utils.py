"""`best_worst_pairs`, `rank_consistency`, `wpo_weights`, `ld_sequence_logprob`."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from losses.dpo import dpo_loss
from losses.logprobs import log_sum_pi_squared, sequence_logprob, token_logprobs
from losses.pair_utils import best_worst_pairs, ld_sequence_logprob, rank_consistency, wpo_weights
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, plant_nonfinite

B, G = 7, 5

# --------------------------------------------------------------------------------------------------
# best_worst_pairs
# --------------------------------------------------------------------------------------------------


def np_best_worst(s, v, margin):
    chosen, rejected, keep = [], [], []
    for row, ok in zip(s, v, strict=True):
        idx = [g for g in range(len(row)) if ok[g]]
        if not idx:
            chosen.append(0)
            rejected.append(0)
            keep.append(False)
            continue
        hi = max(idx, key=lambda g: (row[g], -g))  # first occurrence of the max
        lo = min(idx, key=lambda g: (row[g], g))  # first occurrence of the min
        chosen.append(hi)
        rejected.append(lo)
        keep.append(len(idx) >= 2 and row[hi] - row[lo] > margin)
    return np.array(chosen), np.array(rejected), np.array(keep)


def test_best_worst_pairs_matches_reference():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 4, (B, G)).astype(np.float32)  # many ties
    s[1] = 2.0  # constant group
    valid = rng.uniform(size=(B, G)) > 0.2
    valid[2] = [True, False, False, False, False]  # a single valid sample
    valid[3] = False  # none valid
    for margin in (0.0, 1.0):
        c, r, keep = jax.jit(lambda x, v, m=margin: best_worst_pairs(x, min_margin=m, valid=v))(
            plant_nonfinite(s, valid, rng), valid
        )
        ec, er, ek = np_best_worst(s, valid, margin)
        np.testing.assert_array_equal(np.asarray(keep), ek)
        np.testing.assert_array_equal(np.asarray(c)[ek], ec[ek])
        np.testing.assert_array_equal(np.asarray(r)[ek], er[ek])
        assert c.dtype == np.int32 and keep.dtype == bool
    c, r, keep = best_worst_pairs(s)
    ec, er, ek = np_best_worst(s, np.ones((B, G), bool), 0.0)
    np.testing.assert_array_equal(np.asarray(c), ec)
    np.testing.assert_array_equal(np.asarray(r), er)
    np.testing.assert_array_equal(np.asarray(keep), ek)


# --------------------------------------------------------------------------------------------------
# rank_consistency (CREAM)
# --------------------------------------------------------------------------------------------------


def np_kendall_consistency(a, b, v):
    out = []
    for ra, rb, ok in zip(a, b, v, strict=True):
        idx = [g for g in range(len(ra)) if ok[g]]
        pairs = list(itertools.combinations(idx, 2))
        if not pairs:
            out.append(1.0)
            continue
        tau = sum(np.sign(ra[i] - ra[j]) * np.sign(rb[i] - rb[j]) for i, j in pairs) / len(pairs)
        out.append((tau + 1) / 2)
    return np.array(out)


def test_rank_consistency_matches_kendall_tau():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 5, (B, G)).astype(np.float32)
    b = (a + rng.integers(-2, 3, (B, G))).astype(np.float32)
    a[0], a[1] = np.arange(G), rng.permutation(G)  # no ties
    b[0] = a[0] * 2  # identical ranking
    b[1] = -a[1]  # reversed
    valid = rng.uniform(size=(B, G)) > 0.2
    valid[:2] = True
    valid[2] = [False, True, False, False, False]
    c = jax.jit(rank_consistency)(plant_nonfinite(a, valid, rng), b, valid=valid)
    assert_close(c, np_kendall_consistency(a, b, valid))
    assert float(c[2]) == 1.0
    assert float(c[0]) == 1.0 and float(c[1]) == 0.0
    # symmetric in its two arguments
    assert_close(rank_consistency(b, a, valid=valid), np.asarray(c, np.float64))


def test_rank_consistency_as_cream_label_smoothing():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(4, G)).astype(np.float32), rng.normal(size=(4, G)).astype(np.float32)
    eps = 1.0 - rank_consistency(a, b)
    pc, pr = -rng.uniform(2, 9, 4).astype(np.float32), -rng.uniform(2, 9, 4).astype(np.float32)
    loss, _ = dpo_loss(pc, pr, None, None, reference_free=True, label_smoothing=eps)
    z = 0.1 * (pc.astype(np.float64) - pr)
    e = np.asarray(eps, np.float64)
    ref = np.mean((1 - e) * np.logaddexp(0, -z) + e * np.logaddexp(0, z))
    assert_close(loss, ref)


# --------------------------------------------------------------------------------------------------
# wpo_weights
# --------------------------------------------------------------------------------------------------


def test_wpo_weights_from_logits():
    rng = np.random.default_rng(3)
    N, T, V = 5, 6, 11
    logits = rng.normal(0, 2, (N, T, V)).astype(np.float32)
    tokens = rng.integers(0, V, (N, T)).astype(np.int32)
    mask = make_mask(rng, N, T)
    lp = token_logprobs(logits, tokens)
    lsq = log_sum_pi_squared(logits)
    w = jax.jit(wpo_weights)(plant_nonfinite(np.asarray(lp), mask, rng), lsq, mask)

    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    tok_p = np.take_along_axis(p, tokens[..., None], -1)[..., 0]
    per_tok = np.log(tok_p) - np.log((p**2).sum(-1))
    mean = np.where(mask > 0, per_tok, 0).sum(1) / np.maximum(mask.sum(1), 1)
    assert_close(w, np.exp(mean), rtol=1e-5)
    assert float(w[0]) == 1.0  # empty row
    g = jax.grad(lambda x: wpo_weights(x, lsq, mask).sum())(lp)
    assert np.all(np.asarray(g) == 0)
    assert_nan_safe(
        lambda a, b: wpo_weights(a, b, mask).sum(), (np.asarray(lp), np.asarray(lsq)), mask, rng
    )


# --------------------------------------------------------------------------------------------------
# ld_sequence_logprob (LD-DPO)
# --------------------------------------------------------------------------------------------------


def np_ld(lp, m, public, alpha):
    out = np.zeros(len(lp))
    for n in range(len(lp)):
        k = 0
        for t in range(lp.shape[1]):
            if m[n, t] > 0:
                k += 1
                out[n] += lp[n, t] * (1.0 if k <= public[n] else alpha)
    return out


def test_ld_sequence_logprob_matches_reference_and_limits():
    rng = np.random.default_rng(4)
    N, TC, TR = 6, 8, 5
    lp_c = np.log(rng.uniform(0.05, 1, (N, TC))).astype(np.float32)
    lp_r = np.log(rng.uniform(0.05, 1, (N, TR))).astype(np.float32)
    m_c, m_r = make_mask(rng, N, TC), make_mask(rng, N, TR, empty_row=False)
    alpha = 0.3

    def fn(a, b):
        return ld_sequence_logprob(a, m_c, b, m_r, alpha=alpha)

    ld_c, ld_r = jax.jit(fn)(plant_nonfinite(lp_c, m_c, rng), plant_nonfinite(lp_r, m_r, rng))
    public = np.minimum(m_c.sum(1), m_r.sum(1))
    assert_close(ld_c, np_ld(lp_c.astype(np.float64), m_c, public, alpha))
    assert_close(ld_r, np_ld(lp_r.astype(np.float64), m_r, public, alpha))
    # gradient: weight 1 on the public tokens, α beyond
    g = jax.grad(lambda a: fn(a, lp_r)[0].sum())(lp_c)
    ordinal = np.cumsum(m_c, 1)
    assert_close(g, np.where(m_c > 0, np.where(ordinal <= public[:, None], 1.0, alpha), 0.0))
    # α = 1 gives the plain sums; equal lengths are unaffected by α
    one_c, one_r = ld_sequence_logprob(lp_c, m_c, lp_r, m_r, alpha=1.0)
    assert_close(one_c, np.asarray(sequence_logprob(lp_c, m_c), np.float64))
    assert_close(one_r, np.asarray(sequence_logprob(lp_r, m_r), np.float64))
    same, _ = ld_sequence_logprob(lp_c, m_c, lp_c, m_c, alpha=0.0)
    assert_close(same, np.asarray(sequence_logprob(lp_c, m_c), np.float64))
    assert_nan_safe(lambda a: fn(a, lp_r)[0].sum(), (lp_c,), m_c, rng)


def test_bad_input_raises():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="`min_margin` must be a Python number >= 0"):
        best_worst_pairs(x, min_margin=-1.0)
    with pytest.raises(ValueError, match="`scores` must have rank 2"):
        best_worst_pairs(np.zeros(3))
    with pytest.raises(ValueError, match="`valid` must have shape"):
        best_worst_pairs(x, valid=np.ones((2, 2)))
    with pytest.raises(ValueError, match="`scores_b` must have the shape of `scores_a`"):
        rank_consistency(x, np.zeros((2, 4)))
    with pytest.raises(ValueError, match="`log_sum_pi_sq` must have the shape"):
        wpo_weights(x, np.zeros((2, 4), np.float32), np.ones((2, 3)))
    with pytest.raises(ValueError, match="`alpha` must lie in \\[0, 1\\]"):
        ld_sequence_logprob(x, np.ones((2, 3)), x, np.ones((2, 3)), alpha=1.5)
    with pytest.raises(ValueError, match="`alpha` must be a Python number"):
        ld_sequence_logprob(x, np.ones((2, 3)), x, np.ones((2, 3)), alpha=np.float32(0.5))
    with pytest.raises(ValueError, match="must have N = 2 rows"):
        ld_sequence_logprob(
            x, np.ones((2, 3)), np.zeros((3, 3), np.float32), np.ones((3, 3)), alpha=0.5
        )
