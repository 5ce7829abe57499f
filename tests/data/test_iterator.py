"""Batch order: every epoch a permutation, exact resume from a saved state, host slices."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxrl_llm.data import IteratorState, eval_batches, host_slice, next_batch


def _batches(state, n, *, num_examples, batch_size, shuffle=True):
    out = []
    for _ in range(n):
        idx, state = next_batch(
            state, num_examples=num_examples, batch_size=batch_size, shuffle=shuffle
        )
        out.append(idx)
    return out, state


@pytest.mark.parametrize(("num_examples", "batch_size"), [(10, 3), (7, 7), (5, 12), (13, 1)])
@pytest.mark.parametrize("k", [1, 4, 9])
def test_resume_from_a_saved_state_gives_the_same_batches(num_examples, batch_size, k):
    start = IteratorState(seed=11, epoch=0, position=0)
    uninterrupted, _ = _batches(start, 15, num_examples=num_examples, batch_size=batch_size)
    first, saved = _batches(start, k, num_examples=num_examples, batch_size=batch_size)
    restored = IteratorState.from_dict(json.loads(json.dumps(saved._asdict())))  # a checkpoint
    rest, _ = _batches(restored, 15 - k, num_examples=num_examples, batch_size=batch_size)
    for a, b in zip(uninterrupted, first + rest, strict=True):
        np.testing.assert_array_equal(a, b)


def test_each_epoch_visits_every_example_once_and_orders_differ():
    num_examples, batch_size = 12, 4
    batches, state = _batches(
        IteratorState(0, 0, 0), 9, num_examples=num_examples, batch_size=batch_size
    )
    epochs = np.concatenate(batches).reshape(3, num_examples)
    for order in epochs:
        assert sorted(order.tolist()) == list(range(num_examples))
    assert not np.array_equal(epochs[0], epochs[1])
    assert state == IteratorState(0, 3, 0)


def test_batches_span_epoch_boundaries_and_stay_full():
    batches, state = _batches(IteratorState(2, 0, 0), 4, num_examples=5, batch_size=3)
    assert all(len(b) == 3 for b in batches)
    flat = np.concatenate(batches)  # 12 = two full epochs and 2 examples of the third
    assert sorted(flat[:5].tolist()) == sorted(flat[5:10].tolist()) == list(range(5))
    assert state == IteratorState(2, 2, 2)


def test_order_depends_only_on_the_seed():
    a, _ = _batches(IteratorState(1, 0, 0), 3, num_examples=50, batch_size=8)
    b, _ = _batches(IteratorState(1, 0, 0), 3, num_examples=50, batch_size=8)
    c, _ = _batches(IteratorState(2, 0, 0), 3, num_examples=50, batch_size=8)
    np.testing.assert_array_equal(np.concatenate(a), np.concatenate(b))
    assert not np.array_equal(np.concatenate(a), np.concatenate(c))


def test_without_shuffle_every_epoch_is_file_order():
    batches, _ = _batches(IteratorState(0, 0, 0), 3, num_examples=4, batch_size=3, shuffle=False)
    assert np.concatenate(batches).tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0]


def test_host_slices_partition_the_global_batch():
    idx, _ = next_batch(IteratorState(0, 0, 0), num_examples=100, batch_size=12)
    parts = [host_slice(idx, process_index=i, process_count=4) for i in range(4)]
    np.testing.assert_array_equal(np.concatenate(parts), idx)
    assert all(len(p) == 3 for p in parts)
    np.testing.assert_array_equal(host_slice(idx), idx)  # one process: everything
    with pytest.raises(ValueError, match="must divide evenly over 5 processes"):
        host_slice(idx, process_index=0, process_count=5)
    with pytest.raises(ValueError, match="need 0 <= process_index < process_count"):
        host_slice(idx, process_index=4, process_count=4)


def test_eval_batches_cover_each_example_once():
    batches = eval_batches(10, 4)
    assert all(len(i) == 4 for i, _ in batches)
    valid_idx = np.concatenate([i[v] for i, v in batches])
    assert valid_idx.tolist() == list(range(10))
    assert batches[-1][1].tolist() == [True, True, False, False]
    assert batches[-1][0].tolist() == [8, 9, 0, 0]  # padded with example 0 (documented)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"seed": 0, "epoch": 0}, "expected keys seed, epoch, position"),
        ({"seed": 0, "epoch": 0, "position": -1}, "`position` must be an integer >= 0"),
        ({"seed": 0, "epoch": 1.5, "position": 0}, "`epoch` must be an integer >= 0"),
        ({"seed": "a", "epoch": 0, "position": 0}, "`seed` must be an integer"),
    ],
)
def test_state_from_dict_rejects_bad_states(data, message):
    with pytest.raises(ValueError, match=message):
        IteratorState.from_dict(data)


def test_state_from_dict_accepts_numpy_scalars():
    state = IteratorState.from_dict(
        {"seed": np.int64(3), "epoch": np.int32(1), "position": np.int64(2)}
    )
    assert state == IteratorState(3, 1, 2) and type(state.seed) is int


def test_next_batch_rejects_a_state_from_another_dataset():
    with pytest.raises(ValueError, match="position 9 is outside the dataset of 5 examples"):
        next_batch(IteratorState(0, 0, 9), num_examples=5, batch_size=2)
    with pytest.raises(ValueError, match="`batch_size` must be >= 1"):
        next_batch(IteratorState(0, 0, 0), num_examples=5, batch_size=0)


def test_a_position_at_the_end_of_the_dataset_is_refused():
    """A state's position lies in [0, num_examples): 5 of 5 is outside (a state from a larger
    data set), not the start of a new epoch."""
    with pytest.raises(ValueError, match="state position 5 is outside the dataset"):
        next_batch(IteratorState(0, 0, 5), num_examples=5, batch_size=1)
