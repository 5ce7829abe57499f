"""Filters and the per-step draw against float64 NumPy references and exact distributions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.sampler import draw_tokens, filter_logits, row_uniforms
from tests.sampler.helpers import reference_distribution

V = 11
SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.6),
    dict(temperature=1.3, top_k=4),
    dict(temperature=1.0, top_p=0.7),
    dict(temperature=0.8, min_p=0.15),
    dict(temperature=1.0, top_k=6, top_p=0.8, min_p=0.05),
]


def _logits(rows: int, seed: int = 0) -> np.ndarray:
    return (1.5 * np.random.default_rng(seed).normal(size=(rows, V))).astype(np.float32)


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_filter_keeps_exactly_the_reference_support(setting):
    z = _logits(17, seed=1)
    temperature = setting["temperature"]
    filters = {k: v for k, v in setting.items() if k != "temperature"}
    kept = np.isfinite(np.asarray(filter_logits(jnp.asarray(z / temperature), **filters)))
    want = reference_distribution(z, **setting) > 0
    np.testing.assert_array_equal(kept, want)


@pytest.mark.parametrize("top_k", [1, 2, 3, 5])
def test_each_filter_acts_on_what_the_previous_one_kept_even_with_ties(top_k):
    # small-integer logits tie often, so top-k keeps more than k tokens; top-p must then measure
    # the mass over all of them (as if applied to top-k's output), and min-p after both
    z = jnp.asarray(np.random.default_rng(3).integers(-2, 3, size=(200, V)).astype(np.float32))
    for top_p, min_p in ((0.5, None), (0.85, None), (0.7, 0.3)):
        chained = filter_logits(filter_logits(z, top_k=top_k), top_p=top_p)
        chained = filter_logits(chained, min_p=min_p) if min_p else chained
        joint = filter_logits(z, top_k=top_k, top_p=top_p, min_p=min_p)
        np.testing.assert_array_equal(np.isfinite(joint), np.isfinite(chained))


def test_filter_no_ops_and_bad_rank():
    z = jnp.asarray(_logits(3))
    for kw in (dict(top_k=V), dict(top_k=V + 5), dict(top_p=1.0), dict(min_p=0.0), {}):
        np.testing.assert_array_equal(np.asarray(filter_logits(z, **kw)), np.asarray(z))
    one = np.asarray(filter_logits(z, top_k=1))
    assert (np.isfinite(one).sum(axis=1) == 1).all()
    with pytest.raises(ValueError, match=r"`scaled` must be \[N, V\]"):
        filter_logits(z[0])
    with pytest.raises(ValueError, match="`top_k` must be None or an int >= 1, got 0"):
        filter_logits(z, top_k=0)  # lax.top_k failed with an internal error
    with pytest.raises(ValueError, match="`top_p` must be None or in"):
        filter_logits(z, top_p=0.0)
    with pytest.raises(ValueError, match="`min_p` must be None or in"):
        filter_logits(z, min_p=1.5)


@pytest.mark.parametrize("setting", SETTINGS, ids=str)
def test_draw_matches_the_exact_distribution_and_logprobs(setting):
    """40k draws of one row: frequencies within 5 standard errors; log-probs exact."""
    n = 40_000
    z = _logits(1, seed=2)
    probs = reference_distribution(z, **setting)[0]
    keys = jax.random.split(jax.random.key(3), n)
    uniforms = row_uniforms(keys, 1)[:, 0]
    draw = draw_tokens(jnp.broadcast_to(jnp.asarray(z), (n, V)), uniforms, **setting)
    tokens = np.asarray(draw.tokens)
    freq = np.bincount(tokens, minlength=V) / n
    assert (freq[probs == 0] == 0).all(), (freq, probs)
    np.testing.assert_array_less(np.abs(freq - probs), 5 * np.sqrt(probs * (1 - probs) / n) + 1e-9)

    z64 = z[0].astype(np.float64) / setting["temperature"]
    policy = z64 - np.log(np.exp(z64 - z64.max()).sum()) - z64.max()
    np.testing.assert_allclose(np.asarray(draw.logprobs), policy[tokens], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(draw.sampling_logprobs), np.log(probs[tokens]), rtol=1e-5, atol=1e-6
    )


def test_greedy_draw_is_the_argmax_and_reports_temperature_one_logprobs():
    z = _logits(9, seed=4)
    draw = draw_tokens(jnp.asarray(z), None, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(draw.tokens), z.argmax(axis=1))
    z64 = z.astype(np.float64)
    lse = np.log(np.exp(z64).sum(axis=1))
    np.testing.assert_allclose(np.asarray(draw.logprobs), z64.max(axis=1) - lse, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(draw.sampling_logprobs), 0.0)


def test_inverse_cdf_edges_pick_the_first_and_last_kept_tokens():
    z = jnp.log(jnp.array([[0.25, 0.0, 0.25, 0.5, 0.0]], jnp.float32))  # log 0 = -inf
    tiny, one = np.float32(1e-7), np.float32(1.0)
    tokens = [int(draw_tokens(z, jnp.array([u]), temperature=1.0).tokens[0]) for u in (tiny, one)]
    assert tokens == [0, 3]  # zero-probability tokens 1 and 4 are never chosen
    assert int(draw_tokens(z, jnp.array([np.float32(0.26)]), temperature=1.0).tokens[0]) == 2


def test_a_running_sum_that_rounds_across_removed_tokens_never_draws_them(monkeypatch):
    """XLA's float32 cumsum is not monotone over a large vocabulary: a prefix sum may dip below,
    or rise above, its neighbour's also across tokens of weight 0. Such sums, made here by
    hand, must not make a removed token (weight 0) the draw: the first kept token at or above
    the target is drawn, or the last kept token when rounding leaves none there."""
    z = jnp.log(jnp.array([[0.25, 0.0, 0.25, 0.0, 0.5, 0.0]], jnp.float32))
    exact = jnp.cumsum
    # the weights exp(z − max z) = [0.5, 0, 0.5, 0, 1, 0] sum to [0.5, 0.5, 1, 1, 2, 2]; rounded:
    # a rise at token 1 and a dip at token 2, or a kept token 4 below the removed token 5
    rise_and_dip = jnp.array([0.0, 1e-4, -1e-4, 0.0, 0.0, -5e-5], jnp.float32)
    last_below = jnp.array([0.0, 0.0, 0.0, 0.0, -1e-4, 0.0], jnp.float32)
    cases = [  # (rounding, u, token): the old count of C_v < u·C_V gave 1, 3, 3 and 5
        (rise_and_dip, 0.25005, 2),
        (rise_and_dip, 0.49998, 4),
        (rise_and_dip, 0.49999, 4),
        (rise_and_dip, 0.1, 0),
        (rise_and_dip, 1.0, 4),
        (last_below, 1.0, 4),
    ]
    for rounding, u, token in cases:
        monkeypatch.setattr(jnp, "cumsum", lambda x, axis=None, r=rounding: exact(x, axis) + r)
        draw = draw_tokens(z, jnp.array([np.float32(u)]), temperature=1.0)
        assert int(draw.tokens[0]) == token, (u, int(draw.tokens[0]))
        assert np.isfinite(float(draw.sampling_logprobs[0]))


@pytest.mark.parametrize("setting", [dict(top_k=50), dict(min_p=0.05)], ids=str)
def test_no_removed_token_is_drawn_at_a_real_vocabulary_size(setting):
    """V = 151,936 (Qwen's): every uniform that lands where XLA's running sum dips or rises
    across a removed token (found from the same cumsum) still draws a kept token."""
    vocab, rows = 151_936, 4
    z = 2.0 * jax.random.normal(jax.random.key(0), (rows, vocab))
    filtered = np.asarray(jax.jit(lambda z: filter_logits(z, **setting))(z))
    weights = jnp.exp(filtered - filtered.max(-1, keepdims=True))
    cdf = np.asarray(jax.jit(lambda w: jnp.cumsum(w, axis=-1))(weights), np.float64)
    us, row_of = [], []
    for n in range(rows):  # a uniform inside each interval where the sum is not monotone
        for c in np.nonzero(np.diff(cdf[n]) < 0)[0][:25]:
            us.append(np.float32((cdf[n, c] + cdf[n, c + 1]) / 2 / cdf[n, -1]))
            row_of.append(n)
    assert us, "no rounding dip found: the premise of this test changed (XLA's cumsum)"
    draw = jax.jit(lambda z, u: draw_tokens(z, u, temperature=1.0, **setting))
    for u, n in zip(us, row_of, strict=True):
        uniforms = jnp.full((rows,), 0.5).at[n].set(u)
        token = int(draw(z, uniforms).tokens[n])
        assert np.isfinite(filtered[n, token]), (setting, n, float(u), token)


def test_row_uniforms_are_in_unit_interval_and_depend_only_on_row_key_and_step():
    keys = jax.random.split(jax.random.key(0), 4)
    u = np.asarray(row_uniforms(keys, 6))
    assert u.shape == (4, 6) and (u > 0).all() and (u <= 1).all()
    np.testing.assert_array_equal(np.asarray(row_uniforms(keys[2:3], 9))[0, :6], u[2])
    assert len(np.unique(u)) == u.size


# ------------------------------------------------ exact ties at the cut-offs (mutation testing)
# probabilities [0.5, 0.25, 0.125, 0.125] are exact in float32, so the masses before each token
# (0, 0.5, 0.75, 0.875) and the ratios to the largest (1, 0.5, 0.25, 0.25) hit the bounds exactly

HALVES = jnp.log(jnp.array([[0.5, 0.25, 0.125, 0.125]]))


def _kept(filtered):
    return np.isfinite(np.asarray(filtered)).astype(int).tolist()


def test_top_p_keeps_a_token_only_while_the_mass_before_it_is_below_p():
    def kept(p):
        return _kept(filter_logits(HALVES, top_p=p))

    assert kept(0.5) == [[1, 0, 0, 0]]  # the mass before token 1 is 0.5: not below 0.5
    assert kept(0.75) == [[1, 1, 0, 0]]
    assert kept(0.76) == [[1, 1, 1, 1]]  # token 2 is kept, and token 3 ties with it


def test_min_p_keeps_a_token_at_exactly_min_p_times_the_largest():
    def kept(z, p):
        return _kept(filter_logits(z, min_p=p))

    assert kept(HALVES, 0.5) == [[1, 1, 0, 0]]
    assert kept(HALVES, 0.25) == [[1, 1, 1, 1]]
    # min_p = 1 keeps every token tied with the largest, never none (a NaN draw otherwise)
    assert kept(jnp.array([[1.0, 1.0, 0.0]]), 1.0) == [[1, 1, 0]]
    draw = draw_tokens(jnp.array([[1.0, 1.0, 0.0]]), jnp.array([0.3]), temperature=1.0, min_p=1.0)
    np.testing.assert_allclose(draw.sampling_logprobs, [np.log(0.5)], rtol=1e-6)


def test_the_inverse_cdf_takes_the_first_token_whose_cdf_reaches_u():
    """y = min{v : C_v >= u · C_V}: with 4 equal tokens, u = 0.5 reaches C_1 = 0.5 exactly."""
    flat = jnp.zeros((1, 4))
    picks = [
        int(draw_tokens(flat, jnp.array([u]), temperature=1.0).tokens[0])
        for u in (0.25, 0.26, 0.5, 0.75, 1.0)
    ]
    assert picks == [0, 1, 1, 2, 3]
