"""`kto_loss`, `kto_reference_point`, `bco_loss` (ALGORITHMS.md §8.5, §8.6) against float64 NumPy."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from losses.dpo import dpo_loss
from losses.kto import bco_loss, kto_loss, kto_reference_point
from losses.value import init_running_moments, running_moments_update
from tests.losses.helpers import assert_close, assert_nan_safe, plant_nonfinite

ND, NU = 11, 7


def sig(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def nls(x):
    return np.logaddexp(0.0, -np.asarray(x, np.float64))


def fd_grad(f, x, h=1e-6):
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for i in range(x.size):
        up, dn = x.copy(), x.copy()
        up[i] += h
        dn[i] -= h
        g[i] = (f(up) - f(dn)) / (2 * h)
    return g


def unpaired_batch(seed):
    rng = np.random.default_rng(seed)
    pd = -rng.uniform(2.0, 12.0, ND).astype(np.float32)
    pu = -rng.uniform(2.0, 12.0, NU).astype(np.float32)
    rd = (pd + rng.normal(0.0, 3.0, ND)).astype(np.float32)
    ru = (pu + rng.normal(0.0, 3.0, NU)).astype(np.float32)
    vd = rng.uniform(size=ND) > 0.25
    vu = rng.uniform(size=NU) > 0.25
    vd[:2] = [True, False]
    vu[:2] = [True, False]
    return rng, pd, pu, rd, ru, vd, vu


def np_kto(pd, pu, rd, ru, vd, vu, *, z, beta, wd, wu, kind="kto", den=None):
    lr_d = (np.asarray(pd, np.float64) - rd)[vd]
    lr_u = (np.asarray(pu, np.float64) - ru)[vu]
    if kind == "kto":
        ld = wd * (1 - sig(beta * (lr_d - z)))
        lu = wu * (1 - sig(beta * (z - lr_u)))
    else:
        ld = wd * (1 - sig(beta * lr_d))
        lu = wu * sig(beta * lr_u)
    den = den if den is not None else max(vd.sum() + vu.sum(), 1)
    return (ld.sum() + lu.sum()) / den


def test_kto_anchor():
    loss, _ = kto_loss(
        np.array([0.5, 0.2], np.float32),
        np.array([-0.3], np.float32),
        np.zeros(2, np.float32),
        np.zeros(1, np.float32),
        kl=0.1,
    )
    assert_close(loss, 0.492501)


@pytest.mark.parametrize("kind", ["kto", "apo_zero_unpaired"])
def test_kto_matches_reference_and_gradient(kind):
    rng, pd, pu, rd, ru, vd, vu = unpaired_batch(1 if kind == "kto" else 2)
    z, beta, wd, wu = 0.7, 0.2, 1.0, 1.33

    def fn(pd, pu, rd, ru):
        return kto_loss(
            pd,
            pu,
            rd,
            ru,
            kl=z,
            beta=beta,
            desirable_weight=wd,
            undesirable_weight=wu,
            loss_type=kind,
            chosen_valid=vd,
            rejected_valid=vu,
        )

    dirty = [plant_nonfinite(x, v, rng) for x, v in ((pd, vd), (pu, vu), (rd, vd), (ru, vu))]
    (loss, m), (g_d, g_u) = jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(*dirty)

    def ref(a, b):
        return np_kto(a, b, rd, ru, vd, vu, z=z, beta=beta, wd=wd, wu=wu, kind=kind)

    assert_close(loss, ref(pd, pu))
    assert_close(g_d, fd_grad(lambda x: ref(x, pu), pd), rtol=1e-4, atol=1e-7)
    assert_close(g_u, fd_grad(lambda x: ref(pd, x), pu), rtol=1e-4, atol=1e-7)
    assert np.all(np.asarray(g_d)[vd] < 0) and np.all(np.asarray(g_u)[vu] > 0)
    lr_d = (pd.astype(np.float64) - rd)[vd]
    lr_u = (pu.astype(np.float64) - ru)[vu]
    assert_close(m["pref/reward_chosen"], beta * lr_d.mean(), atol=1e-5)
    assert_close(m["pref/reward_rejected"], beta * lr_u.mean(), atol=1e-5)
    point = z if kind == "kto" else 0.0
    right = (lr_d > point).sum() + (lr_u < point).sum()
    assert_close(m["pref/accuracy"], right / (vd.sum() + vu.sum()))
    assert_close(m["pref/kl"], z)


def test_kto_num_examples_and_nan_safety():
    rng, pd, pu, rd, ru, vd, vu = unpaired_batch(3)
    loss, _ = kto_loss(
        pd, pu, rd, ru, kl=0.2, chosen_valid=vd, rejected_valid=vu, num_examples=64.0
    )
    assert_close(loss, np_kto(pd, pu, rd, ru, vd, vu, z=0.2, beta=0.1, wd=1, wu=1, den=64.0))
    # the two sides have their own masks: plant NaN in each side separately
    assert_nan_safe(
        lambda a, b: kto_loss(a, pu, b, ru, kl=0.2, chosen_valid=vd, rejected_valid=vu),
        (pd, rd),
        vd.astype(np.float32),
        rng,
    )
    assert_nan_safe(
        lambda a, b: kto_loss(pd, a, rd, b, kl=0.2, chosen_valid=vd, rejected_valid=vu),
        (pu, ru),
        vu.astype(np.float32),
        rng,
    )


def test_kto_reference_point():
    rng = np.random.default_rng(4)
    lp = -rng.uniform(2.0, 10.0, 16).astype(np.float32)
    ref = (lp - rng.uniform(0.0, 1.0, 16)).astype(np.float32)  # positive mean log-ratio
    valid = rng.uniform(size=16) > 0.3
    z = jax.jit(kto_reference_point)(plant_nonfinite(lp, valid, rng), ref, valid=valid)
    assert_close(z, (lp.astype(np.float64) - ref)[valid].mean())
    assert float(kto_reference_point(ref, lp)) == 0.0  # negative mean: clamped at 0
    g = jax.grad(lambda x: kto_reference_point(x, ref))(lp)
    assert np.all(np.asarray(g) == 0)  # no gradient through the reference point
    # kl carries no gradient inside the loss either
    g = jax.grad(lambda k: kto_loss(lp[:4], lp[4:6], ref[:4], ref[4:6], kl=k)[0])(0.3)
    assert float(g) == 0.0


def test_apo_zero_unpaired_ignores_kl():
    _, pd, pu, rd, ru, _, _ = unpaired_batch(5)
    a, _ = kto_loss(pd, pu, rd, ru, kl=None, loss_type="apo_zero_unpaired")
    b, m = kto_loss(pd, pu, rd, ru, kl=3.0, loss_type="apo_zero_unpaired")
    assert_close(a, float(b))
    assert_close(m["pref/kl"], 3.0)


# --------------------------------------------------------------------------------------------------
# BCO
# --------------------------------------------------------------------------------------------------


def np_bco(pd, pu, rd, ru, vd, vu, beta, delta):
    xd = beta * (np.asarray(pd, np.float64) - rd)[vd] - delta
    xu = beta * (np.asarray(pu, np.float64) - ru)[vu] - delta
    return nls(xd).mean() + nls(-xu).mean()


def test_bco_matches_reference_and_gradient():
    rng, pd, pu, rd, ru, vd, vu = unpaired_batch(6)
    beta, delta = 0.3, 0.25

    def fn(pd, pu, rd, ru):
        return bco_loss(pd, pu, rd, ru, beta=beta, delta=delta, chosen_valid=vd, rejected_valid=vu)

    dirty = [plant_nonfinite(x, v, rng) for x, v in ((pd, vd), (pu, vu), (rd, vd), (ru, vu))]
    (loss, m), (g_d, g_u) = jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))(*dirty)

    def ref(a, b):
        return np_bco(a, b, rd, ru, vd, vu, beta, delta)

    assert_close(loss, ref(pd, pu))
    assert_close(g_d, fd_grad(lambda x: ref(x, pu), pd), rtol=1e-4, atol=1e-7)
    assert_close(g_u, fd_grad(lambda x: ref(pd, x), pu), rtol=1e-4, atol=1e-7)
    xd = beta * (pd.astype(np.float64) - rd)[vd] - delta
    xu = beta * (pu.astype(np.float64) - ru)[vu] - delta
    assert_close(m["pref/accuracy"], ((xd > 0).sum() + (xu < 0).sum()) / (vd.sum() + vu.sum()))
    assert_close(m["pref/delta"], delta)


def test_bco_without_shift_is_dpo_bco_pair_and_delta_from_running_moments():
    rng = np.random.default_rng(7)
    pc, pr = -rng.uniform(2, 9, 9).astype(np.float32), -rng.uniform(2, 9, 9).astype(np.float32)
    rc, rr = (
        (pc + rng.normal(size=9)).astype(np.float32),
        (pr + rng.normal(size=9)).astype(np.float32),
    )
    a, _ = bco_loss(pc, pr, rc, rr, beta=0.2)
    b, _ = dpo_loss(pc, pr, rc, rr, beta=0.2, loss_type="bco_pair")
    assert_close(a, float(b))
    # δ = running mean of the rewards β·lr (state updated with this batch first)
    rewards = np.concatenate([0.2 * (pc - rc), 0.2 * (pr - rr)])
    state = running_moments_update(init_running_moments(), rewards)
    loss, _ = bco_loss(pc, pr, rc, rr, beta=0.2, delta=state.mean)
    v = np.ones(9, bool)
    assert_close(loss, np_bco(pc, pr, rc, rr, v, v, 0.2, rewards.astype(np.float64).mean()))


x3 = np.zeros(3, np.float32)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="needs the reference point `kl`"):
        kto_loss(x3, x3, x3, x3, kl=None)
    with pytest.raises(ValueError, match="`loss_type` must be one of"):
        kto_loss(x3, x3, x3, x3, kl=0.0, loss_type="apo_zero")
    with pytest.raises(ValueError, match="`kl` must be a scalar"):
        kto_loss(x3, x3, x3, x3, kl=np.zeros(3))
    with pytest.raises(
        ValueError, match="`beta` must be a scalar \\(the two sides are unpaired\\)"
    ):
        kto_loss(x3, x3, x3, x3, kl=0.0, beta=np.ones(3))
    with pytest.raises(ValueError, match="`undesirable_weight` must be >= 0"):
        kto_loss(x3, x3, x3, x3, kl=0.0, undesirable_weight=-1.0)
    with pytest.raises(ValueError, match="`ref_rejected_logp` must have shape \\(2,\\)"):
        kto_loss(x3, x3[:2], x3, x3, kl=0.0)
    with pytest.raises(ValueError, match="`chosen_valid` must have shape"):
        kto_loss(x3, x3, x3, x3, kl=0.0, chosen_valid=np.ones(2))
    with pytest.raises(ValueError, match="`num_examples` must be a finite number >= 0"):
        kto_loss(x3, x3, x3, x3, kl=0.0, num_examples=-1)
    none = np.zeros(3, np.float32)  # a micro-batch without valid examples: 0, not inf
    loss = kto_loss(x3, x3, x3, x3, kl=0.0, chosen_valid=none, rejected_valid=none, num_examples=0)
    assert float(loss[0]) == 0.0
    with pytest.raises(ValueError, match="`delta` must be a scalar"):
        bco_loss(x3, x3, x3, x3, delta=np.zeros(3))
    with pytest.raises(ValueError, match="`beta` must be > 0"):
        bco_loss(x3, x3, x3, x3, beta=-1.0)
    with pytest.raises(ValueError, match="`kl_logp` must have rank 1"):
        kto_reference_point(np.zeros((2, 2)), np.zeros((2, 2)))
