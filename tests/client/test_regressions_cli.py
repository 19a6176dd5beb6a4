"""The regression watch from the client's side: `ApplianceClient.regressions()` and
`rebaseline()`, `appliance status`'s regressions section and `appliance streams baseline`,
against a real `appliance serve` whose watch finds a real regression.

No state is injected and nothing waits minutes: the appliance starts with a shared
baseline (`profiling.watch.baseline`, the file `appliance trace fingerprint` writes for a
fleet) that says the demo stream's `people` block took about 1 ms, as if measured on a
much faster machine. Its real detector takes ten times that, so the watch's first
comparison (every second here) finds the block slower. Every other row is still learning
(`learn_s` is a day), so nothing else is judged: exactly one regression, every run. The
host case gives the same baseline a host probe a hundred times faster: then the probe and
the rows agree that the host, not the block, got slower.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.client import ApplianceAPIError, ApplianceClient
from appliance.watch.report import Regression
from tests.client import CONFIGS, TOKEN, stream_doc
from tests.support.appliance import ROOT, Served, clean_env, start_served
from tests.support.warm_cli import run_appliance

STREAM, BLOCK = "people-cam", "people-cam/people"
WAIT_S = 45.0
ISO = r"\d{4}-\d\d-\d\dT[\d:.]+Z"


def baseline_doc(probe_us: list[int]) -> dict[str, Any]:
    """A shared baseline of one row: the people block at about 1 ms (1000..1099 µs)."""
    row = {"kind": "block", "name": BLOCK, "samples_us": [1000 + i % 100 for i in range(300)],
           "probe_us": probe_us, "learned_at": 0, "source": "a faster machine",
           "probe_measure": "onnx"}  # what today's probe times  # fmt: skip
    return {"version": 1, "rows": {BLOCK: row}}


def served_with_baseline(folder: Path, probe_us: list[int]) -> Served:
    """`appliance serve` on the demo stream, its watch comparing every second against
    `baseline_doc(probe_us)`, learning nothing else for a day."""
    (folder / "fleet-baseline.json").write_text(json.dumps(baseline_doc(probe_us)))
    watch = {"interval_s": 1, "warmup_s": 0, "learn_s": 86400, "evidence_s": 1,
             "baseline": "fleet-baseline.json"}  # fmt: skip
    doc = {
        "server": {"host": "127.0.0.1", "token": TOKEN, "file_roots": [".", str(CONFIGS)]},
        "profiling": {"watch": watch},
        "streams": [stream_doc(STREAM)],
    }
    config = folder / "appliance.yaml"
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return start_served(config, folder)


def test_status_says_when_the_host_is_slower(tmp_path: Path) -> None:
    # First: before the module's appliance starts, so that the two never run side by side.
    # The baseline's host probe ran in 10 µs: a hundred times faster than any host now.
    served = served_with_baseline(tmp_path, probe_us=[10] * 30)
    try:
        client = ApplianceClient(served.url, token=TOKEN, timeout=20)
        served.wait_for(lambda: client.regressions().host is not None, WAIT_S, "host slowdown")
        report = client.regressions()
        host = report.host
        assert host is not None and host.kind == "host" and report.active == []
        assert host.probe_ratio is not None and host.probe_ratio > 10 and host.ratio > 3
        done = appliance(served, "status")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        section = lines[lines.index("regressions: 1 active") :]
        assert section[1] == (
            f"  host: ×{host.ratio:.2f} slower as a whole, the host and not a block (probe "
            f"×{host.probe_ratio:.2f}, rows ×{host.common_ratio:.2f}), since {host.started_at}"
        )
        assert len(section) == 2  # the block is not in regression: the host explains it
    finally:
        served.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """No host probe in the baseline: nothing can be put on the host, the block is slower."""
    served = served_with_baseline(tmp_path_factory.mktemp("regression"), probe_us=[])
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture
def client(served: Served) -> ApplianceClient:
    return ApplianceClient(served.url, token=TOKEN, timeout=20)


def appliance(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m appliance ARGS` against `served` (tests/support/warm_cli.py)."""
    command = [*args, "--url", served.url, "--token", TOKEN]
    return run_appliance(command, timeout=30, cwd=ROOT, env=clean_env())


def block_regression(served: Served, client: ApplianceClient) -> Regression:
    """The people block's regression, once the watch raised it and its evidence is done."""
    served.wait_for(lambda: any(r.name == BLOCK for r in client.regressions().active), WAIT_S,
                    "the people block's regression")  # fmt: skip
    (regression,) = client.regressions().active
    assert regression.evidence is not None
    window = regression.evidence.window
    served.wait_for(lambda: client.profiling_window(window).state == "done", WAIT_S, "evidence")
    return regression


def _state(client: ApplianceClient) -> str | None:
    watch = client.stream(STREAM).watch
    return None if watch is None else watch.state


def test_status_lists_a_regression_with_its_evidence(
    served: Served, client: ApplianceClient
) -> None:
    regression = block_regression(served, client)
    assert (regression.kind, regression.stream, regression.block) == ("block", STREAM, "people")
    assert regression.baseline_p50_ms < 1.1 and regression.current_p50_ms > 5
    assert regression.ratio > 3 and regression.host_ratio == 1.0  # nothing put on the host
    assert regression.change is not None and regression.change.what == "start"
    # The stream's own status carries it, and the row's verdict.
    watch = client.stream(STREAM).watch
    assert watch is not None and [r.id for r in watch.regressions] == [regression.id]
    assert {r.name: r.verdict for r in watch.rows if r.state == "watching"} == {BLOCK: "slower"}
    # The evidence is a real trace of that stream, recorded when the regression started.
    evidence = regression.evidence
    assert evidence is not None and evidence.trace == f"/v1/profiling/{evidence.window}/trace"
    trace = client.profiling_trace(evidence.window)
    runs = [e for e in trace["traceEvents"] if e.get("name") == "workflow.run"]
    assert runs and {e["args"]["stream"] for e in runs} == {STREAM}

    done = appliance(served, "status")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    section = lines[lines.index("regressions: 1 active") :]
    r = regression
    assert section[1:] == [
        f"  {BLOCK}: ×{r.ratio:.2f}, p50 {r.baseline_p50_ms:.2f} → {r.current_p50_ms:.2f} ms, "
        f"since {r.started_at}, evidence /v1/profiling/{evidence.window}/trace"
    ]
    assert re.fullmatch(ISO, r.started_at)

    done = appliance(served, "status", "--json")
    report = json.loads(done.stdout)["regressions"]
    assert [a["name"] for a in report["active"]] == [BLOCK] and report["host"] is None


def test_streams_baseline_learns_again_and_ends_the_regression(
    served: Served, client: ApplianceClient
) -> None:
    regression = block_regression(served, client)
    rows = {r.name for r in (client.stream(STREAM).watch or pytest.fail("no watch")).rows}

    done = appliance(served, "streams", "baseline", STREAM)
    assert done.returncode == 0, done.stderr
    first, *printed = done.stdout.splitlines()
    assert (
        first == f"{STREAM}: {len(printed)} rows learn their baseline again, for 86400 s from now"
    )
    names = {line.removeprefix("  ") for line in printed}
    assert rows <= names and {BLOCK, f"frame:{STREAM}", f"age:{STREAM}"} <= names
    assert any(n.startswith("model:") for n in names)  # the models it runs, too

    report = client.regressions()
    assert report.active == [] and report.host is None
    ended = report.history[0]
    assert (ended.id, ended.active, ended.end_reason) == (regression.id, False, "re-baselined")
    # Every row learns again from the next comparison on (a second here).
    served.wait_for(lambda: _state(client) == "learning", WAIT_S, "learning")
    watch = client.stream(STREAM).watch
    assert watch is not None and watch.regressions == []
    # Every row that runs: the drawing has not run, nobody watched (its row is idle).
    states = {r.name: r.state for r in watch.rows}
    assert states.pop(f"{STREAM}/drawn") == "idle"
    assert set(states.values()) == {"learning"}

    done = appliance(served, "status")
    assert done.returncode == 0 and "regressions: none" in done.stdout.splitlines(), done.stdout

    missing = appliance(served, "streams", "baseline", "nope")
    assert missing.returncode == 1 and missing.stderr.startswith("error: 404 not_found"), missing
    with pytest.raises(ApplianceAPIError) as caught:
        client.rebaseline("nope")
    assert caught.value.status == 404
