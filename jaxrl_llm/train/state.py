"""`TrainState`: everything the update step changes, as one pytree (DESIGN.md §7).

    step      int32 []      update_step calls so far (rollout batches consumed)
    params    {"policy": State, "value": State}   trainable parameters (differentiated, updated)
    frozen    {"policy": State, "value": State}   frozen parameters (passed through unchanged)
    opt_state optax state over `params`
    key       PRNG key      minibatch shuffling (split every step)
    kl        KLControllerState   the KL coefficient β (fixed or adaptive controller)
    reward_moments  RunningMoments or None   BCO's running reward statistics (the shift δ
              of a `preference.loss: bco` run; set by `prepare_preference_batch`, passed
              through the update step); None otherwise

The update step is compiled with the whole state donated, so after a step only the returned
state is valid: read `state.frozen` from the latest state (it is the same buffers).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

import losses


class TrainState(NamedTuple):
    """The train state pytree (see the module docstring for the fields).

    Examples:
      >>> import jax.numpy as jnp, optax
      >>> tx = optax.sgd(0.1)
      >>> state = init_train_state({"policy": {"w": jnp.zeros(2)}}, {"policy": {}}, tx,
      ...                          key=jax.random.key(0))
      >>> int(state.step), float(state.kl.beta)
      (0, 0.0)
    """

    step: jax.Array
    params: dict[str, Any]
    frozen: dict[str, Any]
    opt_state: Any
    key: jax.Array
    kl: losses.KLControllerState
    reward_moments: losses.RunningMoments | None = None


def init_train_state(
    params: dict[str, Any],
    frozen: dict[str, Any],
    optimizer: optax.GradientTransformation,
    *,
    key: jax.Array,
    kl: losses.KLControllerState | None = None,
    reward_moments: losses.RunningMoments | None = None,
) -> TrainState:
    """A fresh `TrainState`: step 0, optimizer state initialised on `params`.

    Args:
      params: trainable parameters (from `split_models`).
      frozen: frozen parameters (from `split_models`).
      optimizer: the optax transformation (from `make_optimizer`).
      key: a `jax.random.key` for minibatch shuffling.
      kl: initial KL controller state (e.g. `kl_controller(config.kl).init()`); None: β = 0.
      reward_moments: BCO's running reward statistics (`losses.init_running_moments()` for
        a BCO run); None for every other objective.

    Returns:
      The `TrainState`. Under a mesh, place `params`/`frozen` first; the optimizer state is
      created by a jitted `init`, so its moments inherit the parameters' shardings. The state
      holds the very arrays of `params`/`frozen` (no copy): the first donated update step
      invalidates them, and with them the module they were split from.

    Examples:
      >>> import jax.numpy as jnp, optax
      >>> s = init_train_state({"policy": {"w": jnp.ones(3)}}, {}, optax.adam(1e-3),
      ...                      key=jax.random.key(1))
      >>> s.opt_state[0].mu["policy"]["w"].shape
      (3,)
    """
    if not isinstance(key, jax.Array) or not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        raise ValueError(
            f"init_train_state: `key` must be a typed PRNG key from jax.random.key, got {key!r}."
        )
    if kl is None:
        kl = losses.KLControllerState(beta=jnp.zeros((), jnp.float32))
    opt_state = jax.jit(optimizer.init)(params)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        frozen=frozen,
        opt_state=opt_state,
        key=key,
        kl=losses.KLControllerState(beta=jnp.asarray(kl.beta, jnp.float32)),
        reward_moments=reward_moments,
    )
