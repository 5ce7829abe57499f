"""Group advantage estimators (ALGORITHMS.md §4.0-§4.7, §4.18) against float64 NumPy references."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import losses
from losses.advantages import (
    bnpo_advantages,
    gdpo_advantages,
    gpg_advantages,
    group_advantage_metrics,
    group_advantages,
    group_advantages_flat,
    opo_advantages,
    passk_advantages,
    rloo_advantages,
    rloo_advantages_flat,
    zero_variance_mask,
)
from losses.ppo import reinforce_loss
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, plant_nonfinite

_group = jax.jit(group_advantages, static_argnames=("scale", "ddof", "singleton"))
_group_flat = jax.jit(
    group_advantages_flat, static_argnames=("num_groups", "scale", "ddof", "singleton")
)
_rloo = jax.jit(rloo_advantages, static_argnames=("singleton", "normalize"))
_rloo_flat = jax.jit(rloo_advantages_flat, static_argnames=("num_groups", "singleton", "normalize"))
_gpg = jax.jit(gpg_advantages, static_argnames=("count",))
_passk = jax.jit(passk_advantages, static_argnames=("scale", "ddof"))
_opo = jax.jit(opo_advantages, static_argnames=("singleton",))
_bnpo = jax.jit(bnpo_advantages)
_gdpo = jax.jit(gdpo_advantages, static_argnames=("ddof", "singleton"))
_zvm = jax.jit(zero_variance_mask, static_argnames=("ddof",))
_metrics = jax.jit(group_advantage_metrics)

S_ANCHOR = np.array([[1.0, 0.0, 0.0, 0.75, 0.5]], np.float32)
B, G = 7, 5


# --------------------------------------------------------------------------------------------------
# random inputs and float64 references written from the formulas of ALGORITHMS.md §4
# --------------------------------------------------------------------------------------------------


def random_rewards(rng: np.random.Generator, B: int = B, G: int = G) -> np.ndarray:
    """Continuous, binary and constant groups."""
    s = rng.normal(size=(B, G))
    s[1] = rng.integers(0, 2, size=G)  # binary
    s[1, :2] = [0.0, 1.0]  # not degenerate
    s[3] = 0.1  # zero variance
    s[4] = rng.integers(0, 3, size=G) / 2.0  # ties
    return s.astype(np.float32)


def random_valid(rng: np.random.Generator, B: int = B, G: int = G) -> np.ndarray:
    """Random validity with one group of a single valid sample and one with none."""
    valid = rng.uniform(size=(B, G)) > 0.25
    valid[0] = False
    valid[0, 2] = True  # exactly one valid member
    valid[2] = False  # no valid member
    valid[5] = True
    valid[5, 1] = False
    return valid


def np_group(s, valid=None, *, scale="group", eps=1e-6, ddof=1, singleton="zero"):
    s = np.asarray(s, np.float64)
    valid = np.ones(s.shape, bool) if valid is None else np.asarray(valid, bool)
    out = np.zeros_like(s)
    batch_std = s[valid].std(ddof=ddof)
    for b in range(s.shape[0]):
        x = s[b, valid[b]]
        if len(x) < 2:
            if singleton == "raw" and len(x) == 1:
                den = {"group": 1.0 + eps, "batch": batch_std + eps, "none": 1.0}[scale]
                out[b, valid[b]] = x / den
            continue
        if x.max() == x.min():
            continue
        den = {"group": x.std(ddof=ddof) + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        out[b, valid[b]] = (x - x.mean()) / den
    return out


def np_rloo(s, valid=None, *, singleton="zero", normalize="none", norm_eps=1e-4):
    s = np.asarray(s, np.float64)
    valid = np.ones(s.shape, bool) if valid is None else np.asarray(valid, bool)
    out = np.zeros_like(s)
    for b in range(s.shape[0]):
        idx = np.flatnonzero(valid[b])
        x = s[b, idx]
        if len(x) < 2:
            if singleton == "raw":
                out[b, idx] = x
            continue
        if x.max() == x.min():
            continue
        out[b, idx] = [x[i] - (x.sum() - x[i]) / (len(x) - 1) for i in range(len(x))]
    if normalize == "batch":
        a = out[valid]
        out = np.where(valid, (out - a.mean()) / (a.std(ddof=1) + norm_eps), 0.0)
    return out


def np_flat_group(s, ids, num_groups, valid=None, **kw):
    """Reference for the flat forms: gather each group's rows, apply the grouped reference."""
    s = np.asarray(s, np.float64)
    valid = np.ones(s.shape, bool) if valid is None else np.asarray(valid, bool)
    valid = valid & (ids >= 0) & (ids < num_groups)
    out = np.zeros_like(s)
    batch_std = s[valid].std(ddof=kw.get("ddof", 1))
    scale, eps, ddof = kw.get("scale", "group"), kw.get("eps", 1e-6), kw.get("ddof", 1)
    for g in range(num_groups):
        rows = np.flatnonzero((ids == g) & valid)
        x = s[rows]
        if len(x) < 2:
            if kw.get("singleton", "zero") == "raw" and len(x) == 1:
                den = {"group": 1.0 + eps, "batch": batch_std + eps, "none": 1.0}[scale]
                out[rows] = x / den
            continue
        if x.max() == x.min():
            continue
        den = {"group": x.std(ddof=ddof) + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        out[rows] = (x - x.mean()) / den
    return out


def np_beta_pdf(p, a, b):
    log_b = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    return p ** (a - 1) * (1 - p) ** (b - 1) / math.exp(log_b)


# --------------------------------------------------------------------------------------------------
# numeric anchors (§4.1-§4.7)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("eps", "expected"),
    [
        (1e-6, [1.229835, -1.006228, -1.006228, 0.670819, 0.111803]),
        (1e-4, [1.229562, -1.006006, -1.006006, 0.670670, 0.111778]),
        (1e-9, [1.229837, -1.006231, -1.006231, 0.670820, 0.111803]),
    ],
)
def test_grpo_anchor(eps, expected):
    assert_close(_group(S_ANCHOR, eps=eps)[0], expected)


def test_dr_grpo_rloo_gpg_passk_opo_anchors():
    assert_close(_group(S_ANCHOR, scale="none")[0], [0.55, -0.45, -0.45, 0.30, 0.05])
    assert_close(_rloo(S_ANCHOR)[0], [0.6875, -0.5625, -0.5625, 0.375, 0.0625])
    # α = 5/3: 5 samples, 3 non-zero rewards
    assert_close(_gpg(S_ANCHOR)[0], [0.916667, -0.75, -0.75, 0.5, 0.083333])
    # all 5 centred rewards are non-zero: α = 1
    assert_close(_gpg(S_ANCHOR, count="nonzero_advantage")[0], [0.55, -0.45, -0.45, 0.30, 0.05])
    assert_close(_gpg(S_ANCHOR, f_norm=2.0)[0], [0.458333, -0.375, -0.375, 0.25, 0.041667])
    assert_close(_passk(S_ANCHOR)[0], [0.559016, 0, 0, 0, 0])
    assert_close(_passk(S_ANCHOR, scale=False)[0], [0.25, 0, 0, 0, 0])
    lengths = np.array([[2, 5, 3, 4, 6]], np.int32)
    assert_close(_opo(S_ANCHOR, lengths)[0], [0.6, -0.4, -0.4, 0.35, 0.1])


def test_bnpo_anchors():
    r = np.array([[1, 0, 0, 1], [1, 1, 1, 0]], np.float32)
    assert_close(_bnpo(r, alpha=1.0, beta=1.0), [[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]])
    a = _bnpo(r, alpha=1.5, beta=1.5)
    assert_close(a[0], [0.392699, -0.392699, -0.392699, 0.392699])
    assert_close(a[1], [0.226725, 0.226725, 0.226725, -0.680175])
    assert_close(
        _bnpo(r, alpha=2.0, beta=3.0),
        [[0.333333, -0.333333, -0.333333, 0.333333], [0.444444, 0.444444, 0.444444, -1.333333]],
    )


def test_gdpo_collapse_case_and_trl_standardisation():
    r = np.array([[[1, 1], [0, 0]], [[1, 0], [0, 0]]], np.float32)  # [B=2, G=2, K=2]
    grpo_on_sums = _group(r.sum(-1))
    assert_close(grpo_on_sums, [[0.707107, -0.707107], [0.707107, -0.707107]])
    gdpo = _gdpo(r)
    assert_close(gdpo, [[1.414212, -1.414212], [0.707106, -0.707106]])
    valid = np.ones((2, 2), bool)
    whiten = jax.jit(lambda a, v: losses.masked_whiten(a, v, eps=1e-4, eps_mode="std"))
    trl = whiten(_gdpo(r, eps=1e-4), valid)
    assert_close(trl, [[1.095360, -1.095360], [0.547680, -0.547680]])


# --------------------------------------------------------------------------------------------------
# random inputs against the references
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scale", "singleton", "ddof"),
    [
        ("group", "zero", 1),
        ("group", "raw", 0),
        ("batch", "zero", 0),
        ("batch", "raw", 1),
        ("none", "zero", 0),
        ("none", "raw", 1),
    ],
)
def test_group_advantages_matches_reference(scale, singleton, ddof):
    rng = np.random.default_rng(0)
    s, valid = random_rewards(rng), random_valid(rng)
    s_dirty = plant_nonfinite(s, valid.astype(np.float32), rng)
    got = _group(s_dirty, scale=scale, ddof=ddof, valid=valid, singleton=singleton, eps=1e-4)
    want = np_group(s, valid, scale=scale, eps=1e-4, ddof=ddof, singleton=singleton)
    assert got.dtype == jnp.float32
    assert_close(got, want)


@pytest.mark.parametrize("singleton", ["zero", "raw"])
@pytest.mark.parametrize("normalize", ["none", "batch"])
def test_rloo_matches_reference(singleton, normalize):
    rng = np.random.default_rng(1)
    s, valid = random_rewards(rng), random_valid(rng)
    got = _rloo(
        plant_nonfinite(s, valid.astype(np.float32), rng),
        valid=valid,
        singleton=singleton,
        normalize=normalize,
    )
    assert_close(got, np_rloo(s, valid, singleton=singleton, normalize=normalize))


@pytest.mark.parametrize("count", ["nonzero_reward", "nonzero_advantage"])
def test_gpg_matches_reference(count):
    rng = np.random.default_rng(2)
    s = random_rewards(rng)
    s[6] = 0.0  # zero rewards, also a zero-variance group
    s[1, 2:] = 0.0
    s64 = s.astype(np.float64)
    centred = s64 - s64.mean(1, keepdims=True)
    centred[np.ptp(s64, axis=1) == 0] = 0.0
    counted = s64 if count == "nonzero_reward" else centred
    alpha = s.size / max((counted != 0).sum(), 1)
    assert_close(_gpg(s, count=count, f_norm=1.5), alpha * centred / 1.5)


def test_gpg_counts_a_reward_equal_to_its_group_mean_as_a_zero_advantage():
    # b is the exact mean of (b − d, b, b + d), but the float32 sum rounds: μ_b = b + 1 ulp
    b, d = np.float32(0.94156516), np.float32(2**-5)
    tie = np.array([b - d, b, b + d], np.float32)
    assert (tie[0] + tie[1] + tie[2]) / np.float32(3) != b  # the rounding this test is about
    s = np.stack([tie, np.array([0.0, 0.5, 1.0], np.float32)])  # an exact tie at 0.5
    got = np.asarray(_gpg(s, count="nonzero_advantage"))
    centred = s.astype(np.float64) - s.astype(np.float64).mean(1, keepdims=True)
    assert_close(got, 6 / 4 * centred)  # 4 non-zero advantages of 6
    assert np.abs(got[:, 1]).max() < 1e-6


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("ddof", [0, 1])
def test_passk_matches_reference(scale, ddof):
    rng = np.random.default_rng(3)
    s = random_rewards(rng)
    s[6] = [0.2, 0.9, 0.9, 0.1, 0.5]  # tie at the top
    want = np.zeros((B, G))
    for b in range(B):
        x = s[b].astype(np.float64)
        order = np.argsort(-x, kind="stable")
        gap = x[order[0]] - x[order[1]]
        if scale:
            gap = gap / (x.std(ddof=ddof) + 1e-6)
        want[b, order[0]] = gap
    got = _passk(s, scale=scale, ddof=ddof)
    assert_close(got, want)
    assert np.all(np.asarray(got)[6] == 0.0)


@pytest.mark.parametrize("singleton", ["zero", "raw"])
def test_opo_matches_reference(singleton):
    rng = np.random.default_rng(4)
    s, valid = random_rewards(rng), random_valid(rng)
    lengths = rng.integers(1, 13, size=(B, G)).astype(np.float32)
    vmask = valid.astype(np.float32)
    got = _opo(
        plant_nonfinite(s, vmask, rng),
        plant_nonfinite(lengths, vmask, rng),
        valid=valid,
        singleton=singleton,
    )
    want = np.zeros((B, G))
    for b in range(B):
        idx = np.flatnonzero(valid[b])
        x, L = s[b, idx].astype(np.float64), lengths[b, idx].astype(np.float64)
        if len(x) < 2:
            if singleton == "raw":
                want[b, idx] = x
            continue
        if x.max() > x.min():
            want[b, idx] = x - (L * x).sum() / L.sum()
    assert_close(got, want)


def test_bnpo_moment_matching_matches_reference():
    rng = np.random.default_rng(5)
    r = rng.uniform(size=(B, G)).astype(np.float32)
    r[3] = 0.4  # zero variance
    r[4] = rng.integers(0, 2, size=G)
    r[4, :2] = [0.0, 1.0]
    r64 = r.astype(np.float64)
    p = r64.mean(1)
    m, v = p.mean(), p.var()
    k = m * (1 - m) / v - 1
    a, b = max(1 + k * m / 3, 1.0), max(1 + k * (1 - m) / 3, 1.0)
    assert a > 1.0 or b > 1.0  # the matched shapes are not the trivial fallback
    weight = np.minimum(1.0 / np_beta_pdf(p, a, b), 1e6)
    want = (r64 - p[:, None]) * weight[:, None]
    want[3] = 0.0
    assert_close(_bnpo(r), want)
    # fixed shapes and the weight cap
    weight = np.minimum(1.0 / np_beta_pdf(p, 0.7, 2.5), 1.3)
    want = (r64 - p[:, None]) * weight[:, None]
    want[3] = 0.0
    assert_close(_bnpo(r, alpha=0.7, beta=2.5, max_weight=1.3), want)


def test_raw_singletons_under_a_constant_batch_are_not_amplified_by_eps():
    """scale="batch", singleton="raw": every valid reward equal (σ_batch = 0) left the
    singleton's raw reward divided by eps (3e6); it is divided by 1 + eps, as for "group"."""
    r = np.array([[3.0, 3.0], [3.0, 5.0]], np.float32)
    v = np.array([[1, 1], [1, 0]], bool)
    for eps in (1e-6, 0.0):
        kw = {"scale": "batch", "singleton": "raw", "valid": v, "eps": eps}
        a = losses.group_advantages(r, **kw)
        assert_close(a, [[0.0, 0.0], [3.0 / (1.0 + eps), 0.0]])
        flat = losses.group_advantages_flat(
            r.reshape(-1), np.array([0, 0, 1, 1]), num_groups=2, **{**kw, "valid": v.reshape(-1)}
        )
        assert_close(flat, np.asarray(a).reshape(-1))


def test_bnpo_zero_batch_variance_falls_back_to_uniform():
    r = np.array([[1, 0, 0, 0], [0, 0, 1, 0]], np.float32)  # p = 0.25 for both groups: v = 0
    assert_close(_bnpo(r), r - 0.25)


@pytest.mark.parametrize("with_weights, singleton", [(False, "zero"), (True, "raw")])
def test_gdpo_matches_reference(with_weights, singleton):
    rng = np.random.default_rng(6)
    K = 3
    r = np.stack([random_rewards(rng) for _ in range(K)], axis=-1)
    valid = random_valid(rng)
    weights = np.array([0.5, 2.0, -1.0], np.float32) if with_weights else None
    got = _gdpo(
        plant_nonfinite(r, valid[..., None].astype(np.float32), rng),
        weights=weights,
        valid=valid,
        eps=1e-4,
        singleton=singleton,
    )
    w = np.ones(K) if weights is None else weights.astype(np.float64)
    want = sum(w[k] * np_group(r[..., k], valid, eps=1e-4, singleton=singleton) for k in range(K))
    assert_close(got, want)
    assert (got[0, 2] == 0) == (singleton == "zero")  # random_valid's singleton group (verl: raw)


@pytest.mark.parametrize("min_std", [0.0, 0.3])
def test_zero_variance_mask_matches_reference(min_std):
    rng = np.random.default_rng(7)
    s, valid = random_rewards(rng), random_valid(rng)
    s[6] = [0.0, 0.0, 0.1, 0.0, 0.0]  # std 0.045: kept only by the exact spread test
    valid[6] = True
    got = np.asarray(
        _zvm(plant_nonfinite(s, valid.astype(np.float32), rng), valid=valid, min_std=min_std)
    )
    want = []
    for b in range(B):
        x = s[b, valid[b]].astype(np.float64)
        if len(x) < 2:
            want.append(False)
        elif min_std == 0.0:
            want.append(x.max() > x.min())
        else:
            want.append(x.std(ddof=1) > min_std)
    assert got.dtype == np.bool_
    assert got.tolist() == want
    assert got[6] == (min_std == 0.0)


def test_metrics_match_reference():
    rng = np.random.default_rng(8)
    s, valid = random_rewards(rng), random_valid(rng)
    m = _metrics(plant_nonfinite(s, valid.astype(np.float32), rng), valid=valid)
    x = s[valid].astype(np.float64)
    keep = [
        valid[b].sum() >= 2 and np.ptp(s[b, valid[b]]) > 0 for b in range(B)
    ]  # groups 0, 2 (too few valid) and 3 (constant) are dropped
    assert sorted(m) == ["adv/frac_zero_std", "adv/reward_mean", "adv/reward_std"]
    assert_close(m["adv/frac_zero_std"], 1.0 - np.mean(keep))
    assert_close(m["adv/reward_mean"], x.mean())
    assert_close(m["adv/reward_std"], x.std(ddof=1))
    assert all(v.dtype == jnp.float32 and v.shape == () for v in m.values())


# --------------------------------------------------------------------------------------------------
# flat (ragged) forms
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scale", "singleton"),
    [("group", "zero"), ("group", "raw"), ("batch", "raw"), ("none", "zero")],
)
def test_flat_equals_grouped_for_contiguous_groups(scale, singleton):
    rng = np.random.default_rng(9)
    s, valid = random_rewards(rng), random_valid(rng)
    ids = np.repeat(np.arange(B), G).astype(np.int32)
    kw = dict(valid=valid, singleton=singleton)
    grouped = np.asarray(_group(s, scale=scale, **kw)).reshape(-1)
    flat = _group_flat(
        s.reshape(-1), ids, num_groups=B, scale=scale, valid=valid.reshape(-1), singleton=singleton
    )
    assert_close(flat, grouped)
    grouped = np.asarray(_rloo(s, **kw)).reshape(-1)
    flat = _rloo_flat(
        s.reshape(-1), ids, num_groups=B, valid=valid.reshape(-1), singleton=singleton
    )
    assert_close(flat, grouped)
    # rows in any order: permuting the rows permutes the output
    perm = rng.permutation(B * G)
    shuffled = _group_flat(
        s.reshape(-1)[perm],
        ids[perm],
        num_groups=B,
        scale=scale,
        valid=valid.reshape(-1)[perm],
        singleton=singleton,
    )
    assert_close(shuffled, np.asarray(_group(s, scale=scale, **kw)).reshape(-1)[perm])


@pytest.mark.parametrize(
    ("scale", "singleton"),
    [("group", "zero"), ("group", "raw"), ("batch", "raw"), ("none", "zero")],
)
def test_flat_ragged_groups_match_reference(scale, singleton):
    rng = np.random.default_rng(10)
    sizes = [1, 2, 3, 5, 7, 4]  # a singleton group and groups of different sizes
    ids = np.concatenate([np.full(n, g) for g, n in enumerate(sizes)] + [[-1, 6, 9]]).astype(
        np.int32
    )  # three out-of-range ids for num_groups=7 (group 6 is empty)
    N = len(ids)
    s = rng.normal(size=N).astype(np.float32)
    s[ids == 2] = 0.3  # zero variance
    valid = rng.uniform(size=N) > 0.15
    valid[ids == 4] = True
    perm = rng.permutation(N)
    s, ids, valid = s[perm], ids[perm], valid[perm]
    dirty = plant_nonfinite(s, valid.astype(np.float32), rng)
    got = _group_flat(
        dirty, ids, num_groups=7, scale=scale, valid=valid, singleton=singleton, eps=1e-4
    )
    want = np_flat_group(s, ids, 7, valid, scale=scale, singleton=singleton, eps=1e-4)
    assert_close(got, want)
    assert np.all(np.asarray(got)[(ids < 0) | (ids >= 7)] == 0.0)
    # RLOO on ragged groups: each group's own n
    got = _rloo_flat(dirty, ids, num_groups=7, valid=valid, singleton=singleton)
    want = np.zeros(N)
    ok = valid & (ids >= 0) & (ids < 7)
    for g in range(7):
        rows = np.flatnonzero((ids == g) & ok)
        x = s[rows].astype(np.float64)
        if len(x) < 2:
            if singleton == "raw":
                want[rows] = x
        elif x.max() > x.min():
            want[rows] = x - (x.sum() - x) / (len(x) - 1)
    assert_close(got, want)


def test_flat_out_of_range_rows_do_not_change_other_rows():
    s = np.array([1.0, 2.0, 4.0, 100.0, -50.0], np.float32)
    ids = np.array([0, 0, 0, 3, -1], np.int32)
    got = _group_flat(s, ids, num_groups=3, scale="none")
    assert_close(got, [-4 / 3, -1 / 3, 5 / 3, 0.0, 0.0])
    got = _group_flat(s, ids, num_groups=3, scale="batch", eps=0.0)
    assert_close(got, np.array([-4 / 3, -1 / 3, 5 / 3, 0, 0]) / np.std([1, 2, 4], ddof=1))


def test_rloo_flat_batch_normalisation_equals_grouped():
    rng = np.random.default_rng(11)
    s = random_rewards(rng)
    ids = np.repeat(np.arange(B), G)
    flat = _rloo_flat(s.reshape(-1), ids, num_groups=B, normalize="batch")
    assert_close(flat, np.asarray(_rloo(s, normalize="batch")).reshape(-1))


# --------------------------------------------------------------------------------------------------
# properties (§4.1-§4.7)
# --------------------------------------------------------------------------------------------------


def test_group_and_rloo_sums_are_zero_per_group():
    rng = np.random.default_rng(12)
    s, valid = random_rewards(rng), random_valid(rng)
    for adv in (
        _group(s, valid=valid),
        _group(s, valid=valid, scale="batch"),
        _rloo(s, valid=valid),
    ):
        assert_close(np.asarray(adv).sum(1), np.zeros(B), atol=1e-5)
        assert np.all(np.asarray(adv)[~valid] == 0.0)


def test_group_scale_is_affine_invariant():
    rng = np.random.default_rng(13)
    s, valid = random_rewards(rng), random_valid(rng)
    base = _group(s, valid=valid, eps=0.0)
    assert_close(_group(3.0 * s - 7.0, valid=valid, eps=0.0), base, atol=1e-5)
    assert_close(_group(0.5 * s + 2.0, valid=valid), _group(s, valid=valid), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("eps", [0.0, 1e-9, 1e-6, 1e-4])
def test_constant_groups_give_exact_zeros(eps):
    s = np.array([[0.1, 0.1, 0.1], [0.3, 0.3, 0.3]], np.float32)
    s[1] = np.float32(0.1) * 3  # float residue in μ would be amplified by 1/eps
    for adv in (
        *[_group(s, scale=k, eps=eps) for k in ("group", "batch", "none")],
        _rloo(s),
        _gpg(s),
        _passk(s, eps=eps),
        _opo(s, np.array([[3, 5, 7], [2, 2, 9]])),
        _bnpo(s),
        _bnpo(s, alpha=1.5, beta=2.0),
        _gdpo(s[..., None], eps=eps),
        _group_flat(s.reshape(-1), np.repeat(np.arange(2), 3), num_groups=2, eps=eps),
        _rloo_flat(s.reshape(-1), np.repeat(np.arange(2), 3), num_groups=2),
    ):
        assert np.all(np.asarray(adv) == 0.0), adv
    assert not np.any(np.asarray(_zvm(s)))


def test_none_equals_rloo_times_n_minus_one_over_n():
    rng = np.random.default_rng(14)
    s, valid = random_rewards(rng), random_valid(rng)
    assert_close(_rloo(s), np_rloo(s))  # the full-group (valid=None) path
    assert_close(_group(s, scale="none"), np_group(s, scale="none"))
    assert_close(_group(s, scale="none"), np.asarray(_rloo(s)) * (G - 1) / G)
    n = valid.sum(1, keepdims=True)
    ratio = np.where(n > 1, (n - 1) / np.maximum(n, 1), 0.0)
    assert_close(_group(s, scale="none", valid=valid), np.asarray(_rloo(s, valid=valid)) * ratio)


def test_opo_weighted_sum_is_zero_and_equal_lengths_give_dr_grpo():
    rng = np.random.default_rng(15)
    s, valid = random_rewards(rng), random_valid(rng)
    lengths = rng.integers(1, 20, size=(B, G))
    adv = np.asarray(_opo(s, lengths, valid=valid), np.float64)
    assert_close((adv * lengths * valid).sum(1), np.zeros(B), atol=1e-4)
    same = np.full((B, G), 6, np.int32)
    assert_close(_opo(s, same, valid=valid), _group(s, scale="none", valid=valid))


def test_bnpo_special_cases():
    rng = np.random.default_rng(16)
    r = rng.uniform(size=(B, G)).astype(np.float32)
    assert_close(_bnpo(r, alpha=1.0, beta=1.0), _group(r, scale="none"))
    binary = rng.integers(0, 2, size=(11, G)).astype(np.float32)
    binary[:, 0], binary[:, 1] = 0.0, 1.0  # no degenerate group
    binary[3] = 1.0  # ... but one
    want = (np.pi / 8) * np.asarray(_group(binary, ddof=0, eps=0.0), np.float64)
    assert_close(_bnpo(binary, alpha=1.5, beta=1.5), want)


def test_gdpo_single_component_is_group_advantages_exactly():
    rng = np.random.default_rng(17)
    s, valid = random_rewards(rng), random_valid(rng)
    for kw in ({}, {"valid": valid, "eps": 1e-4, "ddof": 0, "singleton": "raw"}):
        np.testing.assert_array_equal(_gdpo(s[..., None], **kw), _group(s, **kw))


def test_passk_credits_at_most_one_sample_and_is_permutation_equivariant():
    rng = np.random.default_rng(18)
    s = rng.normal(size=(B, G)).astype(np.float32)  # no ties
    adv = np.asarray(_passk(s))
    assert np.all((adv != 0).sum(1) <= 1)
    assert np.all(adv[np.arange(B), s.argmax(1)] > 0)
    perm = rng.permutation(G)
    np.testing.assert_allclose(np.asarray(_passk(s[:, perm])), adv[:, perm], rtol=1e-6, atol=0)
    ties = np.asarray(_passk(random_rewards(rng)))
    assert np.all((ties != 0).sum(1) <= 1)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_zero_variance_mask_drops_groups_like_a_smaller_batch(mode):
    """§4.18 option (b): mask' = mask·keep[b(n)] gives the loss of the batch without them."""
    rng = np.random.default_rng(19)
    T = 11
    s = random_rewards(rng)
    keep = np.asarray(_zvm(s))
    assert keep.tolist() == [True, True, True, False, True, True, True]
    logp = -rng.uniform(0.1, 2.0, size=(B * G, T)).astype(np.float32)
    mask = make_mask(rng, B * G, T)
    adv = _group(s)

    @jax.jit
    def loss(lp, a, m):
        return reinforce_loss(lp, losses.broadcast_to_tokens(a, m), m, agg=mode)[0]

    dropped = mask * np.repeat(keep, G)[:, None]
    loss_b = loss(logp, adv, dropped)
    rows = np.repeat(keep, G)
    loss_small = loss(logp[rows], np.asarray(adv).reshape(-1)[rows], mask[rows])
    assert_close(loss_b, float(loss_small))
    if mode == "token_mean":  # option (a) keeps the degenerate group's tokens in the denominator
        assert abs(float(loss(logp, adv, mask)) - float(loss_b)) > 1e-4


# --------------------------------------------------------------------------------------------------
# NaN safety, stop-gradient, dtypes
# --------------------------------------------------------------------------------------------------

_WEIGHTS = np.random.default_rng(20).normal(size=(B, G)).astype(np.float32)


@pytest.mark.parametrize(
    "fn",
    [
        lambda r, v: group_advantages(r, valid=v),
        lambda r, v: group_advantages(r, valid=v, scale="batch", singleton="raw"),
        lambda r, v: rloo_advantages(r, valid=v, normalize="batch"),
        lambda r, v: gdpo_advantages(r[..., None], valid=v),
        lambda r, v: group_advantages_flat(
            r.reshape(-1), jnp.repeat(jnp.arange(B), G), num_groups=B, valid=v.reshape(-1)
        ).reshape(B, G),
        lambda r, v: rloo_advantages_flat(
            r.reshape(-1), jnp.repeat(jnp.arange(B), G), num_groups=B, valid=v.reshape(-1)
        ).reshape(B, G),
        lambda r, v: zero_variance_mask(r, valid=v, min_std=0.1)[:, None] * 1.0,
        lambda r, v: jnp.stack(list(group_advantage_metrics(r, valid=v).values())),
    ],
)
def test_nan_outside_valid_does_not_leak(fn):
    rng = np.random.default_rng(21)
    s, valid = random_rewards(rng), random_valid(rng).astype(np.float32)

    def scalar(r, v):
        out = fn(r, v)
        return jnp.sum(out * _WEIGHTS) if out.shape == (B, G) else jnp.sum(out)

    assert_nan_safe(scalar, (s, valid), valid, rng, planted=(0,))


def test_opo_nan_lengths_outside_valid_do_not_leak():
    rng = np.random.default_rng(22)
    s, valid = random_rewards(rng), random_valid(rng).astype(np.float32)
    lengths = rng.integers(1, 9, size=(B, G)).astype(np.float32)
    assert_nan_safe(
        lambda r, L, v: jnp.sum(opo_advantages(r, L, valid=v) * _WEIGHTS),
        (s, lengths, valid),
        valid,
        rng,
        planted=(0, 1),
    )


@pytest.mark.parametrize(
    "fn",
    [
        group_advantages,
        lambda r: group_advantages(r, scale="batch"),
        rloo_advantages,
        lambda r: rloo_advantages(r, normalize="batch"),
        gpg_advantages,
        passk_advantages,
        lambda r: opo_advantages(r, jnp.arange(1.0, G + 1.0) * jnp.ones_like(r)),
        lambda r: bnpo_advantages(jax.nn.sigmoid(r)),
        lambda r: gdpo_advantages(jnp.stack([r, r**2], -1), weights=jnp.array([1.0, 0.5])),
        lambda r: group_advantages_flat(r.reshape(-1), jnp.arange(B * G) % B, num_groups=B),
        lambda r: rloo_advantages_flat(r.reshape(-1), jnp.arange(B * G) % B, num_groups=B),
    ],
)
def test_estimators_carry_no_gradient(fn):
    """Advantages are weights (§0.6): the gradient through them is exactly zero."""
    rng = np.random.default_rng(23)
    s = rng.normal(size=(B, G)).astype(np.float32)
    grad = jax.jit(jax.grad(lambda r: jnp.sum(fn(r).reshape(B, G) * _WEIGHTS)))(s)
    assert np.all(np.asarray(grad) == 0.0)


def test_dtypes_are_upcast_to_float32():
    s = jnp.asarray(S_ANCHOR, jnp.bfloat16)
    out = _group(s)
    assert out.dtype == jnp.float32
    assert_close(out[0], np.asarray(_group(np.asarray(s, np.float32)))[0])
    binary = np.array([[True, False, True], [False, False, True]])
    assert_close(_group(binary, scale="none"), _group(binary.astype(np.float32), scale="none"))
    assert _rloo(binary.astype(np.int32)).dtype == jnp.float32
    assert _gdpo(jnp.ones((2, 3, 2), jnp.bfloat16)).dtype == jnp.float32


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------


def test_single_sample_groups_raise():
    one = np.ones((4, 1), np.float32)
    for fn in (
        group_advantages,
        rloo_advantages,
        gpg_advantages,
        passk_advantages,
        bnpo_advantages,
        zero_variance_mask,
        group_advantage_metrics,
    ):
        with pytest.raises(ValueError, match=r"G >= 2 .* got G=1"):
            fn(one)
    with pytest.raises(ValueError, match="got G=1"):
        opo_advantages(one, one)
    with pytest.raises(ValueError, match="got G=1"):
        gdpo_advantages(one[..., None])


def test_bad_options_raise():
    s = jnp.asarray(S_ANCHOR)
    with pytest.raises(ValueError, match="`scale` must be one of 'group', 'batch', 'none'"):
        group_advantages(s, scale="std")
    with pytest.raises(ValueError, match="`scale` must be one of"):
        group_advantages_flat(s[0], jnp.zeros(5, jnp.int32), num_groups=1, scale="prompt")
    with pytest.raises(ValueError, match="`ddof` must be one of 0, 1, got 2"):
        group_advantages(s, ddof=2)
    with pytest.raises(ValueError, match="`singleton` must be one of 'zero', 'raw'"):
        rloo_advantages(s, singleton="nan")
    with pytest.raises(ValueError, match="`normalize` must be one of 'none', 'batch'"):
        rloo_advantages(s, normalize="group")
    with pytest.raises(ValueError, match="`count` must be one of"):
        gpg_advantages(s, count="all")
    with pytest.raises(ValueError, match="`f_norm` must be > 0"):
        gpg_advantages(s, f_norm=0.0)
    with pytest.raises(ValueError, match="`eps` must be >= 0, got -1e-06"):
        group_advantages(s, eps=-1e-6)
    with pytest.raises(ValueError, match="`eps` must be >= 0, got nan"):  # not silently Dr.GRPO
        group_advantages(s, eps=float("nan"))
    with pytest.raises(ValueError, match="`scale` must be one of True, False"):
        passk_advantages(s, scale="group")
    with pytest.raises(ValueError, match="`alpha` and `beta` must both be"):
        bnpo_advantages(s, alpha=2.0)
    with pytest.raises(ValueError, match="`beta` must be > 0"):
        bnpo_advantages(s, alpha=2.0, beta=-1.0)
    with pytest.raises(ValueError, match="`min_std` must be >= 0"):
        zero_variance_mask(s, min_std=-0.1)
    # value ranges, checked on concrete inputs (traced ones cannot be)
    with pytest.raises(ValueError, match=r"bnpo_advantages: `rewards` must lie in \[0.0, 1.0\]"):
        bnpo_advantages(jnp.array([[2.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, -1.0]]))
    with pytest.raises(ValueError, match=r"opo_advantages: `lengths` must lie in \[0, inf\]"):
        opo_advantages(jnp.array([[0.2, 0.5, 0.9]]), jnp.array([[1, -1, 2]]))
    # only valid samples' lengths are checked: an invalid slot may hold −1 padding
    padded = opo_advantages(
        jnp.array([[1.0, 0.0, 1.0]]),
        jnp.array([[3.0, 5.0, -1.0]]),
        valid=jnp.array([[True, True, False]]),
    )
    assert_close(padded, [[0.625, -0.375, 0.0]])
    traced = jax.jit(lambda r: bnpo_advantages(r, alpha=2.0, beta=3.0))
    assert traced(jnp.array([[1.0, 0.0, 0.0, 1.0]])).shape == (1, 4)


def test_bad_shapes_raise():
    s = jnp.ones((3, 4))
    with pytest.raises(ValueError, match="group_advantages: `rewards` must have rank 2"):
        group_advantages(jnp.ones(12))
    with pytest.raises(ValueError, match="`valid` must have shape \\(3, 4\\), got \\(4, 3\\)"):
        group_advantages(s, valid=jnp.ones((4, 3), bool))
    with pytest.raises(ValueError, match="`rewards` must be a real numeric array"):
        rloo_advantages(jnp.ones((3, 4), jnp.complex64))
    with pytest.raises(ValueError, match="`lengths` must have the shape of `rewards`"):
        opo_advantages(s, jnp.ones((3, 5)))
    with pytest.raises(ValueError, match="gdpo_advantages: `rewards` must have rank 3"):
        gdpo_advantages(s)
    with pytest.raises(ValueError, match="`weights` must have shape \\(K,\\) = \\(2,\\)"):
        gdpo_advantages(jnp.ones((3, 4, 2)), weights=jnp.ones(3))
    with pytest.raises(ValueError, match="`valid` must have shape \\(3, 4\\)"):
        gdpo_advantages(jnp.ones((3, 4, 2)), valid=jnp.ones((3, 4, 2)))
    ids = jnp.zeros(12, jnp.int32)
    with pytest.raises(ValueError, match="`rewards` must have rank 1"):
        group_advantages_flat(s, ids, num_groups=3)
    with pytest.raises(ValueError, match="`group_ids` must have the shape of `rewards`"):
        group_advantages_flat(jnp.ones(12), jnp.zeros(11, jnp.int32), num_groups=3)
    with pytest.raises(ValueError, match="`group_ids` must be an integer array"):
        rloo_advantages_flat(jnp.ones(12), jnp.zeros(12), num_groups=3)
    with pytest.raises(ValueError, match="`num_groups` must be a positive Python int"):
        rloo_advantages_flat(jnp.ones(12), ids, num_groups=0)
    with pytest.raises(ValueError, match="`valid` must have shape \\(12,\\)"):
        group_advantages_flat(jnp.ones(12), ids, num_groups=3, valid=jnp.ones(11))
