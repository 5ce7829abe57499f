"""DPO and its loss types: one function, `dpo_loss`, for the whole family (ALGORITHMS.md §8.1).

Inputs are sequence log-prob sums over completion tokens (`losses.sequence_logprob`) of the policy
(`π_c, π_r`) and the frozen reference (`ref_c, ref_r`) on chosen/rejected pairs, `[N]` each.
With `lr = π − ref` (`ref ≡ 0` when `reference_free=True`), the f-divergence score `s(lr)`,
`Δ = s_c − s_r` and `z = β·Δ`, each `loss_type` is a per-pair formula (table in `dpo_loss`); the
loss is `Σ_k w_k · Σ_i v_i·pw_i·ℓ_k,i / D` over the listed types `k` (`loss_weights`), valid pairs
`v`, pair weights `pw` and `D = num_pairs or max(Σ v, 1)`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import as_float32, check_choice, check_positive, check_rank, replicated
from losses._policy import stop_gradient_metrics
from losses._preference import (
    batch_mean,
    check_static_number,
    check_unit_interval,
    pair_array,
    pair_denominator,
    pair_valid,
    pair_weights_array,
    per_pair,
    reward_metrics,
)

DPO_LOSS_TYPES: tuple[str, ...] = (
    "sigmoid",
    "robust",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sigmoid_norm",
)
F_DIVERGENCES: tuple[str, ...] = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")

_LENGTH_TYPES = ("ipo", "sigmoid_norm")  # use Δ' = s_c/ℓ_c − s_r/ℓ_r when lengths are given
_SMOOTHED_TYPES = ("sigmoid", "robust", "exo_pair", "aot", "aot_unpaired")  # read ε
_LOG_RATIO_TYPES = ("aot", "aot_unpaired", "apo_zero", "apo_down")  # defined on lr, not on s(lr)
_SORTED_TYPES = ("aot", "aot_unpaired")  # re-match pairs by sorting over the batch
_EXP_CAP = 80.0  # exponent cap of the forward-KL / α-divergence scores
# |term| cap of the squared losses (IPO, SPPO): e^80 squared overflows float32; 1e17 squared
# (1e34) leaves room for a batch's sum
_SQUARE_CAP = 1e17


class _Terms(NamedTuple):
    """Everything a per-pair formula may read (all `[N]` float32, zero where invalid)."""

    pi_c: Array
    pi_r: Array
    ref_c: Array
    ref_r: Array
    lr_c: Array
    lr_r: Array
    s_c: Array
    s_r: Array
    delta_len: Array  # Δ' (= Δ when no lengths were given)
    beta: Array
    eps: Array
    beta_raw: Array  # as given (scalar for the sorted types): sorting moves pairs, not β
    eps_raw: Array
    tau: Any
    v: Array


def _smoothed_sigmoid(x: Array, eps: Array) -> Array:
    """`−(1−ε)·logσ(x) − ε·logσ(−x)` (ε = 0: `−logσ(x)`)."""
    return -(1.0 - eps) * jax.nn.log_sigmoid(x) - eps * jax.nn.log_sigmoid(-x)


def _sorted_valid_first(x: Array, v: Array) -> tuple[Array, Array]:
    """`x` sorted ascending over the valid entries, invalid ones moved to the end.

    The sort key is `sg(x)` (+inf where invalid); values are gathered from `x`, so the gradient
    of each sorted entry flows to the element it came from. Sharded inputs are gathered first.
    """
    x, v = replicated(x), replicated(v)
    order = jnp.argsort(jnp.where(v > 0, jax.lax.stop_gradient(x), jnp.inf), stable=True)
    return x[order], v[order]


def _aot(t: _Terms, unpaired: bool) -> tuple[Array, Array]:
    if unpaired:
        a, va = _sorted_valid_first(t.lr_c, t.v)
        b, _ = _sorted_valid_first(t.lr_r, t.v)
    else:
        a, va = _sorted_valid_first(t.pi_c - t.pi_r, t.v)
        b, _ = _sorted_valid_first(t.ref_c - t.ref_r, t.v)
    delta = jnp.where(va > 0, a - b, 0.0)
    return _smoothed_sigmoid(t.beta_raw * delta, t.eps_raw), va


def _exo(t: _Terms) -> Array:
    z = t.beta * (t.s_c - t.s_r)
    # ε only matters on valid pairs (checked in (0, 1) when static); keep the logs finite elsewhere
    eps = jnp.where(t.v > 0, t.eps, 0.5)
    return jax.nn.sigmoid(z) * (jax.nn.log_sigmoid(z) - jnp.log1p(-eps)) + jax.nn.sigmoid(-z) * (
        jax.nn.log_sigmoid(-z) - jnp.log(eps)
    )


def _discopop(t: _Terms) -> Array:
    z = t.beta * (t.s_c - t.s_r)
    mu = jax.nn.sigmoid(z / t.tau)
    # e^{−z}·μ written as exp(−z + logσ(z/τ)): the same number, without inf·0 for z ≪ 0
    return -jax.nn.log_sigmoid(z) * (1.0 - mu) + jnp.exp(-z + jax.nn.log_sigmoid(z / t.tau))


def _square(x: Array) -> Array:
    """`x²`, with `|x|` capped at `_SQUARE_CAP` (reached only by forward-KL / α scores)."""
    return jnp.clip(x, -_SQUARE_CAP, _SQUARE_CAP) ** 2


def _ipo(t: _Terms) -> Array:
    half_inv_beta = jnp.where(t.v > 0, 0.5 / jnp.where(t.v > 0, t.beta, 1.0), 0.0)
    return _square(t.delta_len - half_inv_beta)


def _sppo_hard(t: _Terms) -> Array:
    half_inv_beta = jnp.where(t.v > 0, 0.5 / jnp.where(t.v > 0, t.beta, 1.0), 0.0)
    return _square(t.s_c - half_inv_beta) + _square(t.s_r + half_inv_beta)


def _robust(t: _Terms) -> Array:
    z = t.beta * (t.s_c - t.s_r)
    num = -(1.0 - t.eps) * jax.nn.log_sigmoid(z) + t.eps * jax.nn.log_sigmoid(-z)
    return num / (1.0 - 2.0 * t.eps)


def _plain(fn: Callable[[_Terms], Array]) -> Callable[[_Terms], tuple[Array, None]]:
    """A per-pair formula whose items are the pairs themselves (weights applied by the caller)."""
    return lambda t: (fn(t), None)


_FORMULAS: dict[str, Callable[[_Terms], tuple[Array, Array | None]]] = {
    "sigmoid": _plain(lambda t: _smoothed_sigmoid(t.beta * (t.s_c - t.s_r), t.eps)),
    "robust": _plain(_robust),
    "hinge": _plain(lambda t: jax.nn.relu(1.0 - t.beta * (t.s_c - t.s_r))),
    "ipo": _plain(_ipo),
    "exo_pair": _plain(_exo),
    "nca_pair": _plain(
        lambda t: (
            -jax.nn.log_sigmoid(t.beta * t.s_c)
            - 0.5 * jax.nn.log_sigmoid(-t.beta * t.s_c)
            - 0.5 * jax.nn.log_sigmoid(-t.beta * t.s_r)
        )
    ),
    "bco_pair": _plain(
        lambda t: -jax.nn.log_sigmoid(t.beta * t.s_c) - jax.nn.log_sigmoid(-t.beta * t.s_r)
    ),
    "sppo_hard": _plain(_sppo_hard),
    "aot": lambda t: _aot(t, unpaired=False),
    "aot_unpaired": lambda t: _aot(t, unpaired=True),
    "apo_zero": _plain(
        lambda t: (1.0 - jax.nn.sigmoid(t.beta * t.lr_c)) + jax.nn.sigmoid(t.beta * t.lr_r)
    ),
    "apo_down": _plain(
        lambda t: (
            jax.nn.sigmoid(t.beta * t.lr_c) + (1.0 - jax.nn.sigmoid(t.beta * (t.lr_c - t.lr_r)))
        )
    ),
    "discopop": _plain(_discopop),
    "sigmoid_norm": _plain(lambda t: -jax.nn.log_sigmoid(t.beta * t.delta_len)),
}


def _f_divergence_score(lr: Array, f_divergence: str, f_alpha: float) -> Array:
    """The score `s(lr)` of ALGORITHMS.md §8.1 ("Beyond Reverse KL", arXiv 2309.16240)."""
    if f_divergence == "reverse_kl" or (
        f_divergence == "alpha_divergence" and abs(f_alpha - 1.0) < 1e-6
    ):
        return lr
    if f_divergence == "forward_kl":
        return -jnp.exp(jnp.minimum(-lr, _EXP_CAP))
    if f_divergence == "js_divergence":
        return jax.nn.log_sigmoid(lr)
    return jnp.exp(jnp.minimum((f_alpha - 1.0) * lr, _EXP_CAP)) / (f_alpha - 1.0)


def _loss_types(loss_type: Any, *, where: str) -> tuple[str, ...]:
    types = (loss_type,) if isinstance(loss_type, str) else tuple(loss_type)
    if not types:
        raise ValueError(
            f"{where}: `loss_type` must name at least one loss type, got {loss_type!r}."
        )
    for name in types:
        check_choice(name, DPO_LOSS_TYPES, "loss_type", where=where)
    if len(set(types)) != len(types):
        raise ValueError(f"{where}: `loss_type` lists a type twice: {types!r}.")
    return types


def _loss_weights(loss_weights: Any, n: int, *, where: str) -> tuple[Any, ...]:
    if loss_weights is None:
        return (1.0,) * n
    if isinstance(loss_weights, int | float) or not isinstance(loss_weights, Sequence):
        raise ValueError(
            f"{where}: `loss_weights` must be a sequence with one weight per loss type ({n}), "
            f"got {loss_weights!r}."
        )
    weights = tuple(loss_weights)
    if len(weights) != n:
        raise ValueError(
            f"{where}: `loss_weights` must have one weight per loss type ({n}), got {len(weights)}."
        )
    for w in weights:
        check_positive(w, "loss_weights", where=where, allow_zero=True)
    return weights


def _check_options(
    types: tuple[str, ...],
    *,
    beta: Any,
    label_smoothing: Any,
    lengths_given: bool,
    f_divergence: str,
    f_alpha: Any,
    discopop_tau: Any,
    pair_weights: Any,
    where: str,
) -> None:
    """Static checks that tie keyword values to the loss types that read them."""
    check_positive(beta, "beta", where=where)
    check_choice(f_divergence, F_DIVERGENCES, "f_divergence", where=where)
    check_static_number(f_alpha, "f_alpha", where=where)
    check_positive(discopop_tau, "discopop_tau", where=where)
    check_unit_interval(label_smoothing, "label_smoothing", where=where)
    if "robust" in types:
        check_unit_interval(
            label_smoothing, "label_smoothing", where=where, high=0.5, high_open=True
        )
    if "exo_pair" in types:
        check_unit_interval(
            label_smoothing, "label_smoothing", where=where, low_open=True, high_open=True
        )
    smoothing_set = not (isinstance(label_smoothing, int | float) and label_smoothing == 0)
    if smoothing_set and not set(types) & set(_SMOOTHED_TYPES):
        raise ValueError(
            f"{where}: `label_smoothing` is read only by loss types {_SMOOTHED_TYPES}, got "
            f"label_smoothing={label_smoothing!r} with loss_type={types!r}; pass 0.0."
        )
    if lengths_given and not set(types) & set(_LENGTH_TYPES):
        raise ValueError(
            f"{where}: `chosen_length`/`rejected_length` are read only by loss types "
            f"{_LENGTH_TYPES}, got loss_type={types!r}; pass None."
        )
    on_log_ratio = [t for t in types if t in _LOG_RATIO_TYPES]
    if f_divergence != "reverse_kl" and on_log_ratio:
        raise ValueError(
            f"{where}: loss types {tuple(on_log_ratio)} are defined on the log-ratios, not on an "
            f"f-divergence score; use f_divergence='reverse_kl', got {f_divergence!r}."
        )
    sorted_types = [t for t in types if t in _SORTED_TYPES]
    if sorted_types:
        if pair_weights is not None:
            raise ValueError(
                f"{where}: `pair_weights` cannot be used with {tuple(sorted_types)}: those types "
                "re-match pairs by sorting, so a weight has no pair to belong to."
            )
        for name, value in (("beta", beta), ("label_smoothing", label_smoothing)):
            if jnp.ndim(value) != 0:
                raise ValueError(
                    f"{where}: `{name}` must be a scalar with {tuple(sorted_types)} (pairs are "
                    f"re-matched by sorting), got shape {jnp.shape(value)}."
                )


def _lengths(chosen_length: Any, rejected_length: Any, v: Array, *, where: str) -> Any:
    if chosen_length is None and rejected_length is None:
        return None
    if chosen_length is None or rejected_length is None:
        raise ValueError(
            f"{where}: pass both `chosen_length` and `rejected_length` or neither, got only "
            f"{'chosen_length' if rejected_length is None else 'rejected_length'}."
        )
    lc = pair_array(
        chosen_length, "chosen_length", v, where=where, differentiable=False, floating=False
    )
    lrj = pair_array(
        rejected_length, "rejected_length", v, where=where, differentiable=False, floating=False
    )
    return jnp.maximum(lc, 1.0), jnp.maximum(lrj, 1.0)


def _reference(ref: Any, name: str, v: Array, reference_free: bool, *, where: str) -> Array:
    if reference_free:
        if ref is not None:
            raise ValueError(
                f"{where}: reference_free=True uses ref ≡ 0; pass `{name}=None`, got an array."
            )
        return jnp.zeros(v.shape, jnp.float32)
    if ref is None:
        raise ValueError(f"{where}: `{name}` is required unless reference_free=True, got None.")
    return pair_array(ref, name, v, where=where, differentiable=False)


def dpo_loss(
    chosen_logp: ArrayLike,
    rejected_logp: ArrayLike,
    ref_chosen_logp: ArrayLike | None,
    ref_rejected_logp: ArrayLike | None,
    *,
    beta: float | ArrayLike = 0.1,
    loss_type: str | Sequence[str] = "sigmoid",
    label_smoothing: float | ArrayLike = 0.0,
    chosen_length: ArrayLike | None = None,
    rejected_length: ArrayLike | None = None,
    f_divergence: str = "reverse_kl",
    f_alpha: float = 0.5,
    discopop_tau: float = 0.05,
    reference_free: bool = False,
    pair_weights: ArrayLike | None = None,
    loss_weights: Sequence[float] | None = None,
    valid: ArrayLike | None = None,
    num_pairs: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Direct Preference Optimization and its loss types (ALGORITHMS.md §8.1).

    With `lr = π − ref` per sequence, the f-divergence score `s = s(lr)`, `Δ = s_c − s_r`,
    `z = β·Δ`, `ε = label_smoothing` and `Δ' = s_c/ℓ_c − s_r/ℓ_r` when lengths are given
    (else `Δ' = Δ`), the per-pair loss of each `loss_type` is:

        sigmoid       −(1−ε)·logσ(z) − ε·logσ(−z)                    DPO 2305.18290; ε>0: cDPO
        robust        (−(1−ε)·logσ(z) + ε·logσ(−z)) / (1 − 2ε)      rDPO 2403.00409, 0 ≤ ε < ½
        hinge         relu(1 − z)                                    SLiC-HF 2305.10425
        ipo           (Δ' − 1/(2β))²                                 IPO 2310.12036
        exo_pair      σ(z)(logσ(z) − log(1−ε)) + σ(−z)(logσ(−z) − log ε), 0 < ε < 1   EXO 2402.00856
        nca_pair      −logσ(β s_c) − ½logσ(−β s_c) − ½logσ(−β s_r)  NCA 2402.05369
        bco_pair      −logσ(β s_c) − logσ(−β s_r)                    BCO 2404.04656 (δ = 0)
        sppo_hard     (s_c − 1/(2β))² + (s_r + 1/(2β))²              SPPO 2405.00675
        aot           sigmoid form on δ = sort(π_c − π_r) − sort(ref_c − ref_r)   AOT 2406.05882
        aot_unpaired  sigmoid form on δ = sort(lr_c) − sort(lr_r)   AOT 2406.05882 (TRL `aot_pair`)
        apo_zero      (1 − σ(β lr_c)) + σ(β lr_r)                    APO 2408.06266
        apo_down      σ(β lr_c) + (1 − σ(β(lr_c − lr_r)))            APO 2408.06266
        discopop      μ = σ(z/τ_d): −logσ(z)(1−μ) + exp(−z)·μ        DiscoPOP 2406.08414
        sigmoid_norm  −logσ(β·Δ')                                    TRL

    Scores (`f_divergence`, "Beyond Reverse KL: Generalizing Direct Preference Optimization with
    Diverse Divergence Constraints", arXiv 2309.16240): `reverse_kl: s = lr`;
    `forward_kl: s = −exp(min(−lr, 80))`; `js_divergence: s = logσ(lr)`;
    `alpha_divergence: s = exp(min((α−1)·lr, 80))/(α−1)` (reverse KL when `|α − 1| < 1e-6`).
    Our `f_alpha = α` is TRL's `f_alpha_divergence_coef` (TRL 1.16: default 0.5, 1 falls back
    to reverse KL; older TRL releases took `1 − α`). The exponent cap of 80 (also applied to
    forward_kl) keeps float32 finite. The types defined on `lr` (aot, aot_unpaired, apo_zero,
    apo_down) require `f_divergence="reverse_kl"`. TRL's scores are ours plus a constant that
    makes them vanish at `lr = 0` (`1 − e^{−lr}`, `log 2 + logσ(lr)`, `(e^{(α−1)lr} − 1)/(α−1)`):
    the constant cancels in `Δ`, so every type on `Δ` agrees, but not in `Δ'` or in the types
    that read `s_c` and `s_r` apart; TRL 1.16 refuses those (nca_pair, bco_pair, sppo_hard)
    with another divergence, and reproduces ipo / sigmoid_norm with lengths only for reverse_kl.

    The loss is `Σ_k w_k · Σ_i v_i·pw_i·ℓ_k,i / D` over the types `k` of a tuple `loss_type`
    with `loss_weights` `w` (default all 1.0; MPO, arXiv 2411.10442, is
    `("sigmoid", "bco_pair")` with `(0.8, 0.2)` plus an NLL term via `rpo_loss`), valid pairs
    `v`, `pair_weights` `pw` (e.g. WPO's `wpo_weights` products) and `D = num_pairs` or
    `max(Σ v, 1)`. `aot`/`aot_unpaired` sort over the whole (global) batch: invalid pairs are
    sorted last, and pair weights, per-pair β and per-pair ε are refused because sorting re-matches
    the pairs. `β` and `ε` may be per-pair `[N]` arrays (MM-RLHF's dynamic β,
    `β_i = β₀(1 + w(1 − e^{−k·margin_i}))`; CREAM's soft labels `ε_i = 1 − c_i` with
    `rank_consistency`). Static checks: `β > 0`; `ε ∈ [0, 1]`, `< ½` for robust, `∈ (0, 1)` for
    exo_pair (TRL 1.16 raises too; older releases replaced ε = 0 by 1e-3); a non-zero ε needs a
    type that reads it and lengths need ipo or sigmoid_norm, otherwise `ValueError`. Lengths
    are clamped to ≥ 1. Reference log-probs carry no gradient.

    Peers: TRL `DPOConfig(loss_type=..., label_smoothing, f_divergence_type,
    f_alpha_divergence_coef, discopop_tau, reference_free, loss_weights)` (all types; TRL's ipo
    divides by the lengths: pass `chosen_length`/`rejected_length`); OpenRLHF `DPOLoss(beta,
    label_smoothing, ipo)` (cDPO, summed IPO); Tunix `dpo_loss_fn` (cDPO). Current TRL ignores ε
    for sigmoid (pass 0.0 to reproduce it).

    Args:
      chosen_logp: `[N]` policy log-prob sums `π_c` of the chosen responses (differentiable).
      rejected_logp: `[N]` policy log-prob sums `π_r` of the rejected responses.
      ref_chosen_logp: `[N]` reference log-prob sums `ref_c` (None iff `reference_free`).
      ref_rejected_logp: `[N]` reference log-prob sums `ref_r` (None iff `reference_free`).
      beta: `β > 0`, scalar or `[N]`.
      loss_type: one name of the table or a tuple of names (weighted sum).
      label_smoothing: `ε`, scalar or `[N]` (sigmoid = cDPO, robust, exo_pair, aot types).
      chosen_length: `[N]` token counts `ℓ_c` of the chosen responses (ipo, sigmoid_norm).
      rejected_length: `[N]` token counts `ℓ_r` of the rejected responses.
      f_divergence: "reverse_kl", "forward_kl", "js_divergence" or "alpha_divergence".
      f_alpha: static `α` of the α-divergence (see above).
      discopop_tau: `τ_d > 0` of discopop (DiscoPOP's 0.05).
      reference_free: `ref ≡ 0` (pass None for both reference arrays).
      pair_weights: optional `[N]` non-negative weights (stop-gradient).
      loss_weights: one weight per loss type when `loss_type` is a tuple.
      valid: optional `[N]` {0,1}; invalid (padding) pairs are ignored.
      num_pairs: global count `D` of valid pairs (micro-batching); None: this batch's.

    Returns:
      `(loss, metrics)`: a float32 scalar; `pref/reward_chosen` (mean `β·lr_c`),
      `pref/reward_rejected`, `pref/margin` (mean `β(lr_c − lr_r)`), `pref/accuracy`
      (`mean[lr_c > lr_r]`), `pref/logp_chosen`, `pref/logp_rejected` (mean `π`), and with
      several types `pref/loss_<type>` (each type's unweighted loss).

    Examples:
      >>> import jax.numpy as jnp
      >>> pc, pr = jnp.array([-3.0, -4.5]), jnp.array([-6.0, -5.0])
      >>> rc, rr = jnp.array([-4.0, -4.0]), jnp.array([-5.0, -5.0])
      >>> loss, m = dpo_loss(pc, pr, rc, rr, beta=0.1)
      >>> round(float(loss), 6), float(m["pref/accuracy"])
      (0.6583, 0.5)
      >>> loss, _ = dpo_loss(pc, pr, rc, rr, loss_type="ipo")
      >>> float(loss)
      19.625
    """
    where = "dpo_loss"
    types = _loss_types(loss_type, where=where)
    weights = _loss_weights(loss_weights, len(types), where=where)
    lengths_given = chosen_length is not None or rejected_length is not None
    _check_options(
        types,
        beta=beta,
        label_smoothing=label_smoothing,
        lengths_given=lengths_given,
        f_divergence=f_divergence,
        f_alpha=f_alpha,
        discopop_tau=discopop_tau,
        pair_weights=pair_weights,
        where=where,
    )
    pairs = _dpo_pairs(
        chosen_logp,
        rejected_logp,
        ref_chosen_logp,
        ref_rejected_logp,
        valid,
        reference_free,
        where=where,
    )
    pi_c, pi_r, ref_c, ref_r, v = pairs
    b = per_pair(beta, "beta", v, where=where)
    eps = per_pair(label_smoothing, "label_smoothing", v, where=where)
    lr_c, lr_r = pi_c - ref_c, pi_r - ref_r
    s_c = _f_divergence_score(lr_c, f_divergence, f_alpha)
    s_r = _f_divergence_score(lr_r, f_divergence, f_alpha)
    lengths = _lengths(chosen_length, rejected_length, v, where=where)
    delta_len = s_c - s_r if lengths is None else s_c / lengths[0] - s_r / lengths[1]
    raw = [jax.lax.stop_gradient(as_float32(x)) for x in (beta, label_smoothing)]
    terms = _Terms(
        pi_c, pi_r, ref_c, ref_r, lr_c, lr_r, s_c, s_r, delta_len, b, eps, *raw, discopop_tau, v
    )
    pw = pair_weights_array(pair_weights, v, where=where)
    den = pair_denominator(v, num_pairs, where=where)

    loss = jnp.zeros((), jnp.float32)
    metrics = reward_metrics(b * lr_c, b * lr_r, v)
    metrics["pref/logp_chosen"] = batch_mean(pi_c, v)
    metrics["pref/logp_rejected"] = batch_mean(pi_r, v)
    for name, w in zip(types, weights, strict=True):
        per_item, item_weights = _FORMULAS[name](terms)
        item_weights = pw if item_weights is None else item_weights
        type_loss = jnp.sum(jnp.where(item_weights != 0, per_item * item_weights, 0.0)) / den
        loss = loss + as_float32(w) * type_loss
        if len(types) > 1:
            metrics[f"pref/loss_{name}"] = type_loss
    return loss, stop_gradient_metrics(metrics)


def _dpo_pairs(
    chosen_logp: Any,
    rejected_logp: Any,
    ref_chosen_logp: Any,
    ref_rejected_logp: Any,
    valid: Any,
    reference_free: bool,
    *,
    where: str,
) -> tuple[Array, Array, Array, Array, Array]:
    """Validate the four `[N]` log-prob arrays; `(π_c, π_r, ref_c, ref_r, v)` zeroed off-valid."""
    if not isinstance(reference_free, bool):
        raise ValueError(
            f"{where}: `reference_free` must be a Python bool, got {type(reference_free).__name__}."
        )
    check_rank(chosen_logp, 1, "chosen_logp", where=where)
    v = pair_valid(valid, jnp.shape(chosen_logp), where=where)
    pi_c = pair_array(chosen_logp, "chosen_logp", v, where=where)
    pi_r = pair_array(rejected_logp, "rejected_logp", v, where=where)
    ref_c = _reference(ref_chosen_logp, "ref_chosen_logp", v, reference_free, where=where)
    ref_r = _reference(ref_rejected_logp, "ref_rejected_logp", v, reference_free, where=where)
    return pi_c, pi_r, ref_c, ref_r, v
