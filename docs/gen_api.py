"""Generate `docs/api.md`, the API reference, from the packages' `__all__` and docstrings.

    python docs/gen_api.py            # rewrite docs/api.md
    python docs/gen_api.py --check    # exit 1 (with a diff summary) if docs/api.md is stale

Documented packages: `losses`, `sharding` and every package under `jaxrl_llm/` (nested ones
included) whose `__init__.py` assigns `__all__`. They are found on disk, so a new subpackage
appears in the reference as soon as it declares `__all__`. Only the package `__init__` modules
are imported (never a submodule on its own), so optional heavy dependencies that the packages
import lazily stay unimported.

For each package the reference lists every public (non-dunder) name of `__all__`, grouped by the
module it is imported from, with its signature and the first paragraph of its docstring, after a
table of contents. The output is deterministic: names and modules are sorted, default values are
rendered without memory addresses (`jnp.float32`, `<function f>`), sets are sorted, and long
constants are shortened.

A package that fails to import, or whose `__all__` names something it does not define, is
reported on stderr and in the document, and the script exits with status 1 (also when writing).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import enum
import importlib
import inspect
import re
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "api.md"
ROOT_PACKAGES = ("losses", "sharding", "jaxrl_llm")

MAX_CONSTANT_CHARS = 240
MAX_CONSTANT_ITEMS = 40
MAX_ONE_LINE_SIGNATURE = 88
MAX_DEFAULT_CHARS = 80
_ADDRESS = re.compile(r"\s+at\s+0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")
_FORWARD_REF = re.compile(r"ForwardRef\('([^']*)'[^)]*\)")
_MODULE_ALIASES = (("jax.numpy.", "jnp."), ("numpy.", "np."))


class PackageFailure(NamedTuple):
    """A package that could not be documented, and why (one line)."""

    package: str
    reason: str


class Entry(NamedTuple):
    """One public name: where it is defined, its rendered signature and docstring summary."""

    name: str
    module: str
    signature: str
    summary: str
    members: tuple[tuple[str, str, str], ...]  # (name, one-line signature, summary) per member
    constant: bool  # not a function or class (its summary comes from a comment, if any)


class PackageDoc(NamedTuple):
    """The documented public names of one package."""

    package: str
    summary: str
    entries: tuple[Entry, ...]


# --------------------------------------------------------------------------- discovery


def _assigns_all(init_file: Path) -> bool:
    """Whether a package `__init__.py` assigns `__all__` at top level (read, not imported)."""
    tree = ast.parse(init_file.read_text(encoding="utf-8"), filename=str(init_file))
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return True
    return False


def discover_packages(root: Path = ROOT, roots: Iterable[str] = ROOT_PACKAGES) -> list[str]:
    """Packages under `roots` whose `__init__.py` assigns `__all__`: roots in order, each sorted."""
    found = []
    for top in roots:
        packages = []
        for init_file in (root / top).rglob("__init__.py"):
            rel = init_file.parent.relative_to(root)
            if any(part.startswith((".", "_")) for part in rel.parts):
                continue
            if _assigns_all(init_file):
                packages.append(".".join(rel.parts))
        found += sorted(packages)
    return found


def import_sources(package: str, init_file: Path) -> dict[str, str]:
    """Map each name imported by `from X import name` in a package `__init__` to `X`."""
    tree = ast.parse(init_file.read_text(encoding="utf-8"), filename=str(init_file))
    sources: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            module = ".".join([*base, node.module] if node.module else base)
        else:
            module = node.module or package
        for alias in node.names:
            sources[alias.asname or alias.name] = module
    return sources


# --------------------------------------------------------------------------- rendering values


def _qualified_name(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or ""
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))
    name = f"{module}.{qualname}" if module and module != "builtins" else qualname
    for prefix, alias in _MODULE_ALIASES:
        if name.startswith(prefix):
            return alias + name[len(prefix) :]
    return name


def stable_repr(value: Any) -> str:
    """A repr of `value` that is the same in every process (no addresses, sorted sets)."""
    if value is None or isinstance(value, bool | int | float | complex | str | bytes):
        return repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, type | types.FunctionType | types.BuiltinFunctionType | types.ModuleType):
        if isinstance(value, types.ModuleType):
            return value.__name__
        return _qualified_name(value)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        inner = ", ".join(stable_repr(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(stable_repr(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{stable_repr(k)}: {stable_repr(v)}" for k, v in value.items()) + "}"
        )
    if isinstance(value, set | frozenset):
        items = sorted(stable_repr(v) for v in value)
        if not items:
            return "set()" if isinstance(value, set) else "frozenset()"
        body = "{" + ", ".join(items) + "}"
        return body if isinstance(value, set) else f"frozenset({body})"
    return _ADDRESS.sub("", repr(value))


def _shorten(text: str, limit: int = MAX_CONSTANT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _annotation(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    text = _FORWARD_REF.sub(r"\1", inspect.formatannotation(annotation))
    return _ADDRESS.sub("", text)


def _factory_defaults(obj: Any) -> dict[str, str]:
    """Dataclass fields with a `default_factory`, rendered as `Factory()`."""
    cls = obj if inspect.isclass(obj) else None
    if cls is None or not dataclasses.is_dataclass(cls):
        return {}
    return {
        f.name: f"{stable_repr(f.default_factory)}()"
        for f in dataclasses.fields(cls)
        if f.default_factory is not dataclasses.MISSING
    }


def _default(value: Any, known: dict[int, str]) -> str:
    """A default value: a documented constant by its name, else its stable repr (shortened)."""
    if id(value) in known and not isinstance(value, str | int | float | bool):
        return known[id(value)]
    return _shorten(stable_repr(value), MAX_DEFAULT_CHARS)


def _parameter(param: inspect.Parameter, factories: dict[str, str], known: dict[int, str]) -> str:
    text = param.name
    if param.kind is inspect.Parameter.VAR_POSITIONAL:
        text = "*" + text
    elif param.kind is inspect.Parameter.VAR_KEYWORD:
        text = "**" + text
    if param.annotation is not inspect.Parameter.empty:
        text += f": {_annotation(param.annotation)}"
    if param.default is not inspect.Parameter.empty:
        default = factories.get(param.name) or _default(param.default, known)
        text += (
            f" = {default}" if param.annotation is not inspect.Parameter.empty else f"={default}"
        )
    return text


def _hides_init(signature: inspect.Signature, cls: type) -> bool:
    """`(*args, **kwargs)` from a metaclass `__call__` (e.g. Flax NNX) over a real `__init__`."""
    kinds = [p.kind for p in signature.parameters.values()]
    generic = kinds == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]
    return generic and cls.__init__ is not object.__init__


def render_signature(
    name: str,
    obj: Any,
    *,
    wrap: bool = True,
    skip_self: bool = False,
    known: dict[int, str] | None = None,
) -> str:
    """`name(params) -> ret`; one parameter per line when longer than a line and `wrap`.

    Objects without a signature render as `class Name(Bases)` (classes) or the bare name;
    `skip_self` drops the first parameter (methods looked up on their class); `known` names
    default values that are documented constants (`id(value)` → `"sharding.LOGICAL_AXIS_RULES"`).
    """
    known = known or {}
    try:
        signature = inspect.signature(obj)
        if inspect.isclass(obj) and _hides_init(signature, obj):
            signature = inspect.signature(obj.__init__)
            skip_self = True
    except (TypeError, ValueError):
        if inspect.isclass(obj):
            bases = ", ".join(_qualified_name(b) for b in obj.__bases__ if b is not object)
            return f"class {name}({bases})" if bases else f"class {name}"
        return name
    factories = _factory_defaults(obj)
    parts: list[str] = []
    params = list(signature.parameters.values())[1 if skip_self else 0 :]
    for i, param in enumerate(params):
        kind = param.kind
        previous = params[i - 1].kind if i else None
        if kind is inspect.Parameter.KEYWORD_ONLY and previous not in (
            inspect.Parameter.KEYWORD_ONLY,
            inspect.Parameter.VAR_POSITIONAL,
        ):
            parts.append("*")
        parts.append(_parameter(param, factories, known))
        following = params[i + 1].kind if i + 1 < len(params) else None
        if (
            kind is inspect.Parameter.POSITIONAL_ONLY
            and following is not inspect.Parameter.POSITIONAL_ONLY
        ):
            parts.append("/")
    returns = ""
    if signature.return_annotation is not inspect.Signature.empty and not inspect.isclass(obj):
        returns = f" -> {_annotation(signature.return_annotation)}"
    one_line = f"{name}({', '.join(parts)}){returns}"
    if not wrap or len(one_line) <= MAX_ONE_LINE_SIGNATURE:
        return one_line
    body = "".join(f"    {part},\n" for part in parts)
    return f"{name}(\n{body}){returns}"


def _fill(words: list[str], width: int) -> list[str]:
    """Pack `words` greedily into indented lines of at most `width` characters."""
    lines: list[str] = []
    for word in words:
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append("    " + word)
    return lines


def render_constant(name: str, value: Any) -> str:
    """`NAME: type = value` for non-callable names.

    Dicts show their keys only; long tuples and lists are spread over lines (scalars filled,
    other items one per line; at most `MAX_CONSTANT_ITEMS` lines); anything else is shortened
    to `MAX_CONSTANT_CHARS`.
    """
    kind = type(value).__name__
    if isinstance(value, dict):
        keys = ", ".join(stable_repr(k) for k in value)
        return _shorten(f"{name}: dict  # keys: {keys}")
    one_line = f"{name}: {kind} = {stable_repr(value)}"
    if len(one_line) <= MAX_ONE_LINE_SIGNATURE or not isinstance(value, tuple | list):
        return _shorten(one_line)
    items = [f"    {_shorten(stable_repr(v), MAX_ONE_LINE_SIGNATURE)}," for v in value]
    if all(isinstance(v, str | int | float) for v in value):  # scalars: fill the lines
        items = _fill([item.strip() for item in items], width=MAX_ONE_LINE_SIGNATURE)
    if len(items) > MAX_CONSTANT_ITEMS:
        items = [*items[:MAX_CONSTANT_ITEMS], f"    # ... {len(items) - MAX_CONSTANT_ITEMS} more"]
    brackets = "()" if isinstance(value, tuple) else "[]"
    return "\n".join([f"{name}: {kind} = {brackets[0]}", *items, brackets[1]])


# --------------------------------------------------------------------------- docstrings


def _own_doc(obj: Any) -> str | None:
    """The object's own docstring (not a base class's, not dataclass/NamedTuple boilerplate)."""
    if inspect.isclass(obj):
        doc = vars(obj).get("__doc__")
        if not isinstance(doc, str):
            return None
        if doc.startswith(f"{obj.__name__}(") and (
            dataclasses.is_dataclass(obj) or hasattr(obj, "_fields")
        ):
            return None  # generated by @dataclass / NamedTuple
        return inspect.cleandoc(doc)
    if _is_function_like(obj) or isinstance(obj, property):
        doc = getattr(obj, "__doc__", None)
        return inspect.cleandoc(doc) if isinstance(doc, str) else None
    return None


def first_paragraph(doc: str | None) -> str:
    """The docstring's first paragraph on one line ("" if none)."""
    if not doc:
        return ""
    paragraph = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def _is_function_like(obj: Any) -> bool:
    return inspect.isroutine(obj) or (callable(obj) and hasattr(obj, "__wrapped__"))


def _class_members(cls: type, known: dict[int, str]) -> tuple[tuple[str, str, str], ...]:
    """Public methods and properties defined in the class body (plus `__call__`)."""
    members = []
    for attr, raw in sorted(vars(cls).items()):
        if attr.startswith("_") and attr != "__call__":
            continue
        wrapped = isinstance(raw, classmethod | staticmethod)
        func = raw.__func__ if wrapped else raw
        if isinstance(func, property):
            members.append((attr, attr, first_paragraph(_own_doc(func))))
        elif inspect.isfunction(func):
            target = getattr(cls, attr) if wrapped else func
            signature = render_signature(
                attr, target, wrap=False, skip_self=not wrapped, known=known
            )
            members.append((attr, signature, first_paragraph(_own_doc(func))))
    return tuple(members)


# --------------------------------------------------------------------------- packages


def _public_module(module: Any, package: str) -> str:
    """`module` cut before its first private part (`a._b.c` → `a`); `package` if foreign."""
    if not isinstance(module, str) or module.split(".")[0] != package.split(".")[0]:
        return package
    parts = module.split(".")
    cut = next((i for i, part in enumerate(parts) if part.startswith("_")), len(parts))
    return ".".join(parts[:cut]) or package


def import_package(package: str) -> types.ModuleType | PackageFailure:
    """Import a package and check its `__all__`; a failure is returned, never raised."""
    try:
        module = importlib.import_module(package)
    except Exception as error:  # any import-time failure is reported, not raised
        message = str(error).strip().splitlines()
        reason = f"{type(error).__name__}: {message[0] if message else ''}".rstrip(": ")
        return PackageFailure(package, f"import failed: {reason}")
    names = getattr(module, "__all__", None)
    if names is None:
        return PackageFailure(package, "has no `__all__`")
    missing = sorted(n for n in names if not hasattr(module, n))
    if missing:
        return PackageFailure(package, f"`__all__` names undefined attributes: {missing}")
    return module


def _public_names(module: types.ModuleType) -> list[str]:
    return [n for n in module.__all__ if not (n.startswith("__") and n.endswith("__"))]


def known_constants(modules: Iterable[types.ModuleType]) -> dict[int, str]:
    """`id(value)` → `"package.NAME"` for the container constants the packages export.

    Signatures then show `rules=sharding.LOGICAL_AXIS_RULES` instead of a long tuple. The first
    package (in documentation order) that exports an object names it.
    """
    known: dict[int, str] = {}
    for module in modules:
        for name in _public_names(module):
            value = getattr(module, name)
            if isinstance(value, tuple | list | dict | set | frozenset):
                known.setdefault(id(value), f"{module.__name__}.{name}")
    return known


def _constant_doc(module_name: str, name: str) -> str | None:
    """The comment block right above `name = ...` in its module, or a string right after it."""
    source_file = getattr(sys.modules.get(module_name), "__file__", None)
    if not source_file or not source_file.endswith(".py"):
        return None
    source = Path(source_file).read_text(encoding="utf-8")
    tree = ast.parse(source)
    lines = source.splitlines()
    for index, node in enumerate(tree.body):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue
        following = tree.body[index + 1] if index + 1 < len(tree.body) else None
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            return inspect.cleandoc(following.value.value)
        comment: list[str] = []
        line = node.lineno - 2
        while line >= 0 and lines[line].lstrip().startswith("#"):
            comment.insert(0, lines[line].lstrip().lstrip("#:").strip())
            line -= 1
        return "\n".join(comment) or None
    return None


def document_package(module: types.ModuleType, known: dict[int, str]) -> PackageDoc:
    """Document the public names of an imported package (see `import_package`)."""
    package = module.__name__
    init_file = getattr(module, "__file__", None)
    sources = import_sources(package, Path(init_file)) if init_file else {}
    entries = []
    for name in _public_names(module):
        obj = getattr(module, name)
        source = sources.get(name, package if name in vars(module) else None)
        owner = _public_module(source or getattr(obj, "__module__", None), package)
        constant = not (inspect.isclass(obj) or _is_function_like(obj))
        if constant:
            signature, members = render_constant(name, obj), ()
            doc = _constant_doc(source or package, name)
        else:
            signature = render_signature(name, obj, known=known)
            members = _class_members(obj, known) if inspect.isclass(obj) else ()
            doc = _own_doc(obj)
        entries.append(Entry(name, owner, signature, first_paragraph(doc), members, constant))
    entries.sort(key=lambda e: (e.module, e.name.lower(), e.name))
    return PackageDoc(package, first_paragraph(inspect.getdoc(module)), tuple(entries))


# --------------------------------------------------------------------------- markdown


class _Slugger:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to '-', deduplicated."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, heading: str) -> str:
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = self.seen.get(slug, 0)
        self.seen[slug] = count + 1
        return slug if count == 0 else f"{slug}-{count}"


def _home_package(entry: Entry, package: str, documented: dict[str, set[str]]) -> str:
    """The most specific *other* documented package that defines `entry` (or `package`).

    A name that a package re-exports from a documented subpackage (or sibling) is documented
    once, where it lives, and only linked from the re-exporting package.
    """
    best = package
    for other, names in documented.items():
        inside = entry.module == other or entry.module.startswith(other + ".")
        if other != package and inside and entry.name in names and len(other) > len(best):
            best = other
    return best


def _entry_markdown(entry: Entry) -> list[str]:
    lines = [f"#### `{entry.name}`", "", "```text", entry.signature, "```", ""]
    if entry.summary or not entry.constant:
        lines += [entry.summary or "*No docstring.*", ""]
    for _, signature, summary in entry.members:
        lines.append(f"- `{signature}`: {summary}" if summary else f"- `{signature}`")
    if entry.members:
        lines.append("")
    return lines


def render_markdown(docs: list[PackageDoc], failures: list[PackageFailure]) -> str:
    """The whole `docs/api.md` text."""
    documented = {doc.package: {e.name for e in doc.entries} for doc in docs}
    # Pass 1: anchors of every heading, in document order (GitHub numbers duplicates in order).
    slugger = _Slugger()
    slugger("API reference")
    slugger("Contents")
    anchors: dict[tuple[str, ...], str] = {}
    own: dict[str, list[Entry]] = {}
    for doc in docs:
        anchors[(doc.package,)] = slugger(f"Package {doc.package}")
        own[doc.package] = [
            e for e in doc.entries if _home_package(e, doc.package, documented) == doc.package
        ]
        for module in sorted({e.module for e in own[doc.package]}):
            anchors[(doc.package, module)] = slugger(module)
            for entry in own[doc.package]:
                if entry.module == module:
                    anchors[(doc.package, "", entry.name)] = slugger(entry.name)
    failure_anchor = slugger("Packages that could not be documented")

    def link(package: str, entry: Entry) -> str:
        return f"[`{entry.name}`](#{anchors[(package, '', entry.name)]})"

    # Pass 2: table of contents and body.
    toc: list[str] = []
    body: list[str] = []
    for doc in docs:
        entries = own[doc.package]
        reexports = [e for e in doc.entries if e not in entries]
        count = f"{len(entries)} names" + (f", {len(reexports)} re-exported" if reexports else "")
        toc.append(f"- [`{doc.package}`](#{anchors[(doc.package,)]}) ({count})")
        body += [f"## Package `{doc.package}`", "", doc.summary, ""]
        if reexports:
            by_home = sorted(reexports, key=lambda e: (e.name.lower(), e.name))
            links = ", ".join(link(_home_package(e, doc.package, documented), e) for e in by_home)
            body += [f"Also re-exports (documented where they are defined): {links}.", ""]
        for module in sorted({e.module for e in entries}):
            module_entries = [e for e in entries if e.module == module]
            links = ", ".join(link(doc.package, e) for e in module_entries)
            toc.append(f"  - [`{module}`](#{anchors[(doc.package, module)]}): {links}")
            body += [f"### `{module}`", ""]
            for entry in module_entries:
                body += _entry_markdown(entry)
    if failures:
        toc.append(f"- [Packages that could not be documented](#{failure_anchor})")
        body += ["## Packages that could not be documented", ""]
        body += [f"- `{f.package}`: {f.reason}" for f in failures]
        body.append("")
    header = [
        "# API reference",
        "",
        "<!-- Generated by `python docs/gen_api.py` from `__all__` and the docstrings; do not edit",
        "     by hand. `python docs/gen_api.py --check` (run by tests/test_api_docs.py) fails when",
        "     this file is stale. -->",
        "",
        "Every public name of `losses`, `sharding` and the `jaxrl_llm` subpackages, grouped by the",
        "module that defines it, with its signature and the first paragraph of its docstring. The",
        "full docstrings (formulas, papers, shapes, examples) are one `help(name)` away;",
        "[algorithms.md](algorithms.md) groups the `losses` functions by concept.",
        "",
        "## Contents",
        "",
        *toc,
        "",
    ]
    text = "\n".join(header + body)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.rstrip("\n") + "\n"


def build(packages: Iterable[str] | None = None) -> tuple[str, list[PackageFailure]]:
    """Document `packages` (default: the discovered ones); returns the text and the failures."""
    modules: list[types.ModuleType] = []
    failures: list[PackageFailure] = []
    for package in discover_packages() if packages is None else packages:
        result = import_package(package)
        if isinstance(result, PackageFailure):
            failures.append(result)
        else:
            modules.append(result)
    known = known_constants(modules)
    docs = [document_package(module, known) for module in modules]
    return render_markdown([d for d in docs if d.entries], failures), failures


def _diff_summary(old: str, new: str, path: Path, max_lines: int = 40) -> str:
    diff = list(
        difflib.unified_diff(
            old.splitlines(),
            new.splitlines(),
            f"{path} (on disk)",
            f"{path} (generated)",
            n=0,
            lineterm="",
        )
    )
    added = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
    shown = "\n".join(diff[:max_lines])
    more = f"\n... ({len(diff) - max_lines} more diff lines)" if len(diff) > max_lines else ""
    return f"{path} is stale: {added} line(s) to add, {removed} to remove.\n{shown}{more}"


def main(argv: list[str] | None = None, report: Callable[[str], None] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="markdown file to write")
    args = parser.parse_args(argv)
    say = report or (lambda message: print(message, file=sys.stderr))

    text, failures = build()
    for failure in failures:
        say(f"gen_api: cannot document `{failure.package}`: {failure.reason}")
    status = 1 if failures else 0
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            say(_diff_summary(current, text, args.output))
            say("Regenerate it with `python docs/gen_api.py`.")
            status = 1
        return status
    args.output.write_text(text, encoding="utf-8")
    say(f"gen_api: wrote {args.output} ({len(text.splitlines())} lines)")
    return status


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
