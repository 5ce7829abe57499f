"""Reward-model scores made harder to hack: PAR shaping and ensembles (ALGORITHMS.md §10.3, §10.6).

A learned reward model is over-optimised when the policy finds responses it scores too high.
Two remedies act on the scores before the advantage estimator:

* bound and centre the reward against reference responses (`par_rewards`);
* aggregate an ensemble of reward models conservatively (`ensemble_rewards`).

Reward functions run under stop-gradient (§0.6). Every output is float32.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_choice
from losses._rewards import check_number, real_array, sg

EnsembleMode = Literal["mean", "wco", "uwo", "robust"]
ENSEMBLE_MODES: tuple[str, ...] = ("mean", "wco", "uwo", "robust")


def par_rewards(scores: ArrayLike, ref_scores: ArrayLike) -> Array:
    """Preference-as-reward shaping: sigmoid of the score centred on references (ALGORITHMS.md §10.3).

        r_n = mean_r σ(s_n − s_ref,nr)

    Bounded in (0, 1), 0.5 when the response scores like the references, invariant to a shift
    common to `s` and `s_ref`, and flat for large margins: the policy gains little from pushing the
    reward model far beyond the references.

    Source: PAR, "Reward Shaping to Mitigate Reward Hacking in RLHF" (arXiv 2502.18770). No peer.

    Args:
      scores: `[N]` reward-model scores of the sampled responses.
      ref_scores: `[N,R]` scores of `R` reference responses per sample (e.g. the SFT model's
        responses to the same prompt), or `[R]` references shared by every sample.

    Returns:
      `[N]` float32 rewards in (0, 1), under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = par_rewards(jnp.array([1.0, -0.5]), jnp.array([0.0, 0.5]))
      >>> [round(x, 6) for x in r.tolist()]
      [0.676759, 0.323241]
    """
    where = "par_rewards"
    s = real_array(scores, "scores", where=where, rank=1)
    ref = real_array(ref_scores, "ref_scores", where=where, rank=(1, 2))
    if ref.ndim == 2 and ref.shape[0] != s.shape[0]:
        raise ValueError(
            f"{where}: `ref_scores` must be [N,R] with N = {s.shape[0]} or [R], "
            f"got shape {ref.shape}."
        )
    if ref.shape[-1] < 1:
        raise ValueError(f"{where}: `ref_scores` needs at least one reference, got {ref.shape}.")
    if ref.ndim == 1:
        ref = ref[None, :]
    return sg(jnp.mean(jax.nn.sigmoid(s[:, None] - ref), axis=-1))


def ensemble_rewards(
    rewards: ArrayLike,
    *,
    mode: EnsembleMode = "mean",
    uwo_coef: float | None = None,
    robust_weight: float | None = None,
) -> Array:
    """Combine the scores of an ensemble of `E` reward models (ALGORITHMS.md §10.6).

        mean:    mean_e r_e
        wco:     min_e r_e                                  (worst-case optimisation)
        uwo:     mean_e r_e − λ·var_e r_e   (ddof 0)        (uncertainty-weighted optimisation)
        robust:  ω·r_0 + (1 − ω)·min_e r_e                  (member 0 is the nominal model, BRME)

    `wco ≤ mean` and `uwo ≤ mean` (λ ≥ 0) always; `wco ≤ uwo` holds when
    `λ·var ≤ mean − min`, e.g. whenever `λ ≤ 1/(max_e − min_e)` (Bhatia–Davis). With `E = 1`
    every mode returns the single member.

    Sources: "Reward Model Ensembles Help Mitigate Overoptimization" (arXiv 2310.02743; WCO, UWO);
    "Reward-Robust RLHF in LLMs" (seed paper; nominal-plus-worst-case BRME). `uwo_coef` and
    `robust_weight` are required for their modes: the papers tune them per setup. Peers:
    OpenRLHF accepts several reward models (`--reward_pretrain a,b`) but has no WCO/UWO mode.

    Args:
      rewards: `[E,N]` scores of `E` members for `N` samples (standardise each member first if
        their scales differ).
      mode: "mean", "wco", "uwo" or "robust".
      uwo_coef: λ >= 0, required for "uwo".
      robust_weight: ω in [0, 1], required for "robust".

    Returns:
      `[N]` float32 rewards, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[1.0, 0.2], [0.6, 0.4], [0.8, 0.0]])
      >>> [round(x, 6) for x in ensemble_rewards(r, mode="wco").tolist()]
      [0.6, 0.0]
      >>> [round(x, 6) for x in ensemble_rewards(r, mode="uwo", uwo_coef=0.5).tolist()]
      [0.786667, 0.186667]
    """
    where = "ensemble_rewards"
    check_choice(mode, ENSEMBLE_MODES, "mode", where=where)
    r = real_array(rewards, "rewards", where=where, rank=2)
    if r.shape[0] < 1:
        raise ValueError(f"{where}: `rewards` needs at least one member (axis 0), got {r.shape}.")
    if mode == "mean":
        return sg(jnp.mean(r, axis=0))
    if mode == "wco":
        return sg(jnp.min(r, axis=0))
    if mode == "uwo":
        if uwo_coef is None:
            raise ValueError(f"{where}: mode='uwo' requires `uwo_coef` (λ >= 0), got None.")
        check_number(uwo_coef, "uwo_coef", where=where, low=0.0)
        mean = jnp.mean(r, axis=0)
        var = jnp.mean((r - mean) ** 2, axis=0)
        return sg(mean - uwo_coef * var)
    if robust_weight is None:
        raise ValueError(
            f"{where}: mode='robust' requires `robust_weight` (ω in [0, 1]), got None."
        )
    check_number(robust_weight, "robust_weight", where=where, low=0.0, high=1.0)
    # member 0 selected by a reduction rather than `r[0]`: `E` may be sharded across devices
    is_nominal = jnp.arange(r.shape[0])[:, None] == 0
    nominal = jnp.sum(jnp.where(is_nominal, r, 0.0), axis=0)
    return sg(robust_weight * nominal + (1.0 - robust_weight) * jnp.min(r, axis=0))
