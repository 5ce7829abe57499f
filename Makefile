# Two commands: `make demo` (the main job) and `make test` (lint + the test suite without its
# extended cases; `make test-all` runs those too: tests/extended.py).
# Each target creates .venv and installs the project into it when it is missing or when
# pyproject.toml changed since the last install.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_WORKERS ?= 2

.PHONY: demo test test-all lint format bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "jaxrl_llm needs Python >= 3.11, found " + sys.version'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m jaxrl_llm demo

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -q -m "not extended"

test-all: lint
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -q

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
