"""`jaxrl_llm.runner`: every public function and class is exported and has a doctest example."""

from __future__ import annotations

import jaxrl_llm.runner as runner
from tests.public_api import names_missing_from_all, names_without_examples


def test_every_exported_name_has_an_example():
    undocumented = names_without_examples(runner)
    assert not undocumented, f"public names without a doctest example: {undocumented}"


def test_all_lists_every_public_function_and_class():
    forgotten = names_missing_from_all(runner)
    assert not forgotten, f"public names missing from jaxrl_llm.runner.__all__: {forgotten}"
