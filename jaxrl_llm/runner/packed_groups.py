"""The step-by-step RL loop's groups packed without padding (`train.pack_groups`).

A step packs only when padding makes up at least `train.pack_min_padding` (0.6) of the
slots of the padded forward (`padding_share`): packed rows attend over `P + G·W` keys, so a
batch of mostly full-length completions runs slower packed (small model, 8 × 8 × 64, no early
stop: update 0.48 → 1.05 s) while short, uneven ones run faster (8 × 8, rows stopping after
≈ 10 of 64 slots: update 0.53 → 0.29 s).

On one device, after the batch is cut to its longest completion (`runner.completion_width`),
the loop packs each group (its prompt once, then its `G` completions) several to a row
(`jaxrl_llm.train.pack_groups`, host NumPy) and runs the old-policy, reference and critic
forwards (`PackedSequences`) and the update (`RLBatch.packed`) on the packed rows: only the
real tokens, the same losses and gradients up to float rounding. Rows of `P + G·W` slots (`W` the
cut width); the row count is rounded up to a multiple of `⌈B / 8⌉`, so a run compiles at
most 8 row counts per width. `RunConfig` refuses it where the batch is split or re-read in
rows (minibatches, accumulation, online DPO with `G > 2`, `parallel: pmap`, the compiled
iteration); on a mesh of several devices the loop runs the padded rows.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxrl_llm.runner.context import RunContext
from jaxrl_llm.train import PackedGroups, SequenceBatch, pack_groups, packing_fill
from sharding import fetch_global


def packed_groups(ctx: RunContext, sequences: SequenceBatch) -> PackedGroups | None:
    """The batch's `PackedGroups` on the device, or None where the run does not pack
    (`train.pack_groups` off, or a mesh of several devices).

    Examples:
      >>> from types import SimpleNamespace as NS
      >>> ctx = NS(config=NS(train=NS(pack_groups=False)), mesh=NS(size=1))
      >>> packed_groups(ctx, None) is None
      True
    """
    train = ctx.config.train
    if not train.pack_groups or ctx.mesh.size != 1:
        return None
    host = jax.tree.map(np.asarray, SequenceBatch(*fetch_global(tuple(sequences[:3]))))
    G = ctx.sampling.num_samples
    if padding_share(host, G) < train.pack_min_padding:
        return None  # mostly real tokens: the padded forwards are faster
    return jax.device_put(pack_groups(host, G, pad_id=ctx.tokenizer.pad_id))


def padding_share(batch: SequenceBatch, group_size: int) -> float:
    """The share of padding in the slots a padded forward computes with each prompt once per
    group (`B·P + N·T`): `1 − (real prompt + completion tokens) / slots` (host).

    Examples:
      >>> b = SequenceBatch(np.array([[0, 5, 6, 0], [0, 5, 7, 8]]),
      ...                   np.array([[0, 1, 1, 0], [0, 1, 1, 1]]), np.ones((2, 2)))
      >>> padding_share(b, 2)  # real: prompt 1 + completions 1 + 2 = 4 of 2 + 4 slots
      0.3333333333333333
    """
    mask = np.asarray(batch.attention_mask) > 0
    N, T = np.asarray(batch.completion_mask).shape
    P = mask.shape[1] - T
    real = mask[::group_size, :P].sum() + mask[:, P:].sum()
    return 1.0 - float(real) / float(N // group_size * P + N * T)


def packing_metrics(packed: PackedGroups) -> dict[str, float]:
    """`perf/packed_rows` and `perf/packing_fill` (the share of the rows' slots that hold a
    token).

    Examples:
      >>> p = PackedGroups(*([np.array([[1, 1, 0, 0]])] * 4), None, None)
      >>> packing_metrics(p)
      {'perf/packed_rows': 1.0, 'perf/packing_fill': 0.5}
    """
    return {
        "perf/packed_rows": float(np.shape(packed.segment_ids)[0]),
        "perf/packing_fill": packing_fill(packed),
    }
