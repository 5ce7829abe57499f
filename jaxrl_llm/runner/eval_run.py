"""`jaxrl-llm eval CONFIG.yaml [--checkpoint STEP|latest|none]`: evaluate a run's checkpoint.

Builds the run's models and data as `train` would (without training or warm-starting), restores
the policy of the chosen checkpoint from `run_dir/checkpoints` (`none`: the model as configured,
before any training), evaluates it on the eval split (`runner.evaluate`: greedy accuracy,
accuracy at temperature 1, pass@k; sampled with the key of the run's own evaluation at that
step, so the command reproduces what the run logged there), and as the run does for its kind
(`runner.evaluate.evaluate_state`: an SFT run's held-out NLL, a preference run's held-out
preference examples); prints a table and writes `run_dir/eval/step_<STEP>.json`
(`step_initial.json` for `none`).
"""

from __future__ import annotations

import json
import pathlib
import warnings
from collections.abc import Mapping
from typing import Any

import jax

from jaxrl_llm.checkpoint import Checkpointer, IncompleteCheckpointWarning, StateMismatchError
from jaxrl_llm.config import ConfigError
from jaxrl_llm.runner.config import RunConfig, check_devices
from jaxrl_llm.runner.evaluate import evaluate_state
from jaxrl_llm.runner.keys import EVAL_STREAM, fold_in, stream_key
from jaxrl_llm.runner.setup import CHECKPOINT_DIR, build_context
from sharding import make_mesh

EVAL_DIR = "eval"


def parse_checkpoint(text: str) -> int | str:
    """`"latest"`, `"none"` or a step number.

    Examples:
      >>> parse_checkpoint("latest"), parse_checkpoint("12")
      ('latest', 12)
      >>> parse_checkpoint("last")
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: --checkpoint: expected a step number, 'latest' or 'none', got 'last'.
    """
    if text in ("latest", "none"):
        return text
    try:
        step = int(text)
    except ValueError:
        step = -1
    if step < 0:
        raise ConfigError(
            f"--checkpoint: expected a step number, 'latest' or 'none', got {text!r}."
        )
    return step


def evaluate_run(
    config: RunConfig,
    *,
    checkpoint: int | str = "latest",
    num_prompts: int | None = None,
    pass_k: tuple[int, ...] | None = None,
) -> tuple[str, dict[str, float], pathlib.Path]:
    """Evaluate a checkpoint of a run (module docstring).

    Args:
      config: the run's config (`run_dir` set).
      checkpoint: a step, "latest" or "none".
      num_prompts: evaluate the first this many eval examples (None: `train.eval_prompts`).
      pass_k: the k of pass@k (None: `train.eval_pass_k`).

    Returns:
      `(label, metrics, json_path)`; `label` is the step or "initial".

    Raises:
      ConfigError: no such checkpoint, or no eval split.

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> evaluate_run(RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig()))
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: run_dir: not set; pass --run-dir or set run_dir in the config.
    """
    if config.run_dir is None:
        raise ConfigError("run_dir: not set; pass --run-dir or set run_dir in the config.")
    if num_prompts is not None and num_prompts < 1:
        raise ConfigError(f"--prompts (num_prompts): must be >= 1, got {num_prompts}.")
    import dataclasses

    train = config.train
    if num_prompts is not None:
        train = dataclasses.replace(train, eval_prompts=num_prompts)
    if pass_k is not None:
        train = dataclasses.replace(train, eval_pass_k=tuple(pass_k))
    config = dataclasses.replace(config, train=train)
    run_dir = pathlib.Path(config.run_dir)
    check_devices(config, jax.device_count())
    mesh = make_mesh(config.mesh)
    with jax.set_mesh(mesh):
        # `none`: the policy the run's RL starts from, warm-started as the run was (the run's
        # own cached warm start, trained here if there is none); a checkpoint replaces it
        initial = checkpoint == "none"
        context, state, _ = build_context(
            config, mesh, run_dir, with_warm_start=initial, resume=initial
        )
    if train.eval_prompts == 0:
        raise ConfigError(
            "train.eval_prompts: 0 (evaluation off) leaves nothing to evaluate; pass --prompts N "
            "or train.eval_prompts=N."
        )
    if not context.task.eval and not context.preference_eval_examples:
        raise ConfigError(
            f"data.eval_source: {config.data.source!r} has no eval split to evaluate on."
        )
    label = "initial"
    if checkpoint != "none":
        directory = run_dir / CHECKPOINT_DIR
        if not directory.is_dir():
            raise ConfigError(f"--checkpoint: no checkpoints in {directory}.")
        with Checkpointer(directory, save_every=1) as ckpt:
            steps = ckpt.all_steps()
            if not steps:
                raise ConfigError(f"--checkpoint: no complete checkpoint in {directory}.")
            step = steps[-1] if checkpoint == "latest" else checkpoint
            # only for `latest` (it reads every step's metadata again), as `--resume` warns
            newer = (
                [s for s in ckpt.unreadable_steps() if s > step] if checkpoint == "latest" else []
            )
            if newer:
                warnings.warn(
                    f"--checkpoint latest: skipping step(s) {newer} in {directory}, which cannot "
                    f"be read (damaged files); evaluating step {step}.",
                    IncompleteCheckpointWarning,
                    stacklevel=2,
                )
            if step not in steps:
                raise ConfigError(
                    f"--checkpoint: step {step} has no complete checkpoint in {directory}; "
                    f"complete steps: {steps}."
                )
            with jax.set_mesh(mesh):
                try:
                    state, _ = ckpt.restore(step, target_state=state)
                except StateMismatchError as err:
                    if not all(leaf.startswith("opt_state") for leaf in err.leaves):
                        raise
                    raise ConfigError(  # the whole train state is restored, optimizer included
                        f"{err} The optimizer state differs: evaluate with the optim.* "
                        "settings (and overrides) the run was trained with."
                    ) from None
        label = str(step)
    # the key of the run's own evaluation at that step (step 0: before training), so that the
    # command reproduces the metrics the run logged for the checkpoint
    key = fold_in(stream_key(config.seed, EVAL_STREAM), 0 if label == "initial" else int(label))
    metrics = evaluate_state(context, state, key)
    out = run_dir / EVAL_DIR / f"step_{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"checkpoint": label, **metrics}, indent=2, sort_keys=True) + "\n")
    return label, metrics, out


def _format_value(value: Any) -> str:
    """4 decimals, or 4 significant digits for a float that 4 decimals would show as 0."""
    if not isinstance(value, float):
        return str(value)
    return f"{value:.4f}" if value == 0 or abs(value) >= 5e-5 else f"{value:.3e}"


def format_eval_table(label: str, metrics: Mapping[str, Any]) -> str:
    """A two-column text table of the eval metrics.

    Examples:
      >>> print(format_eval_table("3", {"eval/accuracy": 0.5, "eval/pass@2": 0.75}))
      checkpoint      3
      eval/accuracy   0.5000
      eval/pass@2     0.7500
    """
    rows = [("checkpoint", label)]
    for key, value in metrics.items():
        if key.startswith("time/"):
            continue
        rows.append((key, _format_value(value)))
    width = max(len(k) for k, _ in rows) + 3
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)
