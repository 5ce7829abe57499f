"""`docs/api.md` is in sync with the code, and `docs/gen_api.py` renders stably and fails loudly."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import pytest

from tests.compile_settings import fast_compile_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "docs" / "gen_api.py"
REGENERATE = "docs/api.md is stale or incomplete: regenerate it with `python docs/gen_api.py`"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_api", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_current():
    env = fast_compile_env(JAX_PLATFORMS="cpu", PYTHONHASHSEED="random")
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{REGENERATE}\n{result.stdout}{result.stderr[-8000:]}"


def test_documents_losses_sharding_and_subpackages_with_all(gen):
    discovered = gen.discover_packages()
    assert discovered[:2] == ["losses", "sharding"], discovered
    on_disk = sorted(
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "jaxrl_llm").rglob("__init__.py")
        if "__all__" in init.read_text(encoding="utf-8")
    )
    assert sorted(p for p in discovered if p.startswith("jaxrl_llm")) == on_disk


_SENTINEL = object()


def _sample_function(x, *, dtype=jnp.float32, modes=frozenset({"b", "a", "c"}), sentinel=_SENTINEL):
    return x


def _helper():
    return None


def _sample_with_function_default(x, fn=_helper, rules=(("batch", ("data", "fsdp")),)):
    return x


def test_signature_defaults_render_without_addresses(gen):
    text = gen.render_signature("f", _sample_function, wrap=False)
    assert text == (
        "f(x, *, dtype=jnp.float32, modes=frozenset({'a', 'b', 'c'}), sentinel=<object object>)"
    )
    text = gen.render_signature("g", _sample_with_function_default, wrap=False)
    assert text == f"g(x, fn={__name__}._helper, rules=(('batch', ('data', 'fsdp')),))"


def test_known_constants_and_dataclass_factories(gen):
    rules = (("batch", "data"), ("embed", None))

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Config:
        """A config."""

        names: list = dataclasses.field(default_factory=list)
        size: int = 3

    def sharded(x, *, rules=rules):
        return x

    assert gen.render_signature("sharded", sharded, known={id(rules): "pkg.RULES"}) == (
        "sharded(x, *, rules=pkg.RULES)"
    )
    assert (
        gen.render_signature("Config", Config) == "Config(*, names: list = list(), size: int = 3)"
    )


def test_long_signatures_wrap_one_parameter_per_line(gen):
    def many(first_argument, second_argument, *, third_keyword=1.0, fourth_keyword="token_mean"):
        return first_argument

    text = gen.render_signature("a_function_with_a_long_name", many)
    assert text.splitlines() == [
        "a_function_with_a_long_name(",
        "    first_argument,",
        "    second_argument,",
        "    *,",
        "    third_keyword=1.0,",
        "    fourth_keyword='token_mean',",
        ")",
    ]


def test_first_paragraph_joins_lines(gen):
    doc = "Summary line\ncontinues here.\n\n    formula = 1\n"
    assert gen.first_paragraph(doc) == "Summary line continues here."
    assert gen.first_paragraph(None) == ""


@pytest.fixture
def fake_packages(tmp_path, monkeypatch):
    """Three throwaway packages: one fine, one that fails to import, one with a bad `__all__`."""
    packages = {
        "apidoc_good": '"""A fine package."""\n\n'
        "from apidoc_good.core import scale\n\n"
        "LIMITS = (1, 2)\n"
        '__all__ = ["LIMITS", "scale"]\n',
        "apidoc_broken": 'raise RuntimeError("boom at import")\n__all__ = []\n',
        "apidoc_undefined": '__all__ = ["missing_name"]\n',
    }
    for name, init in packages.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(init)
    (tmp_path / "apidoc_good" / "core.py").write_text(
        "def scale(x, *, factor=2.0):\n"
        '    """Multiply `x` by `factor`.\n\n    More detail that is not shown.\n    """\n'
        "    return x * factor\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield list(packages)
    for name in list(sys.modules):
        if name.split(".")[0] in packages:
            del sys.modules[name]


def test_failing_packages_are_reported_not_raised(gen, fake_packages):
    text, failures = gen.build(fake_packages)
    reasons = {f.package: f.reason for f in failures}
    assert reasons == {
        "apidoc_broken": "import failed: RuntimeError: boom at import",
        "apidoc_undefined": "`__all__` names undefined attributes: ['missing_name']",
    }
    assert "## Package `apidoc_good`" in text
    assert "### `apidoc_good.core`" in text
    assert "scale(x, *, factor=2.0)" in text
    assert "Multiply `x` by `factor`." in text and "More detail" not in text
    assert "LIMITS: tuple = (1, 2)" in text
    assert "## Packages that could not be documented" in text
    assert "- `apidoc_broken`: import failed: RuntimeError: boom at import" in text


def test_main_exits_1_on_import_failure_and_on_a_stale_file(
    gen, fake_packages, tmp_path, monkeypatch
):
    messages: list[str] = []
    output = tmp_path / "api.md"
    monkeypatch.setattr(gen, "discover_packages", lambda: ["apidoc_good"])
    assert gen.main(["--output", str(output)], report=messages.append) == 0
    assert gen.main(["--check", "--output", str(output)], report=messages.append) == 0

    output.write_text(output.read_text().replace("Multiply", "Divide"))
    messages.clear()
    assert gen.main(["--check", "--output", str(output)], report=messages.append) == 1
    assert "1 line(s) to add, 1 to remove" in messages[0]
    assert "python docs/gen_api.py" in messages[-1]

    monkeypatch.setattr(gen, "discover_packages", lambda: ["apidoc_good", "apidoc_broken"])
    messages.clear()
    assert gen.main(["--output", str(output)], report=messages.append) == 1
    assert any("cannot document `apidoc_broken`" in m for m in messages)


def test_constants_render_compactly(gen):
    assert gen.render_constant("D", {"b": 1, "a": print}) == "D: dict  # keys: 'b', 'a'"
    assert gen.render_constant("AXES", ("data", "fsdp")) == "AXES: tuple = ('data', 'fsdp')"
    rules = tuple((f"logical_axis_{i}", ("data", "fsdp")) for i in range(4))
    assert gen.render_constant("RULES", rules).splitlines() == [
        "RULES: tuple = (",
        *[f"    ('logical_axis_{i}', ('data', 'fsdp'))," for i in range(4)],
        ")",
    ]
    names = [f"name_{i:02d}" for i in range(12)]
    lines = gen.render_constant("NAMES", names).splitlines()
    assert lines[0] == "NAMES: list = [" and lines[-1] == "]"
    assert (
        " ".join(line.strip() for line in lines[1:-1]) == ", ".join(f"'{n}'" for n in names) + ","
    )
    assert all(len(line) <= 88 for line in lines)
