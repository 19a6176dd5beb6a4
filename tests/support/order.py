"""The longest test files first, so that `make test`'s workers finish together.

`--dist loadfile` hands each worker whole files in collection order (pytest-xdist's
LoadScopeScheduling: a first batch round-robin, then one file to whichever worker
drains). In alphabetical order the suite's two longest live files (tests/watch: 33 s
and 29 s) came last, and one worker ran them alone for the run's last half minute (7
Dec: 478 s and 453 s of tests on the two workers, 500 s wall). Longest first is the
classic greedy rule for filling two machines (LPT): what is left at the end is short.

The weights are each file's seconds in a past run (`tests/support/weights.json`,
written by `python -m tests.support.report --weights`); a file with none is put among
the middling ones, since new files start small but may start a server. Tests keep their
order within a file: module fixtures are set up once either way. pytest-xdist reorders
the files by their number of tests unless told not to: `make test` passes
`--no-loadscope-reorder`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WEIGHTS = Path(__file__).with_name("weights.json")
UNKNOWN_S = 5.0  # a file no run has timed yet: about the 80th percentile of files


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def load_weights(path: Path = WEIGHTS) -> dict[str, float]:
    try:
        weights = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # no weights: collection order, as pytest found it
    return {str(k): float(v) for k, v in weights.items()}


def longest_first(nodeids: list[str], weights: dict[str, float]) -> list[int]:
    """The items' indices, their files longest first; a file's items in their order."""
    first_seen: dict[str, int] = {}
    for i, nodeid in enumerate(nodeids):
        first_seen.setdefault(file_of(nodeid), i)

    def key(i: int) -> tuple[float, int, int]:
        name = file_of(nodeids[i])
        return (-weights.get(name, UNKNOWN_S), first_seen[name], i)

    return sorted(range(len(nodeids)), key=key)


@pytest.hookimpl(trylast=True)  # after the hooks that filter or rename items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    weights = load_weights()
    if weights:
        order = longest_first([item.nodeid for item in items], weights)
        items[:] = [items[i] for i in order]
