"""Sums-and-counts reduction of micro-batch metrics (no mean of means)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.train import micro_batch_stats, reduce_stats


def test_reduction_recovers_the_whole_batch_statistics():
    # two updates (k = 2 micro-batches each) → four micro-batches with different token counts
    tokens = np.array([3.0, 5.0, 1.0, 7.0])
    seqs = np.array([1.0, 2.0, 1.0, 3.0])
    frac = np.array([0.0, 0.4, 1.0, 0.5])  # per micro-batch token means
    seq_mean = np.array([2.0, 0.5, 1.0, 3.0])  # per micro-batch sequence means
    loss_parts = np.array([0.1, 0.3, -0.2, 0.6])  # shares of the two updates' losses
    maxes = np.array([1.1, 1.7, 1.2, 1.3])
    grad_norms = np.array([9.0, 2.0, 9.0, 4.0])  # only the 2nd and 4th are applied updates
    applied = np.array([0.0, 1.0, 0.0, 1.0])

    def one(i):
        return micro_batch_stats(
            {
                "policy/clip_frac": jnp.asarray(frac[i]),
                "policy/seq_ratio_mean": jnp.asarray(seq_mean[i]),
                "loss/total": jnp.asarray(loss_parts[i]),
                "policy/ratio_max": jnp.asarray(maxes[i]),
                "optim/grad_norm": jnp.asarray(grad_norms[i]),
            },
            num_tokens=jnp.asarray(tokens[i]),
            num_seqs=jnp.asarray(seqs[i]),
            loss_weight=0.5,
            optim_weight=jnp.asarray(applied[i]),
        )

    stacked = jax.tree.map(lambda *x: jnp.stack(x), *[one(i) for i in range(4)])
    out = {k: float(v) for k, v in reduce_stats(stacked).items()}
    np.testing.assert_allclose(
        out["policy/clip_frac"], (frac * tokens).sum() / tokens.sum(), rtol=1e-6
    )
    np.testing.assert_allclose(
        out["policy/seq_ratio_mean"], (seq_mean * seqs).sum() / seqs.sum(), rtol=1e-6
    )
    np.testing.assert_allclose(out["loss/total"], ((0.1 + 0.3) + (-0.2 + 0.6)) / 2, rtol=1e-6)
    np.testing.assert_allclose(out["policy/ratio_max"], 1.7, rtol=1e-6)
    np.testing.assert_allclose(out["optim/grad_norm"], 3.0, rtol=1e-6)


def test_empty_counts_report_zero():
    stats = micro_batch_stats(
        {"entropy/mean": jnp.asarray(0.0)},
        num_tokens=jnp.asarray(0.0),
        num_seqs=jnp.asarray(0.0),
        loss_weight=1.0,
    )
    assert float(reduce_stats(stats)["entropy/mean"]) == 0.0


def test_kto_per_side_means_reduce_exactly_over_micro_batches():
    """KTO's per-side means with each side's own count: a micro-batch of undesirable examples
    only reported reward_chosen = 0 with the weight of all its examples (0.5 instead of 1.0,
    margin 1.5 instead of 2.0 in the audit's case)."""
    import losses

    beta = 0.1
    lr = {"a": ([], [-10.0] * 4), "b": ([10.0] * 2, [-10.0] * 2)}  # (desirable, undesirable)

    def kto(chosen, rejected):
        c, r = jnp.asarray(chosen, jnp.float32), jnp.asarray(rejected, jnp.float32)
        return losses.kto_loss(
            c,
            r,
            jnp.zeros_like(c),
            jnp.zeros_like(r),
            beta=beta,
            kl=None,
            loss_type="apo_zero_unpaired",
        )[1]

    def stats(metrics, n):
        return micro_batch_stats(
            metrics,
            num_tokens=jnp.asarray(3.0 * n),
            num_seqs=jnp.asarray(float(n)),
            loss_weight=1.0,
        )

    parts = [stats(kto(*lr[k]), len(lr[k][0]) + len(lr[k][1])) for k in ("a", "b")]
    reduced = reduce_stats(jax.tree.map(lambda *x: jnp.stack(x), *parts))
    whole = kto([10.0] * 2, [-10.0] * 6)
    for key in ("pref/reward_chosen", "pref/reward_rejected", "pref/margin", "pref/accuracy"):
        np.testing.assert_allclose(float(reduced[key]), float(whole[key]), rtol=1e-6, err_msg=key)
    assert float(reduced["pref/margin"]) == 2.0 and not any(k.startswith("count/") for k in reduced)


def test_a_weight_for_a_metric_that_is_not_reported_is_an_error():
    import pytest

    with pytest.raises(ValueError, match=r"\['count/pref/x'\] name no reported metric"):
        micro_batch_stats(
            {"count/pref/x": jnp.asarray(1.0)},
            num_tokens=jnp.asarray(1.0),
            num_seqs=jnp.asarray(1.0),
            loss_weight=1.0,
        )
