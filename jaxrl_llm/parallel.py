"""Glue between the Flax NNX models and `sharding`: shardings of model states and KV caches.

Every `nnx.Param` of the models carries its logical axis names in its `out_sharding` metadata
(docs/models.md). `logical_axes` reads them into a pytree that mirrors the state, and
`param_shardings` maps them through the rule table, giving the `in_shardings` /
`out_shardings` of a jitted step over `(graphdef, state)`:

    graphdef, state = nnx.split(model)
    shardings = param_shardings(state, mesh)          # a State of NamedShardings
    state = jax.device_put(state, shardings)
    opt_shardings = sharding.optimizer_shardings(opt_state, state, shardings, mesh)

`cache_shardings` does the same for a `KVCache`, whose buffers have the logical axes
`KVCache.logical_axes()` (keys `layers, batch, kv_heads, cache_seq, head_dim`, values with the last
two swapped) under the activation rules: the rows over `("data", "fsdp")`, KV heads over `tensor`
when they divide it.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx
from jax.sharding import AbstractMesh, Mesh

from jaxrl_llm.models.cache import KVCache
from sharding import ACTIVATION_AXIS_RULES, LOGICAL_AXIS_RULES, logical_shardings, path_str
from sharding.rules import Rules


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def logical_axes(state: Any) -> Any:
    """The logical axis names of every variable of an `nnx.State`, as a mirroring pytree.

    Each `nnx.Variable` keeps its type and metadata and holds its `out_sharding` names instead
    of its value, so the result lines up leaf for leaf with the state (what
    `sharding.logical_shardings` expects). Variables other than parameters without names
    (e.g. RNG counters) get `None`: replicated.

    Args:
      state: an `nnx.State` (from `nnx.split` / `nnx.state`), concrete or abstract.

    Raises:
      ValueError: an `nnx.Param` has no `out_sharding` names (its path is named).

    Examples:
      >>> from jaxrl_llm.models import Decoder, ModelConfig
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> state = nnx.state(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
      >>> logical_axes(state)["layers"]["mlp"]["down"].get_value()
      ('layers', 'mlp', 'embed')
    """

    def names(path: Any, var: Any) -> Any:
        if not _is_variable(var):
            return None
        axes = var.get_metadata().get("out_sharding")
        if axes is None and isinstance(var, nnx.Param):
            raise ValueError(
                f"logical_axes: parameter '{path_str(path)}' has no logical axis names "
                "(`out_sharding` metadata); build it with `make_param` or pass `out_sharding`."
            )
        return var.replace(None if axes is None else tuple(axes))

    return jax.tree_util.tree_map_with_path(names, state, is_leaf=_is_variable)


def param_shardings(
    state: Any, mesh: Mesh | AbstractMesh, *, rules: Rules = LOGICAL_AXIS_RULES
) -> Any:
    """`NamedSharding`s of a model state, from its parameters' logical axis names.

    The result mirrors `state` (an `nnx.State` whose variables hold `NamedSharding`s), so it
    can be passed as `in_shardings` / `out_shardings` for the state, to `jax.device_put`, and
    to `sharding.optimizer_shardings` and `sharding.check_replication`. This is the placement
    `from_pretrained(..., mesh=mesh)` gives each parameter.

    Args:
      state: an `nnx.State`, concrete or abstract (`nnx.eval_shape`).
      mesh: the (abstract) mesh.
      rules: the parameter rule table.

    Examples:
      >>> from jax.sharding import AbstractMesh
      >>> from jaxrl_llm.models import Decoder, ModelConfig
      >>> cfg = ModelConfig(family="llama", vocab_size=16, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=2, num_kv_heads=2, head_dim=4)
      >>> state = nnx.state(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
      >>> shardings = param_shardings(state, AbstractMesh((1, 4, 2), ("data", "fsdp", "tensor")))
      >>> tuple(shardings["layers"]["attn"]["q"].get_value().spec)
      (None, 'fsdp', 'tensor', None)
    """
    return logical_shardings(state, logical_axes(state), mesh, rules=rules)


def cache_shardings(
    cache: KVCache, mesh: Mesh | AbstractMesh, *, rules: Rules = ACTIVATION_AXIS_RULES
) -> KVCache:
    """`NamedSharding`s of a `KVCache` (arrays or `jax.ShapeDtypeStruct`s).

    `k` `[L, N, K, T, Hd]` and `v` `[L, N, K, Hd, T]` use `KVCache.logical_axes()`; `positions` `[N, T]` use
    `("batch", "cache_seq")`; `lengths` is `[N]` (`"batch"`) or a shared scalar (replicated).
    The rows must split over the batch mesh axes; KV heads that `tensor` does not divide are
    replicated over it (every device of a tensor group then keeps all heads).

    Raises:
      ValueError: the number of rows does not split over the batch mesh axes.

    Examples:
      >>> from jax.sharding import AbstractMesh
      >>> from jaxrl_llm.models import ModelConfig
      >>> cfg = ModelConfig(family="llama", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4)
      >>> cache = jax.eval_shape(lambda: KVCache.init(cfg, batch=8, max_len=6))
      >>> out = cache_shardings(cache, AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor")))
      >>> tuple(out.k.spec), tuple(out.positions.spec)
      ((None, ('data', 'fsdp'), 'tensor', None, None), (('data', 'fsdp'), None))
    """
    return logical_shardings(cache, cache.logical_axes(), mesh, rules=rules, must_split=("batch",))
