"""JAX's persistent compilation cache for training runs (`train.compilation_cache`).

A run compiles its sampler, log-prob, advantage and update programs (or the one compiled
iteration) before its first step: seconds on a CPU, minutes for a large model. With the cache
on, every compiled executable is also written to a directory, and a later process compiling
the same program (same model shapes, settings, jax version and flags) loads it instead: a
second run of the same config starts its first step almost at once.

    train.compilation_cache: "~/.cache/jaxrl_llm/jax"   the default (shared by all runs)
    train.compilation_cache: null                        off

A directory already configured for the process (`JAX_COMPILATION_CACHE_DIR`, or
`jax.config.update("jax_compilation_cache_dir", ...)`) is kept. Every program is cached,
however short its compile time (`jax_persistent_cache_min_compile_time_secs = 0`): on a
laptop CPU most programs of a small model compile in under the default 1 s threshold.
The cache is trusted code: do not point it at a directory that others can write.
"""

from __future__ import annotations

import logging
import pathlib

import jax

log = logging.getLogger(__name__)


def enable_compilation_cache(directory: str | None) -> str | None:
    """Turn on the persistent compilation cache in `directory` (None: leave everything as is).

    Args:
      directory: the cache directory (`~` expanded, created if missing), or None.

    Returns:
      The directory in use (the process's own setting when one was already made), or None.

    Examples:
      >>> enable_compilation_cache(None) is None
      True
    """
    if directory is None:
        return None
    current = jax.config.jax_compilation_cache_dir
    if current:
        return current
    path = pathlib.Path(directory).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log.warning("compilation cache off: cannot create %s (%s)", path, err)
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return str(path)
