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
