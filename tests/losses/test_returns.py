"""Token-level returns and advantages (ALGORITHMS.md §4.8-§4.13) against float64 NumPy loops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.returns import (
    discounted_returns,
    gae,
    min_form_returns,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
)
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, plant_nonfinite

N, T = 7, 11

# Jitted entry points. Every call passes the full set of keywords (defaults filled in), so calls
# that differ only in traced hyperparameters (`gamma`, `lam`, `whiten_eps`) share one compilation;
# static options are static arguments.


def _jitted(fn, static=(), **defaults):
    compiled = jax.jit(fn, static_argnames=static)

    def call(*args, **kwargs):
        return compiled(*args, **{**defaults, **kwargs})

    return call


_discounted_returns = _jitted(discounted_returns, gamma=1.0)
_gae = _jitted(gae, ("skip_masked",), gamma=1.0, lam=1.0, skip_masked=True)
_reinforce_pp_advantages = _jitted(
    reinforce_pp_advantages,
    ("masked_carry", "whiten_ddof", "whiten_eps_mode"),
    gamma=1.0,
    masked_carry=True,
    whiten_ddof=1,
    whiten_eps=1e-8,
    whiten_eps_mode="add",
)
_reinforce_pp_baseline_advantages = _jitted(
    reinforce_pp_baseline_advantages,
    ("singleton", "whiten_ddof", "whiten_eps_mode"),
    valid=None,
    singleton="zero",
    whiten_ddof=1,
    whiten_eps=1e-8,
    whiten_eps_mode="add",
)
_remax_advantages = _jitted(remax_advantages)
_min_form_returns = _jitted(min_form_returns, completion_mask=None)


# --------------------------------------------------------------------------------------------------
# float64 references, written from the formulas with explicit loops
# --------------------------------------------------------------------------------------------------


def _gamma_nt(gamma, shape):
    return np.broadcast_to(np.asarray(gamma, np.float64), shape)


def np_discounted(r, m, gamma=1.0, *, carry=True):
    """§4.8/§4.12: R' = r_t + γ_t·R; ret_t = R'·m_t; R carried (or reset) at masked tokens."""
    g = _gamma_nt(gamma, r.shape)
    out = np.zeros(r.shape)
    for n in range(r.shape[0]):
        R = 0.0
        for t in reversed(range(r.shape[1])):
            if m[n, t] > 0:
                R = float(r[n, t]) + g[n, t] * R
                out[n, t] = R
            elif not carry:
                R = 0.0
    return out


def np_gae(r, v, m, gamma=1.0, lam=1.0, *, skip=True):
    """§4.11, both modes, from the recursion as written in the spec."""
    g = _gamma_nt(gamma, r.shape)
    adv = np.zeros(r.shape)
    for n in range(r.shape[0]):
        if skip:
            nv, last = 0.0, 0.0
            for t in reversed(range(r.shape[1])):
                if m[n, t] > 0:
                    delta = float(r[n, t]) + g[n, t] * nv - float(v[n, t])
                    last = delta + g[n, t] * lam * last
                    nv = float(v[n, t])
                    adv[n, t] = last
        else:
            rr = np.where(m[n] > 0, r[n].astype(np.float64), 0.0)
            vv = np.where(m[n] > 0, v[n].astype(np.float64), 0.0)
            last = 0.0
            for t in reversed(range(r.shape[1])):
                nxt = vv[t + 1] if t + 1 < r.shape[1] else 0.0
                last = rr[t] + g[n, t] * nxt - vv[t] + g[n, t] * lam * last
                adv[n, t] = last if m[n, t] > 0 else 0.0
    ret = np.where(m > 0, adv + np.where(m > 0, v.astype(np.float64), 0.0), 0.0)
    return adv, ret


def np_whiten(x, m, *, ddof=1, eps=1e-8, mode="add"):
    vals = x[m > 0].astype(np.float64)
    mu, var = vals.mean(), vals.var(ddof=ddof)
    scale = {
        "add": 1 / np.sqrt(var + eps),
        "max": 1 / np.sqrt(max(var, eps)),
        "std": 1 / (np.sqrt(var) + eps),
    }[mode]
    return np.where(m > 0, (x - mu) * scale, 0.0)


def np_group_baseline(s, valid=None, singleton="zero"):
    """b = s − μ_b over the valid samples of each group (§4.1 scale="none", §4.0 singletons)."""
    s = np.asarray(s, np.float64)
    valid = np.ones(s.shape, bool) if valid is None else np.asarray(valid, bool)
    b = np.zeros(s.shape)
    for i in range(s.shape[0]):
        k = valid[i].sum()
        for j in range(s.shape[1]):
            if not valid[i, j]:
                continue
            if k >= 2:
                b[i, j] = s[i, j] - s[i][valid[i]].mean()
            elif singleton == "raw":
                b[i, j] = s[i, j]
    return b


def np_min_form(r, m, cm=None):
    out = np.zeros(r.shape)
    for n in range(r.shape[0]):
        for t in range(r.shape[1]):
            future = [float(r[n, k]) for k in range(t, r.shape[1]) if m[n, k] > 0]
            keep = bool(future) if cm is None else bool(future) and cm[n, t] > 0
            out[n, t] = min(future) if keep else 0.0
    return out


def _data(seed, n=N, t=T):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(n, t)).astype(np.float32)
    v = rng.normal(size=(n, t)).astype(np.float32)
    return rng, r, v, make_mask(rng, n, t)


def _trailing_mask(rng, n, t):
    lengths = rng.integers(1, t + 1, size=n)
    return (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)


def _assert_zero_outside(x, m):
    assert np.all(np.asarray(x)[np.broadcast_to(m, np.shape(x)) == 0] == 0.0)


# --------------------------------------------------------------------------------------------------
# discounted_returns (§4.12)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [1.0, 0.9, "per_token"])
def test_discounted_returns_matches_reference(gamma):
    rng, r, _, m = _data(0)
    if gamma == "per_token":
        gamma = rng.uniform(0.5, 1.0, size=(N, T)).astype(np.float32)
    out = _discounted_returns(r, m, gamma=gamma)
    assert out.dtype == jnp.float32 and out.shape == (N, T)
    assert_close(out, np_discounted(r, m, gamma))
    _assert_zero_outside(out, m)


def test_discounted_returns_gamma_one_is_masked_reverse_cumsum():
    _, r, _, m = _data(1)
    rm = np.where(m > 0, r.astype(np.float64), 0.0)
    expected = np.flip(np.cumsum(np.flip(rm, 1), 1), 1) * m
    assert_close(_discounted_returns(r, m), expected)


@pytest.mark.parametrize("gamma", [0.9, "per_token"])
def test_discounted_returns_equal_gae_with_zero_values_and_lam_one(gamma):
    rng, r, _, m = _data(2)
    if gamma == "per_token":
        gamma = rng.uniform(0.5, 1.0, size=(N, T)).astype(np.float32)
    adv, _ = _gae(r, np.zeros_like(r), m, gamma=gamma, lam=1.0)
    assert_close(_discounted_returns(r, m, gamma=gamma), np.asarray(adv, np.float64))


def test_discounted_returns_per_token_gamma_one_inside_an_action():
    # γ_t = 1 inside a multi-token action, γ between actions (POAD/BAD): actions [0,1], [2,3]
    r = np.array([[0.0, 0.0, 0.0, 1.0]], np.float32)
    g = np.array([[1.0, 0.5, 1.0, 0.5]], np.float32)
    assert_close(_discounted_returns(r, np.ones_like(r), gamma=g), [[0.5, 0.5, 1.0, 1.0]])


def test_discounted_returns_nan_outside_mask_does_not_leak():
    rng, r, _, m = _data(3)
    g = rng.uniform(0.5, 1.0, size=(N, T)).astype(np.float32)
    clean = _discounted_returns(r, m, gamma=g)
    dirty = _discounted_returns(plant_nonfinite(r, m, rng), m, gamma=plant_nonfinite(g, m, rng))
    np.testing.assert_array_equal(np.asarray(dirty), np.asarray(clean))
    assert_nan_safe(
        lambda a, b, c: jnp.sum(_discounted_returns(a, b, gamma=c)),
        (r, m, g),
        m,
        rng,
        planted=(0, 2),
    )


# --------------------------------------------------------------------------------------------------
# gae (§4.11)
# --------------------------------------------------------------------------------------------------


def test_gae_anchors():
    r = np.array([[0.0, 0.0, 1.0]], np.float32)
    v = np.array([[0.5, 0.6, 0.7]], np.float32)
    ones = np.ones_like(r)
    for skip in (True, False):
        adv, ret = _gae(r, v, ones, gamma=1.0, lam=1.0, skip_masked=skip)
        assert_close(adv, [[0.5, 0.4, 0.3]])
        assert_close(ret, [[1.0, 1.0, 1.0]])
        adv, ret = _gae(r, v, ones, gamma=1.0, lam=0.95, skip_masked=skip)
        assert_close(adv, [[0.46575, 0.385, 0.3]])
        assert_close(ret, [[0.96575, 0.985, 1.0]])
    r = np.array([[0.0, 5.0, 1.0]], np.float32)
    v = np.array([[0.5, 9.0, 0.7]], np.float32)
    m = np.array([[1.0, 0.0, 1.0]], np.float32)
    adv, ret = _gae(r, v, m, gamma=0.9, lam=0.95, skip_masked=True)
    assert_close(adv, [[0.3865, 0.0, 0.3]])
    assert_close(ret, [[0.8865, 0.0, 1.0]])
    adv, _ = _gae(r, v, m, gamma=0.9, lam=0.95, skip_masked=False)
    assert_close(adv, [[0.257958, 0.0, 0.3]])


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), ("per_token", 0.8)])
def test_gae_matches_reference(skip, gamma, lam):
    rng, r, v, m = _data(4)
    if gamma == "per_token":
        gamma = rng.uniform(0.5, 1.0, size=(N, T)).astype(np.float32)
    adv, ret = _gae(r, v, m, gamma=gamma, lam=lam, skip_masked=skip)
    exp_adv, exp_ret = np_gae(r, v, m, gamma, lam, skip=skip)
    assert adv.dtype == jnp.float32 and ret.dtype == jnp.float32
    assert_close(adv, exp_adv)
    assert_close(ret, exp_ret)
    _assert_zero_outside(adv, m)
    _assert_zero_outside(ret, m)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_gae_lam_one_is_reward_to_go_minus_value(gamma):
    _, r, v, m = _data(5)
    # skipping mode: the reward-to-go runs over valid positions only
    adv, _ = _gae(r, v, m, gamma=gamma, lam=1.0)
    expected = np.zeros((N, T))
    for n in range(N):
        for t in range(T):
            if m[n, t] > 0:
                future = [k for k in range(t, T) if m[n, k] > 0]
                to_go = sum(gamma**i * float(r[n, k]) for i, k in enumerate(future))
                expected[n, t] = to_go - float(v[n, t])
    assert_close(adv, expected)
    # standard mode: masked steps count in the discount and contribute zero reward
    adv, _ = _gae(r, v, m, gamma=gamma, lam=1.0, skip_masked=False)
    rm = np.where(m > 0, r.astype(np.float64), 0.0)
    to_go = np.array(
        [
            [sum(gamma ** (k - t) * rm[n, k] for k in range(t, T)) for t in range(T)]
            for n in range(N)
        ]
    )
    assert_close(adv, np.where(m > 0, to_go - v, 0.0))


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_gae_lam_zero_is_the_td_error(gamma):
    _, r, v, m = _data(6)
    adv, _ = _gae(r, v, m, gamma=gamma, lam=0.0)
    expected = np.zeros((N, T))
    for n in range(N):
        for t in range(T):
            if m[n, t] > 0:
                nxt = [k for k in range(t + 1, T) if m[n, k] > 0]
                next_v = float(v[n, nxt[0]]) if nxt else 0.0
                expected[n, t] = float(r[n, t]) + gamma * next_v - float(v[n, t])
    assert_close(adv, expected)
    adv, _ = _gae(r, v, m, gamma=gamma, lam=0.0, skip_masked=False)
    vm = np.where(m > 0, v.astype(np.float64), 0.0)
    next_v = np.concatenate([vm[:, 1:], np.zeros((N, 1))], axis=1)
    assert_close(adv, np.where(m > 0, r + gamma * next_v - vm, 0.0))


def test_gae_modes_agree_on_prefix_masks_and_differ_with_holes():
    rng, r, v, _ = _data(7)
    m = _trailing_mask(rng, N, T)
    m[0] = 0.0  # an empty row is a prefix too
    g = rng.uniform(0.5, 1.0, size=(N, T)).astype(np.float32)
    a1, r1 = _gae(r, v, m, gamma=g, lam=0.9, skip_masked=True)
    a2, r2 = _gae(r, v, m, gamma=g, lam=0.9, skip_masked=False)
    assert_close(a1, np.asarray(a2, np.float64))
    assert_close(r1, np.asarray(r2, np.float64))
    holed = m.copy()
    holed[1, :] = 1.0
    holed[1, 4] = 0.0  # a masked observation token inside a row
    a1, _ = _gae(r, v, holed, gamma=0.9, lam=0.9, skip_masked=True)
    a2, _ = _gae(r, v, holed, gamma=0.9, lam=0.9, skip_masked=False)
    assert not np.allclose(np.asarray(a1), np.asarray(a2))


@pytest.mark.parametrize("skip", [True, False])
def test_gae_nan_in_rewards_and_values_outside_mask_does_not_leak(skip):
    rng, r, v, m = _data(8)
    clean = _gae(r, v, m, gamma=0.9, lam=0.95, skip_masked=skip)
    dirty = _gae(
        plant_nonfinite(r, m, rng),
        plant_nonfinite(v, m, rng),
        m,
        gamma=0.9,
        lam=0.95,
        skip_masked=skip,
    )
    for c, d in zip(clean, dirty, strict=True):
        np.testing.assert_array_equal(np.asarray(d), np.asarray(c))

    def scalar(a, b, c):
        adv, ret = _gae(a, b, c, gamma=0.9, lam=0.95, skip_masked=skip)
        return jnp.sum(adv) + jnp.sum(ret)

    assert_nan_safe(scalar, (r, v, m), m, rng, planted=(0, 1), argnums=(0, 1))


def test_gae_per_token_gamma_outside_mask_unused_when_skipping():
    rng, r, v, m = _data(9)
    g = rng.uniform(0.5, 1.0, size=(N, T)).astype(np.float32)
    clean = _gae(r, v, m, gamma=g, lam=0.9)
    dirty = _gae(r, v, m, gamma=plant_nonfinite(g, m, rng), lam=0.9)
    for c, d in zip(clean, dirty, strict=True):
        np.testing.assert_array_equal(np.asarray(d), np.asarray(c))


# --------------------------------------------------------------------------------------------------
# REINFORCE++ (§4.8)
# --------------------------------------------------------------------------------------------------

_RPP_R = np.array([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]], np.float32)
_RPP_M = np.array([[1, 1, 1], [1, 1, 0]], np.float32)


def test_reinforce_pp_anchor():
    assert_close(_discounted_returns(_RPP_R, _RPP_M), [[1, 1, 1], [0.5, 0.5, 0]])
    assert_close(
        _reinforce_pp_advantages(_RPP_R, _RPP_M),
        [[0.730297] * 3, [-1.095445, -1.095445, 0.0]],
    )


def test_reinforce_pp_openrlhf_keywords():
    # returns [1,1,1,0.5,0.5]: mean 0.8, population variance 0.06 → (x − 0.8)/sqrt(0.06)
    adv = _reinforce_pp_advantages(_RPP_R, _RPP_M, whiten_ddof=0, whiten_eps_mode="max")
    assert_close(adv, [[0.816497] * 3, [-1.224745, -1.224745, 0.0]])


@pytest.mark.parametrize("masked_carry", [True, False])
@pytest.mark.parametrize(
    ("gamma", "ddof", "eps", "mode"),
    [(1.0, 1, 1e-8, "add"), (0.9, 0, 1e-3, "max"), ("per_token", 1, 1e-3, "std")],
)
def test_reinforce_pp_matches_reference(masked_carry, gamma, ddof, eps, mode):
    rng, r, _, m = _data(10)
    if gamma == "per_token":
        gamma = rng.uniform(0.5, 1.0, size=(N, T)).astype(np.float32)

    out = _reinforce_pp_advantages(
        r,
        m,
        gamma=gamma,
        masked_carry=masked_carry,
        whiten_ddof=ddof,
        whiten_eps=eps,
        whiten_eps_mode=mode,
    )
    ret = np_discounted(r, m, gamma, carry=masked_carry)
    assert out.dtype == jnp.float32
    assert_close(out, np_whiten(ret, m, ddof=ddof, eps=eps, mode=mode))
    _assert_zero_outside(out, m)


def test_reinforce_pp_carry_modes_agree_on_trailing_padding_only():
    rng, r, _, _ = _data(11)
    m = _trailing_mask(rng, N, T)
    a = _reinforce_pp_advantages(r, m, gamma=0.95, masked_carry=True)
    b = _reinforce_pp_advantages(r, m, gamma=0.95, masked_carry=False)
    assert_close(a, np.asarray(b, np.float64))
    holed = m.copy()
    holed[1, :] = 1.0
    holed[1, 4] = 0.0
    a = _reinforce_pp_advantages(r, holed, masked_carry=True)
    b = _reinforce_pp_advantages(r, holed, masked_carry=False)
    assert not np.allclose(np.asarray(a), np.asarray(b))


def test_reinforce_pp_nan_outside_mask_does_not_leak():
    rng, r, _, m = _data(12)
    for carry in (True, False):
        clean = _reinforce_pp_advantages(r, m, masked_carry=carry)
        dirty = _reinforce_pp_advantages(plant_nonfinite(r, m, rng), m, masked_carry=carry)
        np.testing.assert_array_equal(np.asarray(dirty), np.asarray(clean))
    assert_nan_safe(
        lambda a, b: jnp.sum(_reinforce_pp_advantages(a, b) ** 2), (r, m), m, rng, planted=(0,)
    )


# --------------------------------------------------------------------------------------------------
# REINFORCE++ with a group baseline (§4.9)
# --------------------------------------------------------------------------------------------------

_S = np.array([[1.0, 0.0, 0.0, 0.75, 0.5]], np.float32)  # the `s` of §4.1
_LENGTHS = np.array([2, 5, 3, 4, 6])
_M = (np.arange(6)[None, :] < _LENGTHS[:, None]).astype(np.float32)


def _per_sequence(adv, m):
    """The (constant) value of each row over its valid tokens."""
    adv = np.asarray(adv)
    rows = []
    for n in range(adv.shape[0]):
        vals = adv[n][m[n] > 0]
        assert np.allclose(vals, vals[0]), "advantage is not constant over a sequence"
        rows.append(vals[0])
    return np.array(rows)


def test_reinforce_pp_baseline_anchors():
    assert_close(np_group_baseline(_S)[0], [0.55, -0.45, -0.45, 0.30, 0.05])  # §4.1 "none"
    b_tok = np.repeat(np_group_baseline(_S)[0], _LENGTHS)
    assert_close(b_tok.mean(), -0.05)
    assert_close(b_tok.var(ddof=1), 0.134211)
    adv = _reinforce_pp_baseline_advantages(_S, _M)
    assert_close(_per_sequence(adv, _M), [1.637789, -1.091859, -1.091859, 0.955377, 0.272965])
    _assert_zero_outside(adv, _M)
    adv = _reinforce_pp_baseline_advantages(_S, _M, whiten_ddof=0, whiten_eps_mode="max")
    assert_close(_per_sequence(adv, _M), [1.680336, -1.120224, -1.120224, 0.980196, 0.280056])


def test_reinforce_pp_baseline_openrlhf_pipeline():
    # OpenRLHF: b on the last valid token → reinforce_pp_advantages(γ=1, ddof=0, "max")
    rng = np.random.default_rng(13)
    B, G = 1, N
    s = rng.normal(size=(B, G)).astype(np.float32)
    m = make_mask(rng, B * G, T)
    b = np_group_baseline(s).reshape(-1)
    r = np.zeros((B * G, T), np.float32)
    for n in range(B * G):
        valid = np.nonzero(m[n])[0]
        if len(valid):
            r[n, valid[-1]] = b[n]
    expected = _reinforce_pp_advantages(r, m, gamma=1.0, whiten_ddof=0, whiten_eps_mode="max")
    got = _reinforce_pp_baseline_advantages(s, m, whiten_ddof=0, whiten_eps_mode="max")
    assert_close(got, np.asarray(expected, np.float64))


@pytest.mark.parametrize("singleton", ["zero", "raw"])
@pytest.mark.parametrize("use_valid", [False, True])
def test_reinforce_pp_baseline_matches_reference(singleton, use_valid):
    rng = np.random.default_rng(14)
    B, G = 3, 5
    s = rng.normal(size=(B, G)).astype(np.float32)
    m = make_mask(rng, B * G, T)
    valid = None
    if use_valid:
        valid = np.ones((B, G), bool)
        valid[0, 3] = False
        valid[2, :4] = False  # a singleton group
    out = _reinforce_pp_baseline_advantages(s, m, valid=valid, singleton=singleton, whiten_eps=1e-3)
    tok_mask = m if valid is None else m * valid.reshape(-1, 1)
    per_token = np_group_baseline(s, valid, singleton).reshape(-1, 1) * tok_mask
    assert out.dtype == jnp.float32 and out.shape == (B * G, T)
    assert_close(out, np_whiten(per_token, tok_mask, eps=1e-3))
    _assert_zero_outside(out, tok_mask)


def test_reinforce_pp_baseline_no_leak_from_empty_or_invalid_rows():
    rng = np.random.default_rng(15)
    s = rng.normal(size=(2, 7)).astype(np.float32)
    m = make_mask(rng, 14, T)
    valid = np.ones((2, 7), bool)
    valid[1, 2] = False
    clean = _reinforce_pp_baseline_advantages(s, m, valid=valid)
    dirty_s = s.copy()
    dirty_s[1, 2] = np.nan  # an unscorable sample (TRL marks them with NaN)
    dirty = _reinforce_pp_baseline_advantages(dirty_s, m, valid=valid)
    np.testing.assert_array_equal(np.asarray(dirty), np.asarray(clean))
    assert np.all(np.isfinite(np.asarray(dirty)))


# --------------------------------------------------------------------------------------------------
# ReMax (§4.10)
# --------------------------------------------------------------------------------------------------


def test_remax_matches_reference():
    rng, r, _, m = _data(16)
    b = rng.normal(size=(N,)).astype(np.float32)
    out = _remax_advantages(r, b, m)
    expected = np.where(m > 0, np_discounted(r, m, 1.0) - b[:, None].astype(np.float64), 0.0)
    assert out.dtype == jnp.float32
    assert_close(out, expected)
    _assert_zero_outside(out, m)


def test_remax_outcome_reward_at_last_token_gives_s_minus_b_everywhere():
    rng = np.random.default_rng(17)
    m = make_mask(rng, N, T)
    s = rng.normal(size=(N,)).astype(np.float32)
    b = rng.normal(size=(N,)).astype(np.float32)
    r = np.zeros((N, T), np.float32)
    for n in range(N):
        valid = np.nonzero(m[n])[0]
        if len(valid):
            r[n, valid[-1]] = s[n]
    out = _remax_advantages(r, b, m)
    assert_close(out, np.where(m > 0, (s - b)[:, None].astype(np.float64), 0.0))


def test_remax_nan_outside_mask_does_not_leak():
    rng, r, _, m = _data(18)
    b = rng.normal(size=(N,)).astype(np.float32)
    dirty_b = b.copy()
    dirty_b[0] = np.nan  # row 0 is empty: its baseline is never used
    clean = _remax_advantages(r, b, m)
    dirty = _remax_advantages(plant_nonfinite(r, m, rng), dirty_b, m)
    np.testing.assert_array_equal(np.asarray(dirty), np.asarray(clean))
    assert_nan_safe(lambda a, c: jnp.sum(_remax_advantages(a, b, c)), (r, m), m, rng, planted=(0,))


# --------------------------------------------------------------------------------------------------
# min-form returns (§4.13)
# --------------------------------------------------------------------------------------------------


def test_min_form_anchor_and_sum_form():
    r = np.array([[0.9, 0.2, 0.7, 0.5]], np.float32)
    ones = np.ones_like(r)
    assert_close(_min_form_returns(r, ones), [[0.2, 0.2, 0.5, 0.5]])
    assert_close(_discounted_returns(r, ones), [[2.3, 1.4, 1.2, 0.5]])


@pytest.mark.parametrize("with_completion_mask", [False, True])
def test_min_form_matches_reference(with_completion_mask):
    rng = np.random.default_rng(19)
    r = rng.uniform(-1, 1, size=(N, T)).astype(np.float32)
    step_mask = (rng.uniform(size=(N, T)) < 0.35).astype(np.float32)
    step_mask[0] = 0.0  # a row without step rewards
    cm = make_mask(rng, N, T) if with_completion_mask else None
    out = _min_form_returns(r, step_mask, completion_mask=cm)
    assert out.dtype == jnp.float32
    assert_close(out, np_min_form(r, step_mask, cm))


def test_min_form_properties():
    rng = np.random.default_rng(20)
    r = rng.uniform(-1, 1, size=(N, T)).astype(np.float32)
    step_mask = (rng.uniform(size=(N, T)) < 0.5).astype(np.float32)
    step_mask[:, 0] = 1.0
    out = np.asarray(_min_form_returns(r, step_mask))
    for n in range(N):
        rewarded = r[n][step_mask[n] > 0]
        last = np.nonzero(step_mask[n])[0][-1]
        kept = out[n, : last + 1]
        assert np.all(kept >= rewarded.min() - 1e-7) and np.all(kept <= rewarded.max() + 1e-7)
        assert np.all(np.diff(kept) >= 0), "min-form return must be non-decreasing in t"
        assert np.all(out[n, last + 1 :] == 0.0)
    # a constant reward c gives c everywhere; the sum form grows with the number of steps
    c = 0.3
    steps = np.arange(1, N + 1)  # row n has n + 1 rewarded steps
    m = (np.arange(T)[None, :] < steps[:, None]).astype(np.float32)
    rc = np.full((N, T), c, np.float32)
    assert_close(_min_form_returns(rc, m), c * m)
    assert_close(_discounted_returns(rc, m)[:, 0], c * steps)


def test_min_form_on_a_step_layout_with_token_positions():
    # step rewards on step-end tokens of [N,T] == the same rewards in an [N,M] step layout
    r_tok = np.array([[0.0, 0.9, 0.0, 0.2, 0.0, 0.7]], np.float32)
    m_tok = np.array([[0, 1, 0, 1, 0, 1]], np.float32)
    comp = np.ones_like(r_tok)
    out = _min_form_returns(r_tok, m_tok, completion_mask=comp)
    assert_close(out, [[0.2, 0.2, 0.2, 0.2, 0.7, 0.7]])
    steps = _min_form_returns(np.array([[0.9, 0.2, 0.7]], np.float32), np.ones((1, 3)))
    assert_close(np.asarray(out)[:, [1, 3, 5]], np.asarray(steps, np.float64))


def test_min_form_nan_outside_mask_does_not_leak():
    rng = np.random.default_rng(21)
    r = rng.uniform(-1, 1, size=(N, T)).astype(np.float32)
    m = (rng.uniform(size=(N, T)) < 0.5).astype(np.float32)
    clean = _min_form_returns(r, m)
    dirty = _min_form_returns(plant_nonfinite(r, m, rng), m)
    np.testing.assert_array_equal(np.asarray(dirty), np.asarray(clean))
    assert_nan_safe(lambda a, b: jnp.sum(_min_form_returns(a, b)), (r, m), m, rng, planted=(0,))


# --------------------------------------------------------------------------------------------------
# stop-gradient, dtypes, traced hyperparameters, errors
# --------------------------------------------------------------------------------------------------


def test_outputs_are_stop_gradient_targets():
    rng, r, v, m = _data(22)
    s = rng.normal(size=(1, N)).astype(np.float32)
    b = rng.normal(size=(N,)).astype(np.float32)

    @jax.jit
    def all_grads(r, v, s, b):
        return [
            jax.grad(lambda a: jnp.sum(discounted_returns(a, m, gamma=0.9)))(r),
            jax.grad(lambda a, c: sum(jnp.sum(x) for x in gae(a, c, m, lam=0.9)), (0, 1))(r, v),
            jax.grad(lambda a: jnp.sum(reinforce_pp_advantages(a, m) ** 2))(r),
            jax.grad(lambda a: jnp.sum(reinforce_pp_baseline_advantages(a, m) ** 2))(s),
            jax.grad(lambda a, c: jnp.sum(remax_advantages(a, c, m)), (0, 1))(r, b),
            jax.grad(lambda a: jnp.sum(min_form_returns(a, m)))(r),
        ]

    for g in jax.tree.leaves(all_grads(r, v, s, b)):
        assert np.all(np.asarray(g) == 0.0)


def test_bfloat16_inputs_give_float32_outputs():
    _, r, v, m = _data(23)
    rb, vb = jnp.asarray(r, jnp.bfloat16), jnp.asarray(v, jnp.bfloat16)
    adv, ret = _gae(rb, vb, m, gamma=0.9, lam=0.95)
    assert adv.dtype == ret.dtype == jnp.float32
    exp_adv, _ = np_gae(np.asarray(rb, np.float32), np.asarray(vb, np.float32), m, 0.9, 0.95)
    assert_close(adv, exp_adv)
    b = jnp.zeros((N,), jnp.bfloat16)
    s = jnp.zeros((1, N), jnp.bfloat16)
    for out in jax.eval_shape(
        lambda: (
            discounted_returns(rb, m),
            reinforce_pp_advantages(rb, m),
            reinforce_pp_baseline_advantages(s, m),
            remax_advantages(rb, b, m),
            min_form_returns(rb, m),
        )
    ):
        assert out.dtype == jnp.float32
    int_rewards = (r > 0).astype(np.int32)  # binary verifier rewards as integers
    assert_close(_discounted_returns(int_rewards, m), np_discounted(int_rewards, m))


def test_traced_gamma_and_lam_match_static_ones():
    _, r, v, m = _data(24)
    traced = jax.jit(lambda g, l: gae(r, v, m, gamma=g, lam=l))(0.9, 0.95)
    static = jax.jit(lambda: gae(r, v, m, gamma=0.9, lam=0.95))()  # Python floats: constants
    for a, b in zip(traced, static, strict=True):
        assert_close(a, np.asarray(b, np.float64))


def _trace(fn):
    return jax.eval_shape(fn)


def test_bad_input_errors_name_the_problem():
    # traced abstractly (jax.eval_shape): the checks run at trace time, nothing is compiled
    r = jnp.ones((3, 4))
    m = jnp.ones((3, 4))
    with pytest.raises(ValueError, match="`rewards` must have rank 2"):
        _trace(lambda: discounted_returns(jnp.ones(4), jnp.ones(4)))
    with pytest.raises(ValueError, match=r"`mask` must have shape \(3, 4\)"):
        _trace(lambda: discounted_returns(r, jnp.ones((3, 5))))
    with pytest.raises(ValueError, match="`gamma` must be a scalar or a per-token array"):
        _trace(lambda: discounted_returns(r, m, gamma=jnp.ones((3,))))
    with pytest.raises(ValueError, match=r"`gamma` must lie in \[0, 1\]"):
        _trace(lambda: gae(r, r, m, gamma=1.5))
    with pytest.raises(ValueError, match=r"`lam` must lie in \[0, 1\]"):
        _trace(lambda: gae(r, r, m, lam=-0.1))
    with pytest.raises(ValueError, match="`lam` must be a scalar"):
        _trace(lambda: gae(r, r, m, lam=jnp.ones((3, 4))))
    with pytest.raises(ValueError, match="`values` must have the shape of `rewards`"):
        _trace(lambda: gae(r, jnp.ones((3, 5)), m))
    with pytest.raises(ValueError, match="`skip_masked` must be one of"):
        _trace(lambda: gae(r, r, m, skip_masked="yes"))
    with pytest.raises(ValueError, match="`rewards` must be a real numeric array"):
        _trace(lambda: gae(r.astype(jnp.complex64), r, m))
    with pytest.raises(ValueError, match="`masked_carry` must be one of"):
        _trace(lambda: reinforce_pp_advantages(r, m, masked_carry=None))
    with pytest.raises(ValueError, match="`whiten_ddof` must be one of"):
        _trace(lambda: reinforce_pp_advantages(r, m, whiten_ddof=2))
    with pytest.raises(ValueError, match="`whiten_eps_mode` must be one of"):
        _trace(
            lambda: reinforce_pp_baseline_advantages(jnp.ones((1, 3)), m, whiten_eps_mode="sqrt")
        )
    with pytest.raises(ValueError, match="`singleton` must be one of"):
        _trace(lambda: reinforce_pp_baseline_advantages(jnp.ones((1, 3)), m, singleton="one"))
    with pytest.raises(ValueError, match=r"`mask` must have N = B·G = 4 rows"):
        _trace(lambda: reinforce_pp_baseline_advantages(jnp.ones((2, 2)), m))
    with pytest.raises(ValueError, match="`valid` must have the shape of `rewards`"):
        _trace(
            lambda: reinforce_pp_baseline_advantages(
                jnp.ones((1, 3)), m, valid=jnp.ones((3,), bool)
            )
        )
    with pytest.raises(ValueError, match="`baseline` must hold one value per row"):
        _trace(lambda: remax_advantages(r, jnp.ones((4,)), m))
    with pytest.raises(ValueError, match="`baseline` must have rank 1"):
        _trace(lambda: remax_advantages(r, jnp.ones((3, 1)), m))
    with pytest.raises(ValueError, match="`completion_mask` must have shape"):
        _trace(lambda: min_form_returns(r, m, completion_mask=jnp.ones((3, 5))))
    with pytest.raises(ValueError, match="`step_rewards` must have rank 2"):
        _trace(lambda: min_form_returns(jnp.ones((2, 3, 4)), jnp.ones((2, 3, 4))))
