"""Fixtures of the reliability suite: one compilation cache for the subprocess runs, and one
uninterrupted reference run shared by the crash, resume, reproducibility and checkpoint tests.

The runs here are a few steps of a width-16 model, so compiling dominates their time. The test
process compiles with most XLA optimisation passes off (`tests/compile_settings.py`; it changes
how fast programs compile, not what they compute), and every `jaxrl-llm train` subprocess runs
with the same setting and a persistent compilation cache
shared by the session, so only the first subprocess compiles. In-process runs share their
compiled programs through `jaxrl_llm.runner.programs`' cache.
"""

from __future__ import annotations

import pytest

from tests.reliability.helpers import RUN, train


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    """A persistent compilation cache directory for the subprocess runs of the session."""
    return tmp_path_factory.mktemp("jax_compilation_cache")


@pytest.fixture(scope="package")
def reference_run(tmp_path_factory):
    """The run directory of an uninterrupted `RUN` (6 steps, checkpoints at 2, 4, 6).

    Read-only for the tests: copy it (`helpers.copy_run`) to resume or damage it."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert train(run_dir, RUN) == 0
    return run_dir
