"""The step-by-step RL loop's groups packed without padding (`train.pack_groups`).

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
from jaxrl_llm.train import PackedGroups, SequenceBatch, pack_groups
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
    if not ctx.config.train.pack_groups or ctx.mesh.size != 1:
        return None
    host = SequenceBatch(*fetch_global(tuple(sequences[:3])))
    packed = pack_groups(
        jax.tree.map(np.asarray, host), ctx.sampling.num_samples, pad_id=ctx.tokenizer.pad_id
    )
    return jax.device_put(packed)


def packing_metrics(packed: PackedGroups) -> dict[str, float]:
    """`perf/packed_rows` and `perf/packing_fill` (the share of the rows' slots that hold a
    token).

    Examples:
      >>> p = PackedGroups(*([np.array([[1, 1, 0, 0]])] * 4), None, None)
      >>> packing_metrics(p)
      {'perf/packed_rows': 1.0, 'perf/packing_fill': 0.5}
    """
    segments = np.asarray(packed.segment_ids)
    return {
        "perf/packed_rows": float(segments.shape[0]),
        "perf/packing_fill": float(np.mean(segments > 0)),
    }
