"""Rewards → advantages (and returns, and a keep-mask of informative groups) before the update.

Runs once per rollout batch, after the old-policy / reference / critic forwards and before the
update step; it is pure and jittable (no host syncs). Rows come in contiguous groups of `G`
samples of one prompt (`n = b·G + g`). Per `config.advantage.estimator` (ALGORITHMS.md §4, §7.2):

    group, rloo:      s ← kl_penalized_scores(s, old, ref, β)        if kl.mode = "reward"
                      a[B,G] = group_advantages(s) | rloo_advantages(s);  A = broadcast(a, m)
    reinforce_pp_baseline:   A = reinforce_pp_baseline_advantages(s[B,G], m)
    reinforce_pp:     r[N,T] = kl_penalized_rewards(s, old, ref, β)  (β = 0 without KL reward:
                      the score sits on the last valid token);  A = reinforce_pp_advantages(r)
    gae:              r as above;  A, R = gae(r, V_old, m, γ, λ)
    whiten:           A ← masked_whiten(A, m)

With `drop_zero_variance` (DAPO) `keep[n]` is False for rows whose group's raw rewards are all
equal (`losses.zero_variance_mask`). Their rows leave every batch-wide statistic above (the batch
std of `scale: batch`, the whitening, the token whitening of `reinforce_pp_baseline`), and
`build_rl_batch` zeroes their completion mask, so they also leave the loss and its normalisers
(the in-graph form of DAPO's dynamic sampling; a loop that re-samples to refill the batch reads
`keep` to know how many groups survived).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

import losses
from jaxrl_llm.train.algorithms import (
    GROUPED_ESTIMATORS,
    AlgorithmConfig,
    keeps_row_subset,
    online_dpo_pairs,
    online_dpo_select,
)
from jaxrl_llm.train.batch import RLBatch, SequenceBatch, check_sequence_batch


class Advantages(NamedTuple):
    """Output of `compute_advantages`.

    Attributes:
      advantages: `[N,T]` float32, 0 outside the mask.
      returns: `[N,T]` value targets (gae), else None.
      keep: `[N]` bool; False for rows of groups without a learning signal when
        `drop_zero_variance` is on (all True otherwise).
      metrics: flat dict of float32 scalars: `adv/reward_mean`, `adv/reward_std`,
        `adv/frac_zero_std` (grouped batches), `adv/mean`, `adv/std`, `adv/kept_frac`,
        `kl/rollout_k1` (token mean of `old_logp − ref_logp`, when both are given) and
        `value/explained_var` of the old values (gae).

    Examples:
      >>> Advantages(advantages=None, returns=None, keep=None, metrics={}).metrics
      {}
    """

    advantages: jax.Array
    returns: jax.Array | None
    keep: jax.Array
    metrics: dict[str, jax.Array]


def _explained_variance(values: jax.Array, returns: jax.Array, mask: jax.Array) -> jax.Array:
    """`1 − var(R − V)/var(R)` over valid tokens (ddof 1); 0 when `var(R) = 0`."""

    def var(x: jax.Array) -> jax.Array:
        return losses.masked_var(x, mask, ddof=1)

    v_ret = var(returns)
    return jnp.where(v_ret > 0, 1.0 - var(returns - values) / jnp.where(v_ret > 0, v_ret, 1.0), 0.0)


def compute_advantages(
    config: AlgorithmConfig,
    rewards: jax.Array,
    completion_mask: jax.Array,
    *,
    group_size: int,
    old_logp: jax.Array | None = None,
    ref_logp: jax.Array | None = None,
    values: jax.Array | None = None,
    kl_coef: jax.Array | float = 0.0,
) -> Advantages:
    """Advantages of one rollout batch under `config` (see the module docstring).

    Args:
      config: the algorithm.
      rewards: `[N]` sequence scores (verifiers / reward models, after any shaping).
      completion_mask: `[N,T]` {0,1}; a row without tokens (a group the reward guard dropped)
        enters no group or batch statistic and gets advantage 0.
      group_size: `G`, samples per prompt (rows `b·G … b·G + G − 1` share a prompt); the
        grouped estimators need `G >= 2`.
      old_logp: `[N,T]` behaviour-policy log-probs (KL in the reward).
      ref_logp: `[N,T]` reference log-probs (KL in the reward, KL metric).
      values: `[N,T]` old critic values (gae).
      kl_coef: β of the KL reward (the KL controller's `state.kl.beta`).

    Returns:
      `Advantages`.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrl_llm.train.algorithms import preset
      >>> out = compute_advantages(preset("dapo"), jnp.array([1.0, 0.0, 1.0, 1.0]),
      ...                          jnp.ones((4, 2)), group_size=2)
      >>> out.advantages[:, 0].round(3).tolist(), out.keep.tolist()
      ([0.707, -0.707, 0.0, 0.0], [True, True, False, False])
    """
    where = "compute_advantages"
    adv_cfg, kl_cfg = config.advantage, config.kl
    mask = jnp.asarray(completion_mask)
    if mask.ndim != 2:
        raise ValueError(f"{where}: `completion_mask` must be [N,T], got shape {mask.shape}.")
    N, T = mask.shape
    m = (mask > 0).astype(jnp.float32)
    s = jnp.asarray(rewards)
    if s.shape != (N,) or not jnp.issubdtype(s.dtype, jnp.floating):
        raise ValueError(
            f"{where}: `rewards` must be a float array [N] = ({N},), got {s.dtype}{s.shape}."
        )
    s = s.astype(jnp.float32)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"{where}: `group_size` must be a positive int, got {group_size!r}.")
    if N % group_size:
        raise ValueError(
            f"{where}: N = {N} rows are not whole groups of group_size = {group_size}."
        )
    grouped = adv_cfg.estimator in GROUPED_ESTIMATORS
    if grouped and group_size < 2:
        raise ValueError(
            f"{where}: estimator {adv_cfg.estimator!r} compares samples of a prompt and needs "
            f"group_size >= 2, got {group_size}."
        )
    for name, arr in (("old_logp", old_logp), ("ref_logp", ref_logp), ("values", values)):
        if arr is not None and arr.shape != (N, T):
            raise ValueError(f"{where}: `{name}` must have shape {(N, T)}, got {arr.shape}.")
    kl_reward = kl_cfg.mode == "reward"
    if kl_reward and (old_logp is None or ref_logp is None):
        raise ValueError(f"{where}: kl.mode='reward' needs `old_logp` and `ref_logp`.")
    if adv_cfg.estimator == "gae" and values is None:
        raise ValueError(f"{where}: the 'gae' estimator needs the old critic `values`.")

    B = N // group_size
    # a row without completion tokens is no sample: the rows of a group the reward guard dropped
    # (`on_failure: drop_group`, their mask zeroed) enter no group or batch statistic
    valid = jnp.sum(m, axis=1) > 0
    grouped_valid = valid.reshape(B, group_size)
    if adv_cfg.drop_zero_variance:
        keep = losses.zero_variance_mask(s.reshape(B, group_size), valid=grouped_valid)
        keep = jnp.repeat(keep, group_size)
    else:
        keep = jnp.ones((N,), bool)
    # the dropped groups leave every batch-wide statistic (batch std, whitening), as they would
    # had they been filtered out before the batch was formed (DAPO's dynamic sampling)
    kept = m * keep[:, None]
    metrics: dict[str, jax.Array] = {}
    returns = None
    if adv_cfg.estimator in ("group", "rloo"):
        scores = s
        if kl_reward:
            scores = losses.kl_penalized_scores(s, old_logp, ref_logp, m, beta=kl_coef)
        if adv_cfg.estimator == "group":
            a = losses.group_advantages(
                scores.reshape(B, group_size),
                scale=adv_cfg.scale,
                eps=adv_cfg.eps,
                ddof=adv_cfg.ddof,
                valid=(keep & valid).reshape(B, group_size),
            )
        else:
            a = losses.rloo_advantages(scores.reshape(B, group_size))
        adv = losses.broadcast_to_tokens(a, m)
    elif adv_cfg.estimator == "reinforce_pp_baseline":
        adv = losses.reinforce_pp_baseline_advantages(s.reshape(B, group_size), kept)
    else:
        zeros = jnp.zeros((N, T), jnp.float32)
        token_rewards = losses.kl_penalized_rewards(
            s,
            old_logp if kl_reward else zeros,
            ref_logp if kl_reward else zeros,
            m,
            beta=kl_coef if kl_reward else 0.0,
            estimator=kl_cfg.resolved_estimator if kl_reward else "k1",
        )
        if adv_cfg.estimator == "reinforce_pp":
            adv = losses.reinforce_pp_advantages(token_rewards, m, gamma=adv_cfg.gamma)
        else:
            adv, returns = losses.gae(
                token_rewards, values, m, gamma=adv_cfg.gamma, lam=adv_cfg.lam
            )
            metrics["value/explained_var"] = _explained_variance(values, returns, m)
    if adv_cfg.whiten:
        adv = losses.masked_whiten(adv, kept)

    if group_size >= 2:
        metrics.update(
            losses.group_advantage_metrics(s.reshape(B, group_size), valid=grouped_valid)
        )
    else:
        metrics["adv/reward_mean"] = losses.masked_mean(s, valid.astype(jnp.float32))
    metrics["adv/mean"] = losses.masked_mean(adv, kept)
    metrics["adv/std"] = jnp.sqrt(losses.masked_var(adv, kept, ddof=1))
    metrics["adv/kept_frac"] = jnp.mean(keep.astype(jnp.float32))
    if old_logp is not None and ref_logp is not None:
        metrics["kl/rollout_k1"] = losses.masked_mean(old_logp - ref_logp, m)
    metrics = {k: jax.lax.stop_gradient(jnp.asarray(v, jnp.float32)) for k, v in metrics.items()}
    return Advantages(jax.lax.stop_gradient(adv), returns, keep, metrics)


def build_rl_batch(
    config: AlgorithmConfig,
    *,
    tokens: jax.Array,
    attention_mask: jax.Array,
    completion_mask: jax.Array,
    rewards: jax.Array,
    group_size: int,
    old_logp: jax.Array | None = None,
    ref_logp: jax.Array | None = None,
    old_values: jax.Array | None = None,
    rollout_logp: jax.Array | None = None,
    kl_coef: jax.Array | float = 0.0,
) -> tuple[RLBatch, dict[str, jax.Array]]:
    """Assemble the `RLBatch` of one rollout: advantages, returns, and the kept-rows mask.

    Fields the algorithm does not use are left out (None): `ref_logp` without KL,
    `old_values`/`returns` without a critic, `rollout_logp` without rollout correction.

    Args:
      config: the algorithm.
      tokens: `[N,S]` prompt + completion tokens.
      attention_mask: `[N,S]`.
      completion_mask: `[N,T]`.
      rewards: `[N]` sequence scores.
      group_size: `G`.
      old_logp: `[N,T]` old-policy log-probs (from `make_logprob_fn`).
      ref_logp: `[N,T]` reference log-probs.
      old_values: `[N,T]` old critic values (from `make_value_fn`).
      rollout_logp: `[N,T]` the sampler's behaviour log-probs.
      kl_coef: β (`state.kl.beta`).

    Returns:
      `(batch, metrics)` with the metrics of `compute_advantages`. Online DPO with `G > 2`
      keeps each group's best and worst rows (`online_dpo_select`): the batch has `2N/G` rows.
      Its `ref_logp` may then be None here (`keeps_row_subset`): the ranking does not read
      it, so the caller runs the reference forward on the kept rows only and sets
      `batch.ref_logp` (the update refuses the batch without it).

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrl_llm.train.algorithms import preset
      >>> batch, metrics = build_rl_batch(
      ...     preset("dapo"), tokens=jnp.ones((4, 5), jnp.int32), attention_mask=jnp.ones((4, 5)),
      ...     completion_mask=jnp.ones((4, 2)), rewards=jnp.array([1.0, 0.0, 1.0, 1.0]),
      ...     group_size=2, old_logp=jnp.zeros((4, 2)))
      >>> batch.completion_mask.sum(axis=1).tolist(), batch.ref_logp is None
      ([2.0, 2.0, 0.0, 0.0], True)
    """
    where = "build_rl_batch"
    check_sequence_batch(SequenceBatch(tokens, attention_mask, completion_mask), where=where)
    if config.critic is not None and old_values is None:
        raise ValueError(f"{where}: a critic algorithm needs `old_values`.")
    if config.rollout_correction is not None and rollout_logp is None:
        raise ValueError(f"{where}: `rollout_correction` needs `rollout_logp`.")
    if config.needs_reference and ref_logp is None and not keeps_row_subset(config, group_size):
        raise ValueError(
            f"{where}: kl.mode={config.kl.mode!r} / policy_loss {config.policy_loss.name!r} "
            "needs `ref_logp`."
        )
    out = compute_advantages(
        config,
        rewards,
        completion_mask,
        group_size=group_size,
        old_logp=old_logp,
        ref_logp=ref_logp,
        values=old_values,
        kl_coef=kl_coef,
    )
    mask = (jnp.asarray(completion_mask) > 0).astype(jnp.float32) * out.keep[:, None]
    batch = RLBatch(
        tokens=tokens,
        attention_mask=attention_mask,
        completion_mask=mask,
        advantages=out.advantages * mask,
        old_logp=old_logp,
        ref_logp=ref_logp if config.needs_reference else None,
        old_values=old_values if config.critic is not None else None,
        returns=out.returns if config.critic is not None else None,
        rollout_logp=rollout_logp if config.rollout_correction is not None else None,
    )
    metrics = out.metrics
    if config.policy_loss.name == "online_dpo":  # the share of pairs whose rewards differ
        if group_size > 2:  # each group's best and worst sample: 2 rows per prompt
            batch = online_dpo_select(batch, group_size)
        _, valid = online_dpo_pairs(batch.advantages, batch.completion_mask)
        metrics = {**metrics, "online_dpo/valid_pairs": jnp.mean(valid.astype(jnp.float32))}
    return batch, metrics
