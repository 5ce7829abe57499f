"""PAR shaping and reward-model ensembles (ALGORITHMS.md §10.3, §10.6) vs float64 references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.robust_rewards import ENSEMBLE_MODES, ensemble_rewards, par_rewards
from tests.losses.helpers import assert_close

N, R, E = 9, 4, 5

_par = jax.jit(par_rewards)
_ensemble = jax.jit(ensemble_rewards, static_argnames=("mode", "uwo_coef", "robust_weight"))


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_ensemble(r, mode, lam=None, omega=None):
    r = np.asarray(r, np.float64)
    if mode == "mean":
        return r.mean(0)
    if mode == "wco":
        return r.min(0)
    if mode == "uwo":
        return r.mean(0) - lam * r.var(0)
    return omega * r[0] + (1.0 - omega) * r.min(0)


# --------------------------------------------------------------------------------------------------
# par_rewards
# --------------------------------------------------------------------------------------------------


def test_par_rewards_anchor_and_reference():
    assert_close(_par(jnp.array([1.0, -0.5]), jnp.array([0.0, 0.5])), [0.676759, 0.323241])
    rng = np.random.default_rng(0)
    s = rng.normal(size=N).astype(np.float32)
    ref = rng.normal(size=(N, R)).astype(np.float32)
    expected = np_sigmoid(s[:, None].astype(np.float64) - ref).mean(1)
    out = _par(s, ref)
    assert out.shape == (N,) and out.dtype == jnp.float32
    assert_close(out, expected)


def test_par_rewards_bounded_centred_and_shift_invariant():
    rng = np.random.default_rng(1)
    s = (5.0 * rng.normal(size=N)).astype(np.float32)
    ref = (5.0 * rng.normal(size=(N, R))).astype(np.float32)
    out = np.asarray(_par(s, ref))
    assert np.all(out > 0.0) and np.all(out < 1.0)
    assert_close(_par(ref[:, 0], ref[:, :1]), np.full(N, 0.5))  # s = s_ref → 0.5
    assert_close(_par(s + 3.0, ref + 3.0), out)
    # monotone in the score
    assert np.all(np.diff(np.asarray(_par(np.sort(s), ref[:1].repeat(N, 0)))) >= 0)


def test_par_rewards_rejects_bad_shapes():
    with pytest.raises(ValueError, match="ref_scores"):
        par_rewards(jnp.ones(N), jnp.ones((N + 1, R)))
    with pytest.raises(ValueError, match="ref_scores"):
        par_rewards(jnp.ones(N), jnp.ones((N, 0)))
    with pytest.raises(ValueError, match="scores"):
        par_rewards(jnp.ones((N, 1)), jnp.ones(R))


# --------------------------------------------------------------------------------------------------
# ensemble_rewards
# --------------------------------------------------------------------------------------------------


def test_ensemble_rewards_anchor():
    r = jnp.array([[1.0, 0.2], [0.6, 0.4], [0.8, 0.0]])
    assert_close(_ensemble(r), [0.8, 0.2])
    assert_close(_ensemble(r, mode="wco"), [0.6, 0.0])
    assert_close(_ensemble(r, mode="uwo", uwo_coef=0.5), [0.786667, 0.186667])
    assert_close(_ensemble(r, mode="robust", robust_weight=0.25), [0.7, 0.05])


@pytest.mark.parametrize("mode", ENSEMBLE_MODES)
def test_ensemble_rewards_match_reference(mode):
    r = np.random.default_rng(2).normal(size=(E, N)).astype(np.float32)
    kw = {"uwo_coef": 0.7} if mode == "uwo" else {"robust_weight": 0.4} if mode == "robust" else {}
    out = _ensemble(r, mode=mode, **kw)
    assert out.shape == (N,)
    assert_close(out, np_ensemble(r, mode, lam=kw.get("uwo_coef"), omega=kw.get("robust_weight")))


def test_ensemble_orderings_and_single_member():
    rng = np.random.default_rng(3)
    r = rng.uniform(size=(E, 200)).astype(np.float32)  # scores in [0, 1]: λ ≤ 1/(max − min)
    mean = np.asarray(_ensemble(r))
    wco = np.asarray(_ensemble(r, mode="wco"))
    uwo = np.asarray(_ensemble(r, mode="uwo", uwo_coef=1.0))
    robust = np.asarray(_ensemble(r, mode="robust", robust_weight=0.3))
    assert np.all(wco <= uwo + 1e-6) and np.all(uwo <= mean + 1e-6)
    assert np.all(wco <= robust + 1e-6) and np.all(robust <= r[0] + 1e-6)
    # a large λ can fall below the worst case: the ordering needs λ·var ≤ mean − min
    assert np.any(np.asarray(_ensemble(r, mode="uwo", uwo_coef=50.0)) < wco)
    one = r[:1]
    for mode, kw in [
        ("mean", {}),
        ("wco", {}),
        ("uwo", {"uwo_coef": 3.0}),
        ("robust", {"robust_weight": 0.2}),
    ]:
        assert_close(_ensemble(one, mode=mode, **kw), one[0])


def test_ensemble_rewards_no_gradient_and_errors():
    r = np.random.default_rng(4).normal(size=(E, N)).astype(np.float32)
    g = jax.grad(lambda x: jnp.sum(ensemble_rewards(x, mode="uwo", uwo_coef=1.0)))(r)
    assert np.all(np.asarray(g) == 0.0)
    with pytest.raises(ValueError, match="uwo_coef"):
        ensemble_rewards(r, mode="uwo")
    with pytest.raises(ValueError, match="uwo_coef"):
        ensemble_rewards(r, mode="uwo", uwo_coef=-1.0)
    with pytest.raises(ValueError, match="robust_weight"):
        ensemble_rewards(r, mode="robust")
    with pytest.raises(ValueError, match="robust_weight"):
        ensemble_rewards(r, mode="robust", robust_weight=1.5)
    with pytest.raises(ValueError, match="mode"):
        ensemble_rewards(r, mode="max")
    with pytest.raises(ValueError, match="rewards"):
        ensemble_rewards(r[0])
