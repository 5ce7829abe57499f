"""`sapo_loss` (ALGORITHMS.md §5.4): anchors, float64 reference, on-policy identity, NaN safety."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.ppo import reinforce_loss
from losses.sapo import sapo_loss
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, np_aggregate

N, T = 7, 11

# §5.1's anchor inputs, one token per column
ANCHOR_ADV = np.array([[1.0, 1.0, -1.0, -1.0, -1.0]], np.float32)
ANCHOR_LOGR = np.array([[0.5, -0.5, 0.5, -0.5, 1.5]], np.float32)


def _inputs(seed: int, scale: float = 0.4):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, N, T)
    lp = -rng.uniform(0.05, 3.0, size=(N, T)).astype(np.float32)
    old = (lp + scale * rng.normal(size=(N, T))).astype(np.float32)
    adv = rng.normal(size=(N, T)).astype(np.float32)
    adv[3, :4] = 0.0  # A = 0 takes tau_neg and contributes nothing
    return rng, lp, old, adv, mask


def _agg_weights(mask: np.ndarray, mode: str) -> np.ndarray:
    """d aggregate / d per_token (aggregate is linear in it), from the float64 reference."""
    weights = np.zeros(mask.shape)
    for n, t in np.ndindex(*mask.shape):
        onehot = np.zeros(mask.shape)
        onehot[n, t] = 1.0
        weights[n, t] = np_aggregate(onehot, mask, mode)
    return weights


def _np_sapo(lp, old, adv, mask, *, tau_pos, tau_neg, clamp):
    """Float64 per-token loss, its derivative w.r.t. logp, the gate and the ratio (§5.4)."""
    m = mask > 0
    lp, old, adv = (np.where(m, np.asarray(x, np.float64), 0.0) for x in (lp, old, adv))
    logr = lp - old
    c = np.inf if clamp is None else clamp
    r = np.where(m, np.exp(np.clip(logr, -c, c)), 0.0)
    tau = np.where(adv > 0, tau_pos, tau_neg)
    s = 1.0 / (1.0 + np.exp(-tau * (r - 1.0)))
    gate = np.where(m, 4.0 / tau * s, 0.0)
    per_token = -gate * adv
    dr_dlp = np.where(np.abs(logr) < c, r, 0.0)
    dper_dlp = np.where(m, -adv * 4.0 * s * (1.0 - s) * dr_dlp, 0.0)
    return per_token, dper_dlp, gate, logr, r


def test_anchor_gate_and_gradient_weights():
    old = np.full_like(ANCHOR_LOGR, -2.0)
    lp = old + ANCHOR_LOGR
    adv = jnp.asarray(ANCHOR_ADV)

    def token_loss(logp, m):
        return sapo_loss(logp, old, adv, m, agg="token_sum")[0]

    onehots = jnp.eye(5, dtype=jnp.float32)[:, None, :]  # [5, 1, 5]: one valid token each
    per_token = jax.jit(jax.vmap(token_loss, in_axes=(None, 0)))(lp, onehots)
    gate = -np.asarray(per_token) / ANCHOR_ADV[0]
    assert_close(gate, [2.626889, 1.611530, 2.529512, 1.516795, 3.713560])

    grad = jax.jit(jax.grad(token_loss))(lp, jnp.ones((1, 5)))
    ratio = np.exp(ANCHOR_LOGR[0].astype(np.float64))
    weights = np.asarray(grad)[0] / (-ANCHOR_ADV[0] * ratio)  # dℓ/dr / (−A)
    assert_close(weights, [0.901753, 0.962273, 0.892420, 0.958513, 0.098224])


def test_derivative_is_one_at_ratio_one():
    lp = jnp.array([[-0.7, -1.3, -2.1]])
    adv = jnp.array([[1.5, -0.5, -2.0]])
    m = jnp.ones((1, 3))

    @jax.jit
    def value_and_grad(x, tau):  # τ traced: one compilation for every τ
        def f(y):
            return sapo_loss(y, y, adv, m, tau_pos=tau, tau_neg=tau, agg="token_sum")[0]

        return jax.value_and_grad(f)(x)

    for tau in (0.3, 1.0, 1.05, 4.0):
        value, grad = value_and_grad(lp, tau)
        assert_close(grad, -np.asarray(adv))  # dℓ/dlogp = −A·(dg/dr = 1)·(r = 1)
        # the value at r = 1 is −(2/τ)·A, not −A (compare gradients, not values, with PPO)
        assert_close(value, -2.0 / tau * float(np.sum(adv)))


@pytest.mark.parametrize(
    ("mode", "on_policy"),
    [
        ("token_mean", "none"),
        ("seq_mean_token_mean", "equal"),
        ("seq_mean_token_sum_norm", "none"),
    ],
)
def test_on_policy_gradient_equals_reinforce(mode, on_policy):
    rng, lp, _, adv, mask = _inputs(0)
    tw = rng.uniform(0.0, 1.0, size=(N, T)).astype(np.float32)

    def sapo(x):
        old = None if on_policy == "none" else x
        return sapo_loss(x, old, adv, mask, agg=mode, token_weights=tw)[0]

    def reinforce(x):
        return reinforce_loss(x, adv, mask, agg=mode, token_weights=tw)[0]

    assert_close(jax.jit(jax.grad(sapo))(lp), np.asarray(jax.jit(jax.grad(reinforce))(lp)))


def test_weight_at_ratio_1p5_decreases_as_tau_grows():
    lp = jnp.full((1, 2), np.log(1.5), jnp.float32)
    old = jnp.zeros((1, 2))
    adv = jnp.array([[1.0, -1.0]])

    @jax.jit
    def grad(tau):
        def f(x):
            return sapo_loss(x, old, adv, jnp.ones((1, 2)), tau_pos=tau, tau_neg=tau)[0]

        return jax.grad(f)(lp)

    taus = (0.25, 0.5, 1.0, 1.05, 2.0, 4.0)
    # dℓ/dr / (−A) for A = +1 (tau_pos) and A = −1 (tau_neg); seq_mean_token_mean divides by 2
    weights = np.array(
        [2.0 * np.asarray(grad(tau))[0] / (-np.asarray(adv)[0] * 1.5) for tau in taus]
    )
    assert np.all(np.diff(weights, axis=0) < 0), weights
    sig = 1.0 / (1.0 + np.exp(-0.5 * np.array(taus)))  # dg/dr = 4σ(1−σ), σ = σ(0.5τ)
    assert_close(weights, np.stack([4.0 * sig * (1.0 - sig)] * 2, axis=1))


@pytest.mark.parametrize(
    ("mode", "clamp"),
    [
        ("token_mean", 20.0),
        ("token_sum", None),
        ("seq_mean_token_mean", 0.5),
        ("seq_mean_token_sum", 20.0),
        ("seq_mean_token_sum_norm", None),
    ],
)
def test_matches_float64_reference(mode, clamp):
    rng, lp, old, adv, mask = _inputs(1, scale=0.6)
    isw = rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)
    tw = (rng.uniform(size=(N, T)) > 0.2).astype(np.float32)
    kw = {"tau_pos": 0.8, "tau_neg": 1.7}

    def f(x, o, a, m, w, t):
        return sapo_loss(
            x, o, a, m, agg=mode, is_weights=w, token_weights=t, log_ratio_clamp=clamp, **kw
        )

    (loss, metrics), grad = jax.jit(jax.value_and_grad(f, has_aux=True))(
        lp, old, adv, mask, isw, tw
    )
    per_token, dper, gate, logr, r = _np_sapo(lp, old, adv, mask, clamp=clamp, **kw)
    assert_close(loss, np_aggregate(per_token * isw * tw, mask, mode))
    assert_close(grad, dper * isw * tw * _agg_weights(mask, mode))
    count = mask.sum()
    valid = mask > 0
    assert_close(metrics["policy/gate_mean"], gate.sum() / count)
    assert_close(metrics["policy/approx_kl"], -logr[valid].sum() / count)
    assert_close(metrics["policy/ratio_mean"], r[valid].sum() / count)
    assert_close(metrics["policy/ratio_max"], r[valid].max())
    assert all(v.dtype == jnp.float32 and v.shape == () for v in metrics.values())
    assert loss.dtype == jnp.float32


def test_global_normalisers_and_bf16_inputs():
    _, lp, old, adv, mask = _inputs(2)
    f = jax.jit(lambda x, o, a, m, n=None: sapo_loss(x, o, a, m, agg="token_mean", num_tokens=n))
    loss, _ = f(jnp.asarray(lp, jnp.bfloat16), jnp.asarray(old, jnp.bfloat16), adv, mask)
    assert loss.dtype == jnp.float32
    full = float(f(lp, old, adv, mask)[0])
    num_tokens = float(mask.sum())
    parts = [
        float(f(lp[s], old[s], adv[s], mask[s], num_tokens)[0]) for s in (slice(0, 3), slice(3, N))
    ]
    assert_close(sum(parts), full)


@pytest.mark.parametrize("planted", [(0, 1, 2), (0, 1, 2, 4)])
def test_nan_outside_mask_does_not_leak(planted):
    rng, lp, old, adv, mask = _inputs(3)
    isw = rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)
    assert_nan_safe(
        lambda x, o, a, m, w: sapo_loss(x, o, a, m, is_weights=w),
        (lp, old, adv, mask, isw),
        mask,
        rng,
        planted=planted,
    )


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((2, 3))
    m = jnp.ones((2, 3))
    with pytest.raises(ValueError, match=r"`tau_pos` must be > 0, got 0\.0"):
        sapo_loss(lp, lp, lp, m, tau_pos=0.0)
    with pytest.raises(ValueError, match=r"`tau_neg` must be > 0, got -1\.05"):
        sapo_loss(lp, lp, lp, m, tau_neg=-1.05)
    with pytest.raises(ValueError, match="sapo_loss: `old_logp` must have the shape"):
        sapo_loss(lp, jnp.zeros((2, 4)), lp, m)
    with pytest.raises(ValueError, match="sapo_loss: `advantages` must be per token"):
        sapo_loss(lp, lp, jnp.zeros((2,)), m)
    with pytest.raises(ValueError, match="`agg` must be one of"):
        sapo_loss(lp, lp, lp, m, agg="seq-mean-token-mean")
    with pytest.raises(ValueError, match="sapo_loss: `logp` must be a floating-point array"):
        sapo_loss(jnp.zeros((2, 3), jnp.int32), None, lp, m)
