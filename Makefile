# The two commands: `make run` (the embedded demo) and `make test` (the whole suite).
# Everything they need is installed here; nothing relies on a hand-installed package.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= configs/demo.yaml
PYTEST_ARGS ?=

.PHONY: install run test test-deps lint format bench docs clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python >= 3.11 is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

run: install
	$(BIN)/appliance serve --config $(CONFIG)

test-deps:
	sh tests/install_deps.sh

test: install test-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install test-deps  # bench/sink_overhead.py runs a real mosquitto
	@for script in bench/[!_]*.py; do echo "== $$script"; $(BIN)/python $$script --quick || exit 1; done
	$(BIN)/python bench/_figures.py --check

docs: install  # the measured figures in README.md and docs/ from bench/results/*.json
	$(BIN)/python bench/_figures.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache tests/.cache traces
