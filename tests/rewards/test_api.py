"""Public surface of `jaxrl_llm.rewards` and `jaxrl_llm.data`: exported, documented, light."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

PACKAGES = ("jaxrl_llm.rewards", "jaxrl_llm.data")


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_name_has_a_doctest_example(name):
    package = importlib.import_module(name)
    undocumented = []
    for attr in package.__all__:
        obj = getattr(package, attr)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            doc = inspect.getdoc(obj) or ""
            if "Examples:" not in doc or ">>>" not in doc:
                undocumented.append(attr)
    assert not undocumented, f"{name}: public names without a doctest example: {undocumented}"


@pytest.mark.parametrize("name", PACKAGES)
def test_all_lists_every_public_function_of_its_modules(name):
    package = importlib.import_module(name)
    forgotten = []
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith(f"{name}.") or module_name.rsplit(".", 1)[-1].startswith("_"):
            continue
        for attr, obj in vars(module).items():
            unexported = not attr.startswith("_") and attr not in package.__all__
            if unexported and inspect.isfunction(obj) and obj.__module__ == module_name:
                forgotten.append(f"{module_name}.{attr}")
    assert not forgotten, f"public functions missing from {name}.__all__: {forgotten}"


def test_data_imports_no_optional_or_heavy_dependency():
    code = (
        "import sys, jaxrl_llm.data; "
        "print(sorted(m for m in ('tensorflow_datasets', 'tensorflow', 'pyarrow', 'jax', 'torch') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
