"""Prefix-tree values and TEMPO advantages (ALGORITHMS.md §4.16) against float64 NumPy loops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.advantages import group_advantages
from losses.tree_credit import prefix_tree_values, tempo_advantages
from tests.losses.helpers import assert_close, make_mask, plant_nonfinite

B, G, T = 2, 4, 9
N = B * G
EOS = 9

_values = jax.jit(prefix_tree_values, static_argnames="chunk_size")
_tempo = jax.jit(tempo_advantages, static_argnames=("base", "ddof"))


def np_prefix_values(y, m, s):
    """§4.16 with the mask condition of the implementation (equal validity at every u ≤ t)."""
    Bb, Gg, Tt = y.shape
    V = np.zeros((Bb, Gg, Tt))
    for b, i, t in np.ndindex(Bb, Gg, Tt):
        if m[b, i, t] == 0:
            continue
        match = [
            j
            for j in range(Gg)
            if all(y[b, i, u] == y[b, j, u] and m[b, i, u] == m[b, j, u] for u in range(t + 1))
        ]
        V[b, i, t] = np.mean([s[b, j] for j in match])
    return V


def np_td(V, m, s):
    """TD_it = V_it − V at the previous valid position (μ_b before the first)."""
    Bb, Gg, Tt = V.shape
    td = np.zeros(V.shape)
    for b, i in np.ndindex(Bb, Gg):
        prev = s[b].mean()
        for t in range(Tt):
            if m[b, i, t] > 0:
                td[b, i, t] = V[b, i, t] - prev
                prev = V[b, i, t]
    return td


def tree_batch(seed, *, holes=False):
    """Small-vocabulary responses (so prefixes are shared) ending in a unique EOS token."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, T + 1, size=(B, G))
    m = (np.arange(T)[None, None, :] < lengths[..., None]).astype(np.float32)
    y = rng.integers(0, 2, size=(B, G, T)).astype(np.int32)
    y[0, 1] = y[0, 0]  # shared prefixes / an identical pair
    y[0, 2, :4] = y[0, 0, :4]
    lengths[0, 1] = lengths[0, 0]
    m[0, 1] = m[0, 0]
    for b, g in np.ndindex(B, G):
        y[b, g, lengths[b, g] - 1] = EOS
        y[b, g, lengths[b, g] :] = rng.integers(0, 2, size=T - lengths[b, g])  # garbage padding
    if holes:
        m[1, :, 1] = 0.0  # a masked (observation) token inside every response of prompt 1
    s = rng.integers(0, 2, size=(B, G)).astype(np.float32)
    s[0, 1] = s[0, 0]  # identical responses share a reward
    return rng, y, m, s


# --------------------------------------------------------------------------------------------------
# worked example of §4.16
# --------------------------------------------------------------------------------------------------


def test_worked_example_values_and_td():
    a, b, c, d, e, f = range(6)
    y = np.array([[[a, b, c], [a, b, d], [a, e, f]]], np.int32)
    m = np.ones((1, 3, 3), np.float32)
    s = np.array([[1.0, 0.0, 1.0]], np.float32)
    V = _values(y, m, s)
    assert_close(V[0], [[2 / 3, 1 / 2, 1.0], [2 / 3, 1 / 2, 0.0], [2 / 3, 1.0, 1.0]])
    with_td = _tempo(V, s, m, td_weight=1.0, base="none")
    without = _tempo(V, s, m, td_weight=0.0, base="none")
    td = np.asarray(with_td) - np.asarray(without)
    assert_close(td, [[0, -1 / 6, 1 / 2], [0, -1 / 6, -1 / 2], [0, 1 / 3, 0]], atol=1e-6)
    assert_close(without, (s - s.mean()).reshape(3, 1) * np.ones((3, 3)))


# --------------------------------------------------------------------------------------------------
# prefix_tree_values
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("holes", [False, True])
def test_prefix_values_match_reference_in_every_chunking(holes):
    _, y, m, s = tree_batch(0, holes=holes)
    expected = np_prefix_values(y, m, s)
    for chunk in (None, 4):  # 9 positions: one chunk, or three chunks with padding
        out = _values(y, m, s, chunk_size=chunk)
        assert out.dtype == jnp.float32 and out.shape == (B, G, T)
        assert_close(out, expected)
    # the [N,T] mask layout is accepted too
    assert_close(_values(y, m.reshape(N, T), s, chunk_size=4), expected)


def test_prefix_values_at_the_last_token_are_the_own_reward():
    _, y, m, s = tree_batch(1)
    V = np.asarray(_values(y, m, s, chunk_size=4))
    lengths = m.sum(-1).astype(int)
    last = V[np.arange(B)[:, None], np.arange(G)[None, :], lengths - 1]
    assert_close(last, s)


# --------------------------------------------------------------------------------------------------
# tempo_advantages
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("holes", [False, True])
def test_tempo_matches_reference_and_td_telescopes(holes):
    rng, y, m, s = tree_batch(2, holes=holes)
    V = np.asarray(_values(y, m, s, chunk_size=4))
    V_dirty = plant_nonfinite(V, m, rng)
    out = _tempo(V_dirty, s, m, td_weight=0.5, base="group")
    a = np.asarray(group_advantages(s)).reshape(B, G, 1)
    td = np_td(V, m, s)
    expected = np.where(m > 0, a + 0.5 * td, 0.0).reshape(N, T)
    assert out.shape == (N, T)
    assert_close(out, expected)
    # Σ_t TD_it = s_i − μ_b (identical responses share a reward, EOS makes no prefix a response)
    assert_close(td.sum(-1), s - s.mean(1, keepdims=True), atol=1e-5)


def test_identical_responses_give_zero_td_and_grpo():
    rng = np.random.default_rng(3)
    y = np.broadcast_to(rng.integers(0, 5, size=(B, 1, T)), (B, G, T)).astype(np.int32)
    m = np.broadcast_to(make_mask(rng, B, T, empty_row=False)[:, None, :], (B, G, T))
    s = rng.normal(size=(B, G)).astype(np.float32)  # different rewards, identical responses
    V = _values(y, m, s, chunk_size=4)
    assert_close(V, np.where(m > 0, s.mean(1)[:, None, None], 0.0))
    out = _tempo(V, s, m, td_weight=1.0, base="group")
    grpo = np.asarray(group_advantages(s)).reshape(N, 1) * m.reshape(N, T)
    assert_close(out, grpo)


def test_tempo_accepts_flat_values():
    _, y, m, s = tree_batch(4)
    V = _values(y, m, s, chunk_size=4)
    a = _tempo(V, s, m, td_weight=1.0, base="none")
    b = _tempo(np.asarray(V).reshape(N, T), s, m.reshape(N, T), td_weight=1.0, base="none")
    assert_close(a, np.asarray(b, np.float64))


# --------------------------------------------------------------------------------------------------
# bad inputs
# --------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    y = np.zeros((2, 3, 4), np.int32)
    m = np.ones((2, 3, 4))
    s = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="prefix_tree_values: `tokens` must have rank 3"):
        prefix_tree_values(y[0], m, s)
    with pytest.raises(ValueError, match="prefix_tree_values: `tokens` must be an integer"):
        prefix_tree_values(y.astype(np.float32), m, s)
    with pytest.raises(ValueError, match=r"`rewards` must have shape \(B, G\) = \(2, 3\)"):
        prefix_tree_values(y, m, s[:, :2])
    with pytest.raises(ValueError, match=r"prefix_tree_values: `mask` must have shape \(2, 3, 4\)"):
        prefix_tree_values(y, m[:, :, :2], s)
    with pytest.raises(ValueError, match="`chunk_size` must be a positive Python int or None"):
        prefix_tree_values(y, m, s, chunk_size=0)
    with pytest.raises(ValueError, match="tempo_advantages: `values` must have shape"):
        tempo_advantages(np.zeros((5, 4)), s, m)
    with pytest.raises(ValueError, match="tempo_advantages: `base` must be one of"):
        tempo_advantages(np.zeros((6, 4)), s, m, base="tree")
    with pytest.raises(ValueError, match="tempo_advantages: `td_weight` must be a scalar"):
        tempo_advantages(np.zeros((6, 4)), s, m, td_weight=np.ones(2))
