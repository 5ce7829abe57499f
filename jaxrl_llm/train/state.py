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
    reference State or None   the reference policy's trainable parameters when training moves
              them (`sync_reference`: TR-DPO, TRL's `sync_ref_model`, ProRL's reset), so that
              a checkpoint holds them; passed through the update step. None when the
              reference stays the initial policy (the runner then keeps it outside the state)

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
    reference: Any = None


def init_train_state(
    params: dict[str, Any],
    frozen: dict[str, Any],
    optimizer: optax.GradientTransformation,
    *,
    key: jax.Array,
    kl: losses.KLControllerState | None = None,
    reward_moments: losses.RunningMoments | None = None,
    reference: Any = None,
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
      reference: the reference policy's trainable parameters, when `sync_reference` moves
        them (`reference_params(params)` at the start); None otherwise.

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
        reference=reference,
    )


def sync_reference(
    state: TrainState, alpha: float, optimizer: optax.GradientTransformation | None = None
) -> TrainState:
    """Move the reference toward the policy: `ref ← α·θ + (1 − α)·ref` over the trainable
    policy parameters (`optax.incremental_update`); `α = 1` copies them exactly. With an
    `optimizer`, its state restarts too (`optimizer.init(params)`: moments, step count and so
    the learning-rate schedule), as ProRL's hard reset does.

    TR-DPO's soft update ("Learn Your Reference Model for Real Good Alignment",
    arXiv 2404.09656; TRL `sync_ref_model` with `ref_model_mixup_alpha`, for DPO and GRPO) and,
    with `α = 1`, ProRL's reference reset (arXiv 2505.24864). Each parameter keeps its dtype.

    Args:
      state: a state whose `reference` is set (`init_train_state(reference=...)`).
      alpha: the policy's weight `α` in (0, 1].
      optimizer: the run's optax transformation, to restart its state (None: keep it).

    Raises:
      ValueError: no `reference` in the state, or `alpha` outside (0, 1].

    Examples:
      >>> s = init_train_state({"policy": {"w": jnp.array([1.0, 3.0])}}, {}, optax.sgd(0.1),
      ...                      key=jax.random.key(0), reference={"w": jnp.zeros(2)})
      >>> sync_reference(s, 0.25).reference["w"].tolist()
      [0.25, 0.75]
    """
    if state.reference is None:
        raise ValueError(
            "sync_reference: the state holds no reference (init_train_state(reference=...))."
        )
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"sync_reference: `alpha` must be in (0, 1], got {alpha!r}.")
    policy = state.params["policy"]
    if alpha == 1.0:
        reference = jax.tree.map(lambda p, r: p.astype(r.dtype), policy, state.reference)
    else:
        mixed = optax.incremental_update(policy, state.reference, alpha)
        reference = jax.tree.map(lambda m, r: m.astype(r.dtype), mixed, state.reference)
    if optimizer is not None:
        state = state._replace(opt_state=optimizer.init(state.params))
    return state._replace(reference=reference)
