"""Rollout/train mismatch correction (ALGORITHMS.md §6.1-§6.4) against float64 NumPy."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.rollout_correction import (
    REJECTION_CRITERIA,
    off_policy_sequence_mask,
    rollout_correction_weights,
    rollout_mismatch_metrics,
    rollout_rejection_mask,
)
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, plant_nonfinite

N, T = 7, 11
LEVELS = ("token", "sequence", "geometric")

# Peers' keyword sets (ALGORITHMS.md §6.1) and a few combinations of our own.
PEER_SETTINGS = {
    "verl_token_truncate": {},
    "verl_sequence_truncate": {"level": "sequence"},
    "verl_token_lower_upper_mask": {"mode": "mask", "low": 0.5, "high": 2.0},
    "tunix_token": {},
    "trl_sequence_mask": {
        "level": "sequence",
        "mode": "mask",
        "high": 3.0,
        "log_ratio_clamp": None,
    },
    "openrlhf_tis": {"low": 0.5, "high": 5.0},
    "openrlhf_icepop": {"mode": "mask", "low": 0.5, "high": 5.0},
    "openrlhf_seq_mask_tis": {
        "mode": "mask",
        "mask_level": "geometric",
        "low": 0.5,
        "high": 5.0,
    },
    "geometric_truncate": {"level": "geometric", "low": 0.9, "high": 1.1},
    "geometric_mask": {"level": "geometric", "mode": "mask", "low": 0.9, "high": 1.1},
    "sequence_mask_token_gate": {"level": "sequence", "mode": "mask", "mask_level": "token"},
    "token_batch_normalized": {"high": 1.5, "batch_normalize": True},
    "sequence_batch_normalized": {"level": "sequence", "high": 2.0, "batch_normalize": True},
    "geometric_mask_batch_normalized": {
        "level": "geometric",
        "mode": "mask",
        "high": 1.2,
        "batch_normalize": True,
    },
    "no_bounds": {"high": None},
}


def _inputs(seed: int, scale: float = 0.3):
    rng = np.random.default_rng(seed)
    roll = -rng.uniform(0.1, 3.0, size=(N, T)).astype(np.float32)
    old = (roll + scale * rng.normal(size=(N, T))).astype(np.float32)
    return rng, old, roll, make_mask(rng, N, T)


def np_weights(
    old,
    roll,
    m,
    *,
    level="token",
    mode="truncate",
    low=None,
    high=2.0,
    mask_level=None,
    batch_normalize=False,
    log_ratio_clamp=20.0,
):
    """§6.1 in float64, written from the formula."""
    valid = m > 0
    d = np.where(valid, old.astype(np.float64) - roll.astype(np.float64), 0.0)
    lengths = valid.sum(1, keepdims=True)

    def log_w(lvl):
        if lvl == "token":
            out = d
        elif lvl == "sequence":
            out = d.sum(1, keepdims=True)
        else:
            out = d.sum(1, keepdims=True) / np.maximum(lengths, 1)
        if log_ratio_clamp is not None:
            out = np.clip(out, -log_ratio_clamp, log_ratio_clamp)
        return out

    rho = np.exp(log_w(level))
    if mode == "truncate":
        w = np.clip(rho, 0.0 if low is None else low, np.inf if high is None else high)
    else:
        gate = np.exp(log_w(mask_level or level))
        keep = np.ones(gate.shape, bool)
        if low is not None:
            keep &= gate >= low
        if high is not None:
            keep &= gate <= high
        w = rho * keep
    w = np.broadcast_to(w, m.shape) * valid
    if batch_normalize:
        mean = w[valid].mean() if level == "token" else w.max(1)[lengths[:, 0] > 0].mean()
        w = w / mean
    return w


_weights = jax.jit(
    rollout_correction_weights,
    static_argnames=(
        "level",
        "mode",
        "low",
        "high",
        "mask_level",
        "batch_normalize",
        "log_ratio_clamp",
    ),
)


@functools.partial(jax.jit, static_argnames="settings")
def _weights_many(old, roll, m, *, settings):
    """Several keyword sets in one compilation (`settings` is a tuple of (name, kwargs items))."""
    return {name: rollout_correction_weights(old, roll, m, **dict(kw)) for name, kw in settings}


def _as_static(settings: dict) -> tuple:
    return tuple((name, tuple(sorted(kw.items()))) for name, kw in settings.items())


def test_anchor():
    old = jnp.array([[-1.0, -2.0, -0.5]])
    roll = jnp.array([[-1.5, -1.0, -0.5]])
    m = jnp.ones((1, 3))
    assert_close(_weights(old, roll, m), [[1.648721, 0.367879, 1.0]])
    assert_close(_weights(old, roll, m, level="sequence"), [[0.606531] * 3])
    assert_close(_weights(old, roll, m, level="geometric"), [[0.846482] * 3])
    # masking: 1.648721 > 1.5 is zeroed, 0.367879 only once a lower bound 0.5 is set; the
    # sequence weight 0.606531 lies inside [0.5, 1.5] and is kept
    assert_close(_weights(old, roll, m, mode="mask", high=1.5), [[0.0, 0.367879, 1.0]])
    assert_close(_weights(old, roll, m, mode="mask", low=0.5, high=1.5), [[0.0, 0.0, 1.0]])
    assert_close(
        _weights(old, roll, m, level="sequence", mode="mask", low=0.5, high=1.5), [[0.606531] * 3]
    )


def test_peer_keyword_sets_match_numpy():
    _, old, roll, m = _inputs(0, scale=0.6)
    out = _weights_many(old, roll, m, settings=_as_static(PEER_SETTINGS))
    for name, kw in PEER_SETTINGS.items():
        expected = np_weights(old, roll, m, **kw)
        assert_close(out[name], expected)
        assert np.all(np.asarray(out[name])[m == 0] == 0.0), name
    # the inputs exercise truncation and masking: some weights change, some are zeroed
    assert np.any(np.asarray(out["openrlhf_icepop"])[m > 0] == 0.0)
    assert 0 < np.mean(np.asarray(out["geometric_mask"])[m > 0] == 0.0) < 1
    assert np.any(np.asarray(out["verl_token_truncate"]) == 2.0)
    assert 0 < np.mean(np.asarray(out["trl_sequence_mask"])[m > 0] == 0.0) < 1


def test_batch_normalize_gives_mean_one():
    _, old, roll, m = _inputs(1)
    out = _weights_many(old, roll, m, settings=_as_static(PEER_SETTINGS))
    assert_close(np.asarray(out["token_batch_normalized"])[m > 0].mean(), 1.0)
    rows = np.asarray(out["sequence_batch_normalized"]).max(1)[m.sum(1) > 0]
    assert_close(rows.mean(), 1.0)


def test_identical_policies_give_unit_weights_everywhere():
    _, old, _, m = _inputs(2)
    settings = {
        f"{level}_{mode}_{gate}_{norm}": {
            "level": level,
            "mode": mode,
            "low": 0.5,
            "high": 2.0,
            "batch_normalize": norm,
            **({"mask_level": gate} if mode == "mask" else {}),
        }
        for level in LEVELS
        for mode in ("truncate", "mask")
        for gate in (LEVELS if mode == "mask" else ("-",))
        for norm in (False, True)
    }
    out = _weights_many(old, old, m, settings=_as_static(settings))
    for w in out.values():
        assert_close(w, m, rtol=0, atol=0)


def test_high_inf_truncate_is_the_exact_ratio():
    _, old, roll, m = _inputs(3, scale=1.0)
    d = np.where(m > 0, old.astype(np.float64) - roll, 0.0)
    tok = _weights(old, roll, m, high=np.inf)
    assert_close(tok, np.exp(d) * m)
    seq = _weights(old, roll, m, level="sequence", high=np.inf)
    assert_close(seq, np.broadcast_to(np.exp(d.sum(1, keepdims=True)), m.shape) * m, rtol=1e-4)


def test_no_gradient_flows_through_the_weights():
    _, old, roll, m = _inputs(4)
    c = np.random.default_rng(5).normal(size=(N, T)).astype(np.float32)
    for kw in ({}, {"level": "sequence", "mode": "mask", "high": 3.0}, {"level": "geometric"}):
        grads = jax.jit(
            jax.grad(
                lambda a, b, kw=kw: jnp.sum(c * rollout_correction_weights(a, b, m, **kw)),
                argnums=(0, 1),
            )
        )(old, roll)
        for g in grads:
            assert np.all(np.asarray(g) == 0.0)


def test_nan_outside_mask_does_not_leak():
    rng, old, roll, m = _inputs(6)
    settings = {"tok": {}, "seq": {"level": "sequence"}, "geo": {"level": "geometric"}}
    settings["mask_norm"] = {"mode": "mask", "low": 0.5, "batch_normalize": True}
    clean = _weights_many(old, roll, m, settings=_as_static(settings))
    dirty = _weights_many(
        plant_nonfinite(old, m, rng),
        plant_nonfinite(roll, m, rng),
        m,
        settings=_as_static(settings),
    )
    for name in settings:
        assert np.all(np.isfinite(np.asarray(dirty[name])))
        assert_close(dirty[name], np.asarray(clean[name], np.float64), rtol=0, atol=0)
    c = rng.normal(size=(N, T)).astype(np.float32)
    assert_nan_safe(
        lambda a, b: jnp.sum(c * rollout_correction_weights(a, b, m, level="sequence")),
        (old, roll),
        m,
        rng,
        argnums=(0, 1),
    )


def test_bfloat16_inputs_give_float32_weights():
    _, old, roll, m = _inputs(7)
    w = _weights(jnp.asarray(old, jnp.bfloat16), jnp.asarray(roll, jnp.bfloat16), m)
    assert w.dtype == jnp.float32


def test_weight_errors_name_the_problem():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="`level` must be one of"):
        rollout_correction_weights(x, x, x, level="seq")
    with pytest.raises(ValueError, match="`mode` must be one of"):
        rollout_correction_weights(x, x, x, mode="clip")
    with pytest.raises(ValueError, match="`mask_level` applies only to mode='mask'"):
        rollout_correction_weights(x, x, x, mask_level="geometric")
    with pytest.raises(ValueError, match="`low` must be <= `high`"):
        rollout_correction_weights(x, x, x, low=3.0, high=2.0)
    with pytest.raises(ValueError, match="`low` must be >= 0"):
        rollout_correction_weights(x, x, x, low=-1.0)
    with pytest.raises(ValueError, match="`high` must be a Python number or None"):
        rollout_correction_weights(x, x, x, high=jnp.array(2.0))
    with pytest.raises(ValueError, match="`rollout_logp` must have the shape of `old_logp`"):
        rollout_correction_weights(x, jnp.zeros((2, 2)), x)
    with pytest.raises(ValueError, match="`old_logp` must have rank 2"):
        rollout_correction_weights(jnp.zeros(3), jnp.zeros(3), jnp.zeros(3))


# --------------------------------------------------------------------------------------------------
# rejection sampling (§6.2)
# --------------------------------------------------------------------------------------------------


def np_rejection(old, roll, m, criteria):
    valid = m > 0
    log_rho = np.where(valid, old.astype(np.float64) - roll, 0.0)
    k = {"k1": -log_rho, "k2": 0.5 * log_rho**2, "k3": np.exp(log_rho) - 1.0 - log_rho}
    lengths = valid.sum(1, keepdims=True)
    keep = valid.copy()
    for name, low, high in criteria:
        scope, kind = name.rsplit("_", 1)
        x = np.where(valid, k[kind], 0.0)
        if scope == "token":
            stat = x
        elif scope == "seq_sum":
            stat = x.sum(1, keepdims=True)
        elif scope == "seq_mean":
            stat = x.sum(1, keepdims=True) / np.maximum(lengths, 1)
        else:
            stat = np.where(valid, x, -np.inf).max(1, keepdims=True)
        if low is not None:
            keep &= stat >= low
        if high is not None:
            keep &= stat <= high
    return keep.astype(np.float64)


@functools.partial(jax.jit, static_argnames="criteria_sets")
def _rejection_many(old, roll, m, *, criteria_sets):
    return [rollout_rejection_mask(old, roll, m, criteria=c) for c in criteria_sets]


def _median_bounds(old, roll, m):
    """One criterion per name, with bounds near quantiles 0.15 / 0.8 of its statistic."""
    valid = m > 0
    log_rho = np.where(valid, old.astype(np.float64) - roll, 0.0)
    k = {"k1": -log_rho, "k2": 0.5 * log_rho**2, "k3": np.exp(log_rho) - 1.0 - log_rho}
    out = []
    for name in REJECTION_CRITERIA:
        scope, kind = name.rsplit("_", 1)
        x = np.where(valid, k[kind], 0.0)
        if scope == "token":
            stat = x[valid]
        elif scope == "seq_sum":
            stat = x.sum(1)
        elif scope == "seq_mean":
            stat = x.sum(1) / np.maximum(valid.sum(1), 1)
        else:
            stat = np.where(valid, x, -np.inf).max(1)[valid.any(1)]
        s = np.unique(stat)  # bounds halfway between two observed values (no float32 ties)
        i, j = int(0.15 * len(s)), int(0.8 * len(s))
        out.append((name, float(s[i] + s[i + 1]) / 2, float(s[j] + s[j + 1]) / 2))
    return out


def test_rejection_criteria_match_numpy():
    _, old, roll, m = _inputs(8)
    singles = _median_bounds(old, roll, m)
    criteria_sets = (
        *((c,) for c in singles),
        ((*singles[0][:2], None), ("seq_max_k3", None, singles[-1][2])),  # AND, open bounds
        (("seq_mean_k2", None, singles[7][2]), ("token_k1", singles[0][1], None)),
        (),
    )
    out = _rejection_many(old, roll, m, criteria_sets=criteria_sets)
    for criteria, keep in zip(criteria_sets, out, strict=True):
        expected = np_rejection(old, roll, m, criteria)
        assert_close(keep, expected, rtol=0, atol=0)
        if len(criteria) == 1:
            kept = expected[m > 0].mean()
            assert 0 < kept < 1, criteria  # each criterion bites without rejecting everything
    assert_close(out[-1], m, rtol=0, atol=0)  # no criteria: every valid token is kept


def test_rejection_identical_policies_keep_everything():
    rng, old, _, m = _inputs(9)
    criteria = tuple((name, -1e-6, 1e-6) for name in REJECTION_CRITERIA)
    (keep,) = _rejection_many(old, old, m, criteria_sets=(criteria,))
    assert_close(keep, m, rtol=0, atol=0)
    (dirty,) = _rejection_many(
        plant_nonfinite(old, m, rng), plant_nonfinite(old, m, rng), m, criteria_sets=(criteria,)
    )
    assert_close(dirty, m, rtol=0, atol=0)


def test_rejection_errors_name_the_problem():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="`criteria name` must be one of"):
        rollout_rejection_mask(x, x, x, criteria=[("seq_max_k1", None, 1.0)])
    with pytest.raises(ValueError, match=r"must be a \(name, low, high\) tuple"):
        rollout_rejection_mask(x, x, x, criteria=[("token_k1", 1.0)])
    with pytest.raises(ValueError, match="must be a sequence of"):
        rollout_rejection_mask(x, x, x, criteria="token_k1")
    with pytest.raises(ValueError, match="needs low <= high"):
        rollout_rejection_mask(x, x, x, criteria=[("token_k2", 1.0, 0.0)])
    with pytest.raises(ValueError, match="must be a Python number or None"):
        rollout_rejection_mask(x, x, x, criteria=[("token_k2", "0", None)])


# --------------------------------------------------------------------------------------------------
# metrics (§6.4)
# --------------------------------------------------------------------------------------------------


def test_mismatch_metrics_match_numpy():
    rng, old, roll, m = _inputs(10)
    w = np.asarray(_weights(old, roll, m, mode="mask", low=0.8, high=1.2))
    metrics = jax.jit(rollout_mismatch_metrics)(old, roll, m, weights=w)
    valid = m > 0
    log_rho = old.astype(np.float64)[valid] - roll[valid]
    expected = {
        "rollout/k1": np.mean(-log_rho),
        "rollout/k3": np.mean(np.exp(log_rho) - 1.0 - log_rho),
        "rollout/ratio_max": np.exp(log_rho).max(),
        "rollout/ppl_ratio": np.exp(np.mean(-log_rho)),
        "rollout/weight_mean": w[valid].mean(),
        "rollout/masked_frac": np.mean(w[valid] == 0),
    }
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        assert_close(metrics[key], value)
        assert metrics[key].dtype == jnp.float32 and metrics[key].shape == ()
    assert 0 < float(metrics["rollout/masked_frac"]) < 1
    dirty = jax.jit(rollout_mismatch_metrics)(
        plant_nonfinite(old, m, rng), plant_nonfinite(roll, m, rng), m, weights=w
    )
    for key in expected:
        assert_close(dirty[key], float(metrics[key]), rtol=0, atol=0)
    no_w = rollout_mismatch_metrics(old, old, m)
    assert set(no_w) == {"rollout/k1", "rollout/k3", "rollout/ratio_max", "rollout/ppl_ratio"}
    assert_close([float(no_w[k]) for k in sorted(no_w)], [0.0, 0.0, 1.0, 1.0])


# --------------------------------------------------------------------------------------------------
# off_policy_sequence_mask (§6.3)
# --------------------------------------------------------------------------------------------------

_off_policy = jax.jit(off_policy_sequence_mask)


def np_off_policy(lp, roll, adv, m, threshold):
    valid = m > 0
    lengths = valid.sum(1)
    drift = np.where(valid, roll.astype(np.float64) - lp, 0.0).sum(1) / np.maximum(lengths, 1)
    if adv.shape == m.shape:
        seq_adv = np.where(valid, adv.astype(np.float64), 0.0).sum(1) / np.maximum(lengths, 1)
    else:
        seq_adv = adv.reshape(-1).astype(np.float64)
    keep = ((seq_adv >= 0) | (drift <= threshold)) & (lengths > 0)
    return keep.astype(np.float64)[:, None], drift


def _off_policy_inputs(seed):
    """Row n drifted by about 0.1·n nats per token; advantages alternate in sign (odd rows < 0)."""
    rng = np.random.default_rng(seed)
    m = make_mask(rng, N, T)
    roll = -rng.uniform(0.1, 3.0, size=(N, T)).astype(np.float32)
    noise = rng.uniform(-0.02, 0.02, size=(N, T))
    lp = roll - 0.1 * np.arange(N)[:, None] - noise
    signs = np.where(np.arange(N) % 2, -1.0, 1.0)[:, None]
    adv = np.repeat(signs * rng.uniform(0.2, 2.0, size=(N, 1)), T, axis=1).astype(np.float32)
    return rng, lp.astype(np.float32), roll, adv, m


@pytest.mark.parametrize("threshold", [0.05, 0.25, 0.45])
def test_off_policy_mask_matches_numpy(threshold):
    rng, lp, roll, adv, m = _off_policy_inputs(0)
    expected, drift = np_off_policy(lp, roll, adv, m, threshold)
    dirty = [plant_nonfinite(x, m, rng) for x in (lp, roll, adv)]
    for a in (dirty[2], adv[:, 0], adv[:, :1]):  # per token, [N], [N,1]
        got = _off_policy(dirty[0], dirty[1], a, m, threshold=threshold)
        assert got.shape == (N, 1) and got.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(got), expected)
    traced = _off_policy(lp, roll, adv, m, threshold=jnp.float32(threshold))
    np.testing.assert_array_equal(np.asarray(traced), expected)
    valid_rows = m.sum(1) > 0
    assert np.asarray(got)[~valid_rows].sum() == 0  # empty rows give 0
    # negative-advantage rows (drift 0.1, 0.3, 0.5) are kept exactly when their drift is small
    negative = adv[:, 0] < 0
    np.testing.assert_array_equal(expected[negative, 0], drift[negative] <= threshold)
    assert expected[~negative & valid_rows].all()


def test_off_policy_mask_keeps_positive_advantages_and_close_policies():
    _, lp, roll, adv, m = _off_policy_inputs(1)
    far = lp - 5.0  # every sequence drifted by 5 nats per token
    keep = np.asarray(_off_policy(far, roll, adv, m, threshold=0.1))[:, 0]
    valid_rows = m.sum(1) > 0
    np.testing.assert_array_equal(keep[valid_rows], adv[valid_rows, 0] >= 0)
    same = np.asarray(_off_policy(roll, roll, adv, m, threshold=0.0))[:, 0]  # D = 0 <= δ
    np.testing.assert_array_equal(same, valid_rows.astype(np.float32))
    # a larger threshold keeps a superset
    small = np.asarray(_off_policy(lp, roll, adv, m, threshold=0.1))
    large = np.asarray(_off_policy(lp, roll, adv, m, threshold=0.3))
    assert np.all(large >= small)


def test_off_policy_mask_as_token_weights_removes_the_gradient_of_masked_sequences():
    from losses.ppo import reinforce_loss

    _, lp, roll, adv, m = _off_policy_inputs(2)
    keep = _off_policy(lp, roll, adv, m, threshold=0.15)
    grad = jax.jit(jax.grad(lambda x: reinforce_loss(x, adv, m, token_weights=keep * m)[0]))(lp)
    dropped = np.asarray(keep)[:, 0] == 0
    assert dropped.any()
    assert np.all(np.asarray(grad)[dropped] == 0)
    # the normaliser still counts the dropped sequences' tokens
    expected = -np.where(m > 0, adv, 0.0) * np.asarray(keep) / m.sum()
    assert_close(grad, expected)
    # the mask carries no gradient itself
    g = jax.jit(
        jax.grad(lambda x: jnp.sum(off_policy_sequence_mask(x, roll, adv, m, threshold=0.1)))
    )(lp)
    assert np.all(np.asarray(g) == 0)


def test_off_policy_mask_errors_name_the_problem():
    x = jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"`advantages` must have shape \[N\] = \(2,\)"):
        off_policy_sequence_mask(x, x, jnp.ones(3), x, threshold=0.1)
    with pytest.raises(ValueError, match="`rollout_logp` must have the shape of `logp`"):
        off_policy_sequence_mask(x, jnp.ones((2, 4)), x, x, threshold=0.1)
    with pytest.raises(ValueError, match="`threshold` must be a number"):
        off_policy_sequence_mask(x, x, x, x, threshold=float("nan"))
    with pytest.raises(ValueError, match="`threshold` must be a scalar"):
        off_policy_sequence_mask(x, x, x, x, threshold=jnp.ones(2))
    with pytest.raises(ValueError, match="`mask` must have shape"):
        off_policy_sequence_mask(x, x, x, jnp.ones((3, 2)), threshold=0.1)
    with pytest.raises(ValueError, match="`logp` must have rank 2"):
        off_policy_sequence_mask(jnp.ones(3), jnp.ones(3), jnp.ones(3), jnp.ones(3), threshold=0.1)
