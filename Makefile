# Quick start: `make demo` runs the demo on embedded defaults; `make test` runs the tests.
# Each target creates .venv (Python 3.11+) and installs into it what that target needs
# (the extras of pyproject.toml), once.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

# What each target installs: the product plus these extras.
EXTRAS_demo     := embedded
EXTRAS_test     := test
EXTRAS_lint     := lint
EXTRAS_bench    := bench

.PHONY: demo test lint bench mutation up clean

$(VENV)/.installed-%: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is needed, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# uv resolves and installs these extras in about 15 s where pip takes over 3 minutes
	# (measured on the CI machine); pip is the fallback when uv cannot be had.
	( $(BIN)/python -m pip install --quiet uv \
	  && $(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[$(EXTRAS_$*)]" ) \
	|| ( $(BIN)/python -m pip install --quiet --upgrade pip \
	  && $(BIN)/python -m pip install --quiet -e ".[$(EXTRAS_$*)]" )
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/python -m devtools demo

up: $(VENV)/.installed-demo
	$(BIN)/python -m devtools up

test: $(VENV)/.installed-test
	$(BIN)/pytest -q -n 4 --dist worksteal

lint: $(VENV)/.installed-lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(VENV)/.installed-bench
	$(BIN)/python -m bench.intake

# The mutation score of the modules that carry the guarantees: it measures the tests,
# not speed (about 30 minutes on two cores; `--module NAME` runs one). See
# devtools/mutation.py.
mutation: $(VENV)/.installed-bench $(VENV)/.installed-test
	$(BIN)/python -m devtools.mutation

clean:
	rm -rf $(VENV) .tool-dispatcher .pytest_cache .mypy_cache .ruff_cache
