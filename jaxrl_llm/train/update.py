"""The pure update step: epochs × minibatches × accumulation over one batch, in one `lax.scan`.

    update_step(state, batch) -> (state, metrics)

For each of `epochs` passes the rows are (optionally) shuffled and split into `M = minibatches`
minibatches of `k = optim.accumulation_steps` micro-batches each: minibatch `m` holds rows
`m, m + M, m + 2M, …` of the (shuffled) batch and its micro-batch `i` every `k`-th of those, so
the minibatches do not depend on `k` and a batch sharded along `N` stays evenly sharded. A scan
over the micro-batches computes each one's gradient (`loss_and_grads`) and feeds it to the
optimizer; with `k > 1` that optimizer is an `optax.MultiSteps`, which applies one
update per `k` micro-batches with their mean gradient. Each micro-batch's loss uses the *global*
token/sequence counts of its optimizer update and is scaled by `k` before differentiation, so
the applied gradient is exactly the gradient of the whole minibatch's loss (ALGORITHMS.md §0.7).
`old_logp` stays the batch's (computed before the step), so PPO's ratio in the first micro-batch
of the first epoch is 1.

After the scan the KL controller (if any) updates β from the batch's KL (`kl/seq_k1`, the k1
KL between the old and the reference policy, ALGORITHMS.md §3.5, `n_steps = N`).

`make_update_step` compiles it with `jax.jit(donate_argnums=0)` and, with a mesh, explicit
`in_shardings`/`out_shardings` (`jaxrl_llm.train.shardings`).

Non-finite steps (`skip_nonfinite=True`): every micro-batch's loss and gradient norm are checked
with `jnp.isfinite`; if any is non-finite the whole step is skipped in-graph,

    ok = all_micro-batches( isfinite(loss) ∧ isfinite(‖g‖) )
    params', opt_state', kl' = where(ok, updated, before)

so the parameters, the optimizer state and the KL controller come back unchanged (the step
counter and the shuffling key still advance: the batch was consumed). The metrics then report
`optim/skipped` (1.0 for a skipped step) and, per loss term the objective returns as
`loss/<term>` (`policy`, `kl`, `entropy`, `value`, `total`, ...), `nonfinite/<term>` = 1.0 when
that term was non-finite in some micro-batch, plus `nonfinite/grad_norm`. The check costs the
previous parameters and optimizer state staying alive until the end of the step (an extra copy
of both when the step makes more than one optimizer update).

Data parallelism (`axis_name`): the same step runs as one shard of a `jax.shard_map` (or
`jax.pmap`) over a named axis of `D` devices (`jaxrl_llm.train.parallel`), each holding a
replica of the state and `n = N/D` rows of the batch. Then

    counts of each micro-batch      psum over the axis      (global token / sequence counts)
    grad_scale                      k·D                     so that pmean(∇(k·D·L_d)) = k·∇L
    gradients                       lax.pmean               every replica applies the same update
    metric sums / counts, maxes     lax.psum / lax.pmax     the means of the whole batch
    KL controller                   sees N = n·D rows

so every replica computes the parameters of the single-device step on the whole batch (up to
the order of float additions). Minibatch `m` holds the rows `≡ m (mod M)` and micro-batch `i`
those with `⌊row/M⌋ ≡ i (mod k)`; with `n` a multiple of `M·k` a device's block of rows
splits into the same classes, so the local strided split selects exactly the jit path's
micro-batches. A shuffled epoch (`shuffle` and `minibatches > 1`) permutes the *global* rows
with the replicated key: each device all-gathers the batch (`N` rows per device for the
step's duration) and takes its block of the permuted order.

Units: an objective whose loss reads rows together (an online DPO pair, `Objective.row_unit`;
a prompt's group of `G` rows, `Objective.group_size`) has the batch split in units of
`u = lcm(row_unit, group_size)` consecutive rows. Everything above then holds with "unit" in
place of "row": minibatch `m` holds the units `≡ m (mod M)`, a shuffle permutes units, and
`N` (per device, `n`) must be a multiple of `u·M·k`. With `u = 1` nothing changes.

Packed groups (`RLBatch.packed`, `jaxrl_llm.train.pack_groups`): the sequence leaves of the
packing (`row`, `batch_row`, `slots`) are ordered and split as the batch's rows, its prompt
rows `[B, P]` and completion rows `[R, W]` in strided rows (micro-batch `j` takes the rows
`≡ j (mod M·k)`, where `pack_groups(parts=M·k)` put its groups). With several micro-batches they must hold
whole groups (a unit of `G` rows: `minibatch_unit: prompt`); a shuffled update takes one
packing per epoch, laid out in the group orders `update_unit_orders` draws from `state.key`
as the step does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import losses
from jaxrl_llm.train.batch import Normalizers
from jaxrl_llm.train.group_packing import SEQUENCE_LEAVES, PackedGroups
from jaxrl_llm.train.metrics import MicroStats, micro_batch_stats, reduce_stats
from jaxrl_llm.train.objectives import Objective
from jaxrl_llm.train.optim import has_learning_rate, learning_rate
from jaxrl_llm.train.params import POLICY, VALUE
from jaxrl_llm.train.shardings import batch_sharding
from jaxrl_llm.train.state import TrainState
from sharding.constraints import out_sharding

GradFn = Callable[..., tuple[Any, jax.Array, dict[str, jax.Array]]]


def loss_and_grads(
    objective: Objective,
    params: Any,
    frozen: Any,
    batch: Any,
    norms: Normalizers,
    kl_coef: Any,
) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    """Gradient of `norms.grad_scale · loss` w.r.t. the trainable `params` (no optimizer).

    Pure and separable from the optimizer so that a data-parallel wrapper (`shard_map` with a
    `pmean` of the gradients, `grad_scale = D`) can reuse it unchanged.

    Args:
      objective: the `Objective`.
      params: trainable parameters.
      frozen: frozen parameters (not differentiated).
      batch: one micro-batch.
      norms: the global normalisers of its optimizer update.
      kl_coef: β of the KL loss.

    Returns:
      `(grads, loss, metrics)`; `loss` is the unscaled micro-batch loss.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrl_llm.train.batch import count_normalizers
      >>> obj = Objective(loss=lambda p, f, b, n, k: (jnp.sum(p["w"] * b) / n.num_tokens, {}),
      ...                 normalizers=None, check=None)
      >>> norms = count_normalizers(jnp.ones((1, 2)))._replace(grad_scale=jnp.array(2.0))
      >>> g, loss, _ = loss_and_grads(obj, {"w": jnp.ones(2)}, {}, jnp.array([1.0, 3.0]), norms, 0.0)
      >>> g["w"].tolist(), float(loss)
      ([1.0, 3.0], 2.0)
    """

    def scaled(p: Any) -> tuple[jax.Array, tuple[jax.Array, dict]]:
        loss, metrics = objective.loss(p, frozen, batch, norms, kl_coef)
        return loss * norms.grad_scale, (loss, metrics)

    grads, (loss, metrics) = jax.grad(scaled, has_aux=True)(params)
    return grads, loss, metrics


def _micro_batches(batch: Any, minibatches: int, k: int, unit: int = 1) -> Any:
    """`[N, ...]` leaves → `[M·k, N/(M·k), ...]`, ordered minibatch-major.

    The rows go in units of `unit` consecutive rows (module docstring), numbered `j`.
    Minibatch `m` holds units `m, m + M, m + 2M, …` whatever `k` is (so accumulation never
    changes which rows share an update); its micro-batch `i` holds every `k`-th of those,
    starting at the `i`-th: units `m + M·(i + k·r)`, each unit's rows consecutive and in order.
    """

    if minibatches * k == 1:  # one micro-batch: the batch in order (packed rows included)
        return jax.tree.map(lambda x: x[None], batch)

    def split(x: jax.Array) -> jax.Array:
        n = x.shape[0] // (minibatches * k * unit)  # units per micro-batch
        rest = x.shape[1:]
        if unit == 1:
            x = x.reshape(n, k, minibatches, *rest)  # [r, i, m] = row m + M·(i + k·r)
            x = jnp.moveaxis(x, 0, 2)  # [k, M, n, ...]
            x = jnp.swapaxes(x, 0, 1)  # [M, k, n, ...]
            return x.reshape(minibatches * k, n, *rest)
        x = x.reshape(n, k, minibatches, unit, *rest)  # [r, i, m] = unit m + M·(i + k·r)
        x = jnp.swapaxes(jnp.moveaxis(x, 0, 2), 0, 1)  # [M, k, n, unit, ...]
        shape = (minibatches * k, n * unit, *rest)
        names = (None, "batch") + (None,) * len(rest)  # Explicit axes: rows stay split
        return jnp.reshape(x, shape, out_sharding=out_sharding(names, shape=shape))

    return jax.tree.map(split, batch)


def update_unit_orders(key: jax.Array, *, epochs: int, units: int) -> jax.Array:
    """The order `[E, units]` in which a shuffled `update_step` (`shuffle` and
    `minibatches > 1`) takes the batch's units (rows, or groups of `unit` rows; module
    docstring) in each of its `E` epochs, drawn from the step's `state.key` as the step draws
    it. Called on the host before the step, it gives the orders a packing per epoch must
    follow (`pack_groups(orders=)`).

    Examples:
      >>> o = update_unit_orders(jax.random.key(0), epochs=2, units=4)
      >>> o.shape, sorted(o[0].tolist()) == sorted(o[1].tolist()) == [0, 1, 2, 3]
      ((2, 4), True)
    """
    step_key, _ = jax.random.split(key)
    keys = jax.random.split(step_key, epochs)
    return jnp.stack([jax.random.permutation(keys[e], units) for e in range(epochs)])


def _unit_rows(order: jax.Array, unit: int) -> jax.Array:
    """The rows of the units in `order`, each unit's `unit` consecutive rows together and in
    order; with `unit = 1`, `order` itself."""
    return (order[:, None] * unit + jnp.arange(unit)).reshape(-1)


def _split_packed(
    packed: PackedGroups, order: jax.Array | None, minibatches: int, k: int, unit: int
) -> PackedGroups:
    """`PackedGroups` → `[M·k, ...]` micro-batches (module docstring): the sequence leaves
    ordered and split as the batch's rows, the packed rows strided."""
    leaves = packed._asdict()
    seqs = {name: leaves.pop(name) for name in SEQUENCE_LEAVES}
    if order is not None:
        seqs = jax.tree.map(lambda x: _take_rows(x, _unit_rows(order, unit)), seqs)
    return PackedGroups(
        **_micro_batches(leaves, minibatches, k), **_micro_batches(seqs, minibatches, k, unit)
    )


def _check_packed(packed: PackedGroups, shuffled: bool, epochs: int, parts: int, unit: int):
    where = "update_step"
    if parts > 1 and unit == 1:
        raise ValueError(
            f"{where}: packed groups (`RLBatch.packed`) split into {parts} micro-batches need "
            "micro-batches of whole groups (the objective's group_size = G: "
            "algorithm.minibatch_unit 'prompt')."
        )
    per_epoch = packed.row.ndim == 2
    if per_epoch != shuffled or (shuffled and packed.row.shape[0] != epochs):
        need = (
            f"one packing per epoch ([E = {epochs}, ...] leaves, pack_groups(orders="
            "update_unit_orders(...)))"
            if shuffled
            else "one packing (no epoch axis)"
        )
        raise ValueError(
            f"{where}: a {'shuffled' if shuffled else 'fixed-order'} update takes {need}, got "
            f"`packed.row` of shape {packed.row.shape}."
        )
    if packed.tokens.shape[-2] % parts or packed.prompt_tokens.shape[-2] % parts:
        raise ValueError(
            f"{where}: {packed.prompt_tokens.shape[-2]} prompt rows and "
            f"{packed.tokens.shape[-2]} completion rows do not split into {parts} "
            "micro-batches (pack_groups(parts=minibatches × accumulation_steps))."
        )


def _update_norms(counts: Normalizers, minibatches: int, k: int, devices: int = 1) -> Normalizers:
    """Each micro-batch gets the summed counts of the `k` micro-batches of its optimizer update;
    its loss is scaled by `k·devices` (`MultiSteps` and a `pmean` each average)."""

    def group_total(x: jax.Array) -> jax.Array:
        return jnp.repeat(jnp.sum(x.reshape(minibatches, k), axis=1), k)

    return Normalizers(
        num_tokens=group_total(counts.num_tokens),
        num_seqs=group_total(counts.num_seqs),
        grad_scale=jnp.full((minibatches * k,), float(k * devices), jnp.float32),
    )


def _grad_norm_metrics(grads: Any) -> dict[str, jax.Array]:
    """`optim/grad_norm` (the global norm of `grads`) and, when `grads` holds a critic (a
    non-empty `value` subtree of the `{"policy", "value"}` dict), `optim/policy_grad_norm` and
    `optim/value_grad_norm`, the norms each `optim.critic_learning_rate` clip sees.

    Examples:
      >>> g = {"policy": {"w": jnp.array([3.0])}, "value": {"v": jnp.array([4.0])}}
      >>> {k: float(v) for k, v in _grad_norm_metrics(g).items()}
      {'optim/grad_norm': 5.0, 'optim/policy_grad_norm': 3.0, 'optim/value_grad_norm': 4.0}
    """
    metrics = {"optim/grad_norm": optax.tree.norm(grads)}
    if isinstance(grads, dict) and jax.tree.leaves(grads.get(VALUE, {})):
        metrics["optim/policy_grad_norm"] = optax.tree.norm(grads[POLICY])
        metrics["optim/value_grad_norm"] = optax.tree.norm(grads[VALUE])
    return metrics


def _applied_grad_norms(grads: Any, opt_state: Any, k: int) -> tuple[dict, jax.Array]:
    """The `_grad_norm_metrics` of the gradient the optimizer applies at this micro-step, and
    whether it applies one.

    With `optax.MultiSteps` the applied gradient is the running mean of the `k` micro-batch
    gradients, completed at the `k`-th (its documented `acc_grads` / `mini_step` state).
    """
    if k == 1:
        return _grad_norm_metrics(grads), jnp.ones((), jnp.float32)
    i = opt_state.mini_step
    mean = jax.tree.map(
        lambda g, acc: acc + (g.astype(acc.dtype) - acc) / (i + 1).astype(acc.dtype),
        grads,
        opt_state.acc_grads,
    )
    return _grad_norm_metrics(mean), (i == k - 1).astype(jnp.float32)


def _take_rows(x: jax.Array, rows: jax.Array) -> jax.Array:
    """`x[rows]`; under Explicit mesh axes the result keeps `x`'s row sharding (a gather along
    a sharded axis cannot infer it)."""
    names = ("batch",) + (None,) * (x.ndim - 1)
    if out_sharding(names, shape=x.shape) is None:  # no mesh, or Auto axes
        return x[rows]
    return x.at[rows].get(out_sharding=jax.typeof(x).sharding.spec)


def _global_rows(batch: Any, rows: jax.Array, axis_name: str | None) -> Any:
    """The batch in the order `rows` of the global batch; with an axis, this device's block.

    Inside a data-parallel step the rows of the permuted global batch that land on device `d`
    are `d·n … (d+1)·n − 1` (module docstring), so each device gathers every row first.
    """
    if axis_name is None:
        return jax.tree.map(lambda x: _take_rows(x, rows), batch)
    n = jax.tree.leaves(batch)[0].shape[0]
    mine = jax.lax.dynamic_slice_in_dim(rows, jax.lax.axis_index(axis_name) * n, n)
    return jax.tree.map(lambda x: jax.lax.all_gather(x, axis_name, axis=0, tiled=True)[mine], batch)


def _across_devices(stats: MicroStats, axis_name: str | None) -> MicroStats:
    """Sum the metric parts (sums, counts) over the data-parallel axis; maxes take the max."""
    if axis_name is None:
        return stats
    return MicroStats(
        sums=jax.lax.psum(stats.sums, axis_name),
        counts=jax.lax.psum(stats.counts, axis_name),
        maxes=jax.lax.pmax(stats.maxes, axis_name),
    )


def _nonfinite_flags(
    loss: jax.Array, metrics: dict[str, jax.Array], grad_norm: jax.Array | None
) -> dict:
    """1.0 per non-finite loss term (`loss/<term>` metrics), total loss and gradient norm (no
    `nonfinite/grad_norm` flag when `grad_norm` is None)."""
    flags = {
        f"nonfinite/{key.split('/', 1)[1]}": value
        for key, value in metrics.items()
        if key.startswith("loss/")
    }
    flags["nonfinite/total"] = loss
    if grad_norm is not None:
        flags["nonfinite/grad_norm"] = grad_norm
    return {k: (~jnp.isfinite(v)).astype(jnp.float32) for k, v in flags.items()}


def update_step(
    state: TrainState,
    batch: Any,
    *,
    objective: Objective,
    optimizer: optax.GradientTransformation,
    epochs: int = 1,
    minibatches: int = 1,
    accumulation_steps: int = 1,
    shuffle: bool = True,
    kl_controller: losses.KLController | None = None,
    grad_fn: GradFn | None = None,
    skip_nonfinite: bool = False,
    axis_name: str | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One update on one batch: `epochs × minibatches` optimizer updates (module docstring).

    Args:
      state: the `TrainState`.
      batch: a batch of the objective's type with `N` rows, `N` divisible by
        `minibatches × accumulation_steps` units of `lcm(objective.row_unit,
        objective.group_size)` rows (module docstring).
      objective: `rl_objective(...)` or `sft_objective(...)`.
      optimizer: from `make_optimizer` (a `MultiSteps` when `accumulation_steps > 1`).
      epochs: passes over the batch.
      minibatches: optimizer updates per epoch.
      accumulation_steps: micro-batches per optimizer update; must equal the optimizer's
        `accumulation_steps`.
      shuffle: reshuffle the rows every epoch (with `state.key`); only matters with
        `minibatches > 1` (one minibatch sees all rows whatever their order).
      kl_controller: updates `state.kl` after the step from the metric `kl/seq_k1` (None: β
        stays as it is).
      grad_fn: replaces `loss_and_grads` (same signature without `objective`); with
        `axis_name` its gradients are still averaged over the axis.
      skip_nonfinite: skip the whole step when a loss or gradient is non-finite (module
        docstring); adds `optim/skipped` and the `nonfinite/…` flags to the metrics.
      axis_name: run as one replica of a data-parallel step over this named axis (inside
        `jax.shard_map` / `jax.pmap`; module docstring): `batch` holds this device's `n` rows,
        `n` divisible by `minibatches × accumulation_steps` units. None: the whole batch is
        here.

    Returns:
      `(new_state, metrics)`: metrics are float32 scalars reduced over all micro-batches as
      sums and counts (`jaxrl_llm.train.metrics`), plus `optim/learning_rate` (optimizers
      from `make_optimizer`) and `kl/beta` (with a `kl_controller`).

    Examples:
      >>> import jax.numpy as jnp, optax
      >>> from jaxrl_llm.train.batch import count_normalizers
      >>> from jaxrl_llm.train.state import init_train_state
      >>> def loss(p, f, b, n, k):
      ...     l = jnp.sum((p["policy"]["w"] - b.completion_mask) ** 2) / n.num_tokens
      ...     return l, {"loss/total": l}
      >>> obj = Objective(loss, lambda b: count_normalizers(b.completion_mask), lambda b, n: None)
      >>> from jaxrl_llm.train.batch import SequenceBatch
      >>> b = SequenceBatch(jnp.zeros((4, 3), jnp.int32), jnp.ones((4, 3)), jnp.ones((4, 1)))
      >>> s = init_train_state({"policy": {"w": jnp.zeros(1)}}, {}, optax.sgd(0.5),
      ...                      key=jax.random.key(0))
      >>> s, m = update_step(s, b, objective=obj, optimizer=optax.sgd(0.5))
      >>> s.params["policy"]["w"].tolist(), int(s.step), round(float(m["loss/total"]), 3)
      ([1.0], 1, 1.0)
      >>> nan = b._replace(completion_mask=jnp.full((4, 1), jnp.nan))
      >>> s2, m = update_step(s, nan, objective=obj, optimizer=optax.sgd(0.5), skip_nonfinite=True)
      >>> s2.params["policy"]["w"].tolist(), float(m["optim/skipped"]), float(m["nonfinite/total"])
      ([1.0], 1.0, 1.0)
    """
    where = "update_step"
    for name, value in (
        ("epochs", epochs),
        ("minibatches", minibatches),
        ("accumulation_steps", accumulation_steps),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: `{name}` must be a positive int, got {value!r}.")
    objective.check(batch, epochs * minibatches)
    k = accumulation_steps
    parts = minibatches * k
    N = jax.tree.leaves(batch)[0].shape[0]
    devices = 1 if axis_name is None else jax.lax.axis_size(axis_name)
    unit = objective.unit
    if N % (parts * unit):
        held = "rows" if axis_name is None else f"rows on each of the {devices} devices"
        units = "" if unit == 1 else f", each of whole {objective.describe_unit()}"
        raise ValueError(
            f"{where}: the batch has N = {N} {held}, not divisible into minibatches × "
            f"accumulation_steps = {minibatches} × {k} = {parts} equal micro-batches{units}."
        )
    shuffled = shuffle and minibatches > 1
    packed = getattr(batch, "packed", None)
    if isinstance(packed, PackedGroups):
        _check_packed(packed, shuffled, epochs, parts, unit)
        batch = batch._replace(packed=None)
    else:
        packed = None
    if (k > 1) != isinstance(state.opt_state, optax.MultiStepsState):
        raise ValueError(
            f"{where}: accumulation_steps = {k} must match the optimizer (an optax.MultiSteps "
            "state iff accumulation_steps > 1; build both from the same OptimConfig)."
        )
    grads_of = grad_fn or functools.partial(loss_and_grads, objective)
    if axis_name is not None:
        local_grads_of = grads_of

        def grads_of(*args: Any) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
            grads, loss, metrics = local_grads_of(*args)
            return jax.lax.pmean(grads, axis_name), loss, metrics

    next_key = jax.random.split(state.key)[1]
    frozen, kl_coef = state.frozen, state.kl.beta

    def micro_step(carry: tuple[Any, Any], xs: tuple[Any, Normalizers, Normalizers]) -> Any:
        params, opt_state = carry
        micro, norms, local = xs
        grads, loss, metrics = grads_of(params, frozen, micro, norms, kl_coef)
        grad_norms, applied = _applied_grad_norms(grads, opt_state, k)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        flags = _nonfinite_flags(loss, metrics, optax.tree.norm(grads)) if skip_nonfinite else {}
        metrics = {**metrics, **grad_norms}
        stats = micro_batch_stats(
            metrics,
            num_tokens=local.num_tokens,
            num_seqs=local.num_seqs,
            loss_weight=1.0 / (k * devices),  # the devices' shares of a loss add up
            optim_weight=applied,
        )
        stats.maxes.update(flags)  # reduced by max: 1.0 if any micro-batch was non-finite
        return (params, opt_state), stats

    def epoch(carry: tuple[Any, Any], xs: tuple[Any, Any]) -> Any:
        order, epoch_packed = xs
        # with one minibatch the update does not depend on the row order: no permutation
        rows = batch
        if order is not None:
            rows = _global_rows(batch, _unit_rows(order, unit), axis_name)
        micro = _micro_batches(rows, minibatches, k, unit)
        if packed is not None:
            fixed = packed if epoch_packed is None else epoch_packed
            micro = micro._replace(packed=_split_packed(fixed, order, minibatches, k, unit))
        local = jax.vmap(objective.normalizers)(micro)
        counts = local if axis_name is None else jax.lax.psum(local, axis_name)
        norms = _update_norms(counts, minibatches, k, devices)
        return jax.lax.scan(micro_step, carry, (micro, norms, local))

    orders = None
    if shuffled:
        orders = update_unit_orders(state.key, epochs=epochs, units=N * devices // unit)
    (params, opt_state), stats = jax.lax.scan(
        epoch,
        (state.params, state.opt_state),
        (orders, packed if shuffled else None),
        length=epochs,
    )
    return finish_update(
        state,
        params,
        opt_state,
        reduce_stats(_across_devices(stats, axis_name)),
        num_rows=N * devices,
        next_key=next_key,
        kl_controller=kl_controller,
        skip_nonfinite=skip_nonfinite,
    )


def finish_update(
    state: TrainState,
    params: Any,
    opt_state: Any,
    metrics: dict[str, jax.Array],
    *,
    num_rows: int,
    next_key: jax.Array,
    kl_controller: losses.KLController | None,
    skip_nonfinite: bool,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """The end of an update step, after its optimizer updates: the KL controller, the
    non-finite skip (module docstring), the learning-rate and β metrics, the new `TrainState`.

    Args:
      state: the state the step started from.
      params, opt_state: after the step's optimizer updates.
      metrics: the step's reduced metrics (`reduce_stats`), with `nonfinite/…` flags when
        `skip_nonfinite`.
      num_rows: the rows of the whole batch (`n_steps` of the KL controller).
      next_key: the state's next PRNG key.
      kl_controller, skip_nonfinite: as for `update_step`.

    Returns:
      `(new_state, metrics)` with `optim/skipped`, `optim/learning_rate` and `kl/beta` added
      where they apply.

    Examples:
      >>> from jaxrl_llm.train.state import init_train_state
      >>> s = init_train_state({"w": jnp.zeros(1)}, {}, optax.sgd(1.0), key=jax.random.key(0))
      >>> flags = {"nonfinite/total": jnp.array(1.0), "nonfinite/grad_norm": jnp.array(0.0)}
      >>> new, m = finish_update(s, {"w": jnp.ones(1)}, s.opt_state, flags, num_rows=2,
      ...                        next_key=s.key, kl_controller=None, skip_nonfinite=True)
      >>> new.params["w"].tolist(), int(new.step), float(m["optim/skipped"])  # a skipped step
      ([0.0], 1, 1.0)
    """
    kl = state.kl
    if kl_controller is not None and "kl/seq_k1" in metrics:
        kl = kl_controller.update(kl, metrics["kl/seq_k1"], num_rows)
    if skip_nonfinite:
        ok = metrics["nonfinite/total"] + metrics["nonfinite/grad_norm"] == 0

        def keep_if_ok(new: Any, old: Any) -> Any:
            return jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)

        params = keep_if_ok(params, state.params)
        opt_state = keep_if_ok(opt_state, state.opt_state)
        kl = keep_if_ok(kl, state.kl)
        metrics["optim/skipped"] = 1.0 - ok.astype(jnp.float32)
    if has_learning_rate(opt_state):
        metrics["optim/learning_rate"] = jnp.asarray(learning_rate(opt_state), jnp.float32)
    if kl_controller is not None:
        metrics["kl/beta"] = jnp.asarray(state.kl.beta, jnp.float32)  # the β of this step
    new_state = state._replace(
        step=state.step + 1, params=params, opt_state=opt_state, key=next_key, kl=kl
    )
    return new_state, metrics


def jit_state_step(
    fn: Callable[..., Any], mesh: Mesh | None, state_shardings: Any, rest_shardings: tuple
) -> Callable[..., Any]:
    """`fn(state, *rest) -> (state, metrics)` under `jax.jit` with the state donated; with a
    mesh, the state in and out with `state_shardings`, the rest with `rest_shardings` (None
    entries: as placed) and the metrics replicated.

    Examples:
      >>> step = jit_state_step(lambda s, x: (s + x, {"x": x}), None, None, ())
      >>> step(jnp.ones(2), 1.0)[0].tolist()
      [2.0, 2.0]
    """
    if mesh is None:
        return jax.jit(fn, donate_argnums=0)
    return jax.jit(
        fn,
        in_shardings=(state_shardings, *rest_shardings),
        out_shardings=(state_shardings, NamedSharding(mesh, PartitionSpec())),
        donate_argnums=0,
    )


def make_update_step(
    objective: Objective,
    optimizer: optax.GradientTransformation,
    *,
    epochs: int = 1,
    minibatches: int = 1,
    accumulation_steps: int = 1,
    shuffle: bool = True,
    kl_controller: losses.KLController | None = None,
    mesh: Mesh | None = None,
    state_shardings: Any = None,
    skip_nonfinite: bool = False,
) -> Callable[[TrainState, Any], tuple[TrainState, dict[str, jax.Array]]]:
    """`update_step` compiled with `jax.jit`, the old state donated.

    With a `mesh`, the step is jitted with `in_shardings=(state_shardings, batch sharding)`,
    `out_shardings=(state_shardings, replicated metrics)` and runs under `jax.set_mesh(mesh)`;
    the batch is split along `N` over the `data` and `fsdp` axes (`ACTIVATION_AXIS_RULES`).

    Args:
      objective, optimizer, epochs, minibatches, accumulation_steps, shuffle, kl_controller,
      skip_nonfinite: as for `update_step` (static: closed over).
      mesh: optional device mesh.
      state_shardings: the `TrainState` shardings (`train_state_shardings(state, mesh,
        optimizer)`); required with a mesh.

    Returns:
      `step(state, batch) -> (state, metrics)`. The passed state is donated (invalid after the
      call).

    Examples:
      >>> import jax.numpy as jnp, optax
      >>> from jaxrl_llm.train.batch import SequenceBatch, count_normalizers
      >>> from jaxrl_llm.train.state import init_train_state
      >>> loss = lambda p, f, b, n, k: (jnp.sum(p["policy"]["w"] ** 2), {})
      >>> obj = Objective(loss, lambda b: count_normalizers(b.completion_mask), lambda b, n: None)
      >>> step = make_update_step(obj, optax.sgd(0.25))
      >>> s = init_train_state({"policy": {"w": jnp.ones(1)}}, {}, optax.sgd(0.25), key=jax.random.key(0))
      >>> b = SequenceBatch(jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3)), jnp.ones((2, 1)))
      >>> s, _ = step(s, b)
      >>> s.params["policy"]["w"].tolist()
      [0.5]
    """
    fn = functools.partial(
        update_step,
        objective=objective,
        optimizer=optimizer,
        epochs=epochs,
        minibatches=minibatches,
        accumulation_steps=accumulation_steps,
        shuffle=shuffle,
        kl_controller=kl_controller,
        skip_nonfinite=skip_nonfinite,
    )
    if mesh is None:
        return jax.jit(fn, donate_argnums=0)
    if state_shardings is None:
        raise ValueError(
            "make_update_step: a `mesh` needs `state_shardings` (train_state_shardings(state, "
            "mesh, optimizer))."
        )
    jitted = jit_state_step(fn, mesh, state_shardings, (batch_sharding(mesh),))

    def step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, jax.Array]]:
        with jax.set_mesh(mesh):
            return jitted(state, batch)

    return step
