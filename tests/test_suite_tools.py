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
from tests.support.flakes import summarise
from tests.support.report import render


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


@pytest.mark.live  # a pytest of its own
def test_each_api_operation_is_a_test_of_its_own(tmp_path: Path) -> None:
    """schemathesis's items get their operation in their id (tests/support/nodeids.py):
    with one shared id, `pytest -n 2 --dist loadfile` ran one operation of 47. Collected
    only: xdist hands out tests by these ids."""
    test = "tests/server/test_openapi.py::test_the_server_keeps_to_its_document"
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
