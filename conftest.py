"""Root pytest configuration, shared by every test path (tests/ and the packages' doctests).

- Modules that must not be imported by --doctest-modules.
- The runner turns on JAX's persistent compilation cache by default (`train.compilation_cache`,
  `~/.cache/jaxrl_llm/jax`). A test run must not write into the user's home, so each pytest
  process points JAX at its own temporary cache directory (inherited by the subprocesses the
  tests start, removed at exit) unless `JAX_COMPILATION_CACHE_DIR` is already set. The runner
  keeps a directory configured for the process, so every training run of the suite uses it.
- The test process compiles with most of XLA's optimisation passes off (`tests/compile_settings.py`:
  compiling, not running, is most of the suite's time).
"""

import atexit
import os
import shutil
import tempfile

import pytest

from tests.compile_settings import optimisations, with_optimisations  # noqa: F401 (a fixture)

collect_ignore = ["jaxrl_llm/__main__.py", "setup.py", ".venv"]

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="jaxrl_llm-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _compile_fast():
    with optimisations(False):
        yield
