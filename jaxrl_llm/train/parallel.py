"""The data-parallel update step (`parallel: pmap`): replicated state, rows split over devices.

    step = make_data_parallel_update_step(objective, optimizer, mesh=mesh, ...)
    state, metrics = step(state, batch)        # state replicated, batch rows over `data`

The step is `update_step(..., axis_name="data")` inside `jax.shard_map` over the whole mesh,
compiled with `jax.jit` (the old state donated). Every device holds a full replica of the
parameters and the optimizer state and `n = N/D` rows of the batch; the gradients are averaged
with an explicit `lax.pmean`, the loss normalisers (token and sequence counts) and the metrics
are summed with `lax.psum`, and the KL controller sees the whole batch
(`jaxrl_llm.train.update`, "Data parallelism"), so the parameters equal those of the
single-device step up to the order of float additions. Statistics of the whole batch that the
loss reads (group / batch advantage scaling, KTO's reference point, BCO's running reward mean)
are computed before the step on the global batch and travel in it, so they need no collective.

Unlike `make_update_step(..., mesh=)` (GSPMD over `data` × `fsdp` × `tensor`), this path is
pure data parallelism: the mesh must have `fsdp = tensor = 1` (`check_data_parallel`). It is
the pmap programming model written with `jax.shard_map` (`jax.pmap` itself is in maintenance
mode and runs as `jit(shard_map)` since JAX 0.10): what each device computes and which
collectives run are spelled out instead of inferred by the partitioner.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

import losses
from jaxrl_llm.train.objectives import Objective
from jaxrl_llm.train.shardings import batch_sharding
from jaxrl_llm.train.state import TrainState
from jaxrl_llm.train.update import update_step

DATA_AXIS = "data"


def check_data_parallel(
    mesh: Mesh,
    rows: int | None = None,
    *,
    minibatches: int = 1,
    accumulation_steps: int = 1,
    unit: int = 1,
) -> int:
    """Check that `mesh` (and a batch of `rows` rows) suit the data-parallel step.

    The mesh must be pure data parallelism (`fsdp = tensor = 1`), and each of its `D` devices
    must get `rows / D` rows that split into `minibatches × accumulation_steps` equal
    micro-batches of whole units (so that every device's micro-batches are the single-device
    ones).

    Args:
      mesh: the device mesh (axes `data`, `fsdp`, `tensor`).
      rows: `N`, rows of an update batch (None: only the mesh is checked).
      minibatches: optimizer updates per epoch.
      accumulation_steps: micro-batches per optimizer update.
      unit: consecutive rows a micro-batch keeps whole (`Objective.unit`: an online DPO
        pair, a shared prompt's group).

    Returns:
      `D`, the number of devices the rows are split over.

    Raises:
      ValueError: `fsdp` or `tensor` is above 1, or the rows do not split as described.

    Examples:
      >>> from jax.sharding import AbstractMesh
      >>> check_data_parallel(AbstractMesh((4, 1, 1), ("data", "fsdp", "tensor")), 16,
      ...                     minibatches=2)
      4
      >>> check_data_parallel(AbstractMesh((2, 2, 1), ("data", "fsdp", "tensor")))
      Traceback (most recent call last):
      ...
      ValueError: data-parallel update: the mesh must have fsdp = tensor = 1 (replicated parameters), got data=2, fsdp=2, tensor=1; use the jit update (`make_update_step(..., mesh=)`, `parallel: jit`) for FSDP or tensor parallelism.
      >>> check_data_parallel(AbstractMesh((4, 1, 1), ("data", "fsdp", "tensor")), 8,
      ...                     minibatches=4)
      Traceback (most recent call last):
      ...
      ValueError: data-parallel update: `rows` = 8 gives 2 rows to each of the 4 devices, not divisible into minibatches × accumulation_steps = 4 × 1 = 4 micro-batches; use a multiple of 16 rows.
    """
    where = "data-parallel update"
    shape = dict(mesh.shape)
    missing = [a for a in (DATA_AXIS, "fsdp", "tensor") if a not in shape]
    if missing:
        raise ValueError(
            f"{where}: `mesh` must have the axes data, fsdp, tensor (`sharding.make_mesh`), got "
            f"{tuple(shape)}."
        )
    if shape["fsdp"] != 1 or shape["tensor"] != 1:
        sizes = ", ".join(f"{a}={shape[a]}" for a in (DATA_AXIS, "fsdp", "tensor"))
        raise ValueError(
            f"{where}: the mesh must have fsdp = tensor = 1 (replicated parameters), got "
            f"{sizes}; use the jit update (`make_update_step(..., mesh=)`, `parallel: jit`) "
            "for FSDP or tensor parallelism."
        )
    devices = shape[DATA_AXIS]
    if rows is None:
        return devices
    parts = minibatches * accumulation_steps
    if rows % devices or (rows // devices) % (parts * unit):
        per_device = (
            f"gives {rows // devices} rows to each of the {devices} devices"
            if rows % devices == 0
            else f"does not split over the {devices} devices"
        )
        units = "" if unit == 1 else f" of whole units of {unit} rows"
        raise ValueError(
            f"{where}: `rows` = {rows} {per_device}, not divisible into minibatches × "
            f"accumulation_steps = {minibatches} × {accumulation_steps} = {parts} "
            f"micro-batches{units}; use a multiple of {devices * parts * unit} rows."
        )
    return devices


def make_data_parallel_update_step(
    objective: Objective,
    optimizer: optax.GradientTransformation,
    *,
    mesh: Mesh,
    epochs: int = 1,
    minibatches: int = 1,
    accumulation_steps: int = 1,
    shuffle: bool = True,
    kl_controller: losses.KLController | None = None,
    skip_nonfinite: bool = False,
) -> Callable[[TrainState, Any], tuple[TrainState, dict[str, jax.Array]]]:
    """`update_step` as a data-parallel program: `jit(shard_map(...))` over `mesh` (module docstring).

    The state goes in and comes out replicated on every device (`PartitionSpec()`), the batch
    rows split over `data` (the sharding of `batch_sharding(mesh)`); metrics come out
    replicated. The step runs under `jax.set_mesh(mesh)`.

    Args:
      objective, optimizer, epochs, minibatches, accumulation_steps, shuffle, kl_controller,
      skip_nonfinite: as for `make_update_step`.
      mesh: a mesh with `fsdp = tensor = 1` (`check_data_parallel`).

    Returns:
      `step(state, batch) -> (state, metrics)`. The passed state is donated. The batch's rows
      must split into `D` equal blocks, each divisible by `minibatches × accumulation_steps`
      (a `ValueError` at trace time otherwise).

    Raises:
      ValueError: the mesh has `fsdp` or `tensor` above 1.

    Examples:
      >>> import jax.numpy as jnp, optax
      >>> from jaxrl_llm.train.batch import SequenceBatch, count_normalizers
      >>> from jaxrl_llm.train.state import init_train_state
      >>> from sharding import MeshConfig, make_mesh
      >>> def loss(p, f, b, n, k):  # token mean of (w - mask)², over the global token count
      ...     l = jnp.sum((p["policy"]["w"] - b.completion_mask) ** 2) / n.num_tokens
      ...     return l, {"loss/total": l}
      >>> obj = Objective(loss, lambda b: count_normalizers(b.completion_mask), lambda b, n: None)
      >>> mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
      >>> step = make_data_parallel_update_step(obj, optax.sgd(0.5), mesh=mesh)
      >>> s = init_train_state({"policy": {"w": jnp.zeros(1)}}, {}, optax.sgd(0.5),
      ...                      key=jax.random.key(0))
      >>> b = SequenceBatch(jnp.zeros((4, 3), jnp.int32), jnp.ones((4, 3)), jnp.ones((4, 1)))
      >>> s, m = step(s, b)
      >>> s.params["policy"]["w"].tolist(), round(float(m["loss/total"]), 3)
      ([1.0], 1.0)
    """
    check_data_parallel(mesh)
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
        axis_name=DATA_AXIS,
    )
    rows = batch_sharding(mesh)
    replicated = NamedSharding(mesh, PartitionSpec())
    # check_vma=False: the pmap model. Each replica differentiates its own loss (no implicit
    # psum in the transpose of replicated inputs); the step averages with an explicit pmean.
    per_device = jax.shard_map(
        fn,
        mesh=mesh,
        in_specs=(PartitionSpec(), rows.spec),
        out_specs=(PartitionSpec(), PartitionSpec()),
        check_vma=False,
    )

    explicit = AxisType.Explicit in mesh.axis_types

    def placed(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, jax.Array]]:
        if explicit:  # the types shard_map checks: size-1 axes may be dropped from the
            # arguments' specs, and a state placed by its logical axes names fsdp / tensor
            state = jax.sharding.reshard(state, PartitionSpec())
            batch = jax.tree.map(lambda x: jax.sharding.reshard(x, rows.spec), batch)
        return per_device(state, batch)

    jitted = jax.jit(
        placed,
        in_shardings=(replicated, rows),
        out_shardings=(replicated, replicated),
        donate_argnums=0,
    )

    def step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, jax.Array]]:
        with jax.set_mesh(mesh):
            return jitted(state, batch)

    return step
