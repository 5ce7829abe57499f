"""Metrics reduced across micro-batches as sums and counts, never as means of means.

Every micro-batch of an update step returns flat scalar metrics that are means over *its own*
valid tokens (the `losses` convention). `micro_batch_stats` turns each into a `(numerator,
denominator)` pair and `reduce_stats` sums both over all micro-batches of all epochs before
dividing, so the result is the mean over the whole batch. The kind of each key is fixed by its
name:

    "…max" (e.g. `policy/ratio_max`, `kl/max`)   max over micro-batches
    "loss/…"                                     the micro-batch's share of its optimizer
                                                 update's loss: summed within an update, then
                                                 averaged over the updates (count 1/k each)
    "…/seq_…" (e.g. `policy/seq_ratio_mean`)     weighted by the micro-batch's valid sequences
    "pref/…", "rm/…" (per pair: preference and   weighted by the micro-batch's valid sequences
    reward-model metrics)
    "optim/…"                                    weighted by an explicit 0/1 (the updates that
                                                 were applied)
    anything else                                weighted by the micro-batch's valid tokens

A metric can name its own weight: a key `count/<key>` next to `<key>` (e.g. KTO's
`count/pref/reward_chosen`, the micro-batch's desirable examples) replaces the weight its name
gives; `count/…` keys are consumed, not reported. After the reduction, `pref/margin` is the
reduced `pref/reward_chosen − pref/reward_rejected` when both are reported: for paired losses
that is the weighted mean of the pairs' margins anyway, and for KTO's and BCO's per-side means
it keeps the margin exact when a micro-batch holds only one side.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

COUNT = "count/"  # prefix of a metric's own weight (module docstring)


class MicroStats(NamedTuple):
    """Per-micro-batch metric parts: `sums[k] / counts[k]` is the mean; `maxes[k]` a max.

    Examples:
      >>> MicroStats(sums={}, counts={}, maxes={}).maxes
      {}
    """

    sums: dict[str, jax.Array]
    counts: dict[str, jax.Array]
    maxes: dict[str, jax.Array]


def _is_max(key: str) -> bool:
    return key.endswith("max")


def micro_batch_stats(
    metrics: dict[str, jax.Array],
    *,
    num_tokens: jax.Array,
    num_seqs: jax.Array,
    loss_weight: jax.Array | float,
    optim_weight: jax.Array | float = 1.0,
) -> MicroStats:
    """Turn one micro-batch's metrics into sums and counts (see the module docstring).

    Args:
      metrics: flat dict of float32 scalars.
      num_tokens: this micro-batch's valid tokens.
      num_seqs: this micro-batch's sequences with at least one valid token.
      loss_weight: weight of `loss/…` keys (1/k for k micro-batches per optimizer update).
      optim_weight: weight of `optim/…` keys (1 where an update was applied, else 0).

    Returns:
      `MicroStats`.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = micro_batch_stats({"policy/clip_frac": jnp.array(0.5), "kl/max": jnp.array(2.0)},
      ...                       num_tokens=jnp.array(4.0), num_seqs=jnp.array(2.0), loss_weight=1.0)
      >>> float(s.sums["policy/clip_frac"]), float(s.counts["policy/clip_frac"]), float(s.maxes["kl/max"])
      (2.0, 4.0, 2.0)
    """
    sums, counts, maxes = {}, {}, {}
    own = {k.removeprefix(COUNT): v for k, v in metrics.items() if k.startswith(COUNT)}
    unknown = sorted(set(own) - set(metrics))
    if unknown:
        raise ValueError(
            f"micro_batch_stats: weights {[COUNT + k for k in unknown]} name no reported metric."
        )
    for key, value in metrics.items():
        if key.startswith(COUNT):
            continue
        value = jnp.asarray(value, jnp.float32)
        if _is_max(key):
            maxes[key] = value
            continue
        if key.startswith("loss/"):
            # the parts of one update's loss add up (they share its global normalisers): the
            # numerator is the part itself, the count 1/k, so the result is the mean per update
            sums[key] = value
            counts[key] = jnp.asarray(loss_weight, jnp.float32)
            continue
        if key in own:
            weight = own[key]
        elif key.startswith("optim/"):
            weight = optim_weight
        elif "/seq_" in key or key.startswith(("pref/", "rm/")):
            weight = num_seqs
        else:
            weight = num_tokens
        weight = jnp.asarray(weight, jnp.float32)
        sums[key] = value * weight
        counts[key] = weight
    return MicroStats(sums, counts, maxes)


def reduce_stats(stats: MicroStats) -> dict[str, jax.Array]:
    """Reduce stacked `MicroStats` (any leading axes: epochs, micro-batches) to scalars.

    A key whose counts sum to 0 (e.g. no valid token anywhere) reports 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = MicroStats(sums={"a": jnp.array([2.0, 1.0])}, counts={"a": jnp.array([4.0, 1.0])},
      ...                maxes={"b_max": jnp.array([1.0, 3.0])})
      >>> {k: float(v) for k, v in reduce_stats(s).items()}
      {'a': 0.6, 'b_max': 3.0}
    """
    out = {}
    for key, total in stats.sums.items():
        count = jnp.sum(stats.counts[key])
        out[key] = jnp.where(count > 0, jnp.sum(total) / jnp.where(count > 0, count, 1.0), 0.0)
    for key, value in stats.maxes.items():
        out[key] = jnp.max(value)
    return with_derived_margin(out)


def with_derived_margin(metrics: dict[str, Any]) -> dict[str, Any]:
    """`metrics` with `pref/margin` set to `pref/reward_chosen − pref/reward_rejected` when all
    three are present (the module docstring); otherwise unchanged.

    Examples:
      >>> with_derived_margin({"pref/reward_chosen": 1.0, "pref/reward_rejected": -0.5,
      ...                      "pref/margin": 0.0})["pref/margin"]
      1.5
    """
    keys = ("pref/margin", "pref/reward_chosen", "pref/reward_rejected")
    if not all(k in metrics for k in keys):
        return metrics
    return {**metrics, keys[0]: metrics[keys[1]] - metrics[keys[2]]}
