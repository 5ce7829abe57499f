"""Self-rewarding signals read off the policy itself, and the unbiased pass@k of a sample set.

* LaSeR (ALGORITHMS.md §9.3): `last_valid_logits` picks the logits at each row's last valid
  completion position (they predict a virtual next token, §0.3), `laser_self_rewards` turns the
  log-probability of a pre-specified token there into a self-reward, and `laser_loss` regresses
  it onto the verifier reward (added to the RLVR loss with a coefficient).
* `pass_at_k` (§11): the unbiased estimator of pass@k from `c` correct answers out of `n` samples,
  a metric of a sample set (B-STaR, DARS, NSR), in the numerically stable product form.

Masked entries are replaced by 0 before any arithmetic (NaN/inf there never leak); logits are
upcast to float32 before the log-softmax.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import (
    as_float32,
    as_mask,
    check_concrete_range,
    check_finite,
    check_floating,
    check_positive,
    check_rank,
    check_real,
    concrete,
)
from losses._policy import stop_gradient_metrics, zero_outside
from losses.reward_model import _masked_mean, _optional_valid

# --------------------------------------------------------------------------------------------------
# LaSeR
# --------------------------------------------------------------------------------------------------


def last_valid_logits(logits: ArrayLike, mask: ArrayLike) -> Array:
    """The logits at each row's last valid completion position: `z[n, max{t : m_nt = 1}]`.

    These logits predict the token after the response (unused by every other loss, §0.3); LaSeR
    reads its self-reward from them. With the usual mask (EOS included) the position is the EOS
    token's. Rows without a valid token give zeros. A gather: the gradient reaches only the
    selected position of each row, and NaN/inf elsewhere in `logits` never leak.

    Source: "LaSeR: Reinforcement Learning with Last-Token Self-Rewarding" (arXiv 2510.14943).

    Args:
      logits: `[N,T,V]` completion-aligned logits (`completion_logits`), any float dtype.
      mask: `[N,T]` {0,1} completion tokens (holes allowed: the highest valid index is used).

    Returns:
      `[N,V]` float32 logits.

    Examples:
      >>> import jax.numpy as jnp
      >>> z = jnp.arange(12.0).reshape(1, 3, 4)
      >>> last_valid_logits(z, jnp.array([[1, 1, 0]])).tolist()
      [[4.0, 5.0, 6.0, 7.0]]
    """
    where = "last_valid_logits"
    check_rank(logits, 3, "logits", where=where)
    check_floating(logits, "logits", where=where)
    N, T, _ = jnp.shape(logits)
    valid = as_mask(mask, (N, T), where=where) > 0
    last = jnp.max(jnp.where(valid, jnp.arange(T)[None, :], -1), axis=-1)  # −1: empty row
    picked = jnp.take_along_axis(jnp.asarray(logits), jnp.maximum(last, 0)[:, None, None], axis=1)[
        :, 0
    ]
    return jnp.where((last >= 0)[:, None], as_float32(picked), 0.0)


def laser_self_rewards(
    last_logits: ArrayLike,
    *,
    token_id: int,
    ref_constant: float | ArrayLike,
    beta_v: float | ArrayLike,
    temperature: float | ArrayLike = 1.0,
) -> Array:
    """LaSeR's last-token self-reward (ALGORITHMS.md §9.3).

        r_s = β_v·( log_softmax(z_last/τ)[token_id] − c_ref )

    `z_last` are the logits at the last valid completion position (`last_valid_logits`), which
    predict a virtual next token; `c_ref ≈ log π_ref(token_id | x, y)` is a pre-computed constant.
    The reward is differentiable w.r.t. `z_last` (trained by `laser_loss`); at test time it
    weights votes.

    Source: "LaSeR: Reinforcement Learning with Last-Token Self-Rewarding" (arXiv 2510.14943).
    (reconstructed — verify against the paper): which position counts as "last" (before or after
    EOS), how `c_ref` is estimated and the value of `β_v` are assumptions; hence no defaults for
    `token_id`, `ref_constant` and `beta_v`.

    Args:
      last_logits: `[N,V]` logits at the last valid completion position.
      token_id: static id of the pre-specified self-verification token.
      ref_constant: `c_ref`, scalar or `[N]`.
      beta_v: the scale `β_v`, scalar.
      temperature: `τ > 0` applied to the logits (the sampling temperature, §0.4).

    Returns:
      `[N]` float32 self-rewards.

    Examples:
      >>> import jax.numpy as jnp
      >>> z = jnp.log(jnp.array([[0.5, 0.25, 0.25]]))
      >>> r = laser_self_rewards(z, token_id=1, ref_constant=jnp.log(0.5), beta_v=2.0)
      >>> round(float(r[0]), 4)  # 2·(log 0.25 − log 0.5)
      -1.3863
    """
    where = "laser_self_rewards"
    check_rank(last_logits, 2, "last_logits", where=where)
    check_floating(last_logits, "last_logits", where=where)
    N, V = jnp.shape(last_logits)
    if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < V:
        raise ValueError(
            f"{where}: `token_id` must be a static Python int in [0, {V}), got {token_id!r}."
        )
    check_positive(temperature, "temperature", where=where)
    check_real(ref_constant, "ref_constant", where=where)
    check_real(beta_v, "beta_v", where=where)
    check_finite(beta_v, "beta_v", where=where)
    if jnp.ndim(beta_v) != 0:
        raise ValueError(f"{where}: `beta_v` must be a scalar, got shape {jnp.shape(beta_v)}.")
    c_ref = as_float32(ref_constant)
    if c_ref.ndim and c_ref.shape != (N,):
        raise ValueError(
            f"{where}: `ref_constant` must be a scalar or have shape ({N},), got {c_ref.shape}."
        )
    z = as_float32(last_logits) / as_float32(temperature)
    logp = jax.nn.log_softmax(z, axis=-1)[:, token_id]
    return as_float32(beta_v) * (logp - c_ref)


def laser_loss(
    self_rewards: ArrayLike,
    verifier_rewards: ArrayLike,
    *,
    valid: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
    """LaSeR's auxiliary loss: squared error of the self-reward (ALGORITHMS.md §9.3).

        loss = Σ_n valid_n·(r_s,n − r_v,n)² / max(Σ_n valid_n, 1)

    `r_s` from `laser_self_rewards` (differentiable), `r_v` the verifier reward (no gradient).
    The actor adds `c_aux·laser_loss` to its RLVR loss; `r_s = r_v` gives zero loss and gradient.

    Source: "LaSeR: Reinforcement Learning with Last-Token Self-Rewarding" (arXiv 2510.14943).
    (reconstructed — verify against the paper): any class re-weighting of the squared error
    (e.g. balancing correct and incorrect responses) is not applied; pass `valid` weights of 0/1
    only.

    Args:
      self_rewards: `[N]` self-rewards `r_s`.
      verifier_rewards: `[N]` verifier rewards `r_v`.
      valid: optional `[N]` {0,1} sequences that count (e.g. excluding truncated responses).

    Returns:
      `(loss, metrics)`: a float32 scalar; `rm/self_reward_mean`, `rm/verifier_reward_mean` and
      `rm/abs_error` (`mean |r_s − r_v|`) over the valid sequences.

    Examples:
      >>> import jax.numpy as jnp
      >>> loss, m = laser_loss(jnp.array([0.5, 0.0]), jnp.array([1.0, 0.0]))
      >>> float(loss), float(m["rm/abs_error"])
      (0.125, 0.25)
    """
    where = "laser_loss"
    check_rank(self_rewards, 1, "self_rewards", where=where)
    check_floating(self_rewards, "self_rewards", where=where)
    check_real(verifier_rewards, "verifier_rewards", where=where)
    shape = jnp.shape(self_rewards)
    if jnp.shape(verifier_rewards) != shape:
        raise ValueError(
            f"{where}: `verifier_rewards` must have the shape of `self_rewards` {shape}, "
            f"got {jnp.shape(verifier_rewards)}."
        )
    v = _optional_valid(valid, shape, where=where)
    r_s = zero_outside(as_float32(self_rewards), v > 0)
    r_v = jax.lax.stop_gradient(zero_outside(as_float32(verifier_rewards), v > 0))
    loss = _masked_mean((r_s - r_v) ** 2, v)
    metrics = {
        "rm/self_reward_mean": _masked_mean(r_s, v),
        "rm/verifier_reward_mean": _masked_mean(r_v, v),
        "rm/abs_error": _masked_mean(jnp.abs(r_s - r_v), v),
    }
    return loss, stop_gradient_metrics(metrics)


# --------------------------------------------------------------------------------------------------
# pass@k
# --------------------------------------------------------------------------------------------------


def pass_at_k(c: ArrayLike, n: ArrayLike, k: int) -> Array:
    """Unbiased pass@k from `c` correct out of `n` samples (ALGORITHMS.md §11).

        pass@k = 1 − C(n − c, k)/C(n, k) = 1 − Π_{j=0}^{k−1} (n − c − j)/(n − j)

    The product form never forms a binomial coefficient (no overflow for large `n`); each factor
    lies in [0, 1], and a factor is 0 once `n − c − j ≤ 0`, so `n − c < k` gives exactly 1 (as in
    the Codex reference implementation; `k > n` also gives 1). `c` and `n` broadcast against each
    other (integer or float counts); `k` is a static int.

    Source: "Evaluating Large Language Models Trained on Code" (arXiv 2107.03374); used as the
    exploration metric of the seed papers B-STaR, DARS, NSR.

    Args:
      c: number of correct samples (any shape), `0 ≤ c ≤ n`.
      n: number of samples (broadcastable with `c`).
      k: static Python int >= 1.

    Returns:
      float32 array of the broadcast shape, values in [0, 1], under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> [round(x, 4) for x in pass_at_k(jnp.array([0, 1, 2, 5]), 5, 2).tolist()]
      [0.0, 0.4, 0.7, 1.0]
    """
    where = "pass_at_k"
    check_real(c, "c", where=where)
    check_real(n, "n", where=where)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{where}: `k` must be a static Python int >= 1, got {k!r}.")
    try:
        shape = jnp.broadcast_shapes(jnp.shape(c), jnp.shape(n))
    except ValueError:
        raise ValueError(
            f"{where}: `c` with shape {jnp.shape(c)} and `n` with shape {jnp.shape(n)} do not "
            "broadcast."
        ) from None
    known_c, known_n = concrete(c), concrete(n)
    check_concrete_range(known_c, "c", where=where, low=0)
    check_concrete_range(known_n, "n", where=where, low=1)
    if known_c is not None and known_n is not None and (known_c > known_n).any():
        raise ValueError(
            f"{where}: `c` (correct samples) must be <= `n` (samples), got c = {c!r}, n = {n!r}."
        )
    cf = jnp.broadcast_to(jnp.asarray(c, jnp.float32), shape)
    nf = jnp.broadcast_to(jnp.asarray(n, jnp.float32), shape)
    j = jnp.arange(k, dtype=jnp.float32).reshape((k,) + (1,) * len(shape))
    den = nf - j
    # (n − c − j)/(n − j) written as 1 − c/(n − j): exactly 1 when c = 0 (pass@k exactly 0)
    factors = jnp.where(den - cf > 0, 1.0 - cf / jnp.maximum(den, 1.0), 0.0)
    return jax.lax.stop_gradient(1.0 - jnp.prod(factors, axis=0))
