"""Model-side sharding: weights laid out for compute, and ops whose result layout is named.

The model code names logical axes only and never sees a mesh (STYLE.md §3.13). These helpers
turn those names into layouts on the context mesh of `jax.set_mesh`, through `sharding.shard`
and `sharding.constraints.out_sharding`, and do nothing without a mesh (the no-mesh program is
the plain one):

- `compute_weight(param, dtype)`: the parameter cast to the compute dtype, then laid out by its
  own logical names under the *activation* rules, where `embed` is whole: FSDP shards
  (`embed` over `fsdp`) are all-gathered for the matmul, tensor-parallel axes (heads, KV heads,
  MLP, vocabulary over `tensor`) stay split. The cast comes first, so a bf16 model gathers bf16.
  In the backward pass the gather's transpose reduce-scatters the gradient back to the stored
  layout.
- `dense`: a projection; one 2-D matmul without a mesh or on one device (`plain_layout`), a
  named `einsum` under a mesh of several devices.
- `einsum`, `take_rows`, `reshape`: the op with its result's logical names. Under Explicit axes
  the names become the op's `out_sharding` (needed where the result layout is ambiguous: a
  contraction over a `tensor`-split axis is all-reduced into it, an embedding gather from a
  vocabulary-split table is a masked local gather plus an all-reduce); under Auto axes the
  result is constrained with `shard` afterwards (a hint for the compiler's propagation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from sharding import shard
from sharding.constraints import out_sharding

Array = jax.Array
Names = Sequence[str | None]


def own_names(param: nnx.Variable, ndim: int) -> tuple[str | None, ...] | None:
    """The logical names of a parameter's own axes (the last `ndim` of its metadata).

    Stacked layers prepend a `layers` axis to the metadata; a slice taken by the layer scan
    keeps that metadata, so a parameter's own axes are the trailing `ndim` names.
    """
    names = param.get_metadata().get("out_sharding")
    if names is None:
        return None
    names = tuple(names)
    if len(names) < ndim:
        raise ValueError(
            f"parameter of rank {ndim} has only {len(names)} logical axis names {names}."
        )
    return names[len(names) - ndim :]


def plain_layout() -> bool:
    """True when the ops need no layouts: no context mesh, or a mesh of one device.

    The model then builds the plain program (2-D matmuls, heads-first attention); named
    layouts only matter when there is something to split. On one device the mesh forms are
    slower on XLA:CPU (token-major einsums with transposing copies): the runner, which always
    sets a mesh, would otherwise pay for them.
    """
    mesh = jax.sharding.get_abstract_mesh()
    return mesh.empty or mesh.size == 1


def unsharded(*xs: Array) -> tuple[Array, ...]:
    """`xs` with their sharding types dropped, for a `plain_layout()` op on a one-device mesh.

    Arrays typed on an Explicit mesh carry their logical layout even when every axis has one
    device, and JAX refuses a plain reshape or contraction whose result layout it cannot infer.
    On one device `reshard` to replicated is free; the op's result gets its names back through
    `shard`. Without a mesh (or with Auto axes) the arrays are returned as they are.
    """
    if jax.sharding.get_abstract_mesh().empty:
        return xs
    return tuple(
        jax.sharding.reshard(x, PartitionSpec())
        if any(p is not None for p in jax.typeof(x).sharding.spec)
        else x
        for x in xs
    )


def _check_traced_under_mesh(value: Array) -> None:
    """Explicit-sharded weights need the mesh context: raise a clear error if it is missing.

    Without `jax.set_mesh` the model builds its no-mesh program, whose ops (the embedding
    gather from a vocabulary-split table, contractions over split axes) cannot resolve the
    layout of Explicit-sharded weights and would fail inside JAX with a `ShardingTypeError`.
    Weights that are whole (or placed under Auto axes, which are not part of the type) pass.
    """
    if not jax.sharding.get_abstract_mesh().empty:
        return
    spec = jax.typeof(value).sharding.spec
    if any(entry is not None for entry in spec):
        raise ValueError(
            f"a model weight of shape {value.shape} is sharded {spec} on an Explicit mesh, but "
            "the model runs without a mesh context: call (and jit) it inside "
            "`with jax.set_mesh(mesh):` so that its activations get layouts."
        )


def compute_weight(param: nnx.Variable, dtype: Any = None) -> Array:
    """`param`'s value in `dtype` (default: its own), laid out for compute by its logical names.

    Raises:
      ValueError: the value is sharded on an Explicit mesh but no mesh context is set.

    Examples:
      >>> from jaxrl_llm.models.layers import make_param
      >>> w = make_param(jax.random.key(0), (4, 3), ("embed", "mlp"), jnp.float32, "ones")
      >>> compute_weight(w, jnp.bfloat16).dtype  # no mesh: just the cast
      dtype(bfloat16)
    """
    value = param[...]
    _check_traced_under_mesh(value)
    if dtype is not None:
        value = value.astype(dtype)
    names = own_names(param, value.ndim)
    return value if names is None else shard(value, names)


def compute_layout(state: Any) -> Any:
    """Every variable of an `nnx.State` laid out for compute (FSDP shards gathered), same dtypes.

    What `compute_weight` does at each use, done once for a whole state: the sampler calls it
    before its decode loop, so the weights are gathered once per rollout instead of once per
    decode step (XLA does not hoist the gathers out of the loop). Each device then holds the
    weights split over `tensor` only. Variables without logical names are left as they are;
    without a mesh the state is returned unchanged.

    Examples:
      >>> from jaxrl_llm.models.layers import RMSNorm
      >>> state = nnx.state(RMSNorm(4, eps=1e-6, plus_one=False, rngs=nnx.Rngs(0)))
      >>> compute_layout(state)["scale"].get_value().tolist()  # no mesh: unchanged
      [1.0, 1.0, 1.0, 1.0]
    """
    if jax.sharding.get_abstract_mesh().empty:
        return state

    def gather(var: Any) -> Any:
        if not isinstance(var, nnx.Variable):
            return var
        value = var.get_value()
        names = own_names(var, value.ndim)
        return var if names is None else var.replace(shard(value, names))

    return jax.tree.map(gather, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _einsum_shape(subscripts: str, operands: Sequence[Array]) -> tuple[int, ...]:
    inputs, output = subscripts.replace(" ", "").split("->")
    sizes: dict[str, int] = {}
    for letters, operand in zip(inputs.split(","), operands, strict=True):
        if "." in letters or len(letters) != operand.ndim:
            raise ValueError(
                f"einsum: subscripts {letters!r} must name each of the {operand.ndim} axes of "
                f"an operand of shape {operand.shape} (no ellipsis)."
            )
        sizes.update(zip(letters, operand.shape, strict=True))
    return tuple(sizes[c] for c in output)


def einsum(subscripts: str, *operands: Array, names: Names, **kwargs: Any) -> Array:
    """`jnp.einsum` whose result has the logical axes `names` (one per output letter).

    Examples:
      >>> x, w = jnp.ones((2, 3, 4)), jnp.ones((4, 5))
      >>> einsum("nsd,df->nsf", x, w, names=("batch", "length", "mlp")).shape
      (2, 3, 5)
    """
    shape = _einsum_shape(subscripts, operands)
    spec = out_sharding(names, shape=shape)
    if spec is not None:
        return jnp.einsum(subscripts, *operands, out_sharding=spec, **kwargs)
    return shard(jnp.einsum(subscripts, *operands, **kwargs), names)


def dense(x: Array, w: Array, *, contract: int, names: Names) -> Array:
    """`x[..., c₁..c_k] @ w[c₁..c_k, o...]` → `[..., o...]` with logical axes `names`.

    The last `contract` axes of `x` are contracted with the first `contract` axes of `w`.
    Without a mesh this is one 2-D matmul `[rows, Σc] @ [Σc, Σo]` (XLA:CPU runs 3-D and 4-D
    einsums with extra activation transposes: the 2-D form made the small benchmark model's
    update step 1.4× faster); under a mesh it is `einsum`, whose result layout is named.

    Examples:
      >>> dense(jnp.ones((2, 3, 4)), jnp.ones((4, 5, 6)), contract=1,
      ...       names=("batch", "length", "heads", "head_dim")).shape
      (2, 3, 5, 6)
      >>> dense(jnp.ones((2, 3, 5, 6)), jnp.ones((5, 6, 4)), contract=2,
      ...       names=("batch", "length", "embed")).shape
      (2, 3, 4)
    """
    lead = x.ndim - contract
    if x.shape[lead:] != w.shape[:contract]:
        raise ValueError(
            f"dense: the last {contract} axes of x {x.shape} must equal the first {contract} "
            f"axes of w {w.shape}."
        )
    if plain_layout():
        x, w = unsharded(x, w)
        rows, out = x.shape[:lead], w.shape[contract:]
        y = x.reshape(math.prod(rows), -1) @ w.reshape(math.prod(w.shape[:contract]), -1)
        return shard(y.reshape(*rows, *out), names)
    letters = "abcdefghijklmnopqrstuvwxyz"
    b, c = letters[:lead], letters[lead : lead + contract]
    o = letters[lead + contract : lead + w.ndim]
    return einsum(f"{b}{c},{c}{o}->{b}{o}", x, w, names=names)


def take_rows(table: Array, ids: Array, names: Names) -> Array:
    """`table[ids]` (rows of `table[V, ...]` for integer `ids`) with logical axes `names`.

    Out-of-range ids give NaN rows, as `jnp.take` does.

    Examples:
      >>> take_rows(jnp.eye(3), jnp.array([[2, 0]]), ("batch", "length", "embed")).tolist()
      [[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]]
    """
    spec = out_sharding(names, shape=ids.shape + table.shape[1:])
    if spec is not None:
        return table.at[ids].get(out_sharding=spec, mode="fill")
    return shard(jnp.take(table, ids, axis=0), names)


def reshape(x: Array, shape: Sequence[int], names: Names) -> Array:
    """`x.reshape(shape)` whose result has the logical axes `names`.

    Under Explicit axes, a split of a sharded axis whose major part the mesh axis does not
    divide (e.g. 4 query heads over `tensor=4` into 2 KV heads × 2) is not expressible; the
    names then decide (here the KV heads are replicated, so the heads are all-gathered).

    Examples:
      >>> reshape(jnp.ones((2, 3, 4)), (2, 3, 2, 2), ("batch", "length", "kv_heads", None)).shape
      (2, 3, 2, 2)
    """
    shape = tuple(shape)
    spec = out_sharding(names, shape=shape)
    if spec is not None:
        return jnp.reshape(x, shape, out_sharding=spec)
    return shard(jnp.reshape(x, shape), names)
