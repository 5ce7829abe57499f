"""LaSeR self-rewards (ALGORITHMS.md §9.3) and unbiased pass@k (§11) against float64 references."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.self_reward import laser_loss, laser_self_rewards, last_valid_logits, pass_at_k
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask

N, T, V = 6, 5, 7

_last = jax.jit(last_valid_logits)
_pass = jax.jit(pass_at_k, static_argnums=(2,))


def np_log_softmax(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _laser_inputs(seed):
    rng = np.random.default_rng(seed)
    logits = (2.0 * rng.normal(size=(N, T, V))).astype(np.float32)
    mask = make_mask(rng, N, T)
    return rng, logits, mask


def _np_last_index(mask):
    return np.array([np.flatnonzero(row).max() if row.any() else -1 for row in mask])


# --------------------------------------------------------------------------------------------------
# LaSeR (§9.3)
# --------------------------------------------------------------------------------------------------


def test_last_valid_logits_picks_the_last_valid_position():
    _, logits, mask = _laser_inputs(0)
    dirty = logits.copy()
    dirty[mask == 0] = np.nan  # only the selected positions are ever read
    out = np.asarray(_last(dirty, mask))
    last = _np_last_index(mask)
    assert last[0] == -1 and mask[2, 1] == 0  # the empty row and a row with a hole
    for n in range(N):
        assert_close(out[n], logits[n, last[n]] if last[n] >= 0 else np.zeros(V))
    assert _last(jnp.asarray(logits, jnp.bfloat16), mask).dtype == jnp.float32


def test_laser_self_rewards_reference():
    rng = np.random.default_rng(1)
    z = (3.0 * rng.normal(size=(N, V))).astype(np.float32)
    c_ref = -rng.uniform(1.0, 3.0, size=N).astype(np.float32)
    for tau, ref in ((1.0, -2.0), (0.6, c_ref)):
        r = laser_self_rewards(z, token_id=4, ref_constant=ref, beta_v=0.1, temperature=tau)
        assert_close(r, 0.1 * (np_log_softmax(z / tau)[:, 4] - ref))
    with pytest.raises(ValueError, match="`token_id` must be a static Python int in \\[0, 7\\)"):
        laser_self_rewards(z, token_id=V, ref_constant=0.0, beta_v=1.0)
    with pytest.raises(ValueError, match="`ref_constant` must be a scalar or have shape"):
        laser_self_rewards(z, token_id=1, ref_constant=jnp.zeros(2), beta_v=1.0)
    with pytest.raises(ValueError, match="`beta_v` must be a scalar"):
        laser_self_rewards(z, token_id=1, ref_constant=0.0, beta_v=jnp.ones(N))
    with pytest.raises(ValueError, match="`temperature` must be > 0"):
        laser_self_rewards(z, token_id=1, ref_constant=0.0, beta_v=1.0, temperature=0.0)


def _laser_total(logits, mask, verifier, valid=None):
    z = last_valid_logits(logits, mask)
    r_s = laser_self_rewards(z, token_id=2, ref_constant=-1.5, beta_v=0.5, temperature=0.8)
    return laser_loss(r_s, verifier, valid=valid)


def test_laser_loss_reference_and_gradient_reaches_only_the_last_row():
    rng, logits, mask = _laser_inputs(2)
    verifier = (rng.uniform(size=N) > 0.5).astype(np.float32)
    valid = np.ones(N, np.float32)
    valid[4] = 0.0
    (loss, metrics), grad = jax.jit(
        jax.value_and_grad(lambda x: _laser_total(x, mask, verifier, valid), has_aux=True)
    )(logits)
    last = _np_last_index(mask)
    z = np.stack([logits[n, last[n]] if last[n] >= 0 else np.zeros(V) for n in range(N)])
    logp = np_log_softmax(z / 0.8)
    r_s = 0.5 * (logp[:, 2] + 1.5)
    n_valid = valid.sum()
    assert_close(loss, (valid * (r_s - verifier) ** 2).sum() / n_valid)
    assert_close(metrics["rm/self_reward_mean"], (valid * r_s).sum() / n_valid)
    assert_close(metrics["rm/abs_error"], (valid * np.abs(r_s - verifier)).sum() / n_valid)
    # d loss / d z_last = 2(r_s − r_v)/n · β_v · (onehot − softmax)/τ, on the last row only
    coef = 2.0 * (r_s - verifier) * valid / n_valid * 0.5 / 0.8
    expected = np.zeros_like(logits, np.float64)
    for n in range(N):
        if last[n] >= 0:
            expected[n, last[n]] = coef[n] * (np.eye(V)[2] - np.exp(logp[n]))
    assert_close(grad, expected)
    g = np.asarray(grad)
    for n in range(N):
        others = np.delete(g[n], last[n], axis=0) if last[n] >= 0 else g[n]
        assert np.all(others == 0.0)
    assert_nan_safe(
        lambda x: _laser_total(x, mask, verifier), (logits,), mask[:, :, None] * np.ones(V), rng
    )


def test_laser_loss_is_zero_with_zero_gradient_when_rewards_agree():
    r = jnp.array([0.3, -1.0, 2.0])
    loss, grad = jax.value_and_grad(lambda x: laser_loss(x, r)[0])(r)
    assert float(loss) == 0.0
    assert np.all(np.asarray(grad) == 0.0)
    # the verifier reward carries no gradient
    assert np.all(np.asarray(jax.grad(lambda v: laser_loss(r + 1.0, v)[0])(r)) == 0.0)


def test_laser_loss_errors_and_nan_safety():
    rng = np.random.default_rng(3)
    r_s = rng.normal(size=N).astype(np.float32)
    r_v = rng.normal(size=N).astype(np.float32)
    valid = (rng.uniform(size=N) > 0.4).astype(np.float32)
    assert_nan_safe(lambda a, b: laser_loss(a, b, valid=valid), (r_s, r_v), valid, rng)
    with pytest.raises(ValueError, match="`verifier_rewards` must have the shape"):
        laser_loss(r_s, r_v[:2])
    with pytest.raises(ValueError, match="`self_rewards` must have rank 1"):
        laser_loss(r_s[None], r_v[None])
    with pytest.raises(ValueError, match="`logits` must have rank 3"):
        last_valid_logits(jnp.zeros((2, 3)), jnp.ones((2, 3)))


# --------------------------------------------------------------------------------------------------
# pass@k (§11)
# --------------------------------------------------------------------------------------------------


def brute_force_pass_at_k(c, n, k):
    """Fraction of the k-subsets of n samples (the first c correct) that hold a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_brute_force_enumeration():
    cases = [(c, n, k) for n in range(1, 7) for c in range(n + 1) for k in range(1, n + 1)]
    for k in sorted({k for _, _, k in cases}):
        sub = [(c, n) for c, n, kk in cases if kk == k]
        c, n = (np.array(x, np.int32) for x in zip(*sub, strict=True))
        expected = [brute_force_pass_at_k(ci, ni, k) for ci, ni in sub]
        assert_close(_pass(c, n, k), expected)


def test_pass_at_k_large_n_broadcasting_and_edges():
    n = 1000
    c = np.array([0, 1, 10, 500, 1000])
    expected = [1.0 - math.comb(n - ci, 100) / math.comb(n, 100) for ci in c]
    assert_close(_pass(c, n, 100), expected, rtol=1e-5)
    assert np.all(np.isfinite(np.asarray(_pass(c, n, 100))))
    grid = _pass(np.arange(4)[:, None], np.array([3, 5, 8])[None, :], 2)  # broadcast to [4,3]
    ref = [
        [
            1.0 - math.comb(nn - cc, 2) / math.comb(nn, 2) if nn - cc >= 2 else 1.0
            for nn in (3, 5, 8)
        ]
        for cc in range(4)
    ]
    assert_close(grid, ref)
    assert_close(_pass(np.array([0, 1]), np.array([2, 2]), 3), [1.0, 1.0])  # k > n, as Codex
    assert_close(_pass(np.array([2.0]), np.array([4.0]), 1), [0.5])  # pass@1 = c/n
    with pytest.raises(ValueError, match="`k` must be a static Python int >= 1"):
        pass_at_k(1, 4, 0)
    with pytest.raises(ValueError, match="do not broadcast"):
        pass_at_k(np.zeros(3), np.zeros(4), 1)
