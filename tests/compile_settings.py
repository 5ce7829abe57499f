"""The suite compiles with most of XLA's optimisation passes off (`jax_disable_most_optimizations`).

Most of the suite's time goes to compiling many small programs of tiny models, not to running
them. With most optimisation passes off (XLA's backend optimisation level 0, no expensive LLVM
passes) they compile in about two thirds of the time; what they compute is the same up to float
rounding, which the tests' tolerances against float64 references absorb. The root `conftest.py`
turns the setting on for the whole test process; `optimisations(True)` turns it off inside a
block. The test subprocesses (multi-device runners, the CLI runs of `tests/reliability`, the
benchmark worker) compile the same way; the notebooks and the demo's learning run compile as
users do, so the suite also runs the programs users compile.

The suite also compiles with XLA:CPU's older fusion emitters (`FAST_XLA_FLAGS`,
`--xla_cpu_use_fusion_emitters=false`): with the optimisation passes off, the newer MLIR
fusion emitters are most of the remaining compile time (`tests/train/test_row_groups.py`,
one process: 47-59 s with them, 32-33 s without, 2026-11-28). The root `conftest.py` adds the
flag to `XLA_FLAGS` before JAX starts its backend, and the test subprocesses inherit it
(`fast_compile_env`); those that run as users run strip it (`user_env`). XLA_FLAGS are read
once per process, so a test cannot turn the flag back on: a check that must compile as users
do (the demo's learning run) starts a subprocess with `user_env`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

import jax

FAST_XLA_FLAGS = "--xla_cpu_use_fusion_emitters=false"


def with_fast_xla_flags(xla_flags: str) -> str:
    """`xla_flags` (an `XLA_FLAGS` value) with `FAST_XLA_FLAGS` added once."""
    if FAST_XLA_FLAGS in xla_flags.split():
        return xla_flags
    return f"{xla_flags} {FAST_XLA_FLAGS}".strip()


def fast_compile_env(environ: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """A subprocess environment that compiles like the test process: `environ` (default
    `os.environ`) and `extra`, with most optimisations off and only `FAST_XLA_FLAGS` in
    `XLA_FLAGS` (one CPU device: a device count of the parent is dropped)."""
    env = dict(os.environ if environ is None else environ, **extra)
    env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
    env["XLA_FLAGS"] = FAST_XLA_FLAGS
    return env


def user_env(environ: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """A subprocess environment that compiles as users do: `environ` (default `os.environ`)
    and `extra` without `XLA_FLAGS` (one CPU device, XLA's default emitters) and without
    `JAX_DISABLE_MOST_OPTIMIZATIONS`."""
    env = dict(os.environ if environ is None else environ, **extra)
    env.pop("XLA_FLAGS", None)
    env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
    return env


@contextlib.contextmanager
def optimisations(enabled: bool) -> Iterator[None]:
    """Compile with XLA's optimisations on (`True`) or mostly off (`False`) inside the block."""
    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", not enabled)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", previous)
