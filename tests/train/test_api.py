"""`jaxrl_llm.train`: every public function is exported and documented with a doctest example."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import jaxrl_llm.train as train


def test_every_exported_name_has_an_example():
    undocumented = []
    for name in train.__all__:
        obj = getattr(train, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        doc = inspect.getdoc(obj) or ""
        if "Examples:" not in doc or ">>>" not in doc:
            undocumented.append(name)
    assert not undocumented, f"public names without a doctest example: {undocumented}"


def test_all_lists_every_public_function_and_class():
    exported = set(train.__all__)
    forgotten = []
    for info in pkgutil.iter_modules(train.__path__):
        module = importlib.import_module(f"jaxrl_llm.train.{info.name}")
        for name, obj in vars(module).items():
            if (
                (inspect.isfunction(obj) or inspect.isclass(obj))
                and obj.__module__ == module.__name__
                and not name.startswith("_")
                and name not in exported
            ):
                forgotten.append(f"{info.name}.{name}")
    assert not forgotten, f"public names missing from jaxrl_llm.train.__all__: {forgotten}"
