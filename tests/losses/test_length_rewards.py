"""Length limits and length rewards (ALGORITHMS.md §10.1, §10.2, §11) vs float64 NumPy references."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.length_rewards import (
    accuracy_gated_rewards,
    conciseness_gated_rewards,
    drpo_positive_weights,
    hapo_history_update,
    hapo_length_rewards,
    kimi_length_rewards,
    mask_truncated,
    overlong_penalty,
    truncation_penalty,
)
from tests.losses.helpers import assert_close, make_mask

B, G, N = 5, 4, 13

_overlong = jax.jit(overlong_penalty, static_argnames=("max_length", "buffer_length", "factor"))
_trunc = jax.jit(truncation_penalty, static_argnames=("coef",))
_kimi = jax.jit(kimi_length_rewards)
_hapo = jax.jit(hapo_length_rewards, static_argnames=("weight", "floor"))
_hapo_update = jax.jit(hapo_history_update)
_acc_gated = jax.jit(accuracy_gated_rewards, static_argnames=("threshold", "lam"))
_concise = jax.jit(conciseness_gated_rewards, static_argnames=("w",))
_drpo = jax.jit(drpo_positive_weights, static_argnames=("lam",))


def assert_no_gradient(fn, *args):
    """Reward functions run under stop-gradient: d(sum out)/d(float args) is exactly 0."""
    floats = tuple(i for i, a in enumerate(args) if np.issubdtype(np.asarray(a).dtype, np.floating))
    grads = jax.grad(lambda *a: jnp.sum(fn(*a)), argnums=floats)(*[jnp.asarray(a) for a in args])
    for g in grads:
        assert np.all(np.asarray(g) == 0.0)


# --------------------------------------------------------------------------------------------------
# float64 references, written from the formulas
# --------------------------------------------------------------------------------------------------


def np_overlong(lengths, max_length, buffer_length, factor):
    out = np.zeros(np.shape(lengths))
    start = max_length - buffer_length
    for i, length in np.ndenumerate(np.asarray(lengths, np.float64)):
        if length <= start:
            out[i] = 0.0
        elif length <= max_length:
            out[i] = -factor * (length - start) / buffer_length
        else:
            out[i] = -factor
    return out


def np_kimi(lengths, correct, valid):
    out = np.zeros(lengths.shape)
    for b in range(lengths.shape[0]):
        ok = valid[b]
        if not ok.any():
            continue
        lo, hi = lengths[b][ok].min(), lengths[b][ok].max()
        for g in range(lengths.shape[1]):
            if not ok[g]:
                continue
            lam = 0.0 if hi == lo else 0.5 - (float(lengths[b, g]) - lo) / (hi - lo)
            out[b, g] = lam if correct[b, g] else min(0.0, lam)
    return out


def np_hapo(lengths, correct, history, weight=1.0, floor=-0.7):
    out = np.zeros(np.shape(lengths))
    for i in np.ndindex(*np.shape(lengths)):
        h = float(history[i])
        if not (np.isfinite(h) and h > 0):
            continue
        c = weight * math.cos(min(float(lengths[i]) / h, 2.0) * math.pi / 2)
        out[i] = max(floor, c) if correct[i] else min(0.0, c)
    return out


def np_hapo_update(history, ids, lengths, correct):
    out = np.array(history, np.float64)
    for p, length, ok in zip(ids, lengths, correct, strict=True):
        if ok and 0 <= p < len(out):
            out[p] = min(out[p], float(length))
    return out


# --------------------------------------------------------------------------------------------------
# overlong_penalty / truncation_penalty / mask_truncated (§10.1)
# --------------------------------------------------------------------------------------------------


def test_overlong_penalty_anchor_and_reference():
    anchor = _overlong(jnp.array([70, 80, 90, 100, 110]), max_length=100, buffer_length=20)
    assert anchor.dtype == jnp.float32
    assert_close(anchor, [0.0, 0.0, -0.5, -1.0, -1.0])
    lengths = np.random.default_rng(0).integers(0, 160, size=(B, G))
    out = _overlong(lengths, max_length=128, buffer_length=48, factor=0.7)
    assert out.shape == (B, G)
    assert_close(out, np_overlong(lengths, 128, 48, 0.7))


def test_overlong_penalty_is_continuous_non_increasing_and_bounded():
    lengths = np.linspace(0.0, 140.0, 2801).astype(np.float32)
    p = np.asarray(_overlong(lengths, max_length=100, buffer_length=30, factor=2.0), np.float64)
    assert np.all(np.diff(p) <= 0.0)
    assert p.max() == 0.0 and p.min() == -2.0
    # continuity at L0 = 70 and at max_length = 100 (no jump larger than the grid step)
    assert np.max(np.abs(np.diff(p))) <= 2.0 * (140.0 / 2800) / 30 + 1e-6
    # below L0 exactly 0, at and beyond max_length exactly -factor
    assert np.all(p[lengths <= 70] == 0.0) and np.all(p[lengths >= 100] == -2.0)


def test_overlong_penalty_matches_trl_default_factor():
    # TRL get_soft_overlong_punishment: (L_max − cache − len)/cache inside the buffer, −1 beyond
    lengths = np.arange(0, 40)
    trl = [
        0.0 if n <= 30 - 8 else ((30 - 8 - n) / 8 if n <= 30 else -1.0) for n in lengths.tolist()
    ]
    assert_close(_overlong(lengths, max_length=30, buffer_length=8), trl)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"max_length": 10, "buffer_length": 20}, "buffer_length"),
        ({"max_length": 10, "buffer_length": 0}, "buffer_length"),
        ({"max_length": 0, "buffer_length": 0.5}, "max_length"),
        ({"max_length": 10, "buffer_length": 5, "factor": -1.0}, "factor"),
        ({"max_length": "10", "buffer_length": 5}, "max_length"),
    ],
)
def test_overlong_penalty_rejects_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        overlong_penalty(jnp.arange(4), **kw)


def test_truncation_penalty_scales_or_replaces_truncated_rewards():
    rng = np.random.default_rng(1)
    r = rng.normal(size=N).astype(np.float32)
    cut = rng.uniform(size=N) > 0.5
    assert_close(_trunc(r, cut, coef=0.25), np.where(cut, 0.25 * r, r))
    r_nan = np.where(cut, np.nan, r).astype(np.float32)  # a fixed value ignores the reward
    out = _trunc(r_nan, cut, coef=-0.5)
    assert_close(out, np.where(cut, -0.5, r))
    assert_close(_trunc(r, cut, coef=1.0), r)
    assert_no_gradient(lambda x: truncation_penalty(x, cut, coef=0.5), r)
    with pytest.raises(ValueError, match="coef"):
        truncation_penalty(r, cut, coef=1.5)
    with pytest.raises(ValueError, match="truncated"):
        truncation_penalty(r, cut[:-1], coef=0.5)


def test_mask_truncated_zeroes_truncated_rows():
    rng = np.random.default_rng(2)
    mask = make_mask(rng, N, 7)
    cut = rng.uniform(size=N) > 0.5
    out = jax.jit(mask_truncated)(mask, cut)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), mask * (1.0 - cut[:, None]))
    with pytest.raises(ValueError, match="mask"):
        mask_truncated(mask[0], cut)
    with pytest.raises(ValueError, match="truncated"):
        mask_truncated(mask, cut[:3])


# --------------------------------------------------------------------------------------------------
# kimi_length_rewards (§10.2)
# --------------------------------------------------------------------------------------------------


def test_kimi_length_rewards_anchor():
    out = _kimi(jnp.array([[100, 200, 300]]), jnp.array([[1, 1, 0]]))
    assert_close(out, [[0.5, 0.0, -0.5]])


def test_kimi_length_rewards_match_reference_with_invalid_and_constant_groups():
    rng = np.random.default_rng(3)
    lengths = rng.integers(10, 90, size=(B, G)).astype(np.float32)
    correct = rng.uniform(size=(B, G)) > 0.5
    valid = rng.uniform(size=(B, G)) > 0.2
    lengths[1] = 42.0  # constant group: λ = 0
    valid[2] = False  # no valid sample
    valid[3] = [True, False, False, False]  # one valid sample: λ = 0
    dirty = np.where(valid, lengths, np.nan).astype(np.float32)  # NaN on invalid samples
    out = _kimi(dirty, correct, valid=valid)
    assert out.shape == (B, G)
    assert np.all(np.isfinite(np.asarray(out)))
    assert_close(out, np_kimi(lengths, correct, valid))
    assert np.all(np.abs(np.asarray(out)) <= 0.5 + 1e-7)
    assert_no_gradient(lambda x: kimi_length_rewards(x, correct, valid=valid), lengths)


def test_kimi_length_rewards_rejects_flat_input():
    with pytest.raises(ValueError, match="lengths"):
        kimi_length_rewards(jnp.arange(4.0), jnp.ones(4))
    with pytest.raises(ValueError, match="correct"):
        kimi_length_rewards(jnp.ones((2, 3)), jnp.ones((2, 2)))


# --------------------------------------------------------------------------------------------------
# hapo_length_rewards / hapo_history_update (§10.2)
# --------------------------------------------------------------------------------------------------


def test_hapo_anchor_and_no_history():
    h = jnp.array([100.0, 100.0, 100.0, 100.0, jnp.inf, -1.0, jnp.nan])
    lengths = jnp.array([50, 150, 50, 250, 50, 50, 50])
    correct = jnp.array([True, True, False, False, True, True, False])
    out = _hapo(lengths, correct, h)
    assert_close(out, [0.707107, -0.7, 0.0, -1.0, 0.0, 0.0, 0.0])


def test_hapo_matches_reference():
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 400, size=(B, G)).astype(np.float32)
    correct = rng.uniform(size=(B, G)) > 0.5
    history = np.where(rng.uniform(size=(B, G)) > 0.2, rng.integers(20, 200, size=(B, G)), np.inf)
    history = history.astype(np.float32)
    out = _hapo(lengths, correct, history, weight=0.8, floor=-0.5)
    assert_close(out, np_hapo(lengths, correct, history, weight=0.8, floor=-0.5))
    assert_no_gradient(lambda x, h: hapo_length_rewards(x, correct, h), lengths, history)


def test_hapo_every_correct_total_beats_every_incorrect_total():
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 1000, size=200).astype(np.float32)
    history = rng.integers(1, 500, size=200).astype(np.float32)
    correct = rng.uniform(size=200) > 0.5
    total = correct + np.asarray(_hapo(lengths, correct, history))
    assert total[correct].min() >= 0.3 - 1e-6
    assert total[~correct].max() <= 0.0
    assert total[correct].min() > total[~correct].max()


def test_hapo_history_update_takes_min_over_correct_in_range():
    rng = np.random.default_rng(6)
    P = 7
    history = np.where(rng.uniform(size=P) > 0.5, 80.0, np.inf).astype(np.float32)
    ids = rng.integers(-1, P + 2, size=30).astype(np.int32)  # some ids out of range
    lengths = rng.integers(1, 150, size=30).astype(np.float32)
    correct = rng.uniform(size=30) > 0.4
    out = _hapo_update(history, ids, lengths, correct)
    np.testing.assert_array_equal(np.asarray(out), np_hapo_update(history, ids, lengths, correct))


def test_hapo_history_then_rewards_rolls_forward():
    # the record only shrinks; a later batch is rewarded against the updated record
    h = jnp.full((2,), jnp.inf)
    ids = jnp.array([0, 0, 1, 1])
    h1 = _hapo_update(h, ids, jnp.array([60, 40, 30, 20]), jnp.array([1, 1, 0, 0]))
    assert np.asarray(h1).tolist() == [40.0, np.inf]
    r = _hapo(jnp.array([40, 20, 30]), jnp.array([1, 1, 1]), h1[jnp.array([0, 0, 1])])
    assert_close(r, [0.0, 0.707107, 0.0])
    h2 = _hapo_update(h1, ids, jnp.array([50, 20, 30, 90]), jnp.array([1, 1, 1, 0]))
    assert np.asarray(h2).tolist() == [20.0, 30.0]


def test_hapo_rejects_bad_inputs():
    with pytest.raises(ValueError, match="history"):
        hapo_length_rewards(jnp.ones(3), jnp.ones(3), jnp.ones(4))
    with pytest.raises(ValueError, match="prompt_ids"):
        hapo_history_update(jnp.ones(3), jnp.ones(3), jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match="lengths"):
        hapo_history_update(jnp.ones(3), jnp.zeros(3, jnp.int32), jnp.ones(2), jnp.ones(3))
    with pytest.raises(ValueError, match="weight"):
        hapo_length_rewards(jnp.ones(3), jnp.ones(3), jnp.ones(3), weight=-1.0)


# --------------------------------------------------------------------------------------------------
# accuracy_gated_rewards (GRPO-λ) / conciseness_gated_rewards / drpo_positive_weights (§11)
# --------------------------------------------------------------------------------------------------


def test_accuracy_gated_rewards_match_reference():
    rng = np.random.default_rng(7)
    correct = (rng.uniform(size=(B, G)) > 0.5).astype(np.float32)
    len_r = rng.uniform(-0.5, 0.5, size=(B, G)).astype(np.float32)
    valid = rng.uniform(size=(B, G)) > 0.2
    valid[0] = False
    expected = np.zeros((B, G))
    for b in range(B):
        if not valid[b].any():
            continue
        acc = correct[b][valid[b]].mean()
        gated = acc >= 0.5
        expected[b] = np.where(valid[b], correct[b] + (0.3 * len_r[b] if gated else 0.0), 0.0)
    dirty_len = np.where(valid, len_r, np.inf).astype(np.float32)
    out = _acc_gated(correct, dirty_len, threshold=0.5, lam=0.3, valid=valid)
    assert_close(out, expected)


def test_accuracy_gated_rewards_extreme_thresholds():
    rng = np.random.default_rng(8)
    correct = (rng.uniform(size=(B, G)) > 0.5).astype(np.float32)
    len_r = rng.normal(size=(B, G)).astype(np.float32)
    assert_close(_acc_gated(correct, len_r, threshold=0.0, lam=0.5), correct + 0.5 * len_r)
    assert_close(_acc_gated(correct, len_r, threshold=1.01, lam=0.5), correct)
    with pytest.raises(ValueError, match="len_r"):
        accuracy_gated_rewards(correct, len_r[:, :2], threshold=0.5, lam=0.1)


def test_conciseness_gated_rewards():
    rng = np.random.default_rng(9)
    correct = (rng.uniform(size=N) > 0.5).astype(np.float32)
    concise = rng.uniform(size=N).astype(np.float32)
    assert_close(_concise(correct, concise, w=0.4), correct * (1.0 + 0.4 * concise))
    dirty = np.where(correct > 0, concise, np.nan).astype(np.float32)  # wrong answers: any score
    out = _concise(correct, dirty, w=0.4)
    assert np.all(np.isfinite(np.asarray(out)))
    assert np.all(np.asarray(out)[correct == 0] == 0.0)
    assert np.all(np.asarray(out)[correct > 0] >= 1.0)
    with pytest.raises(ValueError, match="concise"):
        conciseness_gated_rewards(correct, concise[:3], w=0.1)


def test_drpo_positive_weights_match_reference_and_sum_to_one():
    rng = np.random.default_rng(10)
    len_r = rng.normal(size=(B, G)).astype(np.float32)
    correct = rng.uniform(size=(B, G)) > 0.4
    correct[0] = False
    valid = rng.uniform(size=(B, G)) > 0.1
    dirty = np.where(correct & valid, len_r, np.nan).astype(np.float32)
    out = np.asarray(_drpo(dirty, correct, lam=0.5, valid=valid), np.float64)
    expected = np.zeros((B, G))
    for b in range(B):
        pos = correct[b] & valid[b]
        if pos.any():
            e = np.exp(len_r[b][pos].astype(np.float64) / 0.5)
            expected[b][pos] = e / e.sum()
    assert_close(out, expected)
    sums = out.sum(1)
    has = (correct & valid).any(1)
    assert_close(sums[has], np.ones(has.sum()))
    assert np.all(sums[~has] == 0.0)


def test_drpo_positive_weights_invariances():
    rng = np.random.default_rng(11)
    len_r = rng.normal(size=(B, G)).astype(np.float32)
    correct = np.ones((B, G), bool)
    w = _drpo(len_r, correct, lam=1.0)
    assert_close(_drpo(len_r + 3.0, correct, lam=1.0), np.asarray(w))  # shift invariant
    assert_close(_drpo(len_r, correct, lam=1e6), np.full((B, G), 1.0 / G), atol=1e-5)
    with pytest.raises(ValueError, match="lam"):
        drpo_positive_weights(len_r, correct, lam=0.0)
