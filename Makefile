# The two commands: `make run` (the embedded demo) and `make test` (the whole suite).
# Everything they need is installed here; nothing relies on a hand-installed package.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# What running needs (pyproject's dependencies), and what tests, lint and benches need
# on top (its dev extra): one stamp each.
STAMP  := $(VENV)/.installed
DEV    := $(VENV)/.installed-dev
CONFIG ?= configs/demo.yaml
PYTEST_ARGS ?=

.PHONY: install install-dev run test test-deps lint format bench docs clean

# `make run` installs the appliance alone; `make test` and `make lint` add pytest,
# Playwright (driving Debian's Chromium), mypy, ruff and the rest of the dev extra. The
# README's "Two commands" says how much each downloads, measured on a fresh clone.
install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python >= 3.11 is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $@

install-dev: $(DEV)

$(DEV): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

run: install
	$(BIN)/appliance serve --config $(CONFIG)

test-deps:
	sh tests/install_deps.sh

test: install-dev test-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install-dev test-deps  # bench/sink_overhead.py runs a real mosquitto
	@for script in bench/[!_]*.py; do echo "== $$script"; $(BIN)/python $$script --quick || exit 1; done
	$(BIN)/python bench/_figures.py --check

docs: install-dev  # the measured figures in README.md and docs/ from bench/results/*.json
	$(BIN)/python bench/_figures.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache tests/.cache traces
