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
    with pytest.raises(
        ValueError, match="`mask` must be boolean or real numeric, got dtype complex64"
    ):
        losses.aggregate(jnp.ones((2, 2)), jnp.ones((2, 2), jnp.complex64))
    with pytest.raises(ValueError, match="`mask` must be boolean or real numeric, got <U1"):
        losses.aggregate(jnp.ones((1, 2)), np.array([["a", "b"]]))
    with pytest.raises(ValueError, match=r"`per_token` must be an array .*, got list"):
        losses.aggregate([[1.0, 2.0]], jnp.ones((1, 2)))
    with pytest.raises(ValueError, match="`num_tokens` must be a finite number >= 0, got -4"):
        losses.aggregate(jnp.ones((2, 2)), jnp.ones((2, 2)), num_tokens=-4)
    with pytest.raises(ValueError, match="`num_seqs` must be a finite number >= 0"):
        losses.aggregate(
            jnp.ones((2, 2)), jnp.ones((2, 2)), mode="seq_mean_token_sum", num_seqs=np.nan
        )
    with pytest.raises(ValueError, match="`norm_length` must be > 0, got 0"):
        losses.aggregate(
            jnp.ones((2, 2)), jnp.ones((2, 2)), mode="seq_mean_token_sum_norm", norm_length=0
        )


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_a_global_count_of_zero_falls_back_to_the_local_count(mode):
    # §1.5: D_tok = num_tokens or max(Σm, 1) (and D_seq likewise): a global batch without a valid
    # token gives 0, not NaN; a traced count <= 0 falls back too instead of flipping the sign
    l = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    m = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    key = "num_tokens" if mode == "token_mean" else "num_seqs"
    local = float(losses.aggregate(l, m, mode=mode))
    assert float(losses.aggregate(l, m, mode=mode, **{key: 0})) == local
    assert float(losses.aggregate(l, np.zeros_like(m), mode=mode, **{key: 0})) == 0.0
    traced = jax.jit(lambda n: losses.aggregate(l, m, mode=mode, **{key: n}))
    assert float(traced(-4.0)) == local and float(traced(0.0)) == local
    assert float(traced(2.0)) == float(losses.aggregate(l, m, mode=mode, **{key: 2.0}))


def _pack(rng, loss, mask, lengths, row_length):
    """The sequences `loss[i, :n_i]` (one per row) packed in order into rows of `row_length`,
    sometimes with a padding gap between two, with their segment ids `1, 2, …` per row."""
    rows, fill, seg = [], row_length, 0
    for i, n in enumerate(lengths):
        gap = int(rng.integers(0, 2))
        if fill + gap + n > row_length:
            rows.append([np.zeros(row_length, np.float32) for _ in range(3)])
            fill, seg, gap = 0, 0, 0
        seg, start = seg + 1, fill + gap
        for k, values in enumerate((loss[i, :n], mask[i, :n], np.full(n, seg))):
            rows[-1][k][start : start + n] = values
        fill = start + n
    p_loss, p_mask, seg_ids = (np.stack([r[k] for r in rows]) for k in range(3))
    return p_loss, p_mask, seg_ids.astype(np.int32)


@pytest.mark.parametrize("mode", MODES)
def test_packed_rows_aggregate_as_one_sequence_per_row(mode):
    rng = np.random.default_rng(3)
    lengths = [5, 1, 7, 3, 3, 6, 2, 4]
    loss = rng.normal(size=(len(lengths), 7)).astype(np.float32)
    mask = (rng.uniform(size=loss.shape) < 0.8) * (np.arange(7) < np.array(lengths)[:, None])
    mask = mask.astype(np.float32)
    mask[3] = 0.0  # a sequence without a valid token is not counted
    p_loss, p_mask, seg = _pack(rng, loss, mask, lengths, row_length=9)
    assert p_loss.shape[0] < len(lengths) and seg.max() > 1

    def agg(a, b, s):
        return losses.aggregate(a, b, mode=mode, segment_ids=s, norm_length=7)

    assert_close(jax.jit(agg)(p_loss, p_mask, seg), np_aggregate(loss, mask, mode, norm_length=7))
    # the gradient too: every token gets the weight it has with one sequence per row
    grad = jax.grad(agg)(p_loss, p_mask, seg)
    ref = jax.grad(lambda a: losses.aggregate(a, mask, mode=mode, norm_length=7))(loss)
    np.testing.assert_allclose(grad[p_mask > 0], np.asarray(ref)[mask > 0], rtol=1e-6)


def test_packed_tokens_outside_segments_are_not_counted():
    l = jnp.array([[1.0, 2.0, 100.0, 3.0]])
    m = jnp.ones((1, 4))
    seg = jnp.array([[1, 1, 0, 2]])
    assert_close(losses.aggregate(l, m, mode="token_mean", segment_ids=seg), 2.0)
    assert_close(losses.aggregate(l, m, mode="seq_mean_token_mean", segment_ids=seg), 2.25)


def test_packed_segment_ids_are_checked():
    l, m = jnp.ones((2, 3)), jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"segment_ids.*shape"):
        losses.aggregate(l, m, segment_ids=jnp.ones((2, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"segment_ids.*integer"):
        losses.aggregate(l, m, segment_ids=jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"0 … T = 3.*0 … 4"):
        losses.aggregate(l, m, segment_ids=jnp.array([[0, 1, 4], [1, 1, 1]]))
