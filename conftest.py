"""Root pytest configuration: modules that must not be imported by --doctest-modules."""

collect_ignore = ["jaxrl_llm/__main__.py", "setup.py", ".venv"]
