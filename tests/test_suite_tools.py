"""The suite's own tools: `make test-report` and `make test-flakes`' summary read the
durations files the plugin (tests/support/durations.py) writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import nodeids
from tests.support import order as order_plugin
from tests.support.flakes import summarise
from tests.support.report import file_weights, render


def entry(call: float, outcome: str = "passed", **extra: Any) -> dict[str, Any]:
    return {"setup": 0.5, "call": call, "teardown": 0.0, "outcome": outcome, **extra}


def write(path: Path, tests: dict[str, dict[str, Any]], wall: float = 10.0) -> Path:
    doc = {"wall_s": wall, "workers": 2, "exitstatus": 0, "tests": tests}
    path.write_text(json.dumps(doc))
    return path


def test_the_report_ranks_tests_and_sums_folders() -> None:
    tests = {
        "tests/a/test_x.py::test_slow": entry(4.0, cpu_s=3.0),
        "tests/a/test_x.py::test_fast": entry(0.1, cpu_s=0.1),
        "tests/test_top.py::test_mid": entry(1.0, outcome="failed"),
    }
    runs = [{"file": "d.json", "wall_s": 10.0, "workers": 2, "exitstatus": 1}]
    text = render(tests, runs, top=2)
    slowest = text.split("2 slowest tests")[1].split("\n\n")[0].splitlines()[2:]
    assert [line.split()[-1] for line in slowest] == [
        "tests/a/test_x.py::test_slow",
        "tests/test_top.py::test_mid",
    ]
    assert "   5.1      3.1      2  tests/a" in text  # 4.5 + 0.6 s, 3.0 + 0.1 s of CPU
    assert "   1.5      0.0      1  tests\n" in text
    assert "failed: tests/test_top.py::test_mid" in text


def test_the_flakes_summary_lists_every_test_that_failed_in_any_run(tmp_path: Path) -> None:
    one = write(tmp_path / "1.json", {"t::a": entry(1.0), "t::b": entry(1.0, "failed")})
    two = write(tmp_path / "2.json", {"t::a": entry(1.0, "error in setup")})
    text, code = summarise([one, two, tmp_path / "never-written.json"], neighbour_run=2)
    assert code == 1
    assert "run 2 (with a CPU-bound neighbour on one core): 10 s, 1 tests, 1 not passed" in text
    assert "run 3: no durations file (pytest did not finish)" in text
    assert "runs 1: t::b\n" in text and "runs 2: t::a\n" in text
    assert "runs 2: t::b (missing)" in text
    assert "runs 3: (the whole run)" in text


def test_clean_runs_say_so(tmp_path: Path) -> None:
    runs = [write(tmp_path / f"{k}.json", {"t::a": entry(1.0)}) for k in (1, 2)]
    text, code = summarise(runs, neighbour_run=2)
    assert code == 0 and text.endswith("no test failed in any of the 2 runs")


@pytest.mark.live  # a pytest of its own, unless this session collected the module
def test_each_api_operation_is_a_test_of_its_own(request: pytest.FixtureRequest) -> None:
    """schemathesis's items get their operation in their id (tests/support/nodeids.py):
    with one shared id, `pytest -n 2 --dist loadfile` ran one operation of 47. Collected
    only: xdist hands out tests by these ids. The ids are this session's own when it
    collected the module (`make test`: every worker collects every test), else those of
    a `pytest --collect-only` of it."""
    test = "tests/server/test_openapi.py::test_the_server_keeps_to_its_document"
    ids = [item.nodeid for item in request.session.items if item.nodeid.startswith(test)]
    if not ids:
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only"]
        argv += ["tests/server/test_openapi.py", "-k", "keeps_to_its_document"]
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:]
        ids = [line for line in done.stdout.splitlines() if line.startswith(test)]
    assert f"{test}[GET /health]" in ids and f"{test}[POST /v1/streams]" in ids
    assert len(ids) == len(set(ids)) >= 40  # every operation of /openapi.json, each its own


def test_tests_that_share_an_id_stop_the_collection() -> None:
    class Item:  # what the hook reads of a collected item
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    items: Any = [Item("t.py::a"), Item("t.py::b"), Item("t.py::a")]
    with pytest.raises(pytest.UsageError, match=r"share a node id .*: t\.py::a$"):
        nodeids.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    nodeids.pytest_collection_modifyitems(None, items[:2])  # type: ignore[arg-type]


def test_files_go_to_the_workers_longest_first_keeping_their_tests_order() -> None:
    nodeids = ["a.py::1", "a.py::2", "b.py::1", "c.py::1", "c.py::2", "new.py::1"]
    weights = {"a.py": 1.0, "b.py": 30.0, "c.py": 12.0}
    order = [nodeids[i] for i in order_plugin.longest_first(nodeids, weights)]
    # new.py has no weight: among the middling files (order_plugin.UNKNOWN_S).
    assert order == ["b.py::1", "c.py::1", "c.py::2", "new.py::1", "a.py::1", "a.py::2"]


def test_the_weights_are_each_files_seconds(tmp_path: Path) -> None:
    tests = {
        "a.py::1": {"setup": 1.0, "call": 2.0, "teardown": 0.5},
        "a.py::2": {"setup": 0.0, "call": 1.0, "teardown": 0.0},
        "b.py::1": {"setup": 0.0, "call": 9.0, "teardown": 0.0},
    }
    assert file_weights(tests) == {"b.py": 9.0, "a.py": 4.5}
    path = tmp_path / "weights.json"
    path.write_text(json.dumps(file_weights(tests)))
    assert order_plugin.load_weights(path) == {"b.py": 9.0, "a.py": 4.5}
    assert order_plugin.load_weights(tmp_path / "none.json") == {}
