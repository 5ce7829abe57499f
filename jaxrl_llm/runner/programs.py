"""The compiled programs of a run, cached per process by their static configuration.

A run compiles a handful of programs, each once:

    rollout      sample_tokens (+ the in-graph exact_answer reward)   per sampling config
    logprob      old-policy / reference forward                      per policy graph
    value        critic forward (PPO)                                per model graphs
    preference   prepare_preference_batch (reference log-probs, KTO   per preference config
    preparation  reference point, BCO moments), one program           and policy graph
    advantages   build_rl_batch (advantages, returns, kept groups)   per algorithm and G
    update       the donated update step (RL, SFT, preference, RM)    per objective, optimizer
                 (jit over the mesh, or data-parallel: `parallel`)     and parallel form

Weights are always arguments, never constants, so new parameters never recompile. The caches
are keyed by hashable static values (model graph definitions, frozen configs, the mesh), so a
second run in the same process (a notebook, the test suite, `eval` after `train`) reuses the
programs of the first when its shapes and settings match.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from jaxrl_llm.rewards import exact_answer_reward
from jaxrl_llm.sampler import SamplingConfig, sample_tokens
from jaxrl_llm.sampler.core import repeat_rows
from jaxrl_llm.train import (
    AlgorithmConfig,
    ModelGraphs,
    OptimConfig,
    PreferenceConfig,
    RewardModelConfig,
    SFTConfig,
    build_rl_batch,
    completion_logprobs,
    kl_controller,
    make_logprob_fn,
    make_optimizer,
    make_update_step,
    make_value_fn,
    preference_objective,
    prepare_preference_batch,
    reward_model_objective,
    rl_objective,
    sft_objective,
    sync_reference,
    train_state_shardings,
)
from jaxrl_llm.train.parallel import make_data_parallel_update_step
from jaxrl_llm.train.row_groups import make_row_group_update_step

_CACHE_SIZE = 64
_SCALARS = (int, float, str, type(None))
_BY_ID = object()  # marks an id in a lookup key (never an element of a tuple of scalars)


def _identity(value: Any) -> Any:
    """A scalar or a tuple of scalars as itself (cheap to hash, often rebuilt by the caller),
    anything else as its id."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, tuple) and all(isinstance(v, _SCALARS) for v in value):
        return value
    return (_BY_ID, id(value))


def _program_cache(build: Callable[..., Any]) -> Callable[..., Any]:
    """`functools.lru_cache(build)` behind a lookup by the arguments' identity.

    The loop looks its programs up in every step, with the same graph definition and config
    objects each time. Hashing an `nnx.GraphDef` walks its whole node list (≈ 0.1 ms for the
    2-layer benchmark model on a 2-core CPU, per lookup); the identity lookup skips that
    (scalars and tuples of scalars are keyed by value, `_identity`). It holds the arguments
    it has seen (at most `_CACHE_SIZE` sets, the oldest dropped first), so their ids cannot be
    reused while they are keys; any other call goes through the value-keyed `lru_cache`, so
    equal arguments still share one program.

    Examples:
      >>> calls = []
      >>> double = _program_cache(lambda x: calls.append(x) or 2 * x)
      >>> config = ("a", 1)
      >>> double(config) == double(config) == double(("a", 1)), len(calls)  # equal: built once
      (True, 1)
    """
    by_value = functools.lru_cache(maxsize=_CACHE_SIZE)(build)
    by_identity: dict[tuple[Any, ...], tuple[Any, Any]] = {}
    lock = threading.Lock()

    @functools.wraps(build)
    def lookup(*args: Any, **kwargs: Any) -> Any:
        key = (*map(_identity, args), *((k, _identity(v)) for k, v in sorted(kwargs.items())))
        hit = by_identity.get(key)
        if hit is not None:
            return hit[1]
        program = by_value(*args, **kwargs)
        with lock:  # a miss may come from several threads (row groups)
            if len(by_identity) >= _CACHE_SIZE:
                by_identity.pop(next(iter(by_identity)), None)
            by_identity[key] = ((args, kwargs), program)  # the arguments kept alive: their ids
        return program

    return lookup


@_program_cache
def rollout_program(
    graphdef: Any, config: SamplingConfig, reward_stop_ids: tuple[int, ...] | None
) -> Callable[..., Any]:
    """`(params, frozen, prompt_tokens[B,P], prompt_mask[B,P], answer_tokens[B,A],
    answer_lengths[B], key) -> (Rollout, correct[N] or None)`, jitted.

    With `reward_stop_ids` the program also scores each row with the in-graph
    `exact_answer_reward` (cut at the first of those stop ids); None: no reward in-graph.

    Examples:
      >>> config = SamplingConfig(max_new_tokens=3, num_samples=2)
      >>> run = rollout_program(None, config, (258,))  # None stands for a Decoder's graphdef
      >>> run is rollout_program(None, config, (258,))  # compiled once per static setting
      True

      `tests/runner` runs it on a model: `run(params, frozen, prompts[B,P], mask[B,P],
      answers[B,A], answer_lengths[B], key)` gives a `Rollout` of `B·G` rows and `[B·G]`
      0/1 rewards.
    """

    def run(
        params: Any,
        frozen: Any,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        answer_tokens: jax.Array,
        answer_lengths: jax.Array,
        key: jax.Array,
    ) -> tuple[Any, jax.Array | None]:
        state = nnx.merge_state(params, frozen)
        rollout = sample_tokens(graphdef, state, prompt_tokens, prompt_mask, key, config=config)
        if reward_stop_ids is None:
            return rollout, None
        G = config.num_samples
        correct = exact_answer_reward(
            rollout.completion_tokens,
            rollout.completion_mask,
            repeat_rows(answer_tokens, G, 0, ("batch", None)),  # laid out as the rows
            repeat_rows(answer_lengths, G, 0, ("batch",)),
            stop_ids=reward_stop_ids,
        )
        return rollout, correct

    return jax.jit(run)


def prompt_group_size(config: Any, mesh: Any, *, update: bool) -> int:
    """Rows per shared prompt of the RL run's forwards: `G = sampling.num_samples` where each
    prompt can run once per layer (`train.shared_prompt_forward`,
    `Decoder.shared_prompt_hidden_states`), else 1.

    The rollout batch is prompt-major (row `b·G + g`), and the log-prob forwards and row groups
    take contiguous whole prompts, so `G` applies to them on one device. In the update,
    `parallel: jit` with one minibatch and one micro-batch, or with
    `algorithm.minibatch_unit: prompt` (micro-batches of whole prompts) any number of them;
    minibatches and micro-batches of rows take strided rows, which shared groups would
    change. Online DPO's update sees 2 rows per prompt, its pair, which every micro-batch
    keeps whole (`Objective.row_unit`), so it shares them with any number of micro-batches.

    Examples:
      >>> from types import SimpleNamespace as NS
      >>> config = NS(kind="rl", parallel="jit", train=NS(shared_prompt_forward=True),
      ...             sampling=NS(num_samples=8), optim=NS(accumulation_steps=1),
      ...             algorithm=NS(minibatches=2, minibatch_unit="row",
      ...                          policy_loss=NS(name="ppo_clip")))
      >>> prompt_group_size(config, NS(size=1), update=False)
      8
      >>> prompt_group_size(config, NS(size=1), update=True)  # strided minibatches
      1
    """
    if config.kind != "rl" or not config.train.shared_prompt_forward or mesh.size != 1:
        return 1
    if update and config.parallel != "jit":
        return 1
    if update and config.algorithm.policy_loss.name == "online_dpo":
        return 2  # the update sees each prompt's pair (`train.online_dpo_select`)
    parts = config.algorithm.minibatches * config.optim.accumulation_steps
    if update and parts > 1 and config.algorithm.minibatch_unit == "row":
        return 1
    return config.sampling.num_samples


@_program_cache
def logprob_program(
    graphdef: Any, temperature: float, chunk_size: int | None, group_size: int = 1
) -> Callable[..., Any]:
    """The cached `make_logprob_fn` of a policy graph (old-policy and reference forwards).

    Examples:
      >>> logprob_program(None, 1.0, None) is logprob_program(None, 1.0, None)
      True
    """
    return make_logprob_fn(
        graphdef, temperature=temperature, chunk_size=chunk_size, group_size=group_size
    )


def kept_rows_logprob_program(
    graphdef: Any, algorithm: AlgorithmConfig, forward_group: int
) -> Callable[..., Any]:
    """The log-prob program of the rows `build_rl_batch` kept (`train.keeps_row_subset`:
    online DPO's best and worst of each prompt, consecutive rows sharing the prompt, so the
    shared-prompt forward groups them by 2 where the run's forwards share prompts).

    Examples:
      >>> from jaxrl_llm.train import preset
      >>> kept_rows_logprob_program(None, preset("online_dpo"), 8) is logprob_program(
      ...     None, 1.0, None, 2)
      True
    """
    group = min(forward_group, 2)
    return logprob_program(graphdef, algorithm.temperature, algorithm.chunk_size, group)


@_program_cache
def value_program(graphs: ModelGraphs, group_size: int = 1) -> Callable[..., Any]:
    """The cached `make_value_fn` of the critic (the old values of PPO), with `group_size`
    rows per shared prompt (`prompt_group_size`).

    Examples:
      >>> value_program(ModelGraphs(policy=None))
      Traceback (most recent call last):
      ...
      ValueError: make_value_fn: `graphs.value` is None (no critic was split).
    """
    return make_value_fn(graphs, group_size=group_size)


@_program_cache
def reference_sync_program(alpha: float, optim: OptimConfig | None = None) -> Callable[..., Any]:
    """`state -> state` with the reference moved toward the policy (`sync_reference`) and,
    with `optim`, the optimizer's state restarted; jitted with the state donated, cached per
    settings.

    Examples:
      >>> reference_sync_program(0.6) is reference_sync_program(0.6)
      True
    """
    optimizer = None if optim is None else make_optimizer(optim)
    sync = functools.partial(sync_reference, alpha=alpha, optimizer=optimizer)
    return jax.jit(sync, donate_argnums=0)


@_program_cache
def preference_prepare_program(config: PreferenceConfig, graphdef: Any) -> Callable[..., Any]:
    """`(batch, policy_params, ref_params, frozen, reward_moments) -> (batch, moments)`:
    `prepare_preference_batch` (reference log-probs, KTO's reference point, BCO's running
    moments) as one `jax.jit` program. On a mesh of several devices its arithmetic on the
    batch's rows then runs inside one compiled program instead of as eager ops, each a small
    program of its own with its collectives.

    Examples:
      >>> fn = preference_prepare_program(PreferenceConfig(), None)
      >>> fn is preference_prepare_program(PreferenceConfig(), None)
      True
    """
    logprob_fn = logprob_program(graphdef, 1.0, config.chunk_size, config.prompt_group_size)

    @jax.jit
    def run(batch: Any, policy_params: Any, ref_params: Any, frozen: Any, moments: Any) -> Any:
        return prepare_preference_batch(
            config,
            batch,
            logprob_fn=logprob_fn,
            policy_params=policy_params,
            ref_params=ref_params,
            frozen=frozen,
            reward_moments=moments,
        )

    return run


def _pairs_objective(config: PreferenceConfig | RewardModelConfig, graphs: ModelGraphs) -> Any:
    if isinstance(config, RewardModelConfig):
        return reward_model_objective(config, graphs)
    return preference_objective(config, graphs)


@_program_cache
def preference_eval_program(
    config: PreferenceConfig | RewardModelConfig, graphs: ModelGraphs
) -> Callable[..., Any]:
    """`(params, frozen, batch) -> metrics` of `preference_objective` (or of
    `reward_model_objective`) on one whole prepared batch, under `jax.jit` (no gradient, no
    update): the held-out evaluation of a preference or reward-model run
    (`runner.preference.evaluate_preference`).

    Examples:
      >>> fn = preference_eval_program(PreferenceConfig(), ModelGraphs(policy=None))
      >>> fn is preference_eval_program(PreferenceConfig(), ModelGraphs(policy=None))
      True
    """
    objective = _pairs_objective(config, graphs)

    @jax.jit
    def run(params: Any, frozen: Any, batch: Any) -> dict[str, jax.Array]:
        _, metrics = objective.loss(params, frozen, batch, objective.normalizers(batch), 0.0)
        return metrics

    return run


@_program_cache
def nll_program(graphdef: Any, chunk_size: int | None = None) -> Callable[..., Any]:
    """`(params, frozen, batch) -> (Σ −log π(y_t), Σ m_t)` over a `SequenceBatch`'s completion
    tokens, under `jax.jit` (no gradient): the held-out NLL of an SFT run
    (`runner.evaluate.evaluate_sft`), summed so that batches combine exactly.

    Examples:
      >>> nll_program(None) is nll_program(None)
      True
    """

    @jax.jit
    def run(params: Any, frozen: Any, batch: Any) -> tuple[jax.Array, jax.Array]:
        policy = nnx.merge(graphdef, params, frozen)
        logp, _, _ = completion_logprobs(policy, batch, chunk_size=chunk_size)
        mask = batch.completion_mask > 0
        return jnp.sum(jnp.where(mask, -logp, 0.0)), jnp.sum(mask.astype(jnp.float32))

    return run


@_program_cache
def advantage_program(algorithm: AlgorithmConfig, group_size: int) -> Callable[..., Any]:
    """`build_rl_batch(algorithm, group_size=G, **arrays)` under `jax.jit`.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrl_llm.train import preset
      >>> batch, metrics = advantage_program(preset("dapo"), 2)(
      ...     tokens=jnp.ones((4, 5), jnp.int32), attention_mask=jnp.ones((4, 5)),
      ...     completion_mask=jnp.ones((4, 2)), rewards=jnp.array([1.0, 0.0, 1.0, 1.0]),
      ...     old_logp=None)
      >>> float(metrics["adv/kept_frac"])
      0.5
    """
    return jax.jit(functools.partial(build_rl_batch, algorithm, group_size=group_size))


_UPDATE_CACHE: dict[Any, Callable[..., Any]] = {}


def update_program(
    objective_config: AlgorithmConfig | SFTConfig | PreferenceConfig | RewardModelConfig,
    graphs: ModelGraphs,
    optim: OptimConfig,
    mesh: Mesh,
    state: Any,
    parallel: str = "jit",
    row_groups: int = 1,
    group_size: int = 1,
    samples_per_prompt: int = 1,
) -> Callable[..., Any]:
    """The compiled, donated update step of an RL algorithm, SFT, a preference loss or a reward
    model, with non-finite skipping.

    `parallel="jit"`: jitted over `mesh` with the shardings of `state`
    (`train_state_shardings`). `parallel="pmap"`: the data-parallel step
    (`jaxrl_llm.train.parallel.make_data_parallel_update_step`; the mesh must have
    fsdp = tensor = 1), the state replicated. Cached by `(objective_config, graphs, optim,
    mesh, parallel, row_groups, group_size, samples_per_prompt)` plus the state's structure,
    which fix the shardings.

    `row_groups > 1` (an RL algorithm with one optimizer update per batch, `parallel="jit"`
    on a mesh of one device): the gradient is computed in that many row groups from host
    threads (`jaxrl_llm.train.row_groups`; the same update up to float rounding).

    Args:
      objective_config: an `AlgorithmConfig` (RL), an `SFTConfig`, a `PreferenceConfig` or a
        `RewardModelConfig`.
      graphs: the model graphs.
      optim: the optimizer config (its `make_optimizer` built the state's optimizer state).
      mesh: the device mesh.
      state: a `TrainState` (concrete or abstract) of the run.
      parallel: "jit" or "pmap" (the run's `parallel:`).
      row_groups: row groups of the gradient (1: one program over the whole batch).
      group_size: rows per shared prompt of an RL objective (`prompt_group_size`).
      samples_per_prompt: `G` of an RL run (`rl_objective`: the unit of `minibatch_unit:
        prompt`).

    Returns:
      `step(state, batch) -> (state, metrics)`; metrics include `optim/skipped` and the
      `nonfinite/…` flags (`jaxrl_llm.train.update_step(skip_nonfinite=True)`).

    Examples:
      >>> from jaxrl_llm.models import Decoder, ModelConfig
      >>> from jaxrl_llm.train import init_train_state, split_models
      >>> from sharding import MeshConfig, make_mesh
      >>> cfg = ModelConfig(family="qwen3", vocab_size=259, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> graphs, params, frozen = split_models(Decoder(cfg, rngs=nnx.Rngs(0)))
      >>> optim = OptimConfig(learning_rate=1e-3)
      >>> state = init_train_state(params, frozen, make_optimizer(optim), key=jax.random.key(0))
      >>> mesh = make_mesh(MeshConfig(axis_types="auto"), devices=jax.devices()[:1])
      >>> step = update_program(SFTConfig(), graphs, optim, mesh, state)
      >>> step is update_program(SFTConfig(), graphs, optim, mesh, state)
      True
    """
    if parallel not in ("jit", "pmap"):
        raise ValueError(f"update_program: `parallel` must be 'jit' or 'pmap', got {parallel!r}.")
    key = (objective_config, graphs, optim, mesh, parallel, row_groups, group_size)
    key += (samples_per_prompt,)
    key += (jax.tree.structure(state),)
    if key in _UPDATE_CACHE:
        return _UPDATE_CACHE[key]
    optimizer = make_optimizer(optim)
    controller = None
    if isinstance(objective_config, SFTConfig):
        objective = sft_objective(objective_config, graphs)
    elif isinstance(objective_config, PreferenceConfig | RewardModelConfig):
        objective = _pairs_objective(objective_config, graphs)
    else:
        objective = rl_objective(
            objective_config, graphs, group_size=group_size, samples_per_prompt=samples_per_prompt
        )
        controller = kl_controller(objective_config.kl)
    schedule = {
        "epochs": objective_config.epochs,
        "minibatches": objective_config.minibatches,
        "accumulation_steps": optim.accumulation_steps,
        "shuffle": objective_config.shuffle,
        "kl_controller": controller,
        "skip_nonfinite": True,
    }
    if row_groups > 1:
        if not isinstance(objective_config, AlgorithmConfig) or parallel != "jit":
            raise ValueError(
                "update_program: row groups apply to an RL algorithm's update with "
                f"parallel='jit', got {type(objective_config).__name__} with {parallel!r}."
            )
        if schedule["epochs"] * schedule["minibatches"] * schedule["accumulation_steps"] > 1:
            raise ValueError(
                "update_program: row groups need one optimizer update per batch (epochs = "
                "minibatches = accumulation_steps = 1)."
            )
        step = make_row_group_update_step(
            objective,
            optimizer,
            groups=row_groups,
            kl_controller=controller,
            mesh=mesh,
            state_shardings=train_state_shardings(state, mesh, optimizer),
            skip_nonfinite=True,
        )
    elif parallel == "pmap":
        step = make_data_parallel_update_step(objective, optimizer, mesh=mesh, **schedule)
    else:
        shardings = train_state_shardings(state, mesh, optimizer)
        step = make_update_step(
            objective, optimizer, **schedule, mesh=mesh, state_shardings=shardings
        )
    if len(_UPDATE_CACHE) >= _CACHE_SIZE:
        _UPDATE_CACHE.pop(next(iter(_UPDATE_CACHE)))
    _UPDATE_CACHE[key] = step
    return step
