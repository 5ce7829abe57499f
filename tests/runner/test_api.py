"""`jaxrl_llm.runner`: every public function and class is exported and has a doctest example."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import jaxrl_llm.runner as runner


def test_every_exported_name_has_an_example():
    undocumented = []
    for name in runner.__all__:
        obj = getattr(runner, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        doc = inspect.getdoc(obj) or ""
        if "Examples:" not in doc or ">>>" not in doc:
            undocumented.append(name)
    assert not undocumented, f"public names without a doctest example: {undocumented}"


def test_all_lists_every_public_function_and_class():
    exported = set(runner.__all__)
    forgotten = []
    for info in pkgutil.iter_modules(runner.__path__):
        module = importlib.import_module(f"jaxrl_llm.runner.{info.name}")
        for name, obj in vars(module).items():
            if (
                (inspect.isfunction(obj) or inspect.isclass(obj))
                and obj.__module__ == module.__name__
                and not name.startswith("_")
                and name not in exported
            ):
                forgotten.append(f"{info.name}.{name}")
    assert not forgotten, f"public names missing from jaxrl_llm.runner.__all__: {forgotten}"
