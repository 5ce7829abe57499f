"""`OptimConfig` → one `optax` gradient transformation: clipping, optimizer, schedule, decay mask.

The optimizer is built from optax pieces only (STYLE.md §3.11):

    MultiSteps(                                  if accumulation_steps > 1
      inject_hyperparams(                        exposes the scheduled learning rate in the state
        chain(clip_by_global_norm(max_grad_norm),              if max_grad_norm is set
              <optax alias>(learning_rate=schedule, ..., weight_decay, mask=decay_mask))))

A PPO critic (the `value` subtree of the trainable parameters) shares this step by default:
one global-norm clip over policy and critic, one learning rate (TRL's single-optimizer form).
With `critic_learning_rate` set it is stepped as by an optimizer of its own (verl's and
OpenRLHF's form) while the state keeps the layout above: each top-level subtree (`policy`,
`value`) is clipped to `max_grad_norm` by its own global norm, and the alias's updates of the
`value` subtree are scaled by `critic_learning_rate / learning_rate`. Every optax alias applies
its learning rate as the last factor of its update (Adam's `−lr·m̂/(√v̂ + ε)`, decoupled weight
decay `−lr·λ·θ` included), and its moments are per parameter, so the critic's update is
exactly that of the same optimizer with peak rate `critic_learning_rate` on the same schedule
(warmup and decay shape shared). The optimizer state has the same structure either way, so a
checkpoint resumes with or without the setting.

`name` is any optax alias in `OPTIMIZERS` (`adamw`, `lion`, `adafactor`, `sgd`, ...). Weight
decay is the optimizer's own decoupled decay (AdamW-style), applied only where
`weight_decay_mask` is True: parameters whose dotted path matches none of
`weight_decay_exclude` (norm scales and biases by default). Optimizers without a decoupled decay
(`adam`, `sgd`, ...) reject `weight_decay > 0` instead of silently turning it into an L2 term.

Schedules (step = optimizer updates applied so far; warmup rises linearly from 0):

    constant:  lr·min(1, step/warmup)
    linear:    warmup, then linear from lr to lr·final_lr_ratio at `total_steps`
    cosine:    warmup, then lr·(r + (1 − r)·½(1 + cos(π·(step − warmup)/(total_steps − warmup))))
               with r = final_lr_ratio (optax `warmup_cosine_decay_schedule`)
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax

from jaxrl_llm.train.params import VALUE, param_path

OptimizerName = Literal[
    "adamw",
    "adam",
    "lion",
    "sgd",
    "adafactor",
    "lamb",
    "rmsprop",
    "adabelief",
    "adagrad",
    "adamax",
    "adamaxw",
    "amsgrad",
    "nadamw",
    "radam",
    "yogi",
    "adan",
]
OPTIMIZERS: tuple[str, ...] = OptimizerName.__args__  # type: ignore[attr-defined]
ScheduleName = Literal["constant", "linear", "cosine"]

# optional hyperparameters passed to the optax alias only when set (None = optax's default)
_ALIAS_FIELDS = ("b1", "b2", "eps", "momentum", "nesterov")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """The `optim:` section of a train config: optimizer, schedule, clipping, decay, accumulation.

    Attributes:
      name: optax alias (see `OPTIMIZERS`).
      learning_rate: peak learning rate.
      schedule: "constant", "linear" or "cosine" (see the module docstring).
      warmup_steps: optimizer updates of linear warmup from 0.
      total_steps: optimizer updates until the end of the decay (required by linear/cosine).
      final_lr_ratio: learning rate at `total_steps` as a fraction of `learning_rate`.
      max_grad_norm: clip the global gradient norm to this (None: no clipping).
      weight_decay: decoupled weight decay (only optimizers that have one).
      weight_decay_exclude: regexes (`re.search`) on dotted parameter paths such as
        `policy.layers.attn.q_bias`; matching parameters get no decay.
      accumulation_steps: micro-batches per optimizer update (`optax.MultiSteps`, gradient mean).
      critic_learning_rate: the PPO critic's peak learning rate (None: the critic shares the
        policy's step and clip). Set, the `value` subtree is clipped by its own norm and stepped
        at this rate on the same schedule (see the module docstring); needs a critic.
      b1, b2, eps, momentum, nesterov: passed to the alias when set (None: optax's default);
        an option the chosen alias does not take is an error.

    Examples:
      >>> OptimConfig(name="adamw", learning_rate=1e-5, schedule="cosine", warmup_steps=10,
      ...             total_steps=100).schedule
      'cosine'
      >>> OptimConfig(name="adam", weight_decay=0.1)
      Traceback (most recent call last):
      ...
      ValueError: OptimConfig: `weight_decay` needs an optimizer with decoupled weight decay (adamw, lion, adafactor, lamb, adamaxw, nadamw, adan), got name='adam'.
    """

    name: OptimizerName = "adamw"
    learning_rate: float = 1e-6
    schedule: ScheduleName = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    final_lr_ratio: float = 0.0
    max_grad_norm: float | None = 1.0
    weight_decay: float = 0.0
    weight_decay_exclude: tuple[str, ...] = ("norm", "bias")
    accumulation_steps: int = 1
    critic_learning_rate: float | None = None
    b1: float | None = None
    b2: float | None = None
    eps: float | None = None
    momentum: float | None = None
    nesterov: bool | None = None

    def __post_init__(self) -> None:
        _validate(self)


def _decay_style(name: str) -> str | None:
    """How the alias takes decoupled weight decay: "weight_decay", "weight_decay_rate" or None."""
    params = inspect.signature(getattr(optax, name)).parameters
    if "weight_decay" in params and "mask" in params:
        return "weight_decay"
    if "weight_decay_rate" in params and "weight_decay_mask" in params:
        return "weight_decay_rate"
    return None


def _validate(cfg: OptimConfig) -> None:
    where = "OptimConfig"
    if cfg.name not in OPTIMIZERS:
        raise ValueError(
            f"{where}: `name` must be one of {', '.join(OPTIMIZERS)}, got {cfg.name!r}."
        )
    if cfg.schedule not in ("constant", "linear", "cosine"):
        raise ValueError(
            f"{where}: `schedule` must be 'constant', 'linear' or 'cosine', got {cfg.schedule!r}."
        )
    if not cfg.learning_rate > 0:
        raise ValueError(f"{where}: `learning_rate` must be > 0, got {cfg.learning_rate!r}.")
    if cfg.critic_learning_rate is not None and not cfg.critic_learning_rate > 0:
        raise ValueError(
            f"{where}: `critic_learning_rate` must be > 0 or null, got "
            f"{cfg.critic_learning_rate!r}."
        )
    for key in ("warmup_steps",):
        if getattr(cfg, key) < 0:
            raise ValueError(f"{where}: `{key}` must be >= 0, got {getattr(cfg, key)!r}.")
    if cfg.accumulation_steps < 1:
        raise ValueError(
            f"{where}: `accumulation_steps` must be >= 1, got {cfg.accumulation_steps!r}."
        )
    if not 0.0 <= cfg.final_lr_ratio <= 1.0:
        raise ValueError(
            f"{where}: `final_lr_ratio` must lie in [0, 1], got {cfg.final_lr_ratio!r}."
        )
    if cfg.schedule == "constant":
        if cfg.total_steps is not None or cfg.final_lr_ratio != 0.0:
            raise ValueError(
                f"{where}: `total_steps` and `final_lr_ratio` are for the 'linear' and 'cosine' "
                f"schedules, got schedule='constant' with total_steps={cfg.total_steps!r}, "
                f"final_lr_ratio={cfg.final_lr_ratio!r}."
            )
    elif cfg.total_steps is None or cfg.total_steps <= cfg.warmup_steps:
        raise ValueError(
            f"{where}: schedule={cfg.schedule!r} needs `total_steps` > warmup_steps "
            f"({cfg.warmup_steps}), got {cfg.total_steps!r}."
        )
    if cfg.max_grad_norm is not None and not cfg.max_grad_norm > 0:
        raise ValueError(
            f"{where}: `max_grad_norm` must be > 0 or null, got {cfg.max_grad_norm!r}."
        )
    if cfg.weight_decay < 0:
        raise ValueError(f"{where}: `weight_decay` must be >= 0, got {cfg.weight_decay!r}.")
    if cfg.weight_decay > 0 and _decay_style(cfg.name) is None:
        with_decay = ", ".join(n for n in OPTIMIZERS if _decay_style(n) is not None)
        raise ValueError(
            f"{where}: `weight_decay` needs an optimizer with decoupled weight decay "
            f"({with_decay}), got name={cfg.name!r}."
        )
    for pattern in cfg.weight_decay_exclude:
        try:
            re.compile(pattern)
        except re.error as err:
            raise ValueError(
                f"{where}: `weight_decay_exclude` entry {pattern!r} is not a valid regex ({err})."
            ) from None
    for key in ("b1", "b2", "momentum"):  # decay rates of running averages
        value = getattr(cfg, key)
        if value is not None and not 0.0 <= value < 1.0:
            raise ValueError(f"{where}: `{key}` must lie in [0, 1), got {value!r}.")
    if cfg.eps is not None and not cfg.eps >= 0:
        raise ValueError(f"{where}: `eps` must be >= 0, got {cfg.eps!r}.")
    accepted = inspect.signature(getattr(optax, cfg.name)).parameters
    for key in _ALIAS_FIELDS:
        if getattr(cfg, key) is not None and key not in accepted:
            raise ValueError(
                f"{where}: optax.{cfg.name} takes no `{key}` (it takes "
                f"{', '.join(p for p in accepted if p != 'learning_rate')}), got {key}="
                f"{getattr(cfg, key)!r}."
            )


def make_schedule(config: OptimConfig) -> optax.Schedule:
    """The learning-rate schedule of `config` as an optax schedule `step -> lr`.

    Args:
      config: the optimizer config.

    Returns:
      A function of the optimizer-update count (see the module docstring for the formulas).

    Examples:
      >>> sched = make_schedule(OptimConfig(learning_rate=1.0, schedule="linear",
      ...                                   warmup_steps=2, total_steps=6))
      >>> [round(float(sched(s)), 3) for s in range(7)]
      [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]
    """
    lr, warmup = config.learning_rate, config.warmup_steps
    end = lr * config.final_lr_ratio
    if config.schedule == "constant":
        if warmup == 0:
            return optax.constant_schedule(lr)
        return optax.warmup_constant_schedule(0.0, lr, warmup)
    total = config.total_steps
    assert total is not None  # validated in OptimConfig
    if config.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, total, end_value=end)
    decay = optax.linear_schedule(lr, end, total - warmup)
    if warmup == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])


def weight_decay_mask(params: Any, exclude: tuple[str, ...] = ("norm", "bias")) -> Any:
    """Which parameters get weight decay: True unless the dotted path matches an `exclude` regex.

    Paths are the keys from the root of `params` joined by dots (`policy.layers.mlp_norm.scale`,
    `policy.layers.attn.q_bias`), so the default excludes every RMSNorm scale (including the
    QK-norms) and every bias, and decays matrices and embeddings (the common AdamW practice).

    Args:
      params: a pytree of parameters (nested dicts / `nnx.State`).
      exclude: regexes searched in each path.

    Returns:
      A pytree of bools with the structure of `params`.

    Examples:
      >>> import jax.numpy as jnp
      >>> mask = weight_decay_mask({"attn": {"q": jnp.ones((2, 2)), "q_bias": jnp.ones(2)},
      ...                           "final_norm": {"scale": jnp.ones(2)}})
      >>> mask["attn"], mask["final_norm"]["scale"]
      ({'q': True, 'q_bias': False}, False)
    """
    patterns = [re.compile(p) for p in exclude]

    def decay(path: Any, _: Any) -> bool:
        name = param_path(path)
        return not any(p.search(name) for p in patterns)

    return jax.tree_util.tree_map_with_path(decay, params)


def _alias(config: OptimConfig, learning_rate: Any) -> optax.GradientTransformation:
    kwargs: dict[str, Any] = {
        key: getattr(config, key) for key in _ALIAS_FIELDS if getattr(config, key) is not None
    }
    style = _decay_style(config.name)
    mask: Callable[[Any], Any] = lambda p: weight_decay_mask(p, config.weight_decay_exclude)  # noqa: E731
    if style == "weight_decay":
        kwargs.update(weight_decay=config.weight_decay, mask=mask)
    elif style == "weight_decay_rate":
        kwargs.update(weight_decay_rate=config.weight_decay or None, weight_decay_mask=mask)
    return getattr(optax, config.name)(learning_rate=learning_rate, **kwargs)


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
    """The optax transformation of `config` (see the module docstring for its layout).

    With `accumulation_steps = k > 1` the result is an `optax.MultiSteps` whose `update` returns
    zero updates for k − 1 calls and applies the inner optimizer to the *mean* of the k
    gradients on the k-th (so each micro-batch's loss must be scaled by k to reproduce the sum
    of the parts; `jaxrl_llm.train.update` does this).

    Args:
      config: the optimizer config.

    Returns:
      An `optax.GradientTransformation`; `learning_rate(opt_state)` reads the scheduled rate.

    Examples:
      >>> import jax.numpy as jnp
      >>> tx = make_optimizer(OptimConfig(name="sgd", learning_rate=0.1, max_grad_norm=None))
      >>> params = {"w": jnp.array([1.0, 2.0])}
      >>> updates, state = tx.update({"w": jnp.array([1.0, -1.0])}, tx.init(params), params)
      >>> updates["w"].tolist(), float(learning_rate(state))
      ([-0.1, 0.1], 0.1)
    """

    separate = config.critic_learning_rate is not None

    def chain(learning_rate: Any) -> optax.GradientTransformation:
        parts = []
        if config.max_grad_norm is not None:
            clip = clip_each_subtree if separate else optax.clip_by_global_norm
            parts.append(clip(config.max_grad_norm))
        alias = _alias(config, learning_rate)
        if separate:
            assert config.critic_learning_rate is not None
            ratio = config.critic_learning_rate / config.learning_rate
            alias = _scale_critic(alias, ratio)
        parts.append(alias)
        return optax.chain(*parts)

    tx = optax.inject_hyperparams(chain)(learning_rate=make_schedule(config))
    if config.accumulation_steps > 1:
        return optax.MultiSteps(
            tx, every_k_schedule=config.accumulation_steps
        ).gradient_transformation()
    return tx


def clip_each_subtree(max_norm: float) -> optax.GradientTransformation:
    """`optax.clip_by_global_norm` applied to each top-level entry of the updates on its own.

    Each subtree `g_k` (the `policy` and the `value` parameters of a `TrainState`) becomes
    `g_k · min(1, max_norm / ‖g_k‖)`, so a large critic gradient no longer shrinks the policy's
    step. Its state is optax's `EmptyState`, as `clip_by_global_norm`'s, so the two are
    interchangeable in a chain without changing the optimizer state's structure.

    Args:
      max_norm: the largest global norm of each subtree (> 0).

    Returns:
      An `optax.GradientTransformation` over a mapping of subtrees.

    Examples:
      >>> import jax.numpy as jnp
      >>> tx = clip_each_subtree(1.0)
      >>> g = {"policy": jnp.array([0.3, 0.4]), "value": jnp.array([3.0, 4.0])}
      >>> out, _ = tx.update(g, tx.init(g))
      >>> out["policy"].tolist(), [round(x, 6) for x in out["value"].tolist()]
      ([0.30000001192092896, 0.4000000059604645], [0.6, 0.8])
    """
    if not max_norm > 0:
        raise ValueError(f"clip_each_subtree: `max_norm` must be > 0, got {max_norm!r}.")
    clip = optax.clip_by_global_norm(max_norm)

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del params
        if not isinstance(updates, dict):
            raise ValueError(
                "clip_each_subtree: the updates must be a dict of subtrees (e.g. "
                f"{{'policy': ..., 'value': ...}}), got {type(updates).__name__}."
            )
        return {key: clip.update(sub, clip.init(sub))[0] for key, sub in updates.items()}, state

    return optax.GradientTransformation(optax.init_empty_state, update)


def _scale_critic(
    inner: optax.GradientTransformation, ratio: float
) -> optax.GradientTransformation:
    """`inner` with the updates of the `value` subtree multiplied by `ratio` (same state)."""

    def check(tree: Any) -> None:
        if not isinstance(tree, dict) or not jax.tree.leaves(tree.get(VALUE, {})):
            raise ValueError(
                "OptimConfig.critic_learning_rate: the trainable parameters hold no critic (a "
                f"non-empty '{VALUE}' subtree, as a PPO TrainState has); unset it for a run "
                "without a critic."
            )

    def init(params: Any) -> Any:
        if isinstance(params, dict):  # not optax.tree.map_params's placeholder
            check(params)
        return inner.init(params)

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        check(updates)
        updates, state = inner.update(updates, state, params)
        scaled = jax.tree.map(lambda u: u * jnp.asarray(ratio, u.dtype), updates[VALUE])
        return {**updates, VALUE: scaled}, state

    return optax.GradientTransformation(init, update)


def learning_rate(opt_state: Any) -> jax.Array:
    """The learning rate of the last update of a `make_optimizer` state (float32 scalar).

    Examples:
      >>> import jax.numpy as jnp
      >>> tx = make_optimizer(OptimConfig(learning_rate=3e-4, accumulation_steps=2))
      >>> float(learning_rate(tx.init({"w": jnp.zeros(2)})))
      0.0003000000142492354
    """
    if not has_learning_rate(opt_state):
        raise ValueError(
            "learning_rate: the optimizer state has no injected learning rate (build the "
            f"optimizer with make_optimizer), got {type(opt_state).__name__}."
        )
    return _injected(opt_state).hyperparams["learning_rate"]


def has_learning_rate(opt_state: Any) -> bool:
    """Whether `learning_rate(opt_state)` can read a learning rate (a `make_optimizer` state).

    Examples:
      >>> import jax.numpy as jnp
      >>> has_learning_rate(optax.sgd(0.1).init({"w": jnp.zeros(2)}))
      False
    """
    state = _injected(opt_state)
    return (
        isinstance(state, optax.InjectHyperparamsState | optax.InjectStatefulHyperparamsState)
        and "learning_rate" in state.hyperparams
    )


def _injected(opt_state: Any) -> Any:
    """The `inject_hyperparams` state inside a `make_optimizer` state (unwraps MultiSteps)."""
    if isinstance(opt_state, optax.MultiStepsState):
        return opt_state.inner_opt_state
    return opt_state
