"""The update step with its gradient computed in row groups, side by side from host threads.

    group j < g:   g_j, stats_j = ∇ L_j(θ)            rows [j·N/g, (j+1)·N/g), its own thread
    apply:         g = Σ_j g_j → optimizer, metrics, KL controller, non-finite skip

`L_j` is group `j`'s share of the batch loss: its tokens and sequences over the counts of the
*whole* batch (the `Normalizers`, ALGORITHMS.md §0.7), so `Σ_j L_j = L` and `Σ_j ∇L_j = ∇L`.
The step makes the same optimizer update as `update_step` on the whole batch, up to the order
of float additions: the argument of the data-parallel form (`jaxrl_llm.train.update`), with
host threads in place of devices and a sum in place of the `pmean`. Metrics combine the same
way (sums and counts add, maxes take the max; each group's `loss/…` share counts `1/g`).

Why threads: XLA:CPU runs one program's kernels one after the other, each on one core unless
it is large enough to split, and the update step's elementwise and attention kernels are not
(docs/performance.md); PjRt's CPU client runs a call on the calling thread, so `g` calls from
`g` threads use `g` cores (`jaxrl_llm.sampler.row_groups`). On the 2-core benchmark machine
the small model's forward + backward over 64 × 80 tokens ran 1.11-1.19× faster as two
32-row calls from two threads.

Packed groups (`RLBatch.packed`, `jaxrl_llm.train.pack_groups`): packed for `g` parts
(`pack_groups(parts=g)`), group `j` is part `j` — the groups `≡ j (mod g)` with their own
prompt and completion rows (`packing_part`, the split of `update_step`'s micro-batches) — so
the packed rows share the cores as the padded ones do. The step refuses a packing laid out
for another number of parts (`check_packing_parts`).

Scope: one optimizer update per batch (`epochs = minibatches = accumulation_steps = 1`, the
GRPO default) of an objective whose loss is a sum over rows with global normalisers (every
objective of `jaxrl_llm.train`; the same condition as data parallelism). The step is two
programs, the groups' gradient (one compile for all groups: the offset is an argument) and the
apply step (the state donated).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

import losses
from jaxrl_llm.sampler.row_groups import map_in_threads
from jaxrl_llm.train.batch import Normalizers
from jaxrl_llm.train.group_packing import (
    PackedGroups,
    check_packing_parts,
    group_rows_part,
    packing_part,
)
from jaxrl_llm.train.metrics import MicroStats, micro_batch_stats, reduce_stats
from jaxrl_llm.train.objectives import Objective
from jaxrl_llm.train.state import TrainState
from jaxrl_llm.train.update import (
    _grad_norm_metrics,
    _nonfinite_flags,
    finish_update,
    jit_state_step,
    loss_and_grads,
)


def group_gradients(
    objective: Objective,
    params: Any,
    frozen: Any,
    kl_coef: Any,
    batch: Any,
    start: jax.Array,
    *,
    rows: int,
    groups: int,
    skip_nonfinite: bool = False,
) -> tuple[Any, MicroStats]:
    """Gradient and metric parts of the rows `[start, start + rows)` of `batch` (one group).

    Args:
      objective: the `Objective`.
      params, frozen: trainable and frozen parameters.
      kl_coef: β of the KL loss.
      batch: the whole batch (`N` rows); its counts are the loss's normalisers.
      start: the group's first row (an int32 scalar: one program for every group); with
        packed groups the group is part `start // rows` of the packing (module docstring).
      rows: the group's rows, `N / groups`.
      groups: the number of groups (each group's `loss/…` share counts `1 / groups`).
      skip_nonfinite: add the group's `nonfinite/…` flags of its loss terms to the maxes (the
        gradient's flag is set from the summed gradient by `apply_group_gradients`).

    Returns:
      `(grads, stats)`: `∇L_j` and the group's `MicroStats`.

    Examples:
      >>> from jaxrl_llm.train.batch import SequenceBatch, count_normalizers
      >>> loss = lambda p, f, b, n, k: (jnp.sum(p["w"] * b.completion_mask) / n.num_tokens, {})
      >>> obj = Objective(loss, lambda b: count_normalizers(b.completion_mask), None)
      >>> b = SequenceBatch(jnp.zeros((4, 2), jnp.int32), jnp.ones((4, 2)), jnp.ones((4, 1)))
      >>> g, _ = group_gradients(obj, {"w": jnp.ones(1)}, {}, 0.0, b, jnp.int32(2), rows=2, groups=2)
      >>> g["w"].tolist()  # 2 of the batch's 4 tokens
      [0.5]
    """
    counts = objective.normalizers(batch)
    packed = getattr(batch, "packed", None)
    if isinstance(packed, PackedGroups):  # the part of the groups ≡ j (mod groups)
        j, G = start // rows, packed.row.shape[0] // packed.prompt_tokens.shape[0]
        part = jax.tree.map(lambda x: group_rows_part(x, j, groups, G), batch._replace(packed=None))
        part = part._replace(packed=packing_part(packed, j, groups))
    else:
        part = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, rows), batch)
    local = objective.normalizers(part)
    norms = Normalizers(counts.num_tokens, counts.num_seqs, jnp.ones((), jnp.float32))
    grads, loss, metrics = loss_and_grads(objective, params, frozen, part, norms, kl_coef)
    stats = micro_batch_stats(
        metrics, num_tokens=local.num_tokens, num_seqs=local.num_seqs, loss_weight=1.0 / groups
    )
    if skip_nonfinite:  # the gradient's flag is the summed gradient's (apply_group_gradients)
        stats.maxes.update(_nonfinite_flags(loss, metrics, grad_norm=None))
    return grads, stats


def apply_group_gradients(
    state: TrainState,
    grads: tuple[Any, ...],
    stats: tuple[MicroStats, ...],
    *,
    optimizer: optax.GradientTransformation,
    num_rows: int,
    kl_controller: losses.KLController | None = None,
    skip_nonfinite: bool = False,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer update with the sum of the groups' gradients; the step's metrics.

    Args:
      state: the `TrainState`.
      grads: the groups' gradients (`group_gradients`).
      stats: the groups' metric parts.
      optimizer: from `make_optimizer` (not a `MultiSteps`: one update per batch).
      num_rows: the batch's rows (the KL controller's `n_steps`).
      kl_controller, skip_nonfinite: as for `update_step`.

    Returns:
      `(new_state, metrics)` as `update_step` gives them.

    Examples:
      >>> from jaxrl_llm.train.state import init_train_state
      >>> s = init_train_state({"w": jnp.zeros(1)}, {}, optax.sgd(1.0), key=jax.random.key(0))
      >>> parts = MicroStats({"loss/total": jnp.array(1.0)}, {"loss/total": jnp.array(0.5)}, {})
      >>> g = ({"w": jnp.array([1.0])}, {"w": jnp.array([2.0])})
      >>> s, m = apply_group_gradients(s, g, (parts, parts), optimizer=optax.sgd(1.0), num_rows=4)
      >>> s.params["w"].tolist(), float(m["loss/total"]), float(m["optim/grad_norm"])
      ([-3.0], 2.0, 3.0)
    """
    _, next_key = jax.random.split(state.key)  # as update_step: its shuffling key is unused
    total = jax.tree.map(lambda *g: functools.reduce(jnp.add, g), *grads)
    grad_norms = _grad_norm_metrics(total)
    grad_norm = grad_norms["optim/grad_norm"]
    updates, opt_state = optimizer.update(total, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *stats)
    for key, norm in grad_norms.items():
        stacked.sums[key] = norm[None]
        stacked.counts[key] = jnp.ones((1,), jnp.float32)
    if skip_nonfinite:  # the flag of the summed gradient, as one whole-batch gradient has it
        stacked.maxes["nonfinite/grad_norm"] = (~jnp.isfinite(grad_norm))[None].astype(jnp.float32)
    return finish_update(
        state,
        params,
        opt_state,
        reduce_stats(stacked),
        num_rows=num_rows,
        next_key=next_key,
        kl_controller=kl_controller,
        skip_nonfinite=skip_nonfinite,
    )


def make_row_group_update_step(
    objective: Objective,
    optimizer: optax.GradientTransformation,
    *,
    groups: int,
    kl_controller: losses.KLController | None = None,
    mesh: Mesh | None = None,
    state_shardings: Any = None,
    skip_nonfinite: bool = False,
) -> Callable[[TrainState, Any], tuple[TrainState, dict[str, jax.Array]]]:
    """`step(state, batch)`: one optimizer update whose gradient is computed in `groups` row
    groups, one host thread each (module docstring); the passed state is donated.

    Args:
      objective: the `Objective`.
      optimizer: from `make_optimizer` without accumulation.
      groups: row groups (>= 1); must divide the batch's rows.
      kl_controller, skip_nonfinite: as for `update_step`.
      mesh: optional device mesh of ONE device (a larger mesh splits the rows itself).
      state_shardings: the `TrainState` shardings; required with a mesh.

    Returns:
      `step(state, batch) -> (state, metrics)`.

    Raises:
      ValueError: `groups` < 1, a mesh of several devices, or (at the call) rows that do not
        split into `groups` equal groups.

    Examples:
      >>> from jaxrl_llm.train.batch import SequenceBatch, count_normalizers
      >>> from jaxrl_llm.train.state import init_train_state
      >>> def loss(p, f, b, n, k):
      ...     l = jnp.sum((p["policy"]["w"] - b.completion_mask) ** 2) / n.num_tokens
      ...     return l, {"loss/total": l}
      >>> obj = Objective(loss, lambda b: count_normalizers(b.completion_mask), lambda b, n: None)
      >>> step = make_row_group_update_step(obj, optax.sgd(0.5), groups=2)
      >>> s = init_train_state({"policy": {"w": jnp.zeros(1)}}, {}, optax.sgd(0.5),
      ...                      key=jax.random.key(0))
      >>> b = SequenceBatch(jnp.zeros((4, 3), jnp.int32), jnp.ones((4, 3)), jnp.ones((4, 1)))
      >>> s, m = step(s, b)  # as update_step on the whole batch
      >>> s.params["policy"]["w"].tolist(), int(s.step), round(float(m["loss/total"]), 3)
      ([1.0], 1, 1.0)
    """
    where = "make_row_group_update_step"
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{where}: `groups` must be an int >= 1, got {groups!r}.")
    # `OptimConfig`'s accumulation is `optax.MultiSteps(...).gradient_transformation()`: a plain
    # GradientTransformation, recognised by its state (below)
    accumulation = f"{where}: one update per batch; accumulation is not supported here."
    if isinstance(optimizer, optax.MultiSteps):
        raise ValueError(accumulation)
    if mesh is not None and mesh.size != 1:
        raise ValueError(
            f"{where}: row groups run on one device; the mesh has {mesh.size} (it splits the "
            "rows over its devices already)."
        )
    if mesh is not None and state_shardings is None:
        raise ValueError(f"{where}: a `mesh` needs `state_shardings`.")
    gradients = jax.jit(
        functools.partial(group_gradients, objective, skip_nonfinite=skip_nonfinite),
        static_argnames=("rows", "groups"),
    )

    @functools.cache
    def apply_program(num_rows: int) -> Callable[..., Any]:
        apply = functools.partial(
            apply_group_gradients,
            optimizer=optimizer,
            num_rows=num_rows,
            kl_controller=kl_controller,
            skip_nonfinite=skip_nonfinite,
        )
        return jit_state_step(apply, mesh, state_shardings, (None, None))

    def step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, jax.Array]]:
        if isinstance(state.opt_state, optax.MultiStepsState):
            raise ValueError(
                f"{accumulation} The state's optimizer accumulates gradients "
                "(OptimConfig.accumulation_steps > 1): build it with accumulation_steps = 1."
            )
        objective.check(batch, 1)
        N = jax.tree.leaves(batch)[0].shape[0]
        if N % groups:
            raise ValueError(
                f"{where}: the batch has N = {N} rows, not divisible into {groups} equal row "
                "groups."
            )
        rows = N // groups
        if rows % objective.unit:
            raise ValueError(
                f"{where}: each of the {groups} row groups has {rows} rows, not whole "
                f"{objective.describe_unit()}."
            )
        packed = getattr(batch, "packed", None)
        if isinstance(packed, PackedGroups):
            _check_packed_groups(packed, groups, objective.unit)

        def group(j: int) -> tuple[Any, MicroStats]:
            start = jnp.int32(j * rows)
            beta = state.kl.beta
            return gradients(
                state.params, state.frozen, beta, batch, start, rows=rows, groups=groups
            )

        apply = apply_program(N)
        if mesh is None:
            return apply(state, *zip(*map_in_threads(group, groups), strict=True))
        with jax.set_mesh(mesh):
            return apply(state, *zip(*map_in_threads(group, groups), strict=True))

    return step


def _check_packed_groups(packed: PackedGroups, groups: int, unit: int) -> None:
    """A packed batch's row groups are the parts of `pack_groups(parts=groups)`, each a set
    of whole groups of `G` rows (so whole units of the objective too)."""
    where = "make_row_group_update_step"
    B, N = np.shape(packed.prompt_tokens)[-2], np.shape(packed.row)[-1]
    G = N // B
    if B % groups or G % unit:
        raise ValueError(
            f"{where}: packed groups (`RLBatch.packed`) run in row groups of whole groups: "
            f"the {B} groups of {G} rows must split into {groups} row groups, and each group "
            f"hold whole units of {unit} rows."
        )
    check_packing_parts(packed, groups, where=where)
