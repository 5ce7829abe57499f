"""Sharding cases for the preference losses and pair utilities.

Modules: `losses/dpo.py`, `losses/dpo_variants.py`, `losses/token_dpo.py`,
`losses/ref_free_preference.py`, `losses/kto.py`, `losses/pairwise_pg.py`, `losses/pair_utils.py`.
`[N]` pair arrays (N = 16), `[N,T]` token arrays and `[B,G]` / `[B,2]` group arrays (B = 8) are
sharded along their leading axis; per-pair hyperparameters are passed as positional arrays so they
are sharded too. Integer and boolean outputs are cast to float32 so the runner can compare them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from losses.aggregation import AGG_MODES
from losses.dpo import DPO_LOSS_TYPES, dpo_loss
from losses.dpo_variants import nll_loss, rpo_loss, step_apo_loss, xpo_loss
from losses.kto import bco_loss, kto_loss, kto_reference_point
from losses.pair_utils import best_worst_pairs, ld_sequence_logprob, rank_consistency, wpo_weights
from losses.pairwise_pg import contrastive_pg_loss, pairwise_ppo_loss, relative_regression_loss
from losses.ref_free_preference import cpo_loss, orpo_loss, simpo_loss
from losses.token_dpo import dpo_token_rewards, tgdpo_loss
from tests.losses.helpers import ShardCase, make_mask

_rng = np.random.default_rng(11)
N, T, B, G = 16, 9, 8, 4
_pc = -_rng.uniform(2.0, 12.0, N).astype(np.float32)
_pr = -_rng.uniform(2.0, 12.0, N).astype(np.float32)
_rc = (_pc + _rng.normal(0.0, 2.0, N)).astype(np.float32)
_rr = (_pr + _rng.normal(0.0, 2.0, N)).astype(np.float32)
_valid = _rng.uniform(size=N) > 0.25
_beta = _rng.uniform(0.05, 0.5, N).astype(np.float32)
_eps = _rng.uniform(0.01, 0.3, N).astype(np.float32)
_pw = _rng.uniform(0.5, 1.5, N).astype(np.float32)
_lc = _rng.integers(1, 30, N).astype(np.int32)
_lr = _rng.integers(1, 30, N).astype(np.int32)
_avg_c = -_rng.uniform(0.1, 3.0, N).astype(np.float32)
_avg_r = -_rng.uniform(0.1, 3.0, N).astype(np.float32)
_mask = make_mask(_rng, N, T)
_mask_r = make_mask(_rng, N, 5, empty_row=False)
_tok = np.log(_rng.uniform(0.05, 1.0, (N, T))).astype(np.float32)
_tok_ref = np.log(_rng.uniform(0.05, 1.0, (N, T))).astype(np.float32)
_tok_r = np.log(_rng.uniform(0.05, 1.0, (N, 5))).astype(np.float32)
_tok_rw = _rng.normal(0.0, 0.5, (N, T)).astype(np.float32)
_tok_rw_r = _rng.normal(0.0, 0.5, (N, 5)).astype(np.float32)
_samples = -_rng.uniform(5.0, 30.0, 8).astype(np.float32)
_pd, _pu = _pc, _pr[:8]
_rd, _ru = _rc, _rr[:8]
_vu = _valid[:8]
_seq2 = -_rng.uniform(5.0, 20.0, (B, 2)).astype(np.float32)
_old2 = (_seq2 + _rng.normal(0.0, 0.3, (B, 2))).astype(np.float32)
_rew2 = _rng.normal(size=(B, 2)).astype(np.float32)
_scores = _rng.integers(0, 4, (B, G)).astype(np.float32)
_scores_b = (_scores + _rng.integers(-1, 2, (B, G))).astype(np.float32)
_gvalid = _rng.uniform(size=(B, G)) > 0.2
_SORTED = ("aot", "aot_unpaired")


def _dpo_case(kind):
    """`dpo_loss` with the per-pair options `kind` accepts, all passed as sharded arrays."""

    def run(pc, pr, rc, rr, beta, eps, pw, lc, lr, valid):
        kw = {"loss_type": kind, "valid": valid}
        if kind not in _SORTED:
            kw.update(beta=beta, pair_weights=pw)
        else:
            kw.update(beta=0.2, label_smoothing=0.1)
        if kind in ("sigmoid", "robust", "exo_pair"):
            kw["label_smoothing"] = eps
        if kind in ("ipo", "sigmoid_norm"):
            kw.update(chosen_length=lc, rejected_length=lr)
        return dpo_loss(pc, pr, rc, rr, **kw)

    return ShardCase(
        f"dpo_loss_{kind}", run, (_pc, _pr, _rc, _rr, _beta, _eps, _pw, _lc, _lr, _valid), {}
    )


def _dpo_f(pc, pr, rc, rr, valid, *, f, alpha):
    return dpo_loss(
        pc,
        pr,
        rc,
        rr,
        loss_type=("sigmoid", "nca_pair", "ipo"),
        loss_weights=(1.0, 0.5, 0.01),
        f_divergence=f,
        f_alpha=alpha,
        valid=valid,
    )


def _simpo(c, r, beta, eps, valid):
    return simpo_loss(c, r, beta=beta, label_smoothing=eps, alpha=0.5, valid=valid)


def _kto(pd, pu, rd, ru, vd, vu, *, kind):
    return kto_loss(
        pd,
        pu,
        rd,
        ru,
        kl=0.3,
        loss_type=kind,
        chosen_valid=vd,
        rejected_valid=vu,
        undesirable_weight=1.3,
    )


def _bco(pd, pu, rd, ru, vd, vu):
    return bco_loss(pd, pu, rd, ru, delta=0.2, chosen_valid=vd, rejected_valid=vu)


def _rpo(pc, pr, rc, rr, tok, mask):
    return rpo_loss(
        pc,
        pr,
        rc,
        rr,
        nll_loss(tok, mask)[0],
        nll_coef=0.5,
        loss_type="robust",
        label_smoothing=0.1,
    )


def _best_worst(scores, valid):
    c, r, keep = best_worst_pairs(scores, min_margin=0.5, valid=valid)
    return jnp.stack([c.astype(jnp.float32), r.astype(jnp.float32), keep.astype(jnp.float32)])


def _token_rewards(lp, ref, mask, beta):
    return dpo_token_rewards(lp, ref, mask, beta=beta)


def _consistency(a, b, valid):
    return rank_consistency(a, b, valid=valid)


def _ld(lp_c, m_c, lp_r, m_r):
    return jnp.stack(ld_sequence_logprob(lp_c, m_c, lp_r, m_r, alpha=0.4))


CASES = [
    *[_dpo_case(kind) for kind in DPO_LOSS_TYPES],
    *[
        ShardCase(f"dpo_loss_{f}", _dpo_f, (_pc, _pr, _rc, _rr, _valid), {"f": f, "alpha": a})
        for f, a in (("forward_kl", 0.5), ("js_divergence", 0.5), ("alpha_divergence", 0.3))
    ],
    ShardCase("simpo_loss", _simpo, (_avg_c, _avg_r, _beta * 10, _eps, _valid), {}),
    *[
        ShardCase(f"cpo_loss_{k}", cpo_loss, (_pc, _pr), {"loss_type": k, "beta": 0.2})
        for k in ("sigmoid", "hinge", "ipo")
    ],
    ShardCase("orpo_loss", orpo_loss, (_avg_c, _avg_r), {"beta": 0.2}),
    *[
        ShardCase(f"kto_loss_{k}", _kto, (_pd, _pu, _rd, _ru, _valid, _vu), {"kind": k})
        for k in ("kto", "apo_zero_unpaired")
    ],
    ShardCase("kto_reference_point", kto_reference_point, (_pc, _rc), {}),
    ShardCase("bco_loss", _bco, (_pd, _pu, _rd, _ru, _valid, _vu), {}),
    *[ShardCase(f"nll_loss_{a}", nll_loss, (_tok, _mask), {"agg": a}) for a in AGG_MODES],
    ShardCase("rpo_loss", _rpo, (_pc, _pr, _rc, _rr, _tok, _mask), {}),
    ShardCase(
        "xpo_loss", xpo_loss, (_pc, _pr, _rc, _rr, _samples), {"alpha": 0.05, "loss_type": "hinge"}
    ),
    ShardCase("step_apo_loss", step_apo_loss, (_pc - _rc, _pr - _rr, _eps, _pw), {"beta": 0.3}),
    ShardCase("dpo_token_rewards", _token_rewards, (_tok, _tok_ref, _mask, _beta), {}),
    ShardCase(
        "tgdpo_loss",
        tgdpo_loss,
        (_tok - _tok_ref, _mask, _tok_r, _mask_r, _tok_rw, _tok_rw_r),
        {"beta": 0.2, "alpha": 0.7},
    ),
    ShardCase("pairwise_ppo_loss", pairwise_ppo_loss, (_seq2, _old2, _rew2), {"clip": 0.1}),
    ShardCase(
        "relative_regression_loss",
        relative_regression_loss,
        (_pc - _rc, _pr - _rr, _eps, _pw),
        {"eta": 0.5},
    ),
    ShardCase(
        "contrastive_pg_loss",
        contrastive_pg_loss,
        (_pc, _pr, _rc, _rr, _eps, _pw),
        {"beta": 0.2},
    ),
    ShardCase("best_worst_pairs", _best_worst, (_scores, _gvalid), {}),
    ShardCase("rank_consistency", _consistency, (_scores, _scores_b, _gvalid), {}),
    ShardCase("wpo_weights", wpo_weights, (_tok, _tok_ref, _mask), {}),
    ShardCase("ld_sequence_logprob", _ld, (_tok, _mask, _tok_r, _mask_r), {}),
]
