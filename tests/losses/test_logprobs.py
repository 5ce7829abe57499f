"""Log-probs, entropies and alignment (ALGORITHMS.md §0.3, §2) against float64 NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.logprobs import (
    completion_logits,
    entropy_from_logits,
    log_sum_pi_squared,
    self_certainty,
    sequence_logprob,
    token_logprobs,
)
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask

N, T, V = 7, 11, 13


def jcall(fn, *args, **kwargs):
    """`fn(*args, **kwargs)` under `jax.jit` (arrays traced, keywords closed over)."""
    return jax.jit(lambda *a: fn(*a, **kwargs))(*args)


def jgrad(scalar_fn, x):
    """`jax.grad(scalar_fn)(x)` under `jax.jit`."""
    return jax.jit(jax.grad(scalar_fn))(x)


# --------------------------------------------------------------------------------------------------
# float64 references, written from the formulas
# --------------------------------------------------------------------------------------------------


def np_log_softmax(z: np.ndarray, tau: float = 1.0) -> np.ndarray:
    z = np.asarray(z, np.float64) / tau
    top = z.max(-1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(-1, keepdims=True))


def np_token_logprobs(z, y, tau=1.0):
    return np.take_along_axis(np_log_softmax(z, tau), np.asarray(y)[..., None], -1)[..., 0]


def np_entropy(z, tau=1.0):
    logp = np_log_softmax(z, tau)
    return -(np.exp(logp) * logp).sum(-1)


def np_log_sum_pi_squared(z, tau=1.0):
    return np.log((np.exp(np_log_softmax(z, tau)) ** 2).sum(-1))


def np_self_certainty(z, m, tau=1.0):
    logp = np_log_softmax(z, tau)
    kl = -np.log(z.shape[-1]) - logp.mean(-1)  # KL(U‖p) per token
    kl = np.where(m > 0, kl, 0.0)
    return kl.sum(1) / np.maximum(m.sum(1), 1.0)


def _data(seed: int = 0, scale: float = 3.0):
    rng = np.random.default_rng(seed)
    z = (scale * rng.normal(size=(N, T, V))).astype(np.float32)
    y = rng.integers(0, V, size=(N, T))
    m = make_mask(rng, N, T)
    return rng, z, y, m


def _plant_rows(z: np.ndarray, m: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """NaN/±inf in every logit of the positions outside the mask."""
    z = np.array(z, copy=True)
    bad = np.array([np.nan, np.inf, -np.inf], np.float32)
    rows = np.argwhere(m == 0)
    for n, t in rows:
        z[n, t] = bad[rng.integers(0, 3, size=z.shape[-1])]
    return z


def _assert_logits_nan_safe(fn, z, m, rng, weights):
    """`Σ w·fn(z)` (value and gradient) unchanged by NaN/inf logits outside the mask."""

    def scalar(zz):
        return jnp.sum(fn(zz) * weights)

    g = jax.jit(jax.value_and_grad(scalar))
    v0, g0 = g(jnp.asarray(z))
    v1, g1 = g(jnp.asarray(_plant_rows(z, m, rng)))
    assert np.isfinite(float(v1))
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-6, atol=1e-7)
    g1 = np.asarray(g1)
    assert np.all(np.isfinite(g1)), "gradient is not finite with NaN/inf logits off-mask"
    np.testing.assert_allclose(g1, np.asarray(g0), rtol=1e-6, atol=1e-7)
    assert np.all(g1[m == 0] == 0), "gradient leaks outside the mask"


# --------------------------------------------------------------------------------------------------
# token_logprobs
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_token_logprobs_matches_reference_and_gradient(tau):
    rng, z, y, _ = _data(0)
    w = rng.normal(size=(N, T)).astype(np.float32)
    f = jax.jit(lambda zz: token_logprobs(zz, y, temperature=tau))
    lp = f(z)
    assert lp.dtype == jnp.float32 and lp.shape == (N, T)
    assert_close(lp, np_token_logprobs(z, y, tau))
    # a chunk longer than T is one chunk
    assert_close(jcall(token_logprobs, z, y, temperature=tau, chunk_size=32), np.asarray(lp))
    # ∂(Σ w·lp)/∂z = w·(onehot(y) − softmax(z/τ))/τ
    grad = jax.jit(jax.grad(lambda zz: jnp.sum(token_logprobs(zz, y, temperature=tau) * w)))(z)
    p = np.exp(np_log_softmax(z, tau))
    onehot = np.eye(V)[y]
    assert_close(grad, w[..., None] * (onehot - p) / tau)


def test_temperature_two_is_log_softmax_of_half_the_logits():
    _, z, y, _ = _data(1)
    lp = jcall(token_logprobs, z, y, temperature=2.0)
    assert_close(lp, np_take(np_log_softmax(z / 2.0), y))
    assert_close(lp, jcall(token_logprobs, z / 2.0, y))
    # a traced temperature gives the same
    assert_close(jax.jit(lambda t: token_logprobs(z, y, temperature=t))(2.0), lp)


def np_take(logp, y):
    return np.take_along_axis(logp, y[..., None], -1)[..., 0]


def test_off_by_one_detector_with_completion_logits():
    """Logits that put a large one-hot on tokens[s+1] at position s (§0.3, §2.1)."""
    rng = np.random.default_rng(2)
    P, Tc = 5, 7
    S = P + Tc + 1  # one spare position so that the late alignment still reads one-hot logits
    # consecutive tokens always differ, so a shifted alignment scores the wrong token
    tokens = np.cumsum(rng.integers(1, V, size=(N, S)), axis=1) % V
    logits = np.zeros((N, S, V), np.float32)
    logits[:, :-1] = 30.0 * np.eye(V, dtype=np.float32)[tokens[:, 1:]]
    targets = tokens[:, P : P + Tc]
    lp = jax.jit(lambda z: token_logprobs(completion_logits(z, P, Tc), targets))(logits)
    assert lp.shape == (N, Tc)
    assert np.all(np.asarray(lp) > -1e-6)
    # one position late or early: every token is scored by the wrong logits
    late = jcall(token_logprobs, logits[:, P : P + Tc], targets)
    early = jcall(token_logprobs, logits[:, P - 2 : P - 2 + Tc], targets)
    assert np.all(np.asarray(late) < -20.0)
    assert np.all(np.asarray(early) < -20.0)


def test_completion_logits_slices_and_validates():
    z = np.arange(2 * 9 * 3, dtype=np.float32).reshape(2, 9, 3)
    np.testing.assert_array_equal(completion_logits(z, 4, 5), z[:, 3:8])
    np.testing.assert_array_equal(completion_logits(z, 1, 9), z)  # P − 1 + T = S is allowed
    assert completion_logits(jnp.asarray(z, jnp.bfloat16), 2, 3).dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="`P` must be >= 1"):
        completion_logits(z, 0, 3)
    with pytest.raises(ValueError, match=r"`P − 1 \+ T` must be <= S = 9"):
        completion_logits(z, 4, 7)
    with pytest.raises(ValueError, match="`T` must be a static Python int"):
        completion_logits(z, 2, 3.0)
    with pytest.raises(ValueError, match="`logits` must have rank 3"):
        completion_logits(z[0], 2, 3)


@pytest.mark.parametrize("chunk", [1, 4])
def test_chunked_equals_unchunked_values_and_gradients(chunk):
    """Chunk sizes that divide T=11 (1) and that do not (4; masked variants: see the NaN tests)."""
    rng, z, y, m = _data(3)
    w = rng.normal(size=(N, T)).astype(np.float32)
    fns = (
        lambda zz, c: token_logprobs(zz, y, temperature=0.9, chunk_size=c),
        lambda zz, c: entropy_from_logits(zz, temperature=0.9, chunk_size=c),
        lambda zz, c: log_sum_pi_squared(zz, chunk_size=c),
        lambda zz, c: self_certainty(zz, m, chunk_size=c)[:, None] * w,
    )

    def values_and_grads(zz, c):
        values = tuple(fn(zz, c) for fn in fns)
        grads = tuple(jax.grad(lambda x, fn=fn: jnp.sum(fn(x, c) * w))(zz) for fn in fns)
        return values, grads

    full = jax.jit(lambda zz: values_and_grads(zz, None))(z)
    part = jax.jit(lambda zz: values_and_grads(zz, chunk))(z)
    for a, b in zip(jax.tree.leaves(part), jax.tree.leaves(full), strict=True):
        assert_close(a, np.asarray(b, np.float64))


def test_bf16_logits_are_upcast():
    _, z, y, _ = _data(4)
    zb = jnp.asarray(z, jnp.bfloat16)
    z_up = np.asarray(zb.astype(jnp.float32))
    for c in (None, 4):
        lp = jcall(token_logprobs, zb, y, chunk_size=c)
        assert lp.dtype == jnp.float32
        assert_close(lp, np_token_logprobs(z_up, y))
        h = jcall(entropy_from_logits, zb, chunk_size=c)
        assert h.dtype == jnp.float32
        assert_close(h, np_entropy(z_up))
    g = jgrad(lambda zz: jnp.sum(token_logprobs(zz, y, chunk_size=4)), zb)
    assert g.dtype == jnp.bfloat16


def test_token_logprobs_mask_and_out_of_range_targets():
    rng, z, y, m = _data(5)
    w = rng.normal(size=(N, T)).astype(np.float32)
    lp = jcall(token_logprobs, z, y, mask=m)
    assert_close(lp, np.where(m > 0, np_token_logprobs(z, y), 0.0))
    for c in (None, 4):
        _assert_logits_nan_safe(
            lambda zz, c=c: token_logprobs(zz, y, chunk_size=c, mask=m), z, m, rng, w
        )
    # an ignore index (−100) or an id ≥ V gives NaN, unless masked
    y_bad = np.where(m > 0, y, -100)
    y_bad[1, 0] = V
    out = np.asarray(jcall(token_logprobs, z, y_bad))
    assert np.isnan(out[1, 0]) and np.all(np.isnan(out[m == 0]))
    valid = (m > 0) & (y_bad >= 0) & (y_bad < V)
    assert_close(out[valid], np_token_logprobs(z, y)[valid])
    masked = np.asarray(jcall(token_logprobs, z, y_bad, mask=m))
    assert np.all(masked[m == 0] == 0.0)


def test_token_logprobs_bad_input():
    _, z, y, _ = _data(6)
    with pytest.raises(ValueError, match="`targets` must be an integer array"):
        token_logprobs(z, y.astype(np.float32))
    with pytest.raises(ValueError, match=r"`targets` must have shape \(7, 11\)"):
        token_logprobs(z, y[:, :5])
    with pytest.raises(ValueError, match="`logits` must have rank 3"):
        token_logprobs(z[0], y)
    with pytest.raises(ValueError, match="`logits` must be a floating-point array"):
        token_logprobs(z.astype(np.int32), y)
    with pytest.raises(ValueError, match="`temperature` must be > 0"):
        token_logprobs(z, y, temperature=0.0)
    with pytest.raises(ValueError, match="`chunk_size` must be >= 1"):
        token_logprobs(z, y, chunk_size=0)
    with pytest.raises(ValueError, match="`chunk_size` must be a positive Python int"):
        token_logprobs(z, y, chunk_size=2.5)
    with pytest.raises(ValueError, match="`mask` must have shape"):
        token_logprobs(z, y, mask=np.ones((N, T + 1)))


# --------------------------------------------------------------------------------------------------
# entropy, log Σ π², self-certainty
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [1.0, 1.3])
def test_entropy_matches_reference_and_gradient(tau):
    rng, z, _, _ = _data(7)
    w = rng.normal(size=(N, T)).astype(np.float32)
    h = jax.jit(lambda zz: entropy_from_logits(zz, temperature=tau))(z)
    assert_close(h, np_entropy(z, tau))
    # ∂H/∂z_j = −p_j (z'_j − Σ_v p_v z'_v)/τ
    grad = jax.jit(jax.grad(lambda zz: jnp.sum(entropy_from_logits(zz, temperature=tau) * w)))(z)
    zs = z.astype(np.float64) / tau
    p = np.exp(np_log_softmax(z, tau))
    expected = -p * (zs - (p * zs).sum(-1, keepdims=True)) / tau
    assert_close(grad, w[..., None] * expected)


def test_entropy_limits_and_shift_invariance():
    _, z, _, m = _data(8)
    assert_close(
        jcall(entropy_from_logits, np.zeros((2, 3, V), np.float32)), np.full((2, 3), np.log(V))
    )
    one_hot = 50.0 * np.eye(V, dtype=np.float32)[np.arange(6) % V].reshape(2, 3, V)
    h = np.asarray(jcall(entropy_from_logits, one_hot))
    assert np.all(h >= 0) and np.all(h < 1e-6)
    shift = np.random.default_rng(0).uniform(-5, 5, size=(N, T, 1)).astype(np.float32)
    assert_close(
        jcall(entropy_from_logits, z + shift),
        np.asarray(jcall(entropy_from_logits, z), np.float64),
        atol=1e-5,
    )
    # a −inf logit (masked vocabulary entry) contributes 0, with a finite gradient
    z_inf = z.copy()
    z_inf[..., 0] = -np.inf
    h_inf = jcall(entropy_from_logits, z_inf)
    assert_close(h_inf, np_entropy(z[..., 1:]))
    g = jgrad(lambda zz: jnp.sum(entropy_from_logits(zz)), z_inf)
    assert np.all(np.isfinite(np.asarray(g)))
    # with a mask: NaN logits off-mask reach neither values nor gradients
    w = np.ones((N, T), np.float32)
    _assert_logits_nan_safe(
        lambda zz: entropy_from_logits(zz, mask=m, chunk_size=3), z, m, np.random.default_rng(1), w
    )


def test_log_sum_pi_squared():
    rng, z, _, m = _data(9)
    assert_close(
        jax.jit(lambda zz: log_sum_pi_squared(zz, temperature=0.8))(z),
        np_log_sum_pi_squared(z, 0.8),
    )
    assert_close(
        jcall(log_sum_pi_squared, np.zeros((1, 2, V), np.float32)), np.full((1, 2), -np.log(V))
    )
    one_hot = 60.0 * np.eye(V, dtype=np.float32)[None, :3]
    assert_close(jcall(log_sum_pi_squared, one_hot), np.zeros((1, 3)))
    out = np.asarray(jcall(log_sum_pi_squared, z))
    assert np.all(out <= 1e-6) and np.all(out >= -np.log(V) - 1e-5)
    # gradient: ∂/∂z_j log Σπ² = 2π_j(π_j/Σπ² − 1)
    w = rng.normal(size=(N, T)).astype(np.float32)
    g = jgrad(lambda zz: jnp.sum(log_sum_pi_squared(zz) * w), z)
    p = np.exp(np_log_softmax(z))
    s2 = (p**2).sum(-1, keepdims=True)
    assert_close(g, w[..., None] * 2 * p * (p / s2 - 1))
    _assert_logits_nan_safe(lambda zz: log_sum_pi_squared(zz, mask=m), z, m, rng, w)


def test_self_certainty():
    rng, z, _, m = _data(10)
    sc = jax.jit(lambda zz, mm: self_certainty(zz, mm, temperature=1.2))(z, m)
    assert sc.shape == (N,)
    assert_close(sc, np_self_certainty(z, m, 1.2))
    assert float(sc[0]) == 0.0  # the empty row
    assert np.all(np.asarray(jcall(self_certainty, z, m)) >= 0)
    assert_close(
        jcall(self_certainty, np.zeros((3, 5, V), np.float32), np.ones((3, 5))), np.zeros(3)
    )
    # gradient: ∂KL(U‖p)/∂z_j = (p_j − 1/V)·m/L per row
    g = jgrad(lambda zz: jnp.sum(self_certainty(zz, m)), z)
    p = np.exp(np_log_softmax(z))
    per_row = m / np.maximum(m.sum(1, keepdims=True), 1.0)
    assert_close(g, per_row[..., None] * (p - 1.0 / V))
    _assert_logits_nan_safe(lambda zz: jnp.sum(self_certainty(zz, m, chunk_size=4)), z, m, rng, 1.0)
    with pytest.raises(ValueError, match="`mask` must have shape"):
        self_certainty(z, m[:, :3])


# --------------------------------------------------------------------------------------------------
# sequence_logprob
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_sequence_logprob(reduce):
    rng = np.random.default_rng(11)
    lp = -rng.uniform(0.1, 4.0, size=(N, T)).astype(np.float32)
    m = make_mask(rng, N, T)
    expected = (lp * m).sum(1)
    if reduce == "mean":
        expected = expected / np.maximum(m.sum(1), 1.0)
    out = jax.jit(lambda a, b: sequence_logprob(a, b, reduce=reduce))(lp, m)
    assert out.shape == (N,) and float(out[0]) == 0.0
    assert_close(out, expected)
    w = rng.normal(size=(N,)).astype(np.float32)
    assert_nan_safe(
        lambda a, b: jnp.sum(sequence_logprob(a, b, reduce=reduce) * w),
        (lp, m),
        m,
        rng,
        planted=(0,),
    )
    # gradient: w_n·m_nt (sum) or w_n·m_nt/L_n (mean)
    g = jgrad(lambda a: jnp.sum(sequence_logprob(a, m, reduce=reduce) * w), lp)
    scale = 1.0 if reduce == "sum" else 1.0 / np.maximum(m.sum(1, keepdims=True), 1.0)
    assert_close(g, w[:, None] * m * scale)


def test_sequence_logprob_bad_input():
    with pytest.raises(ValueError, match="`reduce` must be one of"):
        sequence_logprob(np.zeros((2, 3)), np.ones((2, 3)), reduce="max")
    with pytest.raises(ValueError, match="`token_logp` must have rank 2"):
        sequence_logprob(np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match="`token_logp` must be a floating-point array"):
        sequence_logprob(np.zeros((2, 3), np.int32), np.ones((2, 3)))
