"""Shared pieces of the reliability suite: the tiny reference run, the CLI in a subprocess,
final states restored from a run directory, comparable metrics, the user-error check, and
misbehaving reward functions."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading

import jax
import numpy as np

from jaxrl_llm.cli import main
from jaxrl_llm.runner import load_run_config, prepare_run
from tests.compile_settings import fast_compile_env
from tests.runner.helpers import CONFIGS, ROOT, TINY, records

GRPO = str(CONFIGS / "grpo.yaml")
# the runner tests' tiny GRPO run (1 layer, width 16, 2 prompts × 2 samples of 4 tokens, the
# checksum reward on the host), with no evaluation and no export: only the sampler, log-prob,
# advantage and update programs compile, once per process
BASE = [*TINY, "train.eval_prompts=0", "export.enabled=false"]
# the reference run that the crash, resume and reproducibility tests compare with: 6 steps,
# asynchronous checkpoints at steps 2, 4 and 6
RUN = [*BASE, "train.steps=6", "checkpoint.every=2", "checkpoint.async_save=true"]
_WALL_CLOCK = ("time", "elapsed", "wall_seconds")


def train(run_dir, overrides, *, resume=False):
    """`jaxrl-llm train configs/grpo.yaml OVERRIDES --run-dir RUN_DIR` in this process."""
    argv = ["train", GRPO, *overrides, "--run-dir", str(run_dir)]
    return main([*argv, "--resume"] if resume else argv)


def run_cli(args, *, cache_dir, env=None, timeout=300):
    """`python -m jaxrl_llm ARGS` in a subprocess (one CPU device, fast compiles, the session's
    persistent compilation cache); returns the `CompletedProcess` (text output)."""
    full_env = fast_compile_env(
        JAX_PLATFORMS="cpu",
        JAX_COMPILATION_CACHE_DIR=str(cache_dir),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
        **(env or {}),
    )
    return subprocess.run(
        [sys.executable, "-m", "jaxrl_llm", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def host_leaves(tree):
    """The leaves of a pytree as NumPy arrays (typed PRNG keys as their key data)."""
    return [
        np.asarray(
            jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x
        )
        for x in jax.tree.leaves(tree)
    ]


def final_state(run_dir, overrides=RUN):
    """`(step, data position, leaves)` of the newest checkpoint of a run directory."""
    prepared = prepare_run(load_run_config(GRPO, overrides, run_dir=run_dir), resume=True)
    prepared.checkpointer.close()
    return prepared.start_step, prepared.data, host_leaves(prepared.state)


def comparable_records(run_dir):
    """Every metrics.jsonl record without its wall-clock values (time, throughput)."""
    return [
        {
            k: v
            for k, v in record.items()
            if k not in _WALL_CLOCK and not k.startswith(("time/", "perf/"))
        }
        for record in records(run_dir)
    ]


def copy_run(source, destination):
    """A copy of a finished run directory (its checkpoints and metrics) to resume or damage."""
    shutil.copytree(source, destination)
    return destination


def user_error(capsys, argv):
    """Run the CLI in-process; assert a user error (status 2, one line, no traceback)."""
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


_NEVER = threading.Event()  # never set: a call waiting on it hangs until its own timeout


def hanging_reward(prompts, completions, **fields):
    """A reward function that hangs (a stuck reward server): no answer within 60 s.

    The guard's timeout abandons the call's (daemon) thread, which returns after 60 s."""
    _NEVER.wait(60.0)
    return [0.0] * len(completions)
