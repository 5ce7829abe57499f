"""Reference-free preference losses: SimPO (and AlphaPO), CPO, ORPO (ALGORITHMS.md §8.2–§8.4).

None of them needs a reference model. SimPO and ORPO are defined on length-averaged log-probs
`π̄ = Σ_t lp·m / max(Σ_t m, 1)` (`losses.sequence_logprob(..., reduce="mean")`); CPO on sums.
The NLL term that CPO and ORPO add to their objectives is `losses.nll_loss` on the chosen tokens,
added by the caller. Conventions as in `dpo_loss`: `[N]` inputs, optional `valid` pairs, optional
`pair_weights`, loss `Σ v·pw·ℓ / D` with `D = num_pairs or max(Σ v, 1)`, `pref/…` metrics.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_choice, check_positive, check_rank
from losses._policy import stop_gradient_metrics
from losses._preference import (
    batch_mean,
    check_unit_interval,
    pair_array,
    pair_mean,
    pair_valid,
    pair_weights_array,
    per_pair,
    reward_metrics,
)

CPO_LOSS_TYPES: tuple[str, ...] = ("sigmoid", "hinge", "ipo")
_ORPO_MAX_AVG_LOGP = -1e-6  # log1mexp needs ā < 0


def _two_inputs(
    chosen: Any, rejected: Any, names: tuple[str, str], valid: Any, *, where: str
) -> tuple[Array, Array, Array]:
    check_rank(chosen, 1, names[0], where=where)
    v = pair_valid(valid, jnp.shape(chosen), where=where)
    c = pair_array(chosen, names[0], v, where=where)
    r = pair_array(rejected, names[1], v, where=where)
    return c, r, v


def _smoothed_sigmoid(x: Array, eps: Array) -> Array:
    return -(1.0 - eps) * jax.nn.log_sigmoid(x) - eps * jax.nn.log_sigmoid(-x)


_EXP_CAP = 80.0  # exponent cap of AlphaPO's shape (as `dpo_loss`'s f-divergence scores)


def _alpha_shape(avg_logp: Array, alpha: float) -> Array:
    """AlphaPO's reward shape `u = (1 − exp(−α·π̄))/α`, `u = π̄` at α = 0 (continuous in α);
    the exponent is capped at 80 (`π̄ < −80/α`: e^80 already saturates the loss), as float32
    overflows past 88."""
    if alpha == 0:
        return avg_logp
    return -jnp.expm1(jnp.minimum(-alpha * avg_logp, _EXP_CAP)) / alpha


def simpo_loss(
    chosen_avg_logp: ArrayLike,
    rejected_avg_logp: ArrayLike,
    *,
    beta: float | ArrayLike = 2.0,
    gamma: float = 0.5,
    label_smoothing: float | ArrayLike = 0.0,
    alpha: float = 0.0,
    valid: ArrayLike | None = None,
    pair_weights: ArrayLike | None = None,
    num_pairs: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """SimPO: a reference-free margin on length-averaged log-probs (ALGORITHMS.md §8.2).

        u    = (1 − exp(−α·π̄))/α        (AlphaPO reward shape; u = π̄ at α = 0)
        x    = β·(u_c − u_r) − γ
        loss = mean_i [−(1−ε)·logσ(x_i) − ε·logσ(−x_i)]

    With γ = 0 and ε = 0 this is `dpo_loss(π̄_c, π̄_r, None, None, reference_free=True)` on the
    averages; the target margin γ asks the chosen response to win by γ/β in average log-prob.

    Sources: "SimPO: Simple Preference Optimization with a Reference-Free Reward"
    (arXiv 2405.14734); "AlphaPO: Reward shape matters for LLM alignment" (arXiv 2501.03884).
    Peer: TRL `CPOConfig(loss_type="simpo" | "alphapo", simpo_gamma, alpha, cpo_alpha=0)` (TRL's
    default β is 0.1). β = 2.0 lies in the paper's tuned range (reconstructed — verify against
    the paper: the paper tunes β per model, 2.0–10); γ = 0.5 is TRL's default.

    Args:
      chosen_avg_logp: `[N]` length-averaged policy log-probs `π̄_c` (differentiable).
      rejected_avg_logp: `[N]` length-averaged policy log-probs `π̄_r`.
      beta: `β > 0`, scalar or `[N]`.
      gamma: target reward margin `γ` (Python number or scalar).
      label_smoothing: `ε ∈ [0, 1]`, scalar or `[N]`.
      alpha: static AlphaPO shape parameter `α` (0: SimPO).
      valid: optional `[N]` {0,1}; invalid pairs are ignored.
      pair_weights: optional `[N]` non-negative weights (stop-gradient).
      num_pairs: global count of valid pairs; None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar; `pref/reward_chosen` (mean `β·u_c`),
      `pref/reward_rejected`, `pref/margin`, `pref/accuracy` (`mean[u_c > u_r]`).

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, m = simpo_loss(jnp.array([-2.0, -3.0]), jnp.array([-2.0, -2.75]))
      >>> round(float(loss), 4), float(m["pref/accuracy"])
      (1.1437, 0.0)
    """
    where = "simpo_loss"
    check_positive(beta, "beta", where=where)
    check_unit_interval(label_smoothing, "label_smoothing", where=where)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(f"{where}: `alpha` must be a Python number, got {type(alpha).__name__}.")
    c, r, v = _two_inputs(
        chosen_avg_logp,
        rejected_avg_logp,
        ("chosen_avg_logp", "rejected_avg_logp"),
        valid,
        where=where,
    )
    b = per_pair(beta, "beta", v, where=where)
    eps = per_pair(label_smoothing, "label_smoothing", v, where=where)
    g = per_pair(gamma, "gamma", v, where=where)
    u_c, u_r = _alpha_shape(c, alpha), _alpha_shape(r, alpha)
    x = b * (u_c - u_r) - g
    pw = pair_weights_array(pair_weights, v, where=where)
    loss = pair_mean(_smoothed_sigmoid(x, eps), pw, num_pairs, v, where=where)
    return loss, reward_metrics(b * u_c, b * u_r, v)


def cpo_loss(
    chosen_logp: ArrayLike,
    rejected_logp: ArrayLike,
    *,
    beta: float | ArrayLike = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float | ArrayLike = 0.0,
    valid: ArrayLike | None = None,
    pair_weights: ArrayLike | None = None,
    num_pairs: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """CPO's preference term: DPO without a reference model (ALGORITHMS.md §8.3).

        x = π_c − π_r
        sigmoid:  −(1−ε)·logσ(βx) − ε·logσ(−βx)
        hinge:    relu(1 − βx)
        ipo:      (x − 1/(2β))²

    `sigmoid` equals `dpo_loss(π_c, π_r, None, None, reference_free=True)`. CPO's full objective
    adds `1.0·nll_loss(chosen tokens, agg="token_mean")` (TRL `cpo_alpha=1.0`), added by the
    caller. Inputs are sequence sums; TRL feeds length-averaged log-probs for `ipo` — pass
    averages to reproduce it.

    Source: "Contrastive Preference Optimization: Pushing the Boundaries of LLM Performance in
    Machine Translation" (arXiv 2401.08417). Peer: TRL experimental `CPOTrainer`
    (`CPOConfig(loss_type="sigmoid" | "hinge" | "ipo", beta, label_smoothing, cpo_alpha)`).

    Args:
      chosen_logp: `[N]` policy log-prob sums of the chosen responses (differentiable).
      rejected_logp: `[N]` policy log-prob sums of the rejected responses.
      beta: `β > 0`, scalar or `[N]`.
      loss_type: "sigmoid", "hinge" or "ipo".
      label_smoothing: `ε ∈ [0, 1]` (sigmoid only), scalar or `[N]`.
      valid: optional `[N]` {0,1}; invalid pairs are ignored.
      pair_weights: optional `[N]` non-negative weights (stop-gradient).
      num_pairs: global count of valid pairs; None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar; `pref/reward_chosen` (mean `β·π_c`),
      `pref/reward_rejected`, `pref/margin`, `pref/accuracy` (`mean[π_c > π_r]`).

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, _ = cpo_loss(jnp.array([-10.0]), jnp.array([-12.0]), loss_type="hinge")
      >>> round(float(loss), 6)
      0.8
    """
    where = "cpo_loss"
    check_choice(loss_type, CPO_LOSS_TYPES, "loss_type", where=where)
    check_positive(beta, "beta", where=where)
    check_unit_interval(label_smoothing, "label_smoothing", where=where)
    if loss_type != "sigmoid" and not (
        isinstance(label_smoothing, int | float) and label_smoothing == 0
    ):
        raise ValueError(
            f"{where}: `label_smoothing` is read only by loss_type='sigmoid', got "
            f"label_smoothing={label_smoothing!r} with loss_type={loss_type!r}; pass 0.0."
        )
    c, r, v = _two_inputs(
        chosen_logp, rejected_logp, ("chosen_logp", "rejected_logp"), valid, where=where
    )
    b = per_pair(beta, "beta", v, where=where)
    x = c - r
    if loss_type == "sigmoid":
        per_item = _smoothed_sigmoid(
            b * x, per_pair(label_smoothing, "label_smoothing", v, where=where)
        )
    elif loss_type == "hinge":
        per_item = jax.nn.relu(1.0 - b * x)
    else:
        half_inv_beta = jnp.where(v > 0, 0.5 / jnp.where(v > 0, b, 1.0), 0.0)
        per_item = (x - half_inv_beta) ** 2
    pw = pair_weights_array(pair_weights, v, where=where)
    loss = pair_mean(per_item, pw, num_pairs, v, where=where)
    return loss, reward_metrics(b * c, b * r, v)


def _log1mexp(x: Array) -> Array:
    """`log(1 − eˣ)` for `x < 0`, accurate on both sides of `−ln 2` (Mächler's rule)."""
    return jnp.where(x > -jnp.log(2.0), jnp.log(-jnp.expm1(x)), jnp.log1p(-jnp.exp(x)))


def orpo_loss(
    chosen_avg_logp: ArrayLike,
    rejected_avg_logp: ArrayLike,
    *,
    beta: float | ArrayLike = 0.1,
    valid: ArrayLike | None = None,
    pair_weights: ArrayLike | None = None,
    num_pairs: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """ORPO's odds-ratio term on length-averaged log-probs (ALGORITHMS.md §8.4).

        ā        = min(π̄, −1e-6)
        log_odds = (ā_c − ā_r) − (log1mexp(ā_c) − log1mexp(ā_r))      log1mexp(x) = log(1 − eˣ)
        loss     = −β·mean_i logσ(log_odds_i)

    `log_odds` is the log of the odds ratio `odds(y_c)/odds(y_r)` with `odds = p/(1 − p)` and
    `p = exp(ā)`. Equal averages give `β·log 2`; the gradient raises `ā_c` and lowers `ā_r`. This
    is the odds-ratio term only: ORPO's objective adds `nll_loss(chosen tokens,
    agg="token_mean")`. The clamp at −1e-6 keeps `log1mexp` finite (its gradient is 0 above).

    Source: "ORPO: Monolithic Preference Optimization without Reference Model"
    (arXiv 2403.07691). Peers: TRL experimental `ORPOTrainer` (`beta`); Tunix
    `DPOTrainingConfig(algorithm="orpo")` takes *summed* log-probs here
    (`sequence_logprob(..., reduce="sum")`, `beta=lambda_orpo`) with
    `nll_loss(agg="seq_mean_token_mean")`, and its `label_smoothing` has no equivalent.

    Args:
      chosen_avg_logp: `[N]` length-averaged policy log-probs of the chosen responses.
      rejected_avg_logp: `[N]` length-averaged policy log-probs of the rejected responses.
      beta: weight `β > 0` of the odds-ratio term, scalar or `[N]`.
      valid: optional `[N]` {0,1}; invalid pairs are ignored.
      pair_weights: optional `[N]` non-negative weights (stop-gradient).
      num_pairs: global count of valid pairs; None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar; `pref/reward_chosen` (mean `β·ā_c`),
      `pref/reward_rejected`, `pref/margin`, `pref/accuracy` (`mean[ā_c > ā_r]`),
      `pref/log_odds` (mean `log_odds`), `pref/log_odds_ratio` (mean `logσ(log_odds)`).

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, m = orpo_loss(jnp.array([-2.0]), jnp.array([-2.0]))
      >>> round(float(loss), 6)  # β·log 2
      0.069315
    """
    where = "orpo_loss"
    check_positive(beta, "beta", where=where)
    c, r, v = _two_inputs(
        chosen_avg_logp,
        rejected_avg_logp,
        ("chosen_avg_logp", "rejected_avg_logp"),
        valid,
        where=where,
    )
    b = per_pair(beta, "beta", v, where=where)
    a_c = jnp.minimum(c, _ORPO_MAX_AVG_LOGP)
    a_r = jnp.minimum(r, _ORPO_MAX_AVG_LOGP)
    log_odds = (a_c - a_r) - (_log1mexp(a_c) - _log1mexp(a_r))
    log_sig = jax.nn.log_sigmoid(log_odds)
    pw = pair_weights_array(pair_weights, v, where=where)
    loss = pair_mean(-b * log_sig, pw, num_pairs, v, where=where)
    metrics = reward_metrics(b * c, b * r, v)
    metrics["pref/log_odds"] = batch_mean(log_odds, v)
    metrics["pref/log_odds_ratio"] = batch_mean(log_sig, v)
    return loss, stop_gradient_metrics(metrics)
