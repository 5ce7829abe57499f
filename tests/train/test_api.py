"""`jaxrl_llm.train`: every public function is exported and documented with a doctest example."""

from __future__ import annotations

import jaxrl_llm.train as train
from tests.public_api import names_missing_from_all, names_without_examples


def test_every_exported_name_has_an_example():
    undocumented = names_without_examples(train)
    assert not undocumented, f"public names without a doctest example: {undocumented}"


def test_all_lists_every_public_function_and_class():
    forgotten = names_missing_from_all(train)
    assert not forgotten, f"public names missing from jaxrl_llm.train.__all__: {forgotten}"
