"""Fault injection for crash tests: SIGKILL the training process at a chosen point of a run.

Inert unless the environment variable `JAXRL_LLM_FAULT` is set (`fault_point` then costs one
dictionary lookup). The reliability tests (`tests/reliability/test_sigkill_resume.py`) set it
to kill a `jaxrl-llm train` subprocess at an exact point, then resume the run and compare it
bit for bit with an uninterrupted one:

    JAXRL_LLM_FAULT=step:3    killed after step 3's update, before its metrics are logged and
                              its checkpoint is written (the step is lost: "during a step")
    JAXRL_LLM_FAULT=save:4    killed right after the checkpoint save of step 4 started; with
                              `checkpoint.async_save` its files are still being written
                              ("during a save")

The process kills itself with SIGKILL (no handler, no `finally`, no flushing of anything but
the standard streams), exactly as the kernel's OOM killer or a preempting scheduler would.
"""

from __future__ import annotations

import os
import signal
import sys

ENV_VAR = "JAXRL_LLM_FAULT"
POINTS = ("step", "save")


def parse_fault(spec: str) -> tuple[str, int]:
    """`"<point>:<step>"` → `(point, step)`.

    Raises:
      ValueError: an unknown point or a step that is not an int >= 1 (the message names
        `JAXRL_LLM_FAULT`).

    Examples:
      >>> parse_fault("save:4")
      ('save', 4)
      >>> parse_fault("update:x")
      Traceback (most recent call last):
      ...
      ValueError: JAXRL_LLM_FAULT: expected '<point>:<step>' with point one of 'step', 'save' and step an int >= 1, got 'update:x'.
    """
    point, _, step = spec.partition(":")
    if point not in POINTS or not step.isdigit() or int(step) < 1:
        points = ", ".join(map(repr, POINTS))
        raise ValueError(
            f"{ENV_VAR}: expected '<point>:<step>' with point one of {points} and step an int "
            f">= 1, got {spec!r}."
        )
    return point, int(step)


def fault_point(point: str, step: int) -> None:
    """SIGKILL this process if `JAXRL_LLM_FAULT` names this point and step; else nothing.

    Args:
      point: `"step"` or `"save"` (module docstring).
      step: the run's current step.

    Examples:
      >>> ENV_VAR in os.environ  # unset, as in every normal run: `fault_point` does nothing
      False
      >>> fault_point("step", 1)
    """
    spec = os.environ.get(ENV_VAR)
    if not spec or parse_fault(spec) != (point, step):
        return
    print(f"{ENV_VAR}: SIGKILL at {point} {step}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)
