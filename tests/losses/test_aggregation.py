"""`aggregate`: the five modes against a float64 reference, anchors, global normalisers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import losses
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, np_aggregate

MODES = losses.AGG_MODES


def test_anchor_values():
    l = jnp.array([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    m = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0]])
    expected = {
        "token_mean": 2.5,
        "token_sum": 10.0,
        "seq_mean_token_sum": 5.0,
        "seq_mean_token_mean": 3.0,
        "seq_mean_token_sum_norm": 1.25,
    }
    for mode, value in expected.items():
        assert_close(losses.aggregate(l, m, mode=mode), value)
    # verl's pre-2026 seq-mean-token-sum-norm did not divide by the sequence count
    assert_close(losses.aggregate(l, m, mode="seq_mean_token_sum_norm", num_seqs=1), 2.5)


@pytest.mark.parametrize("mode", MODES)
def test_matches_reference_with_empty_row(mode):
    rng = np.random.default_rng(0)
    l = rng.normal(size=(7, 11)).astype(np.float32)
    m = make_mask(rng, 7, 11)
    assert_close(
        jax.jit(lambda a, b: losses.aggregate(a, b, mode=mode))(l, m), np_aggregate(l, m, mode)
    )


@pytest.mark.parametrize("mode", MODES)
def test_nan_outside_mask_does_not_leak(mode):
    rng = np.random.default_rng(1)
    l = rng.normal(size=(5, 7)).astype(np.float32)
    m = make_mask(rng, 5, 7)
    assert_nan_safe(lambda a, b: losses.aggregate(a, b, mode=mode), (l, m), m, rng, planted=(0,))


def test_mode_identities_with_equal_lengths():
    rng = np.random.default_rng(2)
    l = rng.normal(size=(6, 5)).astype(np.float32)
    m = np.zeros((6, 5), np.float32)
    m[:, :3] = 1.0
    agg = lambda mode, **kw: float(losses.aggregate(l, m, mode=mode, **kw))  # noqa: E731
    assert_close(agg("token_mean"), agg("seq_mean_token_mean"))
    assert_close(agg("seq_mean_token_sum"), 3 * agg("token_mean"))
    assert_close(agg("seq_mean_token_sum_norm", norm_length=3), agg("token_mean"))


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_with_global_normalisers_sum_to_the_full_batch(mode):
    rng = np.random.default_rng(3)
    l = rng.normal(size=(8, 6)).astype(np.float32)
    m = make_mask(rng, 8, 6)
    full = float(losses.aggregate(l, m, mode=mode))
    num_tokens = max(m.sum(), 1.0)
    num_seqs = max((m.sum(1) > 0).sum(), 1.0)
    parts = [
        float(
            losses.aggregate(
                l[s], m[s], mode=mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=6
            )
        )
        for s in (slice(0, 4), slice(4, 8))
    ]
    assert_close(sum(parts), full)
    # and as (numerator, denominator) parts summed before dividing
    nums, dens = zip(
        *[
            losses.aggregate(l[s], m[s], mode=mode, return_parts=True)
            for s in (slice(0, 4), slice(4, 8))
        ],
        strict=True,
    )
    if mode == "token_sum":
        assert_close(sum(float(n) for n in nums), full)
    elif mode == "token_mean":
        assert_close(sum(float(n) for n in nums) / sum(float(d) for d in dens), full)


def test_empty_rows_are_not_counted_unless_num_seqs_says_so():
    l = np.ones((3, 2), np.float32)
    m = np.array([[1, 1], [0, 0], [1, 0]], np.float32)
    assert_close(losses.aggregate(l, m, mode="seq_mean_token_mean"), 1.0)
    assert_close(losses.aggregate(l, m, mode="seq_mean_token_mean", num_seqs=3), 2.0 / 3.0)


def test_all_masked_gives_zero_not_nan():
    for mode in MODES:
        out = losses.aggregate(jnp.full((2, 3), jnp.nan), jnp.zeros((2, 3)), mode=mode)
        assert float(out) == 0.0


def test_bad_input_errors_name_the_problem():
    with pytest.raises(ValueError, match="`mode` must be one of"):
        losses.aggregate(jnp.ones((2, 2)), jnp.ones((2, 2)), mode="token-mean")
    with pytest.raises(ValueError, match="`per_token` must have rank 2"):
        losses.aggregate(jnp.ones((2,)), jnp.ones((2,)))
    with pytest.raises(ValueError, match="`mask` must have shape"):
        losses.aggregate(jnp.ones((2, 3)), jnp.ones((2, 2)))
