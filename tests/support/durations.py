"""Where the suite's time goes: every run writes each test's phases to a file.

`tests/artifacts/durations.json` (the folder CI keeps with the viewer's screenshots)
holds, per test, its setup, call and teardown seconds, its outcome and the xdist worker
that ran it, plus the run's wall time and worker count. `make test-report`
(`tests/support/report.py`) prints the slowest tests and a total per folder from it.

Under xdist the controller receives every worker's reports, so one file covers the run;
a worker process writes nothing.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from appliance.atomic import write_atomic

DEFAULT_PATH = Path("tests/artifacts/durations.json")
_CPU_AT = pytest.StashKey[float]()


class DurationsRecorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = time.monotonic()
        self.tests: dict[str, dict[str, Any]] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.setdefault(
            report.nodeid,
            {"setup": 0.0, "call": 0.0, "teardown": 0.0, "outcome": "passed"},
        )
        entry[report.when] = round(entry[report.when] + report.duration, 4)
        # xdist puts the worker that ran it on the report it forwards ("gw0", ...).
        node = getattr(report, "node", None)
        if node is not None:
            entry["worker"] = str(node.gateway.id)
        for key, value in report.user_properties:
            if key == "cpu_s":
                entry["cpu_s"] = round(entry.get("cpu_s", 0.0) + value, 3)
        if report.failed:
            entry["outcome"] = "failed" if report.when == "call" else f"error in {report.when}"
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        document = {
            "wall_s": round(time.monotonic() - self.started, 1),
            "workers": int(getattr(session.config.option, "numprocesses", 0) or 0),
            "exitstatus": int(exitstatus),
            "tests": self.tests,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(document, indent=1, sort_keys=True).encode())


def _tree_cpu_s() -> float:
    """CPU seconds used so far by this process and its children: those reaped
    (RUSAGE_CHILDREN) and those still running (appliances, brokers, browsers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # gone meanwhile: counted once reaped
            continue
        total += times.user + times.system
    return total


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    # The CPU seconds a test costs, its set-up, teardown and children included (a server
    # a module shares counts towards the tests during which it runs). Per worker, so it
    # holds under xdist too; a grandchild reaped by a child that outlives the test is
    # missed until that child is reaped.
    item.stash[_CPU_AT] = _tree_cpu_s()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    report = yield
    if call.when == "teardown" and _CPU_AT in item.stash:
        busy = _tree_cpu_s() - item.stash[_CPU_AT]
        report.user_properties.append(("cpu_s", round(busy, 3)))  # type: ignore[attr-defined]
    return report


def pytest_configure(config: pytest.Config) -> None:
    # An xdist worker's reports reach the controller; only the controller writes.
    if hasattr(config, "workerinput"):
        return
    path = Path(os.environ.get("APPLIANCE_TEST_DURATIONS", str(DEFAULT_PATH)))
    config.pluginmanager.register(DurationsRecorder(path), "appliance-durations")
