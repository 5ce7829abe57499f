"""Trainable and frozen parameters: split the models once into static graphs and two pytrees.

The update step differentiates and updates only the *trainable* pytree; the *frozen* one is
passed through untouched (no gradient, no optimizer state). Which parameters train is chosen by
regexes (`re.search`) on dotted parameter paths, prefixed by the model's role:

    policy.embed   policy.layers.attn.q   policy.layers.mlp_norm.scale   value.head.kernel

`trainable=()` trains everything; otherwise a parameter trains iff it matches a `trainable`
pattern. `frozen` patterns then remove parameters from the trainable set. Training a subset (for
example the attention projections, or only the last norms) is the LoRA-style "train a small part,
share the rest" setup: the reference model then reuses the frozen pytree and needs its own copy
of the trainable subset only (`reference_params`).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import jax
from flax import nnx

POLICY, VALUE = "policy", "value"


def param_path(path: tuple[Any, ...]) -> str:
    """Dotted name of a pytree path (`jax.tree_util` keys or `nnx` path tuples).

    The attribute key of an `nnx.Variable` (its `.value`) is dropped.

    Examples:
      >>> from jax.tree_util import DictKey, GetAttrKey
      >>> param_path((DictKey("policy"), DictKey("layers"), DictKey("q"), GetAttrKey("value")))
      'policy.layers.q'
      >>> param_path(("layers", "attn", "q"))
      'layers.attn.q'
    """
    names = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            names.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            names.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            if key.name != "value":
                names.append(key.name)
        else:
            names.append(str(key))
    return ".".join(names)


class ModelGraphs(NamedTuple):
    """Static graph definitions of the models (from `nnx.split`; closed over, never traced).

    Attributes:
      policy: the policy `Decoder` (split into trainable and frozen states).
      value: the critic (`ValueModel`, or a `ValueHead` on the policy's hidden states), or None.

    Examples:
      >>> ModelGraphs(policy=None, value=None).value is None
      True
    """

    policy: Any
    value: Any = None


def _compile(patterns: tuple[str, ...], name: str) -> list[re.Pattern[str]]:
    out = []
    for pattern in patterns:
        try:
            out.append(re.compile(pattern))
        except re.error as err:
            raise ValueError(
                f"split_models: `{name}` entry {pattern!r} is not a regex ({err})."
            ) from None
    return out


def split_models(
    policy: nnx.Module,
    value: nnx.Module | None = None,
    *,
    trainable: tuple[str, ...] = (),
    frozen: tuple[str, ...] = (),
) -> tuple[ModelGraphs, dict[str, nnx.State], dict[str, nnx.State]]:
    """`nnx.split` the policy (and critic) once into graphs, trainable and frozen states.

    Args:
      policy: the policy `Decoder`.
      value: optional critic: a `ValueModel`, or a `ValueHead` applied to the policy's hidden
        states.
      trainable: regexes of trainable parameter paths (see the module docstring); () = all.
      frozen: regexes of parameter paths to freeze.

    Returns:
      `(graphs, params, frozen_params)` where `params` and `frozen_params` are dicts with the
      keys "policy" (and "value" when a critic is given) of `nnx.State`s. Merge a model back with
      `nnx.merge(graphs.policy, params["policy"], frozen_params["policy"])`.

    Raises:
      ValueError: a pattern matches no parameter, or nothing is left to train.

    Examples:
      >>> from jaxrl_llm.models import Decoder, ModelConfig
      >>> cfg = ModelConfig(family="qwen3", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> graphs, params, fixed = split_models(Decoder(cfg, rngs=nnx.Rngs(0)),
      ...                                      trainable=(r"policy\\.layers\\.attn\\.",))
      >>> sorted(params["policy"]["layers"]["attn"].keys())
      ['k', 'k_norm', 'o', 'q', 'q_norm', 'v']
      >>> "embed" in fixed["policy"], "embed" in params["policy"]
      (True, False)
    """
    train_re = _compile(trainable, "trainable")
    frozen_re = _compile(frozen, "frozen")
    used: set[str] = set()

    def is_trainable(role: str):
        def predicate(path: tuple[Any, ...], _: Any) -> bool:
            name = f"{role}.{param_path(path)}"
            hits = [p.pattern for p in train_re if p.search(name)]
            drops = [p.pattern for p in frozen_re if p.search(name)]
            used.update(hits, drops)
            return (not train_re or bool(hits)) and not drops

        return predicate

    graphs: dict[str, Any] = {}
    params: dict[str, nnx.State] = {}
    fixed: dict[str, nnx.State] = {}
    models = {POLICY: policy} if value is None else {POLICY: policy, VALUE: value}
    for role, model in models.items():
        graphs[role], params[role], fixed[role] = nnx.split(
            model, nnx.All(nnx.Param, is_trainable(role)), ...
        )
    unused = [p for p in (*trainable, *frozen) if p not in used]
    if unused:
        raise ValueError(
            f"split_models: patterns {unused} match no parameter path (paths look like "
            "'policy.layers.attn.q', 'value.head.kernel')."
        )
    if not jax.tree.leaves(params):
        raise ValueError(
            f"split_models: no trainable parameters left (trainable={trainable}, frozen={frozen})."
        )
    return ModelGraphs(**graphs), params, fixed


def reference_params(params: dict[str, nnx.State]) -> nnx.State:
    """A copy of the trainable policy parameters, for a reference model that shares the frozen ones.

    The reference policy is `nnx.merge(graphs.policy, reference_params(params), frozen["policy"])`:
    only the trainable subset is duplicated. (A reference loaded from a different checkpoint is
    simply its own full state.)

    Examples:
      >>> import jax.numpy as jnp
      >>> ref = reference_params({"policy": {"w": jnp.ones(2)}})
      >>> ref["w"].tolist()
      [1.0, 1.0]
    """
    return jax.tree.map(lambda x: x.copy(), params[POLICY])
