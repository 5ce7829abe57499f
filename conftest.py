"""Root pytest configuration, shared by every test path (tests/ and the packages' doctests).

- Modules that must not be imported by --doctest-modules.
- One persistent compilation cache for the whole test session: the pytest process points JAX
  at a temporary directory (removed at exit) unless `JAX_COMPILATION_CACHE_DIR` is already
  set, and caches every program however short its compile time. The xdist workers and the
  subprocesses the tests start (notebooks, runners, CLI runs) inherit both settings, so a
  program one process compiled is loaded by the others instead of compiled again (pytest's
  wall time 906 → 828 s on 2 cores, docs/testing.md). The runner turns on the same cache by
  default (`train.compilation_cache`, `~/.cache/jaxrl_llm/jax`) and keeps a directory already
  configured, so the suite's training runs never write into the user's home. The cache key
  covers the compile options, so programs compiled with and without XLA's optimisations
  (below) never stand in for each other.
- The test process compiles with most of XLA's optimisation passes off and with XLA:CPU's
  older fusion emitters (`tests/compile_settings.py`: compiling, not running, is most of the
  suite's time). The emitter flag goes into `XLA_FLAGS` here, before JAX starts a backend;
  the xdist workers and the test subprocesses inherit it.
"""

import atexit
import os
import shutil
import tempfile

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # before JAX reads its settings
    _cache = tempfile.mkdtemp(prefix="jaxrl_llm-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax
import pytest

from tests.compile_settings import optimisations, with_fast_xla_flags

os.environ["XLA_FLAGS"] = with_fast_xla_flags(os.environ.get("XLA_FLAGS", ""))
if jax._src.xla_bridge.backends_are_initialized():  # a plugin started JAX: flags come too late
    raise RuntimeError("conftest.py: JAX's backend started before the suite's XLA_FLAGS were set")

# JAX may have been imported before this file (a plugin): give it the settings either way
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update(
    "jax_persistent_cache_min_compile_time_secs",
    float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
)

collect_ignore = ["jaxrl_llm/__main__.py", "setup.py", ".venv"]


@pytest.fixture(scope="session", autouse=True)
def _compile_fast():
    with optimisations(False):
        yield
