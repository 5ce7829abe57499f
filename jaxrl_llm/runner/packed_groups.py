"""The step-by-step RL loop's groups packed without padding (`train.pack_groups`).

A step packs only when packing removes at least `train.pack_min_saving` (0.1) of the slots
of the padded forward (`packed_slot_saving`: what counts is how many completion rows the
packing saves, not how much padding the batch holds). On the small model at 8 × 8
(`benchmarks/bench_pack_forms.py`, one batch, the forms alternating): completions that pack
one to a row (16 % and 13 % padding, nothing saved) ran as fast packed as padded
(0.99–1.02×); 64 completions in 56 rows (12 % of the slots saved) ran the update 1.21× and
the forward 1.18× faster; 16 rows (73 % saved) 3.3× and 3.4×.

On one device, after the batch is cut to its longest completion (`runner.completion_width`),
the loop packs each group — its prompt once, its `G` completions back to back in completion
rows of `W` slots, `W` the cut width (`jaxrl_llm.train.pack_groups`, host NumPy) — and runs
the old-policy, reference and critic forwards (`PackedSequences`) and the update
(`RLBatch.packed`) on the packed rows: only the real tokens plus each row's tail, the same
losses and gradients up to float rounding. Each micro-batch's completion-row count is
rounded up to a multiple of `⌈N / (8·parts)⌉`, so a run compiles at most 8 row counts per
width.

Where the update computes its gradient in row groups, one host thread each
(`RunContext.update_row_groups`, `jaxrl_llm.train.row_groups`), the groups are packed in as
many parts (`pack_groups(parts=)`), and the update and the old-policy and reference forwards
run each part from its own thread (`packing_part`): the CPU's cores share the packed rows as
they share the padded ones.

An update of several minibatches or accumulation steps (`parts` micro-batches of whole groups,
`algorithm.minibatch_unit: prompt`) gets each micro-batch's groups in its own rows; a
shuffled one (`minibatches > 1`) one packing per epoch, in the group orders the update will
draw from the state's key (`jaxrl_llm.train.update_unit_orders`). The forwards before the
update run the first epoch's packing. `RunConfig` refuses it where the batch is split in
strided rows (`minibatch_unit: row` with several micro-batches) or re-read in rows
(`parallel: pmap`, the compiled iteration); on a mesh of several devices the loop runs the
padded rows. Online DPO with `G > 2` samples keeps each prompt's best and worst: the loop
packs those pairs (groups of 2) for its reference forward and its update, after choosing
them; the forwards before run the padded rows.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from jaxrl_llm.runner.context import RunContext
from jaxrl_llm.sampler.row_groups import map_in_threads
from jaxrl_llm.train import (
    PackedGroups,
    PackedSequences,
    SequenceBatch,
    completion_row_count,
    group_packing_fill,
    group_rows_part,
    join_group_parts,
    pack_groups,
    packing_part,
    update_unit_orders,
)
from sharding import fetch_global


class StepPacking(NamedTuple):
    """A step's packed groups: `forward` for the forwards of the whole batch before the
    update, `update` for the update (one packing per epoch when it shuffles; else the same),
    and, packed for the update's row groups, each part's padded rows with its packing
    (`packing_part`: what `packed_forward` runs, one thread each; else empty).

    Examples:
      >>> StepPacking(None, None)._fields
      ('forward', 'update', 'forward_parts')
    """

    forward: PackedGroups
    update: PackedGroups
    forward_parts: tuple[PackedSequences, ...] = ()


def packed_groups(
    ctx: RunContext, sequences: SequenceBatch, key: jax.Array, group_size: int | None = None
) -> StepPacking | None:
    """The batch's packed groups on the device, or None where the run does not pack
    (`train.pack_groups` off, a mesh of several devices, or too few slots saved).

    Args:
      ctx: the run.
      sequences: the step's rollout batch (cut to its width).
      key: the key of the state the update will start from (`TrainState.key`): a shuffled
        update's group orders.
      group_size: rows per group of `sequences` (None: `G`, the rollout's; 2 for the pairs
        online DPO keeps of its `G > 2` samples).

    Examples:
      >>> from types import SimpleNamespace as NS
      >>> ctx = NS(config=NS(train=NS(pack_groups=False)), mesh=NS(size=1))
      >>> packed_groups(ctx, None, None) is None
      True
    """
    config = ctx.config
    train = config.train
    if not train.pack_groups or ctx.mesh.size != 1:
        return None
    alg = config.algorithm
    host = jax.tree.map(np.asarray, SequenceBatch(*fetch_global(tuple(sequences[:3]))))
    G = ctx.sampling.num_samples if group_size is None else group_size
    parts = alg.minibatches * config.optim.accumulation_steps
    orders = None
    if alg.shuffle and alg.minibatches > 1:  # the update's micro-batches hold whole groups
        orders = np.asarray(update_unit_orders(key, epochs=alg.epochs, units=len(host[0]) // G))
    row_groups = ctx.update_row_groups if parts == 1 else 1
    parts *= row_groups
    if packed_slot_saving(host, G, parts=parts, orders=orders) < train.pack_min_saving:
        return None  # few rows saved: the padded forwards are as fast, with fewer programs
    packed = pack_groups(host, G, parts=parts, orders=orders, pad_id=ctx.tokenizer.pad_id)
    forward_parts = ()
    if row_groups > 1:  # each row group's rows and packing, for the forwards' threads
        forward_parts = tuple(
            PackedSequences(
                jax.tree.map(lambda x, j=j: group_rows_part(x, j, row_groups, G), host),
                packing_part(packed, j, row_groups),
            )
            for j in range(row_groups)
        )
    packed, forward_parts = jax.device_put((packed, forward_parts))
    if orders is None:
        return StepPacking(packed, packed, forward_parts)
    return StepPacking(jax.tree.map(lambda x: x[0], packed), packed)


def packed_forward(
    fn: Any, params: Any, frozen: Any, sequences: SequenceBatch, packing: StepPacking
) -> Any:
    """`fn(params, frozen, PackedSequences(sequences, packing.forward))` (a log-prob forward,
    `[N, T]`), or, with `packing.forward_parts`, the same from one call per part, each from
    its own thread (`map_in_threads`), joined back into the batch's rows.

    Examples:
      >>> from types import SimpleNamespace as NS
      >>> b = SequenceBatch(np.array([[3, 1], [3, 2], [5, 1], [5, 2]]), np.ones((4, 2)),
      ...                   np.ones((4, 1)))
      >>> config = NS(train=NS(pack_groups=True, pack_min_saving=0.0),
      ...             algorithm=NS(minibatches=1, shuffle=False), optim=NS(accumulation_steps=1))
      >>> ctx = NS(config=config, mesh=NS(size=1), sampling=NS(num_samples=2),
      ...          update_row_groups=2, tokenizer=NS(pad_id=0))
      >>> packing = packed_groups(ctx, b, None)
      >>> fn = lambda p, f, s: s.sequences.tokens[:, 1:] * p  # the rows each call gets
      >>> packed_forward(fn, 10, None, b, packing)[:, 0].tolist()
      [10, 20, 10, 20]
    """
    if not packing.forward_parts:
        return fn(params, frozen, PackedSequences(sequences, packing.forward))
    forward = packing.forward
    G = np.shape(forward.row)[0] // np.shape(forward.prompt_tokens)[0]
    parts = packing.forward_parts
    return join_group_parts(map_in_threads(lambda j: fn(params, frozen, parts[j]), len(parts)), G)


def packed_slot_saving(
    batch: SequenceBatch, group_size: int, *, parts: int = 1, orders: Any = None
) -> float:
    """The share of the padded forward's slots (`B·P + N·T`, each prompt once per group) that
    packing the batch removes: `1 − (B·P + R·T) / (B·P + N·T)`, `R` the completion rows
    `pack_groups(batch, G, parts=, orders=)` would lay out at the cut width `T`
    (`completion_row_count`; host).

    Examples:
      >>> b = SequenceBatch(np.array([[0, 5, 6, 0], [0, 5, 7, 0]]),
      ...                   np.array([[0, 1, 1, 0], [0, 1, 1, 0]]), np.ones((2, 2)))
      >>> packed_slot_saving(b, 2)  # both completions in one row: 2 + 2 of 2 + 4 slots
      0.3333333333333333
    """
    mask = np.asarray(batch.attention_mask) > 0
    N, T = np.shape(batch.completion_mask)
    P = mask.shape[1] - T
    lengths = mask[:, P:].sum(axis=1).reshape(N // group_size, group_size)
    rows = completion_row_count(lengths, width=T, parts=parts, orders=orders)
    prompt_slots = N // group_size * P
    return 1.0 - (prompt_slots + rows * T) / (prompt_slots + N * T)


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


def packing_metrics(packed: PackedGroups, row_groups: int = 1) -> dict[str, float]:
    """`perf/packed_rows` (completion rows), `perf/packing_fill` (the share of the prompt
    and completion rows' slots that hold a token) and `perf/packed_row_groups` (the parts the
    forwards and the update ran in, one thread each: `StepPacking.forward_parts`).

    Examples:
      >>> from jaxrl_llm.train import pack_groups
      >>> b = SequenceBatch(np.array([[0, 4, 5, 0], [0, 4, 6, 7]]),
      ...                   np.array([[0, 1, 1, 0], [0, 1, 1, 1]]), np.array([[1, 0], [1, 1]]))
      >>> packing_metrics(pack_groups(b, 2))
      {'perf/packed_rows': 2.0, 'perf/packing_fill': 0.6666666666666666, 'perf/packed_row_groups': 1.0}
    """
    return {
        "perf/packed_rows": float(np.shape(packed.tokens)[0]),
        "perf/packing_fill": group_packing_fill(packed),
        "perf/packed_row_groups": float(row_groups),
    }
