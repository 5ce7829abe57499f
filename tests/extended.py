"""The extended cases: tests run by `make test-all` only.

`make test` (the README's test command, what CI runs) skips tests marked `extended`
(`-m "not extended"`) to keep within its 15-minute budget on 2 cores; `make test-all` runs them
too. A test is marked extended only when a default test runs the same code path: the default
suite keeps one case per distinct path of a parameter matrix (a loss family, a layout, a
scheduling form), and the extended cases repeat it for the remaining presets of that family;
two benchmark smoke tests whose measured forms are tested in `tests/train` are extended too.
docs/testing.md lists them and the time they take.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

EXTENDED = pytest.mark.extended


def extended(*values, id: str | None = None):
    """One parameter set of `pytest.mark.parametrize`, run by `make test-all` only."""
    return pytest.param(*values, marks=EXTENDED, id=id)


def split_cases(cases: Iterable, core: Iterable) -> list:
    """`cases` (single values) with every one not in `core` marked extended; `core` must name
    cases that exist, so that a renamed case cannot silently leave the default suite."""
    cases, core = list(cases), set(core)
    if unknown := core - set(cases):
        raise ValueError(f"split_cases: core cases {sorted(unknown)} are not among {cases}")
    return [case if case in core else extended(case) for case in cases]
