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
# The suite in three workers on two cores, each test file on one (its module fixtures set
# up once), the longest files first (tests/support/order.py). Three fill the suite's
# waits (processes starting, cameras in real time). They had starved the timing tests
# while models' idle threads spun (718-841 CPU-s a run, one failure in each of three
# runs); with spinning off in the suite (tests/conftest.py) a run took 627 CPU-s, 447 s
# with three workers and none failed (7 Dec, a fresh clone).
# tests/support/durations.py writes where the time went to
# tests/artifacts/durations.json (`make test-report`).
TEST_WORKERS ?= 3
# Bytecode cached even where the environment says not to (PYTHONDONTWRITEBYTECODE, as
# on this build machine): the suite starts hundreds of Python processes (`appliance
# serve`, CLI runs, three workers), and each compiled the project from source, and
# pytest rewrote every test module's asserts again in every worker (14 s of a worker's
# 15 s collection; 6 s with the cache, 7 Dec).
# --no-loadscope-reorder: pytest-xdist would hand out the files with the most tests first,
# whatever their time, and undo tests/support/order.py (one-test files of 30 s came last).
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile \
          --no-loadscope-reorder
N ?= 3

.PHONY: install install-dev run test test-quick test-report test-flakes test-deps lint format bench docs clean

# `make run` installs the appliance alone; `make test` and `make lint` add pytest,
# Playwright (driving Debian's Chromium), mypy, ruff and the rest of the dev extra. The
# README's "Two commands" says how much each downloads, measured on a fresh clone.
install: $(STAMP)

# The venv, with a current pip (`make install` and `make install-dev` alike).
define VENV_READY
	@$(PYTHON) -c 'import sys; sys.exit("Python >= 3.11 is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
endef

$(STAMP): pyproject.toml
	$(VENV_READY)
	$(BIN)/python -m pip install --quiet -e .
	touch $@

install-dev: $(DEV)

# The appliance and the dev extra in one pip run (a second would build the editable
# package and resolve every dependency again: 8 s of a fresh clone's `make test`), not
# compiled at install (--no-compile, 7 s): the suite compiles what it imports, once, as
# it caches bytecode whatever the environment says (PYTEST below).
$(DEV): pyproject.toml
	$(VENV_READY)
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'
	touch $(STAMP) $@

run: install
	$(BIN)/appliance serve --config $(CONFIG)

test-deps:
	sh tests/install_deps.sh

test: install-dev test-deps
	$(PYTEST) $(PYTEST_ARGS)

# The 30 slowest tests of the last `make test` and each folder's total.
test-report: install-dev
	$(BIN)/python -m tests.support.report

# The whole suite N times back to back (the last with a CPU-bound neighbour on one core):
# every test that failed in any run.
test-flakes: install-dev test-deps
	$(BIN)/python -m tests.support.flakes $(N) -- -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The inner loop: every test that needs no server, camera, broker or browser (the compiler,
# blocks, decoders, policy, schemas, statistics), in well under 90 s. tests/support/quick.py
# marks the others `live` and, here, refuses any test that starts a process or a server
# without being marked so.
test-quick: install-dev
	APPLIANCE_TEST_QUICK=1 PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n 2 -m "not live" $(PYTEST_ARGS)

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
