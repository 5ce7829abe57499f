"""`dpo_loss` (ALGORITHMS.md §8.1): every loss type, f-divergences, weights, against float64 NumPy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from losses.dpo import DPO_LOSS_TYPES, dpo_loss
from tests.losses.helpers import assert_close, assert_nan_safe, plant_nonfinite

N = 11
SORTED = ("aot", "aot_unpaired")
SMOOTHED = ("sigmoid", "robust", "exo_pair", "aot", "aot_unpaired")
LENGTH = ("ipo", "sigmoid_norm")
ON_LOG_RATIO = ("aot", "aot_unpaired", "apo_zero", "apo_down")

# --------------------------------------------------------------------------------------------------
# float64 references, written from the formulas of ALGORITHMS.md §8.1
# --------------------------------------------------------------------------------------------------


def nls(x):
    """`−logσ(x)` in float64."""
    return np.logaddexp(0.0, -np.asarray(x, np.float64))


def sig(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


def np_score(lr, f, alpha):
    if f == "reverse_kl" or (f == "alpha_divergence" and abs(alpha - 1.0) < 1e-6):
        return lr
    if f == "forward_kl":
        return -np.exp(np.minimum(-lr, 80.0))
    if f == "js_divergence":
        return -nls(lr)
    return np.exp(np.minimum((alpha - 1.0) * lr, 80.0)) / (alpha - 1.0)


def np_smoothed(x, e):
    return (1 - e) * nls(x) + e * nls(-x)


def np_items(kind, pc, pr, rc, rr, b, e, lc=None, lrl=None, f="reverse_kl", alpha=0.5, tau=0.05):
    """Per-pair (or per-rank, for aot) losses of the valid pairs, float64."""
    pc, pr, rc, rr = (np.asarray(x, np.float64) for x in (pc, pr, rc, rr))
    lr_c, lr_r = pc - rc, pr - rr
    sc, sr = np_score(lr_c, f, alpha), np_score(lr_r, f, alpha)
    d = sc - sr
    z = b * d
    dl = d if lc is None else sc / np.maximum(lc, 1) - sr / np.maximum(lrl, 1)
    if kind == "sigmoid":
        return np_smoothed(z, e)
    if kind == "robust":
        return ((1 - e) * nls(z) - e * nls(-z)) / (1 - 2 * e)
    if kind == "hinge":
        return np.maximum(1 - z, 0.0)
    if kind == "ipo":
        return (dl - 1 / (2 * b)) ** 2
    if kind == "exo_pair":
        return sig(z) * (-nls(z) - np.log(1 - e)) + sig(-z) * (-nls(-z) - np.log(e))
    if kind == "nca_pair":
        return nls(b * sc) + 0.5 * nls(-b * sc) + 0.5 * nls(-b * sr)
    if kind == "bco_pair":
        return nls(b * sc) + nls(-b * sr)
    if kind == "sppo_hard":
        return (sc - 1 / (2 * b)) ** 2 + (sr + 1 / (2 * b)) ** 2
    if kind == "aot":
        return np_smoothed(b * (np.sort(pc - pr) - np.sort(rc - rr)), e)
    if kind == "aot_unpaired":
        return np_smoothed(b * (np.sort(lr_c) - np.sort(lr_r)), e)
    if kind == "apo_zero":
        return (1 - sig(b * lr_c)) + sig(b * lr_r)
    if kind == "apo_down":
        return sig(b * lr_c) + (1 - sig(b * (lr_c - lr_r)))
    if kind == "discopop":
        mu = sig(z / tau)
        return nls(z) * (1 - mu) + np.exp(-z) * mu
    if kind == "sigmoid_norm":
        return nls(b * dl)
    raise ValueError(kind)


def np_dpo(
    pc,
    pr,
    rc,
    rr,
    *,
    types,
    valid=None,
    beta=0.1,
    eps=0.0,
    pw=None,
    lc=None,
    lrl=None,
    weights=None,
    num_pairs=None,
    **kw,
):
    """The weighted loss over the valid pairs (invalid entries are never read)."""
    v = np.ones(len(pc), bool) if valid is None else np.asarray(valid, bool)

    def sel(x):
        return None if x is None else np.broadcast_to(np.asarray(x, np.float64), v.shape)[v]

    b, e, w_pair = sel(beta), sel(eps), sel(1.0 if pw is None else pw)
    args = [sel(x) for x in (pc, pr, rc, rr)]
    den = num_pairs if num_pairs is not None else max(v.sum(), 1)
    weights = weights or (1.0,) * len(types)
    total = 0.0
    for kind, w in zip(types, weights, strict=True):
        items = np_items(kind, *args, b, e, sel(lc), sel(lrl), **kw)
        item_w = 1.0 if kind in SORTED else w_pair
        total += w * np.sum(item_w * items) / den
    return total


def fd_grad(f, x, h=1e-6):
    """Central finite differences of a float64 scalar function of a vector."""
    x = np.asarray(x, np.float64)
    g = np.zeros_like(x)
    for i in range(x.size):
        up, dn = x.copy(), x.copy()
        up[i] += h
        dn[i] -= h
        g[i] = (f(up) - f(dn)) / (2 * h)
    return g


def pair_batch(seed, n=N):
    rng = np.random.default_rng(seed)
    pc = -rng.uniform(2.0, 12.0, n).astype(np.float32)
    pr = -rng.uniform(2.0, 12.0, n).astype(np.float32)
    rc = (pc + rng.normal(0.0, 2.0, n)).astype(np.float32)
    rr = (pr + rng.normal(0.0, 2.0, n)).astype(np.float32)
    valid = rng.uniform(size=n) > 0.25
    valid[:2] = [True, False]
    return rng, pc, pr, rc, rr, valid


def type_options(kind, rng, n=N):
    """Per-pair β / ε / weights / lengths that `kind` accepts."""
    opts = {}
    if kind not in SORTED:
        opts["beta"] = rng.uniform(0.05, 0.5, n).astype(np.float32)
        opts["pair_weights"] = rng.uniform(0.2, 2.0, n).astype(np.float32)
    else:
        opts["beta"] = 0.2
        opts["label_smoothing"] = 0.1
    if kind in ("sigmoid", "robust"):
        opts["label_smoothing"] = rng.uniform(0.0, 0.3, n).astype(np.float32)
    if kind == "exo_pair":
        opts["label_smoothing"] = rng.uniform(0.01, 0.3, n).astype(np.float32)
    if kind in LENGTH:
        opts["chosen_length"] = rng.integers(1, 30, n).astype(np.int32)
        opts["rejected_length"] = rng.integers(1, 30, n).astype(np.int32)
    return opts


def reference_for(kind, pc, pr, rc, rr, valid, opts, **kw):
    return np_dpo(
        pc,
        pr,
        rc,
        rr,
        types=(kind,),
        valid=valid,
        beta=opts.get("beta", 0.1),
        eps=opts.get("label_smoothing", 0.0),
        pw=opts.get("pair_weights"),
        lc=opts.get("chosen_length"),
        lrl=opts.get("rejected_length"),
        **kw,
    )


def value_and_grads(**kw):
    def fn(pc, pr, rc, rr):
        return dpo_loss(pc, pr, rc, rr, **kw)

    return jax.jit(jax.value_and_grad(fn, argnums=(0, 1), has_aux=True))


# --------------------------------------------------------------------------------------------------
# anchors of ALGORITHMS.md §8.1 (β = 0.1, lr_c = [1, −0.5], lr_r = [−1, 0])
# --------------------------------------------------------------------------------------------------

ANCHOR = (
    np.array([-3.0, -4.5], np.float32),
    np.array([-6.0, -5.0], np.float32),
    np.array([-4.0, -4.0], np.float32),
    np.array([-5.0, -5.0], np.float32),
)
ANCHORS = {
    "sigmoid": ({}, [0.598139, 0.718460]),
    "cdpo": ({"loss_type": "sigmoid", "label_smoothing": 0.1}, [0.618139, 0.713460]),
    "robust": ({"label_smoothing": 0.1}, [0.573139, 0.724710]),
    "hinge": ({}, [0.8, 1.05]),
    "ipo": ({}, [9.0, 30.25]),
    "ipo_len": (
        {"loss_type": "ipo", "chosen_length": [5, 4], "rejected_length": [6, 4]},
        [21.467778, 26.265625],
    ),
    "exo_pair": ({"label_smoothing": 1e-3}, [2.422015, 2.847860]),
    "nca_pair": ({}, [1.338793, 1.399263]),
    "bco_pair": ({}, [1.288793, 1.411607]),
    "sppo_hard": ({}, [32.0, 55.25]),
    "apo_zero": ({}, [0.950042, 1.012497]),
    "apo_down": ({}, [0.975145, 1.0]),
    "discopop": ({}, [0.814763, 0.807966]),
}


@pytest.mark.parametrize("name", sorted(ANCHORS))
def test_anchor_values(name):
    kw, expected = ANCHORS[name]
    kw = {"loss_type": name, **kw}
    for key in ("chosen_length", "rejected_length"):
        if key in kw:
            kw[key] = np.asarray(kw[key], np.int32)
    run = jax.jit(lambda *a, valid: dpo_loss(*a, beta=0.1, valid=valid, **kw)[0])
    for i in range(2):
        valid = np.arange(2) == i
        assert_close(run(*ANCHOR, valid=valid), expected[i])
    assert_close(run(*ANCHOR, valid=np.ones(2, bool)), np.mean(expected))


# --------------------------------------------------------------------------------------------------
# every loss type against the reference: value, gradient (finite differences), NaN safety
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", DPO_LOSS_TYPES)
def test_every_loss_type_matches_reference_and_gradient(kind):
    rng, pc, pr, rc, rr, valid = pair_batch(DPO_LOSS_TYPES.index(kind))
    opts = type_options(kind, rng)
    dirty = [plant_nonfinite(x, valid, rng) for x in (pc, pr, rc, rr)]
    (loss, metrics), (g_c, g_r) = value_and_grads(loss_type=kind, valid=valid, **opts)(*dirty)

    assert_close(loss, reference_for(kind, pc, pr, rc, rr, valid, opts))
    ref_gc = fd_grad(lambda x: reference_for(kind, x, pr, rc, rr, valid, opts), pc)
    ref_gr = fd_grad(lambda x: reference_for(kind, pc, x, rc, rr, valid, opts), pr)
    assert_close(g_c, ref_gc, rtol=1e-4, atol=1e-6)
    assert_close(g_r, ref_gr, rtol=1e-4, atol=1e-6)
    assert np.all(np.asarray(g_c)[~valid] == 0) and np.all(np.asarray(g_r)[~valid] == 0)

    b = np.broadcast_to(np.asarray(opts["beta"], np.float64), valid.shape)[valid]
    lr_c = (pc.astype(np.float64) - rc)[valid]
    lr_r = (pr.astype(np.float64) - rr)[valid]
    assert_close(metrics["pref/reward_chosen"], np.mean(b * lr_c), atol=1e-5)
    assert_close(metrics["pref/reward_rejected"], np.mean(b * lr_r), atol=1e-5)
    assert_close(metrics["pref/margin"], np.mean(b * (lr_c - lr_r)), atol=1e-5)
    assert_close(metrics["pref/accuracy"], np.mean(lr_c > lr_r))
    assert_close(metrics["pref/logp_chosen"], np.mean(pc[valid].astype(np.float64)), atol=1e-5)
    assert all(v.dtype == jnp.float32 and v.shape == () for v in metrics.values())


@pytest.mark.parametrize("kind", ["sigmoid", "ipo", "aot", "apo_down"])
def test_nan_outside_valid_pairs_never_leaks(kind):
    rng, pc, pr, rc, rr, valid = pair_batch(40)
    opts = type_options(kind, rng)

    def fn(pc, pr, rc, rr):
        return dpo_loss(pc, pr, rc, rr, loss_type=kind, valid=valid, **opts)

    assert_nan_safe(fn, (pc, pr, rc, rr), valid.astype(np.float32), rng, argnums=(0, 1))


# --------------------------------------------------------------------------------------------------
# f-divergences
# --------------------------------------------------------------------------------------------------

SCORE_TYPES = [t for t in DPO_LOSS_TYPES if t not in ON_LOG_RATIO]


@pytest.mark.parametrize(
    ("f", "alpha"),
    [
        ("forward_kl", 0.5),
        ("js_divergence", 0.5),
        ("alpha_divergence", 0.3),
        ("alpha_divergence", 1.6),
    ],
)
def test_f_divergence_scores_for_every_score_based_type(f, alpha):
    rng, pc, pr, rc, rr, valid = pair_batch(7)
    options = {k: type_options(k, rng) for k in SCORE_TYPES}

    @jax.jit
    def run(pc, pr, rc, rr):
        return {
            k: jax.value_and_grad(
                lambda x, k=k: dpo_loss(
                    x,
                    pr,
                    rc,
                    rr,
                    loss_type=k,
                    valid=valid,
                    f_divergence=f,
                    f_alpha=alpha,
                    **options[k],
                )[0]
            )(pc)
            for k in SCORE_TYPES
        }

    out = run(pc, pr, rc, rr)
    for k in SCORE_TYPES:
        loss, grad = out[k]
        ref = reference_for(k, pc, pr, rc, rr, valid, options[k], f=f, alpha=alpha)
        assert_close(loss, ref, rtol=2e-5)
        ref_g = fd_grad(
            lambda x, k=k: reference_for(k, x, pr, rc, rr, valid, options[k], f=f, alpha=alpha), pc
        )
        assert_close(grad, ref_g, rtol=2e-4, atol=1e-6)


def test_alpha_divergence_limits_and_trl_convention():
    _, pc, pr, rc, rr, _ = pair_batch(8)
    run = jax.jit(
        lambda f, a: dpo_loss(pc, pr, rc, rr, f_divergence=f, f_alpha=a)[0], static_argnums=(0, 1)
    )
    # α = 1 is reverse KL (exactly), α = 0 is forward KL
    assert_close(run("alpha_divergence", 1.0), run("reverse_kl", 0.5))
    assert_close(run("alpha_divergence", 1.0 + 1e-3), run("reverse_kl", 0.5), rtol=1e-3)
    assert_close(run("alpha_divergence", 0.0), run("forward_kl", 0.5))
    # our α is 1 − TRL's coefficient c: Δ = (u_r^{−c} − u_c^{−c})/c
    c = 0.7
    lr_c, lr_r = pc.astype(np.float64) - rc, pr.astype(np.float64) - rr
    trl_delta = (np.exp(-c * lr_r) - np.exp(-c * lr_c)) / c
    assert_close(run("alpha_divergence", 1.0 - c), np.mean(nls(0.1 * trl_delta)))


# --------------------------------------------------------------------------------------------------
# invariances of ALGORITHMS.md §8.1
# --------------------------------------------------------------------------------------------------


def test_shift_of_policy_and_reference_leaves_reference_based_types_unchanged():
    rng, pc, pr, rc, rr, valid = pair_batch(9)
    opts = {k: type_options(k, rng) for k in DPO_LOSS_TYPES}

    @jax.jit
    def run(pc, rc):
        return [
            dpo_loss(pc, pr, rc, rr, loss_type=k, valid=valid, **opts[k])[0] for k in DPO_LOSS_TYPES
        ]

    base, shifted = run(pc, rc), run(pc + 3.0, rc + 3.0)
    for a, b in zip(base, shifted, strict=True):
        assert_close(b, float(a), rtol=1e-5, atol=1e-5)


def test_sigmoid_gradient_signs_and_cdpo_half_is_flat_at_zero_margin():
    _, pc, pr, rc, rr, _ = pair_batch(10)
    (_, _), (g_c, g_r) = value_and_grads()(pc, pr, rc, rr)
    assert np.all(np.asarray(g_c) < 0) and np.all(np.asarray(g_r) > 0)
    # Δ = 0 for every pair: cDPO with ε = ½ has zero gradient there
    (_, _), (g_c, g_r) = value_and_grads(label_smoothing=0.5)(rc, rr, rc, rr)
    assert_close(g_c, np.zeros(N), atol=1e-9)
    assert_close(g_r, np.zeros(N), atol=1e-9)


def test_robust_at_zero_smoothing_is_sigmoid_and_sigmoid_norm_without_lengths_is_sigmoid():
    _, pc, pr, rc, rr, valid = pair_batch(11)
    run = jax.jit(lambda k: dpo_loss(pc, pr, rc, rr, loss_type=k, valid=valid)[0], static_argnums=0)
    assert_close(run("robust"), run("sigmoid"))
    assert_close(run("sigmoid_norm"), run("sigmoid"))


def test_ipo_is_minimised_at_its_closed_form_margin():
    _, pc, pr, rc, rr, _ = pair_batch(12)
    beta = 0.25
    # choose π_c so that Δ = 1/(2β) exactly for every pair: loss 0, gradient 0
    pc_opt = (rc + (pr - rr) + 1.0 / (2 * beta)).astype(np.float32)
    (loss, _), (g_c, g_r) = value_and_grads(loss_type="ipo", beta=beta)(pc_opt, pr, rc, rr)
    assert_close(loss, 0.0, atol=1e-9)
    assert_close(g_c, np.zeros(N), atol=1e-5)
    assert_close(g_r, np.zeros(N), atol=1e-5)
    # and the value is (Δ − 1/(2β))² on summed log-probs when no lengths are passed
    (loss, _), _ = value_and_grads(loss_type="ipo", beta=beta)(pc, pr, rc, rr)
    delta = (pc.astype(np.float64) - rc) - (pr.astype(np.float64) - rr)
    assert_close(loss, np.mean((delta - 2.0) ** 2), rtol=2e-5)


def test_reference_free_is_zero_reference():
    _, pc, pr, _, _, valid = pair_batch(13)
    zeros = np.zeros(N, np.float32)
    for kind in ("sigmoid", "hinge", "aot", "nca_pair"):
        a, ma = dpo_loss(pc, pr, None, None, loss_type=kind, reference_free=True, valid=valid)
        b, mb = dpo_loss(pc, pr, zeros, zeros, loss_type=kind, valid=valid)
        assert_close(a, float(b))
        assert_close(ma["pref/margin"], float(mb["pref/margin"]))


def test_per_pair_beta_equals_separate_scalar_calls():
    _, pc, pr, rc, rr, _ = pair_batch(14, n=4)
    betas = np.array([0.05, 0.1, 0.4, 1.0], np.float32)
    eps = np.array([0.0, 0.1, 0.2, 0.3], np.float32)
    loss, _ = jax.jit(lambda b, e: dpo_loss(pc, pr, rc, rr, beta=b, label_smoothing=e))(betas, eps)
    singles = [
        float(
            dpo_loss(
                pc[i : i + 1],
                pr[i : i + 1],
                rc[i : i + 1],
                rr[i : i + 1],
                beta=float(betas[i]),
                label_smoothing=float(eps[i]),
            )[0]
        )
        for i in range(4)
    ]
    assert_close(loss, np.mean(singles))


def test_loss_weights_combine_types_and_report_each():
    rng, pc, pr, rc, rr, valid = pair_batch(15)
    pw = rng.uniform(0.5, 1.5, N).astype(np.float32)
    types, weights = ("sigmoid", "bco_pair", "ipo"), (0.8, 0.2, 0.05)

    @jax.jit
    def run(pc, pr):
        return dpo_loss(
            pc,
            pr,
            rc,
            rr,
            loss_type=types,
            loss_weights=weights,
            valid=valid,
            pair_weights=pw,
            beta=0.2,
        )

    loss, metrics = run(pc, pr)
    ref = np_dpo(pc, pr, rc, rr, types=types, weights=weights, valid=valid, pw=pw, beta=0.2)
    assert_close(loss, ref)
    for k in types:
        single = np_dpo(pc, pr, rc, rr, types=(k,), valid=valid, pw=pw, beta=0.2)
        assert_close(metrics[f"pref/loss_{k}"], single)
    # default weights: plain sum
    loss, _ = dpo_loss(pc, pr, rc, rr, loss_type=("sigmoid", "hinge"), valid=valid)
    assert_close(loss, np_dpo(pc, pr, rc, rr, types=("sigmoid", "hinge"), valid=valid))
    assert "pref/loss_sigmoid" not in dpo_loss(pc, pr, rc, rr)[1]


def test_aot_is_invariant_to_pair_order_and_sorts_globally():
    rng, pc, pr, rc, rr, valid = pair_batch(16)
    perm = rng.permutation(N)
    for kind in SORTED:
        run = jax.jit(lambda *a, v, kind=kind: dpo_loss(*a, loss_type=kind, valid=v)[0])
        a = run(pc, pr, rc, rr, v=valid)
        b = run(pc[perm], pr[perm], rc[perm], rr[perm], v=valid[perm])
        assert_close(b, float(a))
        # sorting changes the result compared with the pairwise sigmoid loss
        plain = dpo_loss(pc, pr, rc, rr, valid=valid)[0]
        assert abs(float(a) - float(plain)) > 1e-4


def test_num_pairs_is_the_global_denominator():
    _, pc, pr, rc, rr, valid = pair_batch(17)
    for kind in ("sigmoid", "aot"):
        loss, _ = dpo_loss(pc, pr, rc, rr, loss_type=kind, valid=valid)
        glob, _ = dpo_loss(pc, pr, rc, rr, loss_type=kind, valid=valid, num_pairs=40.0)
        assert_close(glob, float(loss) * valid.sum() / 40.0)


def test_reference_log_probs_get_no_gradient():
    _, pc, pr, rc, rr, _ = pair_batch(18)
    g = jax.grad(lambda r: dpo_loss(pc, pr, r, rr, loss_type="ipo")[0])(rc)
    assert np.all(np.asarray(g) == 0)


def test_metrics_carry_no_gradient():
    _, pc, pr, rc, rr, _ = pair_batch(19)
    g = jax.grad(lambda x: dpo_loss(x, pr, rc, rr)[1]["pref/reward_chosen"])(pc)
    assert np.all(np.asarray(g) == 0)


# --------------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------------

x4 = np.zeros(4, np.float32)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"loss_type": "dpo"}, "`loss_type` must be one of"),
        ({"loss_type": ("sigmoid", "sigmoid")}, "lists a type twice"),
        ({"loss_type": ()}, "at least one loss type"),
        ({"loss_type": ("sigmoid", "ipo"), "loss_weights": (1.0,)}, "one weight per loss type"),
        ({"loss_weights": 0.5}, "must be a sequence"),
        (
            {"loss_type": ("sigmoid", "ipo"), "loss_weights": (1.0, -1.0)},
            "`loss_weights` must be >= 0",
        ),
        ({"beta": 0.0}, "`beta` must be > 0"),
        ({"label_smoothing": 1.5}, "`label_smoothing` must lie in \\[0, 1\\]"),
        ({"loss_type": "robust", "label_smoothing": 0.5}, "must lie in \\[0, 0.5\\)"),
        ({"loss_type": "exo_pair"}, "must lie in \\(0, 1\\)"),
        ({"loss_type": "hinge", "label_smoothing": 0.1}, "read only by loss types"),
        (
            {"chosen_length": np.ones(4, np.int32), "rejected_length": np.ones(4, np.int32)},
            "read only by loss types \\('ipo', 'sigmoid_norm'\\)",
        ),
        ({"loss_type": "ipo", "chosen_length": np.ones(4, np.int32)}, "pass both"),
        (
            {"loss_type": "ipo", "chosen_length": np.ones(3), "rejected_length": np.ones(4)},
            "`chosen_length` must have shape \\(4,\\)",
        ),
        ({"f_divergence": "kl"}, "`f_divergence` must be one of"),
        (
            {"f_divergence": "alpha_divergence", "f_alpha": np.float32(0.5)},
            "must be a Python number",
        ),
        ({"loss_type": "apo_zero", "f_divergence": "js_divergence"}, "defined on the log-ratios"),
        ({"loss_type": "aot", "pair_weights": np.ones(4)}, "`pair_weights` cannot be used"),
        ({"loss_type": "aot", "beta": np.ones(4)}, "`beta` must be a scalar with"),
        ({"beta": np.ones(3)}, "`beta` must be a scalar or have shape \\(4,\\)"),
        ({"discopop_tau": 0.0}, "`discopop_tau` must be > 0"),
        ({"reference_free": True}, "pass `ref_chosen_logp=None`"),
        ({"reference_free": 1}, "`reference_free` must be a Python bool"),
        ({"valid": np.ones(3)}, "`valid` must have shape"),
        ({"pair_weights": np.ones(5)}, "`pair_weights` must have shape"),
        ({"pair_weights": np.array([1.0, -5.0, 1.0, 1.0])}, "`pair_weights` must be >= 0"),
        ({"num_pairs": -2}, "`num_pairs` must be a finite number >= 0"),
        # per-pair label smoothing (CREAM's 1 − c) is range-checked like a number
        (
            {"label_smoothing": np.array([0.1, 1.5, 0.1, 0.1])},
            "`label_smoothing` must lie in \\[0, 1\\], got values from 0.1 to 1.5",
        ),
        (
            {"loss_type": "robust", "label_smoothing": np.full(4, 0.7, np.float32)},
            "must lie in \\[0, 0.5\\)",
        ),
        ({"loss_type": "exo_pair", "label_smoothing": np.zeros(4)}, "must lie in \\(0, 1\\)"),
    ],
)
def test_bad_options_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        dpo_loss(x4, x4, x4, x4, **kw)


def test_a_padding_pairs_weight_is_never_read_eagerly_or_under_jit():
    """The eager `pair_weights >= 0` check read invalid pairs: a NaN weight there (WPO weights
    of a padding pair) raised eagerly while jit gave the loss."""
    _, pc, pr, rc, rr, _ = pair_batch(29)
    valid = np.ones(pc.shape, np.float32)
    valid[-1] = 0.0
    dirty, clean = np.ones(pc.shape, np.float32), np.ones(pc.shape, np.float32)
    dirty[-1] = np.nan
    want = dpo_loss(pc, pr, rc, rr, valid=valid, pair_weights=clean)[0]
    assert_close(dpo_loss(pc, pr, rc, rr, valid=valid, pair_weights=dirty)[0], want)
    jitted = jax.jit(lambda w: dpo_loss(pc, pr, rc, rr, valid=valid, pair_weights=w)[0])
    assert_close(jitted(dirty), want)


def test_a_global_pair_count_of_zero_falls_back_to_the_local_count():
    """A micro-batch of a global batch without valid pairs gives 0, not inf (§1.5)."""
    _, pc, pr, rc, rr, _ = pair_batch(23)
    none_valid = np.zeros(pc.shape, np.float32)
    loss = dpo_loss(pc, pr, rc, rr, valid=none_valid, num_pairs=0)[0]
    assert float(loss) == 0.0
    assert_close(dpo_loss(pc, pr, rc, rr, num_pairs=0)[0], dpo_loss(pc, pr, rc, rr)[0])


def test_bad_arrays_raise():
    with pytest.raises(ValueError, match="`chosen_logp` must have rank 1"):
        dpo_loss(np.zeros((4, 2)), x4, x4, x4)
    with pytest.raises(ValueError, match="`rejected_logp` must have shape \\(4,\\)"):
        dpo_loss(x4, np.zeros(3), x4, x4)
    with pytest.raises(ValueError, match="`ref_rejected_logp` must be a floating-point"):
        dpo_loss(x4, x4, x4, np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="`ref_chosen_logp` is required unless reference_free"):
        dpo_loss(x4, x4, None, x4)


def test_discopop_stays_finite_for_large_negative_margins():
    z = np.zeros(1, np.float32)
    far = np.array([-3000.0], np.float32)  # z = β·Δ = −300: e^{−z} overflows float32
    (loss, _), (g_c, _) = value_and_grads(loss_type="discopop")(far, z, z, z)
    assert_close(loss, 300.0)  # −logσ(−300)·(1 − μ) with μ ≈ e^{−6000}
    assert_close(g_c, [-0.1])


@pytest.mark.parametrize("loss_type", ["ipo", "sppo_hard"])
@pytest.mark.parametrize(("f", "alpha"), [("forward_kl", 1.0), ("alpha_divergence", 0.5)])
def test_squared_types_stay_finite_for_scores_near_the_exponent_cap(loss_type, f, alpha):
    """A sequence log-ratio of −90 gives a score of −e^80 (the cap) under the forward KL,
    whose square overflowed float32: the loss was inf and its gradient NaN. The squared term
    is capped at 1e17 (the loss ≥ 1e34 there, the gradient 0: no signal either way)."""
    far = np.array([-90.0, -1.0], np.float32)
    z = np.zeros(2, np.float32)
    kw = {"loss_type": loss_type, "f_divergence": f, "f_alpha": alpha}
    (loss, _), grads = value_and_grads(**kw)(far, z, z, z)
    assert np.isfinite(float(loss)) and float(loss) > 1e33
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)
    (near, _), _ = value_and_grads(**kw)(far[1:], z[1:], z[1:], z[1:])
    assert np.isfinite(float(near)) and float(near) < 1e3  # ordinary scores are not capped
