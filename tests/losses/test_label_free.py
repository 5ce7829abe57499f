"""Majority-vote pseudo-label rewards (ALGORITHMS.md §10.5) against a NumPy reference."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.label_free import majority_vote_rewards

B, G = 7, 6

_vote = jax.jit(majority_vote_rewards)


def np_majority(answers, valid, votes=None, vote_valid=None):
    if votes is None:
        votes, vote_valid = answers, valid
    elif vote_valid is None:
        vote_valid = np.ones(votes.shape, bool)
    out = np.zeros(answers.shape)
    for b in range(answers.shape[0]):
        counts = {}
        order = []
        for v, ok in zip(votes[b], vote_valid[b], strict=True):
            if not ok:
                continue
            if v not in counts:
                order.append(v)
                counts[v] = 0
            counts[v] += 1
        if not counts:
            continue
        best = max(counts.values())
        mode = next(v for v in order if counts[v] == best)  # first occurrence among the tied
        out[b] = (answers[b] == mode) & valid[b]
    return out


def test_majority_vote_anchor():
    a = jnp.array([[3, 5, 3, 9, 5]])
    ok = jnp.array([[True, True, True, False, True]])
    np.testing.assert_array_equal(np.asarray(_vote(a, valid=ok)), [[1, 0, 1, 0, 0]])


def test_majority_vote_matches_reference():
    rng = np.random.default_rng(0)
    answers = rng.integers(0, 3, size=(B, G)).astype(np.int32)
    valid = rng.uniform(size=(B, G)) > 0.25
    valid[0] = False  # no valid voter
    out = _vote(answers, valid=valid)
    assert out.dtype == jnp.float32 and out.shape == (B, G)
    np.testing.assert_array_equal(np.asarray(out), np_majority(answers, valid))
    assert np.all(np.asarray(out)[0] == 0.0)


def test_majority_vote_with_separate_voters():
    rng = np.random.default_rng(1)
    answers = rng.integers(0, 3, size=(B, G)).astype(np.int32)
    valid = rng.uniform(size=(B, G)) > 0.2
    votes = rng.integers(0, 3, size=(B, 4)).astype(np.int32)
    vote_valid = rng.uniform(size=(B, 4)) > 0.2
    out = _vote(answers, valid=valid, vote_ids=votes, vote_valid=vote_valid)
    np.testing.assert_array_equal(np.asarray(out), np_majority(answers, valid, votes, vote_valid))
    # voters that all agree decide the label whatever the group answers
    unanimous = np.full((B, 4), 2, np.int32)
    out = _vote(answers, vote_ids=unanimous)
    np.testing.assert_array_equal(np.asarray(out), (answers == 2).astype(np.float32))


def test_majority_vote_unanimous_group_gets_all_ones():
    a = np.full((B, G), 4, np.int32)
    np.testing.assert_array_equal(np.asarray(_vote(a)), np.ones((B, G)))


def test_majority_vote_is_permutation_equivariant_without_ties():
    rng = np.random.default_rng(2)
    a = np.array([[1, 2, 1, 1, 0, 2], [5, 5, 6, 7, 5, 6]], np.int32)
    out = np.asarray(_vote(a))
    for _ in range(5):
        perm = rng.permutation(G)
        np.testing.assert_array_equal(np.asarray(_vote(a[:, perm])), out[:, perm])


def test_majority_vote_no_gradient_path_and_errors():
    with pytest.raises(ValueError, match="answer_ids"):
        majority_vote_rewards(jnp.ones((B, G)))
    with pytest.raises(ValueError, match="answer_ids"):
        majority_vote_rewards(jnp.ones(G, jnp.int32))
    with pytest.raises(ValueError, match="vote_ids"):
        majority_vote_rewards(jnp.ones((B, G), jnp.int32), vote_ids=jnp.ones((B + 1, 2), jnp.int32))
    with pytest.raises(ValueError, match="vote_valid"):
        majority_vote_rewards(jnp.ones((B, G), jnp.int32), vote_valid=jnp.ones((B, G)))
    with pytest.raises(ValueError, match="valid"):
        majority_vote_rewards(jnp.ones((B, G), jnp.int32), valid=jnp.ones((B, G - 1)))
