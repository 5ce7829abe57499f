"""Sequence packing: the bin packing, the packed layout, and a packed SFT batch's loss and
gradient against the same sequences one per padded row (every aggregation mode)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.train import SequenceBatch, SFTConfig, sft_objective, split_models
from jaxrl_llm.train.batch import count_normalizers
from jaxrl_llm.train.logprobs import completion_logprobs
from jaxrl_llm.train.packing import best_fit_decreasing, pack_batch
from tests.train.helpers import UPDATE_LAYERS, sequences, tiny_policy, tree_max_abs_diff


@pytest.mark.parametrize("seed", range(6))
def test_best_fit_decreasing_is_a_partition_no_two_rows_of_which_fit_in_one(seed):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(4, 20))
    lengths = rng.integers(1, capacity + 1, size=int(rng.integers(1, 40))).tolist()
    bins = best_fit_decreasing(lengths, capacity)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in b) for b in bins]
    assert max(loads) <= capacity
    assert len(bins) >= -(-sum(lengths) // capacity)
    # a row was opened only for an item that fit in no open row, so any two rows overflow one
    for a, b in itertools.combinations(loads, 2):
        assert a + b > capacity


def test_best_fit_decreasing_hand_example_and_errors():
    # 7 -> row 0 (room 3); 4 -> row 1 (room 6); 4 -> row 1 (room 2); 1 fits both rows and
    # best fit takes the tighter row 1 (first fit would take row 0)
    assert best_fit_decreasing([7, 4, 4, 1], capacity=10) == [[0], [1, 2, 3]]
    assert best_fit_decreasing([1, 4, 7, 4], capacity=10) == [[2], [0, 1, 3]]
    with pytest.raises(ValueError, match="item 1 has length 11, more than the capacity 10"):
        best_fit_decreasing([3, 11], capacity=10)
    with pytest.raises(ValueError, match="capacity"):
        best_fit_decreasing([1], capacity=0)


def _unpack(packed: SequenceBatch) -> list[tuple[list[int], list[bool]]]:
    """Each packed sequence's tokens and target flags, in row and segment order."""
    tokens, seg = np.asarray(packed.tokens), np.asarray(packed.segment_ids)
    flags = np.pad(np.asarray(packed.completion_mask) > 0, [(0, 0), (1, 0)])
    out = []
    for r in range(tokens.shape[0]):
        for k in range(1, seg[r].max() + 1):
            where = seg[r] == k
            assert np.all(np.diff(np.nonzero(where)[0]) == 1)  # one contiguous run
            out.append((tokens[r, where].tolist(), flags[r, where].tolist()))
    return out


def test_pack_batch_keeps_every_sequence_and_target():
    batch = jax.tree.map(np.asarray, sequences(jax.random.key(0), 12, 6, 7))
    packed = pack_batch(batch, length=20, num_rows=8, pad_id=0)
    assert packed.tokens.shape == (8, 20) and packed.completion_mask.shape == (8, 19)
    real = np.asarray(batch.attention_mask) > 0
    P = 6
    expected = sorted(
        (
            batch.tokens[n, real[n]].tolist(),
            [bool(f) for f in np.pad(batch.completion_mask[n] > 0, (P, 0))[real[n]]],
        )
        for n in range(12)
    )
    assert sorted(_unpack(packed)) == expected
    assert int(np.sum(packed.segment_ids > 0)) == int(real.sum())
    # empty rows at the end: padding only
    rows_used = int(np.sum(packed.segment_ids.max(axis=1) > 0))
    assert np.all(packed.tokens[rows_used:] == 0) and rows_used < 12
    np.testing.assert_array_equal(packed.attention_mask, packed.segment_ids > 0)


def test_pack_batch_errors_name_the_problem():
    batch = jax.tree.map(np.asarray, sequences(jax.random.key(1), 4, 3, 4))
    with pytest.raises(ValueError, match="already packed"):
        pack_batch(pack_batch(batch))
    with pytest.raises(ValueError, match=r"`length` 3: .* more than the capacity 3"):
        pack_batch(batch, length=3)
    with pytest.raises(ValueError, match=r"need .* rows of 7 slots, more than num_rows = 1"):
        pack_batch(batch, num_rows=1)
    holes = batch._replace(attention_mask=batch.attention_mask.copy())
    holes.attention_mask[0, -1] = 0  # row 0's completion is full: its last target is padding
    with pytest.raises(ValueError, match="row 0 has a completion target on a padding slot"):
        pack_batch(holes)
    first = SequenceBatch(np.ones((1, 3), np.int32), np.array([[0, 1, 1]]), np.ones((1, 2)))
    with pytest.raises(ValueError, match="row 0's first real token is a completion target"):
        pack_batch(first)


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_packed_logprobs_equal_the_padded_rows(family):
    """Positions restart and attention stays inside each sequence (Gemma 2: sliding window and
    soft-capping), so every target's log-prob is that of its padded row."""
    model = tiny_policy(family=family)
    batch = jax.tree.map(np.asarray, sequences(jax.random.key(2), 10, 6, 7))
    packed = pack_batch(batch, length=26)
    assert packed.tokens.shape[0] < 10
    logp = np.asarray(jax.jit(lambda b: completion_logprobs(model, b)[0])(batch))
    packed_logp = np.asarray(jax.jit(lambda b: completion_logprobs(model, b)[0])(packed))
    flags = np.pad(packed.completion_mask > 0, [(0, 0), (1, 0)])
    values = np.pad(packed_logp, [(0, 0), (1, 0)])  # [r, s]: the log-prob of tokens[r, s]
    by_tokens = {}
    for r in range(packed.tokens.shape[0]):
        for k in range(1, packed.segment_ids[r].max() + 1):
            where = packed.segment_ids[r] == k
            key = tuple(packed.tokens[r, where].tolist())
            by_tokens[key] = values[r, where & flags[r]]
    real = batch.attention_mask > 0
    assert len(by_tokens) == 10  # the random sequences are distinct
    for n in range(10):
        expected = logp[n][batch.completion_mask[n] > 0]
        np.testing.assert_allclose(
            by_tokens[tuple(batch.tokens[n, real[n]].tolist())], expected, atol=2e-5
        )


# the two structures of `losses.aggregate` (token- and sequence-weighted); every mode's packed
# aggregation is checked against NumPy in tests/losses/test_aggregation.py
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_packed_sft_loss_and_gradient_equal_the_padded_batch(agg):
    graphs, params, frozen = split_models(tiny_policy(layers=UPDATE_LAYERS))
    objective = sft_objective(SFTConfig(agg=agg), graphs)
    batch = sequences(jax.random.key(3), 8, 6, 7)
    packed = jax.tree.map(jnp.asarray, pack_batch(jax.tree.map(np.asarray, batch), length=39))
    assert packed.tokens.shape[0] < 8

    def loss(p, b):
        norms = objective.normalizers(b)
        return objective.loss(p, frozen, b, norms, None)

    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (value, metrics), grad = value_and_grad(params, batch)
    (p_value, p_metrics), p_grad = value_and_grad(params, packed)
    np.testing.assert_allclose(p_value, value, rtol=2e-5)
    np.testing.assert_allclose(p_metrics["sft/nll"], metrics["sft/nll"], rtol=2e-5)
    assert tree_max_abs_diff(p_grad, grad) < 2e-5 * max(1.0, float(jnp.abs(value)))
    counts, p_counts = count_normalizers(batch.completion_mask), objective.normalizers(packed)
    assert float(p_counts.num_seqs) == float(counts.num_seqs) == 8
    assert float(p_counts.num_tokens) == float(counts.num_tokens)


def test_packed_sft_refuses_the_budget_normalised_mode():
    graphs, _, _ = split_models(tiny_policy())
    objective = sft_objective(SFTConfig(agg="seq_mean_token_sum_norm"), graphs)
    packed = pack_batch(jax.tree.map(np.asarray, sequences(jax.random.key(4), 2, 3, 3)))
    with pytest.raises(ValueError, match=r"seq_mean_token_sum_norm.*packed rows"):
        objective.check(packed, 1)
    with pytest.raises(ValueError, match=r"completion_mask` must be \[N, S − 1\]"):
        objective.check(packed._replace(completion_mask=packed.completion_mask[:, 1:]), 1)
