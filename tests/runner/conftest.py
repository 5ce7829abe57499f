"""Compile the runner tests' programs with XLA's optimisations mostly off.

The runs here are a few steps of a width-16 model, so compiling dominates their time; turning
most of XLA's optimisation passes off (`jax_disable_most_optimizations`) cuts it by about a
third without changing what is computed. The setting is restored after the package, so other
tests compile as usual.
"""

from __future__ import annotations

import jax
import pytest


@pytest.fixture(scope="package", autouse=True)
def _fast_compiles():
    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)
