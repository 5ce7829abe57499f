"""Every notebook in `notebooks/` runs top to bottom (code cells executed in order, offline)."""

from __future__ import annotations

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, capsys):
    notebook = json.loads(path.read_text())
    assert notebook["nbformat"] == 4
    namespace: dict = {"__name__": "__notebook__"}
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        assert not cell.get("outputs"), (
            f"{path.name} cell {index}: commit notebooks without outputs"
        )
        source = "".join(cell["source"])
        exec(compile(source, f"{path.name}[cell {index}]", "exec"), namespace)
    assert capsys.readouterr().out, f"{path.name} printed nothing"
