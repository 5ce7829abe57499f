"""The algorithm feature pages (`docs/algorithms/*.md`) stay in sync with `losses`."""

from __future__ import annotations

import inspect
import pathlib
import re

import losses

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def _pages() -> str:
    return "".join(p.read_text() for p in sorted((DOCS / "algorithms").glob("*.md")))


def test_every_public_losses_function_is_in_the_feature_pages():
    text = _pages()
    missing = [
        name
        for name in losses.__all__
        if inspect.isfunction(getattr(losses, name)) and f"`{name}" not in text
    ]
    assert not missing, f"add these functions to docs/algorithms/*.md: {missing}"


def test_the_index_links_every_page_and_every_link_resolves():
    index = (DOCS / "algorithms.md").read_text()
    linked = set(re.findall(r"\(algorithms/([a-z_]+)\.md\)", index))
    pages = {p.stem for p in (DOCS / "algorithms").glob("*.md")}
    assert linked == pages, f"index links {sorted(linked)}, pages are {sorted(pages)}"
