"""Checks of a package's public API, shared by the packages' `test_api.py` files."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType


def names_without_examples(package: ModuleType) -> list[str]:
    """Exported functions and classes whose docstring has no doctest `Examples:` section."""
    missing = []
    for name in package.__all__:
        obj = getattr(package, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        doc = inspect.getdoc(obj) or ""
        if "Examples:" not in doc or ">>>" not in doc:
            missing.append(name)
    return missing


def names_missing_from_all(package: ModuleType) -> list[str]:
    """Public functions and classes defined in the package's modules but not in `__all__`."""
    exported = set(package.__all__)
    forgotten = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, obj in vars(module).items():
            if (
                (inspect.isfunction(obj) or inspect.isclass(obj))
                and obj.__module__ == module.__name__
                and not name.startswith("_")
                and name not in exported
            ):
                forgotten.append(f"{info.name}.{name}")
    return forgotten
