"""Handling groups without a learning signal: filter, drop in-graph, or resample (ALGORITHMS.md §4.18).

A group whose rewards are all equal gets advantage 0 from every group estimator: it costs
generation and training compute, and under `token_mean` its tokens still dilute the normaliser.
`losses.zero_variance_mask` detects such groups; this module adds what the handling options need:

* `dynamic_sampling_mask` — the keep-mask of DAPO / verl `filter_groups` (std > 0) and of OpenRLHF
  `dynamic_filtering` (group mean inside an open reward range, std above a threshold);
* `keep_groups_mask` — option (b): drop the groups in-graph with `mask' = mask·keep[b(n)]`, after
  which the loss equals the loss of the batch without those groups;
* `select_kept_groups` — the static-shape form of DAPO's dynamic sampling: indices of the first
  `num_groups` kept groups, and a flag telling the host loop to sample more prompts.

Groups are contiguous rows (`n = b·G + g`, `losses.to_groups`). Everything here is a selection and
carries no gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._checks import check_choice, replicated
from losses._rewards import check_number, flags, optional_flags, real_array, zero_outside
from losses.advantages import zero_variance_mask


def dynamic_sampling_mask(
    rewards: ArrayLike,
    *,
    valid: ArrayLike | None = None,
    min_std: float = 0.0,
    ddof: int = 1,
    reward_range: tuple[float, float] | None = None,
) -> Array:
    """Groups worth training on: non-degenerate spread, optionally a mean inside a range (§4.18).

        keep_b = zero_variance_mask(s_b; min_std, ddof)                 (spread > 0 or std > min_std)
               ∧ low < mean_g s_bg < high                               (if reward_range is given)

    Statistics use the valid samples only; groups with fewer than two valid samples are dropped.
    With binary rewards and `reward_range=(0, 1)` the range test alone removes all-correct and
    all-wrong groups; the spread/std test also covers continuous rewards.

    Source: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476,
    dynamic sampling). Peers: verl `algorithm.filter_groups.{enable, metric}` (std > 0: the
    defaults); OpenRLHF `--dynamic_filtering --dynamic_filtering_reward_range low high` with its
    std threshold (`reward_range=(low, high), min_std=threshold, ddof=0`); Tunix
    `DAPOConfig.dynamic_sampling` (not implemented there).

    Args:
      rewards: `[B,G]` sequence rewards (or the metric filtered on, e.g. accuracy), `G >= 2`.
      valid: optional `[B,G]` bool.
      min_std: std threshold (>= 0); 0 uses the exact spread test.
      ddof: delta degrees of freedom of the std when `min_std > 0` (0 or 1).
      reward_range: optional `(low, high)`: keep groups whose mean lies strictly inside.

    Returns:
      `[B]` bool keep-mask.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = jnp.array([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.9, 0.95, 1.0]])
      >>> dynamic_sampling_mask(s).tolist()
      [True, False, True]
      >>> dynamic_sampling_mask(s, reward_range=(0.0, 0.9)).tolist()
      [True, False, False]
    """
    where = "dynamic_sampling_mask"
    check_choice(ddof, (0, 1), "ddof", where=where)
    check_number(min_std, "min_std", where=where, low=0.0)
    keep = zero_variance_mask(rewards, valid=valid, min_std=min_std, ddof=ddof)
    if reward_range is None:
        return keep
    if not isinstance(reward_range, tuple | list) or len(reward_range) != 2:
        raise ValueError(
            f"{where}: `reward_range` must be a pair (low, high) or None, got {reward_range!r}."
        )
    low, high = reward_range
    check_number(low, "reward_range[0]", where=where)
    check_number(high, "reward_range[1]", where=where)
    if isinstance(low, int | float) and isinstance(high, int | float) and not low < high:
        raise ValueError(f"{where}: `reward_range` must have low < high, got {reward_range!r}.")
    s = real_array(rewards, "rewards", where=where, rank=2)
    v = optional_flags(valid, s.shape, "valid", where=where)
    count = jnp.sum(v, axis=-1)
    mean = jnp.sum(zero_outside(s, v), axis=-1) / jnp.maximum(count, 1.0)
    return keep & (mean > low) & (mean < high)


def keep_groups_mask(mask: ArrayLike, keep: ArrayLike) -> Array:
    """Drop whole groups from the loss in-graph: `mask'[n] = mask[n]·keep[n // G]` (§4.18 (b)).

    The dropped rows leave every normaliser of `aggregate`, so the loss (and its gradient) equals
    the loss of the batch without those groups — the in-graph analogue of DAPO's dynamic sampling,
    at the price of a smaller effective batch. `G = N / B` is read from the shapes.

    Source: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476).

    Args:
      mask: `[N, ...]` mask (`[N,T]` token mask, `[N]` row flags, `[N,M]` step mask) with
        `N = B·G`.
      keep: `[B]` bool keep-mask (e.g. from `dynamic_sampling_mask`).

    Returns:
      float32 mask of the shape of `mask`.

    Examples:
      >>> import jax.numpy as jnp
      >>> keep_groups_mask(jnp.ones((4, 2)), jnp.array([True, False])).tolist()
      [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    """
    where = "keep_groups_mask"
    m = jnp.asarray(mask)
    if m.ndim < 1:
        raise ValueError(f"{where}: `mask` must be [N, ...], got a scalar.")
    m = flags(m, m.shape, "mask", where=where)
    k = jnp.asarray(keep)
    if k.ndim != 1 or k.shape[0] < 1 or m.shape[0] % k.shape[0]:
        raise ValueError(
            f"{where}: `keep` must be [B] with B dividing the rows of `mask` ({m.shape[0]}), "
            f"got shape {k.shape}."
        )
    k = flags(k, k.shape, "keep", where=where)
    B = k.shape[0]
    G = m.shape[0] // B
    grouped = m.reshape((B, G, *m.shape[1:]))
    kept = grouped & k.reshape((B,) + (1,) * (grouped.ndim - 1))
    return kept.reshape(m.shape).astype(jnp.float32)


class GroupSelection(NamedTuple):
    """Output of `select_kept_groups`.

    Attributes:
      indices: `int32[num_groups]` group indices: the kept groups in batch order, then (if too few
        are kept) dropped groups in batch order as static-shape filler.
      selected: `bool[num_groups]`, True where `indices` points to a kept group.
      num_kept: `int32[]` number of kept groups in the batch.
      enough: `bool[]` whether `num_kept >= num_groups`; False tells the host to sample more
        prompts (verl keeps generating until it is True, up to `max_num_gen_batches`).

    Examples:
      >>> import jax.numpy as jnp
      >>> sel = select_kept_groups(jnp.array([False, True, True]), num_groups=2)
      >>> sel.indices.tolist(), bool(sel.enough)
      ([1, 2], True)
    """

    indices: Array
    selected: Array
    num_kept: Array
    enough: Array


def select_kept_groups(keep: ArrayLike, *, num_groups: int) -> GroupSelection:
    """Static-shape dynamic sampling: pick the first `num_groups` kept groups (§4.18).

    DAPO (and verl's `filter_groups`) over-sample prompts, drop degenerate groups and train on the
    first `train_batch_size` kept ones. Here the selection is a fixed-size gather: take
    `rollouts[B, G, ...][indices]`; if `enough` is False, sample another batch, concatenate it on
    the host and select again, or train with `keep_groups_mask` on `selected` (the filler groups
    are then masked out).

    Source: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476).
    Peers: verl `algorithm.filter_groups.{enable, max_num_gen_batches}` (truncates to the first
    `train_batch_size` kept prompts, as here).

    Args:
      keep: `[B]` bool keep-mask.
      num_groups: static number of groups to select (`1 <= num_groups <= B`).

    Returns:
      `GroupSelection(indices, selected, num_kept, enough)`.

    Examples:
      >>> import jax.numpy as jnp
      >>> sel = select_kept_groups(jnp.array([True, False, False, True]), num_groups=3)
      >>> sel.indices.tolist(), sel.selected.tolist(), int(sel.num_kept), bool(sel.enough)
      ([0, 3, 1], [True, True, False], 2, False)
    """
    where = "select_kept_groups"
    k = jnp.asarray(keep)
    if k.ndim != 1:
        raise ValueError(f"{where}: `keep` must be [B], got shape {k.shape}.")
    k = replicated(flags(k, k.shape, "keep", where=where))
    B = k.shape[0]
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or not 1 <= num_groups <= B:
        raise ValueError(
            f"{where}: `num_groups` must be a Python int in [1, B={B}], got {num_groups!r}."
        )
    order = jnp.argsort(~k, stable=True).astype(jnp.int32)
    indices = order[:num_groups]
    num_kept = jnp.sum(k.astype(jnp.int32))
    return GroupSelection(
        indices=indices,
        selected=k[indices],
        num_kept=num_kept,
        enough=num_kept >= num_groups,
    )
