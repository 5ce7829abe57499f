"""`gmpo_loss` (ALGORITHMS.md §5.6) against a float64 reference and its identities."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.gmpo import gmpo_loss
from losses.ppo import ppo_clip_loss, reinforce_loss
from tests.losses.helpers import assert_close, assert_nan_safe, make_mask, vg

N, T = 7, 11
GMPO_METRICS = {
    "policy/clip_frac",
    "policy/clip_frac_high",
    "policy/clip_frac_low",
    "policy/seq_ratio_mean",
    "policy/approx_kl",
    "policy/ratio_mean",
    "policy/ratio_max",
}


# --------------------------------------------------------------------------------------------------
# float64 reference, written from §5.6
# --------------------------------------------------------------------------------------------------


def np_gmpo(
    lp,
    old,
    adv,
    mask,
    *,
    clip_low=0.4,
    clip_high=0.4,
    is_weights=None,
    token_weights=None,
    log_ratio_clamp=None,
    num_seqs=None,
):
    """Loss, `∂loss/∂logp`, metrics (float64)."""
    valid = np.asarray(mask) > 0

    def z(x):
        return np.where(valid, np.asarray(x, np.float64), 0.0)

    a = z(adv)
    logr = z(lp) - z(old)
    if log_ratio_clamp is None:
        lc, dlc = logr, np.ones_like(logr)
    else:
        lc = np.clip(logr, -log_ratio_clamp, log_ratio_clamp)
        dlc = (np.abs(logr) < log_ratio_clamp).astype(np.float64)
    c = np.clip(lc, -clip_low, clip_high)
    lr = np.where(a > 0, np.minimum(lc, c), np.where(a < 0, np.maximum(lc, c), 0.0))
    dlr = np.where(a > 0, lc < clip_high, np.where(a < 0, lc > -clip_low, 0.0)) * dlc
    w = valid * (1.0 if token_weights is None else z(token_weights))
    den = np.maximum(w.sum(1), 1.0)
    log_rho = (lr * w).sum(1) / den
    if is_weights is not None:
        log_rho += (np.where(valid, np.log(z(is_weights) + 1e-10), 0.0) * w).sum(1) / den
    rho = np.exp(log_rho)
    a_bar = (a * w).sum(1) / den
    seq_valid = valid.sum(1) > 0
    d_seq = num_seqs if num_seqs is not None else max(seq_valid.sum(), 1)
    loss = np.sum(np.where(seq_valid, -a_bar * rho, 0.0)) / d_seq
    grad = (seq_valid * -a_bar * rho / d_seq / den)[:, None] * w * dlr
    count = max(valid.sum(), 1)
    high = valid & (a > 0) & (lc > clip_high)
    low = valid & (a < 0) & (lc < -clip_low)
    r = np.exp(logr if log_ratio_clamp is None else lc)
    metrics = {
        "policy/clip_frac": (high | low).sum() / count,
        "policy/clip_frac_high": high.sum() / count,
        "policy/clip_frac_low": low.sum() / count,
        "policy/seq_ratio_mean": np.sum(rho * seq_valid) / max(seq_valid.sum(), 1),
        "policy/approx_kl": np.sum(-logr) / count,
        "policy/ratio_mean": np.sum(r * valid) / count,
        "policy/ratio_max": np.max(r[valid]),
    }
    return loss, np.where(valid, grad, 0.0), metrics


def random_batch(seed, *, n=N, t=T, spread=0.4, seq_adv=False):
    rng = np.random.default_rng(seed)
    mask = make_mask(rng, n, t)
    lp = -rng.uniform(0.1, 3.0, size=(n, t)).astype(np.float32)
    old = (lp + spread * rng.normal(size=(n, t))).astype(np.float32)
    if seq_adv:
        adv = np.repeat(rng.normal(size=(n, 1)), t, axis=1).astype(np.float32)
    else:
        adv = rng.normal(size=(n, t)).astype(np.float32)
        adv[rng.uniform(size=(n, t)) < 0.15] = 0.0  # some A = 0 tokens
    return rng, lp, old, adv, mask


# --------------------------------------------------------------------------------------------------
# float64 reference on random inputs
# --------------------------------------------------------------------------------------------------


def test_matches_reference():
    rng, lp, old, adv, mask = random_batch(0, spread=0.6)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)
    tok_w = (rng.uniform(size=(N, T)) > 0.25).astype(np.float32)
    configs = {
        "defaults": {},
        "verl": {"clip_low": 0.2, "clip_high": 0.2},
        "asymmetric_clamped": {"clip_low": 0.1, "clip_high": 0.3, "log_ratio_clamp": 0.75},
        "weights": {"is_weights": is_w, "token_weights": tok_w, "num_seqs": 9.0},
        "all": {
            "clip_low": 0.3,
            "clip_high": 0.2,
            "is_weights": is_w,
            "token_weights": tok_w,
            "log_ratio_clamp": 0.6,
        },
    }
    run = jax.jit(lambda *a: {k: vg(gmpo_loss, **kw)(*a) for k, kw in configs.items()})
    for name, ((loss, metrics), grad) in run(lp, old, adv, mask).items():
        ref_loss, ref_grad, ref_metrics = np_gmpo(lp, old, adv, mask, **configs[name])
        assert loss.dtype == jnp.float32 and loss.shape == ()
        assert_close(loss, ref_loss)
        assert_close(grad, ref_grad)
        assert set(metrics) == GMPO_METRICS
        for key, value in ref_metrics.items():
            assert metrics[key].dtype == jnp.float32
            assert_close(metrics[key], value)
    # the data exercises every branch: clipped both ways, unclipped, A = 0, clamp
    _, _, m = np_gmpo(lp, old, adv, mask, clip_low=0.1, clip_high=0.3)
    assert m["policy/clip_frac_high"] > 0 and m["policy/clip_frac_low"] > 0
    assert np.sum((np.abs(lp - old) > 0.75) & (mask > 0)) >= 2


def test_agg_none_and_seq_mean_token_mean_are_the_same_and_others_raise():
    _, lp, old, adv, mask = random_batch(1)
    run = jax.jit(lambda *a: [gmpo_loss(*a, agg=agg)[0] for agg in (None, "seq_mean_token_mean")])
    a, b = run(lp, old, adv, mask)
    assert float(a) == float(b)
    for agg in ("token_mean", "seq_mean_token_sum", "sequence"):
        with pytest.raises(
            ValueError, match=r"gmpo_loss: `agg` must be None or 'seq_mean_token_mean'"
        ):
            jax.eval_shape(lambda *x, agg=agg: gmpo_loss(*x, agg=agg), lp, old, adv, mask)


# --------------------------------------------------------------------------------------------------
# identities and properties of §5.6
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("old_is_none", [True, False], ids=["old_None", "old_eq_logp"])
def test_ratio_one_gradient_is_reinforce_seq_mean_token_mean(old_is_none):
    _, lp, _, adv, mask = random_batch(2, seq_adv=True)

    @jax.jit
    def run(lp, adv, mask):
        old = None if old_is_none else lp
        return (
            vg(gmpo_loss)(lp, old, adv, mask),
            vg(reinforce_loss, agg="seq_mean_token_mean")(lp, adv, mask)[1],
        )

    ((loss, metrics), grad), pg_grad = run(lp, adv, mask)
    assert_close(grad, np.asarray(pg_grad))
    valid_rows = mask.sum(1) > 0
    assert_close(loss, -np.mean(adv[valid_rows, 0].astype(np.float64)))
    assert_close(metrics["policy/seq_ratio_mean"], 1.0)
    assert float(metrics["policy/clip_frac"]) == 0.0


def test_unclipped_geometric_mean_ratio_is_at_most_the_arithmetic_mean():
    # one row at a time with A = −1: the loss is ρ_n, unclipped with a huge clip range
    _, lp, old, _, mask = random_batch(3, spread=1.0)
    adv = -np.ones((N, T), np.float32)

    def row_rho(lp, old, adv, mask):
        return gmpo_loss(lp[None], old[None], adv[None], mask[None], clip_low=1e3, clip_high=1e3)[0]

    rho = np.asarray(jax.jit(jax.vmap(row_rho))(lp, old, adv, mask), np.float64)
    logr = lp.astype(np.float64) - old
    lengths = mask.sum(1)
    rows = lengths > 0
    arith = np.sum(np.exp(logr) * mask, axis=1)[rows] / lengths[rows]
    geo = np.exp(np.sum(logr * mask, axis=1)[rows] / lengths[rows])
    assert_close(rho[rows], geo)
    assert np.all(rho[rows] <= arith * (1 + 1e-6))
    assert np.all(rho[rows][lengths[rows] > 1] < arith[lengths[rows] > 1])  # strict off equality


def test_zero_advantage_rows_contribute_nothing_but_count():
    _, lp, old, adv, mask = random_batch(4, seq_adv=True, spread=0.6)
    zero_rows = [3, 5]
    adv_z = adv.copy()
    adv_z[zero_rows] = 0.0
    keep = np.array([n for n in range(N) if n not in zero_rows])

    @jax.jit
    def run(lp, old, adv_z, mask):
        full = vg(gmpo_loss)(lp, old, adv_z, mask)
        part = gmpo_loss(lp[keep], old[keep], adv_z[keep], mask[keep])[0]
        return full, part

    ((loss, _), grad), part = run(lp, old, adv_z, mask)
    grad = np.asarray(grad)
    assert np.all(grad[zero_rows] == 0.0)
    assert np.any(grad[keep] != 0.0)
    n_valid = np.sum(mask.sum(1) > 0)
    n_valid_kept = np.sum(mask[keep].sum(1) > 0)
    assert_close(float(loss) * n_valid, float(part) * n_valid_kept)


def test_zero_gradient_outside_the_log_space_trust_region():
    # columns: (A>0, logr>ε_h), (A<0, logr<−ε_l) -> no gradient; (A>0, logr<−ε_l),
    # (A<0, logr>ε_h) and inside the range -> gradient
    logr = np.array([[0.6, -0.6, -0.6, 0.6, 0.1]] * 2, np.float32)
    adv = np.array([[1.0, -1.0, 1.0, -1.0, 1.0]] * 2, np.float32)  # Ā = 0.2
    old = np.full(logr.shape, -3.0, np.float32)
    mask = np.ones(logr.shape, np.float32)
    _, grad = jax.jit(vg(gmpo_loss))(old + logr, old, adv, mask)
    grad = np.asarray(grad)
    assert np.all(grad[:, :2] == 0.0)
    assert np.all(grad[:, 2:] != 0.0)


def test_one_token_sequences_equal_ppo_clip_with_exponentiated_bounds():
    # T = 1: ρ = min(r, e^ε_h) for A > 0 and max(r, e^−ε_l) for A < 0, i.e. PPO-clip with
    # clip_high = e^ε_h − 1 and clip_low = 1 − e^−ε_l (mean over valid rows = token mean)
    _, lp, old, adv, mask = random_batch(5, t=1, n=13, spread=0.6)
    eps_low, eps_high = 0.3, 0.2

    @jax.jit
    def run(*args):
        return (
            vg(gmpo_loss, clip_low=eps_low, clip_high=eps_high)(*args),
            vg(
                ppo_clip_loss,
                clip_low=1.0 - np.exp(-eps_low),
                clip_high=np.exp(eps_high) - 1.0,
                log_ratio_clamp=None,
            )(*args),
        )

    ((loss, metrics), grad), ((ppo_loss, ppo_metrics), ppo_grad) = run(lp, old, adv, mask)
    assert_close(loss, float(ppo_loss))
    assert_close(grad, np.asarray(ppo_grad))
    assert float(metrics["policy/clip_frac"]) > 0
    for key in ("policy/clip_frac_high", "policy/clip_frac_low", "policy/approx_kl"):
        assert_close(metrics[key], float(ppo_metrics[key]))


def test_is_weights_multiply_rho_by_their_geometric_mean():
    _, lp, old, adv, mask = random_batch(6, seq_adv=True)

    @jax.jit
    def run(*args):
        return (
            vg(gmpo_loss)(*args),
            vg(gmpo_loss, is_weights=np.full((N, T), 2.0, np.float32))(*args),
        )

    ((loss, _), grad), ((loss2, _), grad2) = run(lp, old, adv, mask)
    assert_close(loss2, 2 * float(loss))
    assert_close(grad2, 2 * np.asarray(grad))


def test_token_weights_select_the_tokens_of_the_means():
    # deselecting tokens with token_weights = dropping them from the mask, except that a row
    # keeps counting in the sequence mean
    _, lp, old, adv, mask = random_batch(7, seq_adv=True, spread=0.6)
    tok_w = np.ones((N, T), np.float32)
    tok_w[:, 1::3] = 0.0
    sub_mask = mask * tok_w
    assert np.all((sub_mask.sum(1) > 0) == (mask.sum(1) > 0))

    @jax.jit
    def run(lp, old, adv):
        return (
            vg(gmpo_loss, token_weights=tok_w)(lp, old, adv, mask),
            vg(gmpo_loss)(lp, old, adv, sub_mask),
        )

    ((loss, _), grad), ((loss_sub, _), grad_sub) = run(lp, old, adv)
    assert_close(loss, float(loss_sub))
    assert_close(grad, np.asarray(grad_sub))


# --------------------------------------------------------------------------------------------------
# masks, dtypes, errors
# --------------------------------------------------------------------------------------------------


def test_nan_outside_the_mask_does_not_leak():
    rng, lp, old, adv, mask = random_batch(8)
    is_w = rng.uniform(0.3, 2.0, size=(N, T)).astype(np.float32)
    tok_w = (rng.uniform(size=(N, T)) > 0.25).astype(np.float32)

    def fn(lp, old, adv, is_w, tok_w):
        return gmpo_loss(lp, old, adv, mask, is_weights=is_w, token_weights=tok_w)

    assert_nan_safe(fn, (lp, old, adv, is_w, tok_w), mask, rng)


def test_all_masked_batch_gives_zero_loss_and_gradient():
    nan = np.full((3, 5), np.nan, np.float32)
    (loss, metrics), grad = jax.jit(vg(gmpo_loss))(nan, nan, nan, np.zeros((3, 5), np.float32))
    assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)
    assert all(float(v) == 0.0 for v in metrics.values())


def test_bf16_inputs_give_float32_loss():
    _, lp, old, adv, mask = random_batch(9)
    lp16 = jnp.asarray(lp, jnp.bfloat16)
    loss, metrics = jax.jit(gmpo_loss)(lp16, old, adv, mask)
    assert loss.dtype == jnp.float32
    assert all(v.dtype == jnp.float32 for v in metrics.values())
    ref, _, _ = np_gmpo(np.asarray(lp16.astype(jnp.float32)), old, adv, mask)
    assert_close(loss, ref)


def _trace(*args, **kw):
    return jax.eval_shape(lambda *a: gmpo_loss(*a, **kw), *args)


def test_bad_input_errors_name_the_problem():
    lp = jnp.zeros((3, 4))
    m = jnp.ones((3, 4))
    with pytest.raises(ValueError, match="gmpo_loss: `clip_low` must be >= 0"):
        _trace(lp, lp, lp, m, clip_low=-0.4)
    with pytest.raises(ValueError, match="gmpo_loss: `log_ratio_clamp` must be > 0"):
        _trace(lp, lp, lp, m, log_ratio_clamp=0.0)
    with pytest.raises(ValueError, match=r"gmpo_loss: .*broadcast_to_tokens"):
        _trace(lp, lp, jnp.zeros(3), m)
    with pytest.raises(ValueError, match="gmpo_loss: `old_logp` must have the shape of `logp`"):
        _trace(lp, jnp.zeros((4, 3)), lp, m)
    with pytest.raises(ValueError, match="gmpo_loss: `is_weights` must have the shape of `logp`"):
        _trace(lp, lp, lp, m, is_weights=jnp.ones((3,)))
    with pytest.raises(ValueError, match="gmpo_loss: `token_weights` must have the shape"):
        _trace(lp, lp, lp, m, token_weights=jnp.ones((1, 4)))
    with pytest.raises(ValueError, match="gmpo_loss: `mask` must have shape"):
        _trace(lp, lp, lp, jnp.ones((3, 5)))
    # the aggregation keywords every policy loss takes (DESIGN.md), refused by name: a mean over
    # sequences has no token count or length constant
    with pytest.raises(ValueError, match=r"gmpo_loss: `num_tokens` does not apply .*`num_seqs`"):
        gmpo_loss(lp, lp, lp, m, num_tokens=12)
    with pytest.raises(ValueError, match="gmpo_loss: `norm_length` does not apply"):
        gmpo_loss(lp, lp, lp, m, norm_length=4)
    assert float(gmpo_loss(lp, lp, lp, m, num_tokens=None, norm_length=None)[0]) == 0.0


def test_the_log_ratio_is_clamped_at_20_by_default():
    # ALGORITHMS.md §5.0: log_ratio_clamp=20.0 (verl's geo_mean, no clamp, is log_ratio_clamp=None)
    old = jnp.zeros((1, 2))
    logp = jnp.array([[30.0, 0.0]])  # a negative advantage keeps the unclipped log-ratio
    adv, m = -jnp.ones((1, 2)), jnp.ones((1, 2))
    default = float(gmpo_loss(logp, old, adv, m)[0])
    assert default == float(gmpo_loss(logp, old, adv, m, log_ratio_clamp=20.0)[0])
    assert_close(default, np.exp((20.0 + 0.0) / 2))  # −Ā·ρ with Ā = −1, ρ = exp(mean(20, 0))
    assert float(gmpo_loss(logp, old, adv, m, log_ratio_clamp=None)[0]) > 1e6
