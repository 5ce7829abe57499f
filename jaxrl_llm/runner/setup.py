"""Everything a run does before its first step: `prepare_run(config, resume=...)`.

    cache         JAX's persistent compilation cache (`train.compilation_cache`)
    mesh          make_mesh(config.mesh) after checking the batches split over it
    tokenizer     byte or a local directory; every id must have an embedding
    data          both splits tokenized once, P / A / T fixed (`runner.task`)
    models        policy (+ critic), split into trainable / frozen, placed on the mesh
    warm start    SFT before RL, cached in the run directory (`runner.warm_start`)
    reference     a copy of the (warm-started) trainable policy parameters (KL algorithms)
    train state   init_train_state(...), placed with train_state_shardings
    update step   compiled lazily on the first call (`runner.programs`)
    resume        the newest complete checkpoint: state, data position, counters

All user errors (a bad path, a tokenizer / model mismatch, an existing run without
`--resume`, nothing to resume) surface here as `ConfigError`, before any training step.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import time
from typing import Any, NamedTuple

import jax

import losses
from jaxrl_llm.checkpoint import Checkpointer
from jaxrl_llm.config import ConfigError
from jaxrl_llm.data import IteratorState
from jaxrl_llm.metrics_log import METRICS_FILE, TENSORBOARD_DIR
from jaxrl_llm.models import LORA_PATTERN
from jaxrl_llm.rewards import check_reward_call
from jaxrl_llm.runner.compilation_cache import enable_compilation_cache
from jaxrl_llm.runner.config import OBJECTIVE_SECTIONS, RunConfig, check_devices, config_to_dict
from jaxrl_llm.runner.context import RunContext, iterated_examples
from jaxrl_llm.runner.health import SkipTracker
from jaxrl_llm.runner.models import (
    build_critic,
    build_policy,
    check_context,
    check_vocabulary,
    run_tokenizer,
)
from jaxrl_llm.runner.preference import (
    load_preference_eval_examples,
    load_preference_examples,
    precompute_reference,
)
from jaxrl_llm.runner.programs import prompt_group_size, update_program
from jaxrl_llm.runner.scoring import run_stop_ids
from jaxrl_llm.runner.task import load_task
from jaxrl_llm.runner.warm_start import warm_start_policy
from jaxrl_llm.sampler.config import with_stop_strings
from jaxrl_llm.sampler.row_groups import call_flops, resolve_row_groups
from jaxrl_llm.train import (
    TrainState,
    init_train_state,
    kl_controller,
    make_optimizer,
    reference_params,
    split_models,
    train_state_shardings,
)
from jaxrl_llm.train.shardings import param_shardings
from sharding import is_main_process, make_mesh, place_global, wait_for_all_processes

log = logging.getLogger(__name__)
CHECKPOINT_DIR = "checkpoints"


class PreparedRun(NamedTuple):
    """A run ready for its first (or next) step.

    Attributes:
      context: the static `RunContext`.
      state: the `TrainState` (restored when resuming).
      data: the train iterator position.
      start_step: steps already done (0 for a fresh run).
      checkpointer: the run's `Checkpointer` (`run_dir/checkpoints`).
      meta: the restored checkpoint's meta (`{}` for a fresh run).
      skips: consecutive / total skipped steps so far.
      info: setup facts for the summary (warm start, data left out).

    Examples:
      >>> PreparedRun(*([None] * 8))._fields[:3]
      ('context', 'state', 'data')
    """

    context: RunContext
    state: TrainState
    data: IteratorState
    start_step: int
    checkpointer: Checkpointer
    meta: dict[str, Any]
    skips: SkipTracker
    info: dict[str, Any]


def _check_run_dir(run_dir: pathlib.Path, resume: bool) -> bool:
    """A fresh run needs an unused run directory, a resumed one a complete checkpoint.

    Checked before anything is written in `run_dir` (only the directory itself is created).
    A resumed run whose directory holds a run that stopped before its first checkpoint was
    written (its metrics, no step directory, at most an unfinished save) starts again from
    step 0: it lost every step, as it would with any checkpoint, and neither starting fresh
    nor resuming would otherwise be possible.

    Returns:
      Whether a resumed run starts again from step 0.
    """
    _check_writable(run_dir)
    directory = run_dir / CHECKPOINT_DIR
    latest, unreadable = None, []
    if directory.is_dir() and any(directory.iterdir()):  # orbax only where there is something
        with Checkpointer(directory, save_every=1) as existing:
            latest = existing.latest_step()
            unreadable = existing.unreadable_steps()
    metrics = run_dir / METRICS_FILE  # an empty file: a run that failed before logging
    started = metrics.exists() and metrics.stat().st_size > 0
    if resume and latest is None:
        if unreadable:
            raise ConfigError(
                f"--resume: no complete checkpoint in {directory.absolute()}: step(s) "
                f"{unreadable} cannot be read (corrupt files); move them away to start over."
            )
        if not started:
            raise ConfigError(
                f"--resume: no complete checkpoint in {directory.absolute()} to resume from; "
                "start without --resume."
            )
        return True
    if not resume and (latest is not None or started):
        held = f"checkpoints up to step {latest}" if latest is not None else "metrics"
        raise ConfigError(
            f"run_dir: {run_dir} already holds a run ({held}); pass --resume to continue it, "
            "or choose another --run-dir."
        )
    return False


def _check_writable(run_dir: pathlib.Path) -> None:
    """Create `run_dir` (empty: an empty directory is an unused one) and check that this
    process writes there, before the model is built: a typo or a read-only mount is one line,
    not a traceback after it.

    Examples:
      >>> import tempfile
      >>> afile = pathlib.Path(tempfile.mkstemp()[1])
      >>> _check_writable(afile / "run")
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: run_dir: .../run cannot be created ([Errno 20] Not a directory: ...).
    """
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"run_dir: {run_dir} cannot be created ({err}).") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"run_dir: {run_dir} is not writable.")


def _check_processes(config: RunConfig) -> None:
    """Multi-process jobs (`jax.process_count() > 1`, started by `jaxrl-llm train` through
    `sharding.initialize_distributed`) run every step-by-step form over one global mesh; the
    compiled iteration is refused (docs/running.md).

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> _check_processes(RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig()))
    """
    if jax.process_count() == 1:
        return
    if config.kind == "rl" and config.train.compiled_iterations is not None:
        raise ConfigError(
            "train.compiled_iterations: the compiled RL iteration runs in one process; this "
            f"job has {jax.process_count()} (jax.process_count()). Set it to null for a "
            "multi-host run."
        )


def _sampling(config: RunConfig, tokenizer: Any) -> Any:
    """The training sampler: the tokenizer's EOS always stops a row, its pad id fills, and
    `sampling.stop_strings` are matched with the tokenizer's vocabulary (`with_stop_strings`)."""
    import dataclasses

    stops = run_stop_ids(config, tokenizer)
    sampling = dataclasses.replace(config.sampling, stop_tokens=stops, pad_id=tokenizer.pad_id)
    return with_stop_strings(sampling, tokenizer)


def update_row_groups(config: RunConfig, task: Any, policy_params: Any, mesh: Any) -> int:
    """Row groups of the RL update's gradient (`jaxrl_llm.train.row_groups`): the run's
    `sampling.row_groups` (None: automatic, as for the sampler and the log-prob forwards, from
    the FLOPs of one forward over the batch) where they apply — an RL run with one optimizer
    update per batch, `parallel: jit`, one device; 1 anywhere else. A step whose groups run packed
    (`train.pack_groups`) packs them in as many parts (`RunContext.update_row_groups`).

    Examples:
      >>> from types import SimpleNamespace
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> sft = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig())
      >>> update_row_groups(sft, None, None, SimpleNamespace(size=1))
      1
    """
    alg = config.algorithm
    if (
        config.kind != "rl"
        or config.parallel != "jit"
        or mesh.size != 1
        or alg.epochs * alg.minibatches * config.optim.accumulation_steps > 1
    ):
        return 1
    B = config.train.prompts_per_step
    rows = B * config.sampling.num_samples
    seq = task.prompt_length + task.completion_length
    return resolve_row_groups(
        config.sampling.row_groups, B, devices=mesh.size, flops=call_flops(policy_params, rows, seq)
    )


def trainable_patterns(config: RunConfig, has_critic: bool) -> tuple[str, ...]:
    r"""The regexes of the trainable parameter paths (`split_models`): `model.trainable` when
    set; else, with adapters, each adapted model's adapters (with a reward model's scalar head
    and a critic's value head) and the whole of a model without them; else () (everything).

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.models import LoRAConfig
      >>> from jaxrl_llm.train import SFTConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m", lora=LoRAConfig(rank=2)),
      ...                 sft=SFTConfig())
      >>> print(*trainable_patterns(cfg, has_critic=True))
      ^policy\..*_lora_[abm]$ ^value\.
    """
    if config.model.trainable:
        return config.model.trainable
    policy_lora = config.model.lora is not None or config.model.lora_adapter is not None
    critic_lora = has_critic and config.model.critic_lora is not None
    if not (policy_lora or critic_lora):
        return ()
    if policy_lora:
        policy = (r"^policy\..*" + LORA_PATTERN,)
        policy += (r"^policy\.head\.",) if config.kind == "reward_model" else ()
    else:
        policy = (r"^policy\.",)
    if not has_critic:
        return policy
    critic = (r"^value\..*" + LORA_PATTERN, r"^value\.head\.") if critic_lora else (r"^value\.",)
    return policy + critic


def _split(config: RunConfig, policy: Any, critic: Any) -> tuple[Any, Any, Any]:
    trainable = trainable_patterns(config, critic is not None)
    try:
        return split_models(policy, critic, trainable=trainable, frozen=config.model.frozen)
    except ValueError as err:
        raise ConfigError(f"model.trainable / model.frozen: {err}") from None


def _config_changes(saved: Any, current: Any, prefix: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current)):
            out += _config_changes(saved.get(key), current.get(key), f"{prefix}{key}.")
        return out
    return [] if saved == current else [prefix.rstrip(".")]


def prepare_run(config: RunConfig, *, resume: bool = False) -> PreparedRun:
    """Set up a run (module docstring) without training a step.

    Args:
      config: the validated run config (`run_dir` set).
      resume: continue from the newest complete checkpoint in `run_dir/checkpoints`.

    Returns:
      A `PreparedRun`.

    Raises:
      ConfigError: a user error (named), e.g. a run directory that already holds a run without
        `resume`, or `resume` with nothing to resume.

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> prepare_run(RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig()))
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: run_dir: not set; pass --run-dir or set run_dir in the config.
    """
    if config.run_dir is None:
        raise ConfigError("run_dir: not set; pass --run-dir or set run_dir in the config.")
    _check_processes(config)
    check_devices(config, jax.device_count())
    enable_compilation_cache(config.train.compilation_cache)
    mesh = make_mesh(config.mesh)
    section = config.preference or config.reward_model
    if getattr(section, "packing", False) and mesh.size > 1:
        log.warning(
            "packing: the pairs are packed only on one device; on this mesh of %d devices "
            "the forwards run the padded rows (the same results, without its speed-up)",
            mesh.size,
        )
    if config.train.pack_groups and mesh.size > 1:
        log.warning(
            "train.pack_groups: the groups are packed only on one device; on this mesh of %d "
            "devices the forwards and the update run the padded rows (the same results, "
            "without its speed-up)",
            mesh.size,
        )
    run_dir = pathlib.Path(config.run_dir)
    restart = _check_run_dir(run_dir, resume)
    wait_for_all_processes("jaxrl_llm: run directory checked")  # before any process writes
    with jax.set_mesh(mesh):  # placing and initialising sharded arrays needs the mesh
        context, state, info = build_context(config, mesh, run_dir, resume=resume and not restart)
    checkpointer = Checkpointer.from_config(run_dir / CHECKPOINT_DIR, config.checkpoint)
    data = IteratorState(seed=config.data.seed, epoch=0, position=0)
    start, meta, skips = 0, {}, SkipTracker()
    if restart:
        log.warning(
            "--resume: %s holds a run that stopped before its first checkpoint; starting again "
            "from step 0 (its metrics are replaced)",
            run_dir,
        )
        if is_main_process():  # the new run's TensorBoard events must not mix with these
            (run_dir / METRICS_FILE).unlink()
            shutil.rmtree(run_dir / TENSORBOARD_DIR, ignore_errors=True)
    elif resume:
        try:
            with jax.set_mesh(mesh):
                state, meta = checkpointer.restore(target_state=state)
        except BaseException:
            checkpointer.close()  # release orbax's threads before the error reaches the user
            raise
        missing = [k for k in ("step", "data", "skips_consecutive", "skips_total") if k not in meta]
        if missing:  # e.g. a checkpoint written by a loop of one's own
            checkpointer.close()
            raise ConfigError(
                f"--resume: the checkpoint in {run_dir / CHECKPOINT_DIR} was not written by "
                f"`jaxrl-llm train`: its metadata lacks {', '.join(missing)}."
            )
        data = _resumed_data(IteratorState.from_dict(meta["data"]), meta, context)
        start = int(meta["step"])
        if start > config.train.steps:
            checkpointer.close()
            raise ConfigError(
                f"train.steps: {config.train.steps} is below the step of the checkpoint to "
                f"resume ({start}, in {run_dir}); raise it to continue the run, or evaluate "
                "the checkpoint with `jaxrl-llm eval`."
            )
        skips = SkipTracker(int(meta["skips_consecutive"]), int(meta["skips_total"]))
        changed = _config_changes(meta.get("config", {}), config_to_dict(config))
        changed = [k for k in changed if k not in ("train.steps", "run_dir")]
        saved = meta.get("config", {})
        theirs = next((k for k in OBJECTIVE_SECTIONS if saved.get(k) is not None), None)
        if theirs is not None and theirs != config.objective_name:  # another kind of run
            checkpointer.close()
            raise ConfigError(
                f"--resume: the checkpoint in {run_dir} is of a run with `{theirs}:`, the config "
                f"is one with `{config.objective_name}:`; resume with the run's own config, or "
                "start the new run in another --run-dir."
            )
        seeds = [k for k in changed if k in ("seed", "data.seed")]
        if seeds:  # the data order and the update's key come from the checkpoint
            checkpointer.close()
            raise ConfigError(
                f"{seeds[0]}: a resumed run keeps the seeds it started with (the data order and "
                "the shuffling key are in its checkpoint, the sampling keys follow the seed); "
                f"got {seeds[0]} = {_dotted(config_to_dict(config), seeds[0])!r}, the "
                f"checkpoint's is {_dotted(meta['config'], seeds[0])!r}."
            )
        if config.algorithm is not None and config.algorithm.kl.target is None:
            # a fixed β is the config's, also when changed on resume (the checkpoint holds the
            # value it had; an adaptive controller's β is state and continues)
            fixed = kl_controller(config.algorithm.kl).init()
            state = state._replace(
                kl=place_global(fixed, jax.tree.map(lambda x: x.sharding, state.kl))
            )
        if changed:
            log.warning(
                "resuming step %d with a config that differs from the checkpoint's in: %s",
                start,
                ", ".join(changed),
            )
    return PreparedRun(context, state, data, start, checkpointer, meta, skips, info)


def _dotted(tree: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def _resumed_data(data: IteratorState, meta: dict[str, Any], ctx: RunContext) -> IteratorState:
    """The data position to resume from: the checkpoint's, or, where the data it walked has
    another size now (`meta["data_examples"]`, absent in checkpoints written before
    2026-12-07), the start of its next epoch over the new data, with a warning: a position
    in an order of `M` examples means nothing in an order of `M'`."""
    saved = meta.get("data_examples")
    now = iterated_examples(ctx)
    if saved is None or int(saved) == now:
        return data
    log.warning(
        "--resume: the checkpoint's data iterator walked %d examples, the data now holds %d; "
        "its position (epoch %d, example %d) does not carry over, so the run continues from "
        "the start of epoch %d over the new data",
        int(saved),
        now,
        data.epoch,
        data.position,
        data.epoch + 1,
    )
    return IteratorState(seed=data.seed, epoch=data.epoch + 1, position=0)


def build_context(
    config: RunConfig,
    mesh: Any,
    run_dir: pathlib.Path,
    *,
    with_warm_start: bool = True,
    resume: bool = False,
) -> tuple[RunContext, TrainState, dict[str, Any]]:
    """The run context, the initial train state (placed on `mesh`) and setup facts.

    Args:
      config: the run config.
      mesh: the device mesh.
      run_dir: the run directory.
      with_warm_start: run (or load) the configured warm start; False starts from the model as
        configured (e.g. to evaluate a checkpoint, whose parameters replace these anyway).
      resume: a checkpoint's state will replace this one: the warm start loads the run's own
        cache (`warm_start_policy`).

    Returns:
      `(context, state, info)`.

    Examples:
      >>> import pathlib, tempfile
      >>> from jaxrl_llm.data import ArithmeticConfig, DataConfig
      >>> from jaxrl_llm.models import ModelConfig
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> from sharding import make_mesh
      >>> tiny = ModelConfig(family="qwen3", vocab_size=259, hidden_size=8, intermediate_size=16,
      ...                    num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> config = RunConfig(model=ModelSection(init=tiny), sft=SFTConfig(),
      ...     data=DataConfig(arithmetic=ArithmeticConfig(max_digits=1, train_size=8, eval_size=2)))
      >>> context, state, info = build_context(
      ...     config, make_mesh(config.mesh), pathlib.Path(tempfile.mkdtemp()))
      >>> int(state.step), type(context.tokenizer).__name__, len(context.task.train)
      (0, 'ByteTokenizer', 8)
    """
    tokenizer = run_tokenizer(config)
    task = load_task(config, tokenizer)  # bad data fails before a model is loaded or built
    # and so do reward functions that cannot be imported, or (RL) called as every train step
    # calls them, with the train examples' fields (other runs score only their eval split)
    functions = [] if config.rewards.jax_native else config.rewards.resolve()
    train = task.train if config.kind == "rl" else []
    fields = [k for k in (train[0] if train else {}) if all(k in e for e in train)]
    for function in functions if train else ():
        check_reward_call(function, [*fields, "completion_lengths"])
    policy = build_policy(config)
    check_vocabulary(tokenizer, policy)
    if config.kind in ("preference", "reward_model"):  # they sample nothing: their pairs' lengths
        lengths = config.preference_data
        check_context(
            lengths.max_prompt_length,
            lengths.max_completion_length,
            policy,
            names=("preference_data.max_prompt_length", "preference_data.max_completion_length"),
        )
    else:
        check_context(task.prompt_length, task.completion_length, policy)
    critic = build_critic(config, policy)
    graphs, params, frozen = _split(config, policy, critic)
    params = place_global(params, param_shardings(params, mesh))
    frozen = place_global(frozen, param_shardings(frozen, mesh))
    info: dict[str, Any] = {
        "data/too_long_prompts_train": task.too_long_prompts["train"],
        "data/too_long_prompts_eval": task.too_long_prompts["eval"],
        "data/too_long_answers": task.too_long_answers,
    }
    if config.warm_start is not None and with_warm_start:
        params["policy"], frozen["policy"], ws_info = warm_start_policy(
            config,
            task,
            tokenizer,
            graphs,
            params["policy"],
            frozen["policy"],
            mesh,
            run_dir,
            resume=resume,
        )
        info.update(ws_info)
    algorithm = config.algorithm
    preference_examples = preference_eval_examples = None
    if config.offline_pairs:
        preference_examples, pref_info = load_preference_examples(config, tokenizer)
        preference_eval_examples = load_preference_eval_examples(config, tokenizer)
        pref_info["data/preference_eval_examples"] = len(preference_eval_examples)
        info.update(pref_info)
    reference = reference_params(params) if config.uses_reference else None
    reference_logprobs = None
    if config.preference is not None and config.preference.precompute_reference:
        started = time.perf_counter()
        splits = {"train": preference_examples, "eval": preference_eval_examples}
        reference_logprobs = precompute_reference(
            config, graphs, reference, frozen["policy"], mesh, splits, tokenizer.pad_id
        )
        reference = None  # the table replaces the reference's parameters
        info["time/precompute_reference_s"] = time.perf_counter() - started
    synced = config.train.reference_sync is not None
    optimizer = make_optimizer(config.optim)
    controller_state = kl_controller(algorithm.kl).init() if algorithm is not None else None
    bco = config.preference is not None and config.preference.loss == "bco"
    state = init_train_state(
        params,
        frozen,
        optimizer,
        key=jax.random.key(config.seed),
        kl=controller_state,
        reward_moments=losses.init_running_moments() if bco else None,
        reference=reference if synced else None,  # checkpointed with the state
    )
    state = place_global(state, train_state_shardings(state, mesh, optimizer))
    groups = update_row_groups(config, task, params["policy"], mesh)

    update = update_program(
        config.update_objective,
        graphs,
        config.optim,
        mesh,
        state,
        config.parallel,
        row_groups=groups,
        group_size=prompt_group_size(config, mesh, update=True),
        samples_per_prompt=config.group_size,
    )
    context = RunContext(
        config=config,
        tokenizer=tokenizer,
        task=task,
        graphs=graphs,
        mesh=mesh,
        sampling=_sampling(config, tokenizer),
        reward_functions=functions,
        reference=None if synced else reference,
        update=update,
        update_row_groups=groups,
        run_dir=run_dir,
        preference_examples=preference_examples,
        preference_eval_examples=preference_eval_examples,
        reference_logprobs=reference_logprobs,
    )
    return context, state, info
