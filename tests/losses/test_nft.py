"""`nft_loss` (ALGORITHMS.md §5.14) against a float64 reference, the GRPO/Dr.GRPO identities."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.advantages import group_advantages
from losses.layout import broadcast_to_tokens
from losses.nft import nft_loss
from losses.ppo import reinforce_loss
from tests.losses.helpers import (
    assert_close,
    assert_nan_safe,
    make_mask,
    np_agg_weights,
    np_aggregate,
)

B, G, T = 4, 4, 5
N = B * G
# accuracies 0.25, 0.5, 0 (clipped to 0.02) and 1 (clipped to 0.98)
LABELS = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], np.int32)


def random_batch(seed, spread=0.8):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, N, T)
    lp = -rng.uniform(0.1, 2.0, size=(N, T)).astype(np.float32)
    old = (lp - spread * rng.normal(size=(N, T))).astype(np.float32)
    return rng, lp, old, mask


def np_nft(lp, old, correct, mask, upstream, *, clamp_neg, clamp_pos=None, neg_weight=1.0,
           norm="none", ratio_level="token", acc_clip=(0.02, 0.98), log_ratio_max=10.0):  # fmt: skip
    """Per-token `ℓ` and `∂loss/∂lp` for upstream weights `∂loss/∂ℓ` (float64, §5.14)."""
    valid = np.asarray(mask) > 0
    lp, old = (np.where(valid, np.asarray(x, np.float64), 0.0) for x in (lp, old))
    c = np.asarray(correct) > 0
    q = np.repeat(np.clip(c.mean(1), *acc_clip), G)[:, None]
    pos = c.reshape(-1)[:, None]
    logr = lp - old
    if ratio_level == "sequence":
        logr = np.broadcast_to(logr.sum(1, keepdims=True), logr.shape)
    cap = logr if log_ratio_max is None else np.minimum(logr, log_ratio_max)
    dcap = np.ones_like(logr) if log_ratio_max is None else (logr < log_ratio_max) * 1.0
    r = np.exp(cap)
    if clamp_pos is None:
        l_pos, d_pos = -cap, -dcap
    else:
        l_pos, d_pos = -np.log(np.maximum(r, clamp_pos)), -(r / np.maximum(r, clamp_pos)) * dcap
    x = (1 - q * r) / (1 - q)
    xc = np.maximum(x, clamp_neg)
    l_neg = -neg_weight * np.log(xc)
    d_neg = neg_weight / xc * q * r / (1 - q) * dcap
    f = {"none": 1.0, "one_minus": 1 - q, "sqrt": np.sqrt((1 - q) / q)}[norm]
    ell = np.where(valid, f * np.where(pos, l_pos, l_neg), 0.0)
    dl = np.where(valid, f * np.where(pos, d_pos, d_neg), 0.0)  # ∂ℓ/∂(log R)
    if ratio_level == "token":
        return ell, upstream * dl
    return ell, (upstream * dl).sum(1, keepdims=True) * valid


CONFIGS = {
    "token_clamped": {"clamp_neg": 0.3, "clamp_pos": 0.7, "neg_weight": 0.8, "log_ratio_max": 0.8},
    "token_one_minus": {"clamp_neg": 0.5, "norm": "one_minus"},
    "sequence_sqrt": {
        "clamp_neg": 0.3,
        "norm": "sqrt",
        "ratio_level": "sequence",
        "log_ratio_max": 3.0,
    },
}
AGGS = ("token_mean", "seq_mean_token_sum_norm")


def test_matches_reference():
    rng, lp, old, mask = random_batch(0)
    is_w = rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)
    tok_w = (rng.uniform(size=(N, T)) > 0.2).astype(np.float32)

    @jax.jit
    def run(lp, old, correct, mask):
        return {
            (name, agg): jax.value_and_grad(
                lambda x, cfg=cfg, agg=agg: nft_loss(
                    x, old, correct, mask, agg=agg, is_weights=is_w, token_weights=tok_w, **cfg
                ),
                has_aux=True,
            )(lp)
            for name, cfg in CONFIGS.items()
            for agg in AGGS
        }

    w = is_w.astype(np.float64) * tok_w
    valid = mask > 0
    for (name, agg), ((loss, metrics), grad) in run(lp, old, LABELS, mask).items():
        upstream = np_agg_weights(mask, agg) * w
        ell, ref_grad = np_nft(lp, old, LABELS, mask, upstream, **CONFIGS[name])
        assert loss.dtype == jnp.float32
        assert_close(loss, np_aggregate(ell * w, mask, agg))
        assert_close(grad, ref_grad)
        assert_close(metrics["policy/accuracy_mean"], np.mean([0.25, 0.5, 0.02, 0.98]))
        logr = (lp.astype(np.float64) - old)[valid]
        assert_close(metrics["policy/approx_kl"], np.mean(-logr))
    # the clamps act on this data (token level): some negatives and positives hit their floor
    q = np.repeat(np.clip(LABELS.mean(1), 0.02, 0.98), G)[:, None]
    r = np.exp(np.minimum(lp.astype(np.float64) - old, 0.8))
    pos = LABELS.reshape(-1)[:, None] > 0
    assert np.any(valid & ~pos & ((1 - q * r) / (1 - q) < 0.3))
    assert np.any(valid & pos & (r < 0.7))


@pytest.mark.parametrize("old_is_none", [True, False], ids=["old_None", "old_eq_logp"])
def test_on_policy_gradients_equal_grpo_and_dr_grpo(old_is_none):
    _, lp, _, mask = random_batch(1)
    labels = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 0, 0]], np.float32)
    adv_grpo = np.asarray(group_advantages(labels, scale="group", ddof=0, eps=0.0))
    adv_dr = np.asarray(group_advantages(labels, scale="none"))

    @jax.jit
    def run(lp, mask):
        old = None if old_is_none else lp
        out = {}
        for norm, adv in (("sqrt", adv_grpo), ("one_minus", adv_dr)):
            a = broadcast_to_tokens(adv, mask)
            out[norm] = (
                jax.grad(
                    lambda x, n=norm: nft_loss(x, old, labels, mask, clamp_neg=0.1, norm=n)[0]
                )(lp),
                jax.grad(lambda x, a=a: reinforce_loss(x, a, mask)[0])(lp),
            )
        return out

    for grad, pg_grad in run(lp, mask).values():
        assert_close(grad, np.asarray(pg_grad))
        assert np.any(np.asarray(grad) != 0.0)


def test_paper_example_quarter_accuracy():
    # r_q = 0.25, sqrt norm: positives −1.732051·∇lp, negatives +0.577350·∇lp (token_sum)
    lp = -np.ones((G, 1), np.float32)
    grad = jax.jit(
        jax.grad(
            lambda x: nft_loss(
                x, None, LABELS[:1], np.ones_like(lp), clamp_neg=0.1, norm="sqrt", agg="token_sum"
            )[0]
        )
    )(lp)
    assert_close(grad[:, 0], [-1.732051, 0.577350, 0.577350, 0.577350])


def test_a_far_negative_argument_is_clamped_exactly():
    """Groups of 4 with 3 right (r_q = 3/4) and a wrong sample at sequence log-ratio 9.9 (under
    the default cap 10): `(1 − r_q·R)/(1 − r_q)` ≈ −6e4, whose clamp to 1e-3 rounded to 0 when
    written `x + sg(c − x)`: the loss was inf. It is −log c per token, with the float64 gradient."""
    labels = np.array([[0, 1, 1, 1]] * B, np.int32)
    mask = np.ones((N, 3), np.float32)
    lp = np.full((N, 3), -1.0, np.float32)
    old = lp.copy()
    old[0] -= 3.3  # sequence log-ratio 9.9 on the wrong sample of group 0
    upstream = np.full((N, 3), 1.0 / (N * 3))  # token_mean
    kwargs = {"clamp_neg": 1e-3, "ratio_level": "sequence"}
    loss_fn = lambda x: nft_loss(x, old, labels, mask, agg="token_mean", **kwargs)[0]  # noqa: E731
    ell, grad_ref = np_nft(lp, old, labels, mask, upstream, **kwargs)
    assert_close(ell[0, 0], -np.log(1e-3))
    assert_close(float(loss_fn(lp)), float(ell.sum() / (N * 3)), rtol=1e-5)
    grad = jax.grad(loss_fn)(lp)
    assert np.isfinite(np.asarray(grad)).all()
    assert_close(grad, grad_ref, rtol=1e-4, atol=1e-6)


def test_nan_outside_the_mask_does_not_leak():
    rng, lp, old, mask = random_batch(2)
    is_w = rng.uniform(0.5, 1.5, size=(N, T)).astype(np.float32)

    for level in ("token", "sequence"):

        def fn(lp, old, is_w, level=level):
            return nft_loss(
                lp, old, LABELS, mask, clamp_neg=0.3, clamp_pos=0.5, ratio_level=level,
                norm="sqrt", is_weights=is_w, agg="seq_mean_token_mean",
            )  # fmt: skip

        assert_nan_safe(fn, (lp, old, is_w), mask, rng)


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((6, 4))
    m = jnp.ones((6, 4))
    c = jnp.ones((3, 2))

    def trace(*args, **kw):
        return jax.eval_shape(lambda *a: nft_loss(*a, **kw), *args)

    with pytest.raises(TypeError, match="clamp_neg"):
        trace(lp, lp, c, m)
    with pytest.raises(ValueError, match="nft_loss: `clamp_neg` is required"):
        trace(lp, lp, c, m, clamp_neg=None)
    with pytest.raises(ValueError, match="nft_loss: `clamp_neg` must be > 0"):
        trace(lp, lp, c, m, clamp_neg=0.0)
    with pytest.raises(ValueError, match="nft_loss: `clamp_pos` must be > 0"):
        trace(lp, lp, c, m, clamp_neg=0.1, clamp_pos=-1.0)
    with pytest.raises(ValueError, match=r"nft_loss: `norm` must be one of .*got 'std'"):
        trace(lp, lp, c, m, clamp_neg=0.1, norm="std")
    with pytest.raises(ValueError, match=r"nft_loss: `ratio_level` must be one of"):
        trace(lp, lp, c, m, clamp_neg=0.1, ratio_level="seq")
    for bad in ((0.0, 0.9), (0.5, 1.0), (0.6, 0.4), (0.1,)):
        with pytest.raises(ValueError, match=r"nft_loss: `acc_clip` must"):
            trace(lp, lp, c, m, clamp_neg=0.1, acc_clip=bad)
    with pytest.raises(ValueError, match=r"nft_loss: `correct` .* one label per row"):
        trace(lp, lp, jnp.ones((4, 2)), m, clamp_neg=0.1)
    with pytest.raises(ValueError, match=r"nft_loss: `neg_weight` must be >= 0"):
        trace(lp, lp, c, m, clamp_neg=0.1, neg_weight=-1.0)
