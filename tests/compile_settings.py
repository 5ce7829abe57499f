"""The suite compiles with most of XLA's optimisation passes off (`jax_disable_most_optimizations`).

Most of the suite's time goes to compiling many small programs of tiny models, not to running
them. With most optimisation passes off (XLA's backend optimisation level 0, no expensive LLVM
passes) they compile in about two thirds of the time; what they compute is the same up to float
rounding, which the tests' tolerances against float64 references absorb. The root `conftest.py`
turns the setting on for the whole test process (`optimisations_mostly_off`). A test whose
time goes to running a long computation instead (the demo's shortened learning run) asks for
the `with_optimisations` fixture. Subprocesses (notebooks, multi-device runners, the CLI runs
of `tests/reliability`, the benchmark worker) start with JAX's defaults unless their launcher
says otherwise, so the suite also runs the programs as users compile them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import pytest


@contextlib.contextmanager
def optimisations(enabled: bool) -> Iterator[None]:
    """Compile with XLA's optimisations on (`True`) or mostly off (`False`) inside the block."""
    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", not enabled)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", previous)


@pytest.fixture
def with_optimisations() -> Iterator[None]:
    """XLA's default optimisations for one test (a long run, where they pay for themselves)."""
    with optimisations(True):
        yield
