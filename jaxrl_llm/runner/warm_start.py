"""Warm start: supervised fine-tuning on the task's (prompt, answer) pairs before RL, cached.

A random or weak policy rarely samples a correct answer, so every group has equal rewards and
RL has no signal. `warm_start:` first runs `steps` SFT steps (`sft_objective`, token-mean NLL
of answer + EOS, AdamW at `learning_rate`, gradient clipping at 1) on batches of `batch_size`
train pairs, then RL starts from the result, which is also the reference policy of the KL term.

The fine-tuned trainable parameters are saved under `run_dir/warm_start/<hash>/` (an orbax
checkpoint, bit-exact), the hash covering everything they depend on (model, tokenizer, data,
prompt and completion budgets, trainable patterns, seed, warm-start settings). A later run in
the same run directory with the same hash, a resumed run included, loads them instead of
training again; a fresh run with a different hash trains again and replaces the old cache.
A resumed run keeps the warm start it started from, whose parameters are its KL reference: if
its config now hashes otherwise (say `data.arithmetic.train_size` was raised), it loads the
run's cache with a warning instead of training another reference.
"""

from __future__ import annotations

import logging
import pathlib
import shutil
from typing import Any

import jax
import numpy as np

from jaxrl_llm.checkpoint import Checkpointer
from jaxrl_llm.data import IteratorState, next_batch
from jaxrl_llm.runner.completion_width import trim_to_longest
from jaxrl_llm.runner.config import RunConfig, config_hash
from jaxrl_llm.runner.programs import update_program
from jaxrl_llm.runner.task import TaskData, packed_sft_batch, packing_row_unit, sft_batch
from jaxrl_llm.train import ModelGraphs, OptimConfig, SFTConfig, init_train_state, make_optimizer
from jaxrl_llm.train.shardings import batch_devices, place_batch, train_state_shardings
from sharding import place_global

log = logging.getLogger(__name__)
WARM_START_DIR = "warm_start"


def warm_start_hash(config: RunConfig) -> str:
    """The hash of everything the warm-started parameters depend on.

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection, WarmStartConfig
      >>> from jaxrl_llm.train import AlgorithmConfig
      >>> from jaxrl_llm.sampler import SamplingConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), algorithm=AlgorithmConfig(),
      ...     sampling=SamplingConfig(num_samples=2), warm_start=WarmStartConfig(steps=5))
      >>> import dataclasses
      >>> warm_start_hash(cfg) == warm_start_hash(dataclasses.replace(cfg, seed=0))
      True
    """
    return config_hash(
        {
            "model": config.model,
            "tokenizer": config.tokenizer,
            "data": config.data,
            "warm_start": config.warm_start,
            "seed": config.seed,
            "max_new_tokens": config.sampling.max_new_tokens,
            "max_prompt_tokens": config.train.max_prompt_tokens,
            "bucket": (config.sampling.bucket_multiple, config.sampling.min_bucket),
        }
    )


def warm_start_policy(
    config: RunConfig,
    task: TaskData,
    tokenizer: Any,
    graphs: ModelGraphs,
    params: Any,
    frozen: Any,
    mesh: Any,
    run_dir: pathlib.Path,
    *,
    resume: bool = False,
) -> tuple[Any, Any, dict[str, float]]:
    """The warm-started trainable policy parameters (loaded from the cache or trained), and
    the frozen ones to use from now on.

    Args:
      config: the run config (with a `warm_start` section).
      task: the run's data (its supervised pairs `task.sft_train`).
      tokenizer: the run's tokenizer.
      graphs: the model graphs (only `graphs.policy` is used).
      params: the trainable policy parameters to start from (placed on the mesh).
      frozen: the frozen policy parameters.
      mesh: the device mesh.
      run_dir: the run directory (the cache is `run_dir/warm_start`).
      resume: the run continues from a checkpoint: the run's own cache is loaded even when
        the config now hashes otherwise (module docstring), and never removed.

    Returns:
      `(params, frozen, info)` with `info = {"warm_start/cached": 0 or 1,
      "warm_start/nll_first", "warm_start/nll_last"}` (the NLLs of the training, now or when
      cached) and, with `packing`, `"warm_start/packed_rows"` and `"warm_start/packing_fill"`
      (means over the steps: rows per batch, the share of slots holding a token). The update
      steps donate the whole train state, the frozen parameters included, so after training
      `frozen` is the step's output (the same values in new buffers); the arrays passed in are
      deleted.

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig())
      >>> warm_start_policy(cfg, None, None, None, None, None, None, None)
      Traceback (most recent call last):
      ...
      ValueError: warm_start_policy: the config has no `warm_start:` section.

      `tests/runner/test_scoring.py` fine-tunes a tiny model, then reloads it from the cache.
    """
    section = config.warm_start
    if section is None:
        raise ValueError("warm_start_policy: the config has no `warm_start:` section.")
    root = run_dir / WARM_START_DIR
    directory = root / warm_start_hash(config)
    target = {"policy": params}
    own = directory
    if resume and not _has_checkpoint(directory):
        earlier = [d for d in sorted(root.iterdir()) if _has_checkpoint(d)] if root.is_dir() else []
        if earlier:  # the reference this run has trained against so far
            own = earlier[-1]
            log.warning(
                "warm start: a setting the warm start depends on (model, tokenizer, data, "
                "warm_start, seed, lengths) differs from the one this run started from; "
                "resuming keeps the run's own warm start (%s) as the reference",
                own,
            )
    with Checkpointer(own, save_every=1, keep=1, async_save=False) as cache:
        if cache.latest_step() is not None:
            restored, meta = cache.restore(target_state=target)
            log.info("warm start: loaded the fine-tuned parameters from %s", own)
            return restored["policy"], frozen, {"warm_start/cached": 1.0, **meta}
        for stale in root.iterdir():  # parameters of other configurations
            if stale.is_dir() and stale != directory:
                log.warning("warm start: removing %s (another configuration's cache)", stale)
                shutil.rmtree(stale)
        trained, frozen, info = _train(config, task, tokenizer, graphs, params, frozen, mesh)
        cache.save(section.steps, {"policy": trained}, info)
    return trained, frozen, {"warm_start/cached": 0.0, **info}


def _has_checkpoint(directory: pathlib.Path) -> bool:
    """Whether a warm-start cache directory holds its saved parameters."""
    if not directory.is_dir():
        return False
    with Checkpointer(directory, save_every=1, keep=1, async_save=False) as cache:
        return cache.latest_step() is not None


def _train(
    config: RunConfig,
    task: TaskData,
    tokenizer: Any,
    graphs: ModelGraphs,
    params: Any,
    frozen: Any,
    mesh: Any,
) -> tuple[Any, Any, dict[str, float]]:
    section = config.warm_start
    optim = OptimConfig(name="adamw", learning_rate=section.learning_rate, max_grad_norm=1.0)
    policy_graphs = ModelGraphs(policy=graphs.policy)
    optimizer = make_optimizer(optim)
    state = init_train_state(
        {"policy": params}, {"policy": frozen}, optimizer, key=jax.random.key(config.seed)
    )
    # the step is compiled for the state's mesh layout (the fresh optimizer moments included)
    state = place_global(state, train_state_shardings(state, mesh, optimizer))
    objective = SFTConfig(packing=section.packing, packing_length=section.packing_length)
    step = update_program(objective, policy_graphs, optim, mesh, state, config.parallel)
    unit = packing_row_unit(1, batch_devices(mesh), config.parallel)
    position = IteratorState(seed=config.data.seed + 1, epoch=0, position=0)
    nll, rows, fill = [], [], []
    for i in range(section.steps):
        indices, position = next_batch(
            position,
            num_examples=len(task.sft_train),
            batch_size=section.batch_size,
            shuffle=config.data.shuffle,
        )
        examples = [task.train[task.sft_train[j]] for j in indices]
        batch = sft_batch(task, examples, config, tokenizer)
        if config.train.trim_completions and not section.packing:
            batch = trim_to_longest(batch, minimum=config.train.trim_minimum)
        if section.packing:
            batch = packed_sft_batch(
                task, batch, length=section.packing_length, unit=unit, pad_id=tokenizer.pad_id
            )
            rows.append(batch.tokens.shape[0])
            fill.append(float(np.mean(batch.segment_ids > 0)))
        batch = place_batch(batch, mesh)
        state, metrics = step(state, batch)
        if i == 0 or i == section.steps - 1 or (i + 1) % max(1, section.steps // 10) == 0:
            value = float(metrics["sft/nll"])
            nll.append(value)
            log.info("warm start: step %d/%d, nll %.4f", i + 1, section.steps, value)
    info = {"warm_start/nll_first": nll[0], "warm_start/nll_last": nll[-1]}
    if section.packing:  # as the SFT run's sft/packed_rows and sft/packing_fill, step-averaged
        info["warm_start/packed_rows"] = float(np.mean(rows))
        info["warm_start/packing_fill"] = float(np.mean(fill))
    return state.params["policy"], state.frozen["policy"], info
