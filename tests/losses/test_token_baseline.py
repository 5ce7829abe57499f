"""Optimal token baseline (ALGORITHMS.md §4.14) against a float64 NumPy reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.token_baseline import optimal_token_baseline_advantages
from tests.losses.helpers import assert_close, make_mask, plant_nonfinite

B, G, T = 3, 4, 10
N = B * G

_otb = jax.jit(
    optimal_token_baseline_advantages,
    static_argnames=("G", "handle_zero_tail", "positions"),
)


def np_otb(r, m, old, lsp, G, *, rho=None, eps=1e-8, zero_tail=True, ordinal=False):
    """§4.14 written per group and per (absolute or ordinal) position."""
    n_rows, Tt = r.shape
    valid = m > 0
    rz = np.where(valid, r, 0.0).astype(np.float64)
    w = 1 - 2 * np.exp(np.where(valid, old, 0.0)) + np.exp(np.where(valid, lsp, 0.0))
    if rho is not None:
        w = w * np.where(valid, rho, 0.0) ** 2
    R = np.flip(np.cumsum(np.flip(rz, 1), 1), 1)
    W = np.cumsum(np.where(valid, w, 0.0), 1)
    # per row: the positions that are aligned across the group
    cols = [np.flatnonzero(valid[n]) if ordinal else np.arange(Tt) for n in range(n_rows)]
    keys = [np.arange(len(c)) if ordinal else c for c in cols]
    adv = np.zeros((n_rows, Tt))
    for b in range(n_rows // G):
        rows = range(b * G, b * G + G)
        lengths = np.array([valid[n].sum() for n in rows])
        members = (lengths > 0).sum()
        order = np.sort(lengths)
        unique_longest = (lengths == order[-1]).sum() == 1
        for n in rows:
            for col, key in zip(cols[n], keys[n], strict=True):
                if not valid[n, col]:
                    continue
                num = den = 0.0
                for j in rows:
                    jcol = (
                        (np.flatnonzero(valid[j])[key] if key < lengths[j - b * G] else None)
                        if ordinal
                        else key
                    )
                    if jcol is not None and valid[j, jcol]:
                        num += R[j, jcol] * W[j, jcol]
                        den += W[j, jcol]
                base = num / (den + eps) if members >= 2 else 0.0
                if (
                    zero_tail
                    and unique_longest
                    and lengths[n - b * G] == order[-1]
                    and key >= order[-2]
                ):
                    base = 0.0
                adv[n, col] = R[n, col] - base
    return adv, np.where(valid, R, 0.0), W


def otb_batch(seed, *, holes=True):
    rng = np.random.default_rng(seed)
    m = (
        make_mask(rng, N, T)
        if holes
        else (np.arange(T) < rng.integers(0, T + 1, (N, 1))).astype(np.float32)
    )
    m[4:8] = 0.0  # group 1: one member only
    m[5, :6] = 1.0
    m[8:12] = (np.arange(T) < np.array([[3], [7], [5], [3]])).astype(np.float32)  # unique longest
    r = rng.normal(size=(N, T)) * (rng.uniform(size=(N, T)) < 0.3)
    probs = rng.uniform(0.05, 0.95, size=(N, T))
    old = np.log(probs)
    lsp = np.log(probs**2 + rng.uniform(0.0, 1.0 - probs, size=(N, T)) ** 2)  # π_y² ≤ Σπ² ≤ 1
    rho = rng.uniform(0.5, 1.5, size=(N, T))
    dirty = [plant_nonfinite(x, m, rng) for x in (r, old, lsp, rho)]
    return m, [x.astype(np.float32) for x in (r, old, lsp, rho)], dirty


@pytest.mark.parametrize(
    ("positions", "zero_tail", "with_is"),
    [("absolute", True, False), ("absolute", False, True), ("valid_ordinal", True, True)],
)
def test_matches_reference(positions, zero_tail, with_is):
    m, (r, old, lsp, rho), (dr, dold, dlsp, drho) = otb_batch(0)
    adv, ret = _otb(
        dr,
        m,
        dold,
        dlsp,
        G=G,
        is_weights=drho if with_is else None,
        handle_zero_tail=zero_tail,
        positions=positions,
    )
    ref_adv, ref_ret, _ = np_otb(
        r,
        m,
        old,
        lsp,
        G,
        rho=rho if with_is else None,
        zero_tail=zero_tail,
        ordinal=positions == "valid_ordinal",
    )
    assert adv.dtype == jnp.float32 and adv.shape == (N, T)
    assert_close(adv, ref_adv, atol=1e-5)
    assert_close(ret, ref_ret, atol=1e-5)


def test_weighted_advantages_sum_to_zero_at_every_position():
    m, (r, old, lsp, _), dirty = otb_batch(1)
    adv, _ = _otb(dirty[0], m, dirty[1], dirty[2], G=G, handle_zero_tail=False)
    _, _, W = np_otb(r, m, old, lsp, G)
    weighted = (W * m * np.asarray(adv, np.float64)).reshape(B, G, T).sum(1)
    weighted[1] = 0.0  # the single-member group has no baseline (A = R)
    assert np.max(np.abs(weighted)) < 1e-5


def test_zero_tail_gives_the_return_beyond_the_second_longest():
    m, (r, old, lsp, _), _ = otb_batch(2)
    on, _ = _otb(r, m, old, lsp, G=G, handle_zero_tail=True)
    off, ret = _otb(r, m, old, lsp, G=G, handle_zero_tail=False)
    on, off, ret = (np.asarray(x) for x in (on, off, ret))
    # group 2: lengths [3, 7, 5, 3] → row 9 alone beyond position 5
    assert_close(on[9, 5:7], ret[9, 5:7])
    assert_close(off[9, 5:7], np.zeros(2), atol=1e-5)  # its own return as baseline
    # the other rows of the group and the single-member group are unchanged
    for row in (4, 5, 6, 7, 8, 10, 11):
        assert_close(on[row], np.asarray(off[row], np.float64))


def test_single_member_group_keeps_the_return():
    m, (r, old, lsp, _), _ = otb_batch(3)
    adv, ret = _otb(r, m, old, lsp, G=G, handle_zero_tail=False)
    assert_close(adv[4:8], np.asarray(ret[4:8], np.float64))


def test_ordinal_alignment_equals_absolute_for_prefix_masks():
    m, (r, old, lsp, _), _ = otb_batch(4, holes=False)
    a, _ = _otb(r, m, old, lsp, G=G, positions="absolute")
    b, _ = _otb(r, m, old, lsp, G=G, positions="valid_ordinal")
    assert_close(a, np.asarray(b, np.float64))


def test_bad_inputs_raise_clear_errors():
    x = np.zeros((4, 3), np.float32)
    m = np.ones((4, 3))
    fn = optimal_token_baseline_advantages
    with pytest.raises(ValueError, match="`G` must be a Python int >= 2 dividing N = 4"):
        fn(x, m, x, x, G=3)
    with pytest.raises(ValueError, match="`G` must be a Python int >= 2"):
        fn(x, m, x, x, G=1)
    with pytest.raises(ValueError, match="`positions` must be one of 'absolute', 'valid_ordinal'"):
        fn(x, m, x, x, G=2, positions="ordinal")
    with pytest.raises(ValueError, match="`log_sum_pi_sq` must have the shape of `rewards`"):
        fn(x, m, x, x[:, :2], G=2)
    with pytest.raises(ValueError, match="`is_weights` must have the shape of `rewards`"):
        fn(x, m, x, x, G=2, is_weights=x[:2])
    with pytest.raises(ValueError, match="`eps` must be >= 0"):
        fn(x, m, x, x, G=2, eps=-1.0)
    with pytest.raises(ValueError, match="`old_logp` must be a floating-point array"):
        fn(x, m, x.astype(np.int32), x, G=2)
    with pytest.raises(
        ValueError, match="optimal_token_baseline_advantages: `rewards` must have rank 2"
    ):
        fn(x[0], m[0], x[0], x[0], G=2)
