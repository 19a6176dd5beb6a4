"""`appliance streams ...` and `appliance status` as a user runs them, against a live
appliance: real processes, output and exit codes checked."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.client import CONFIGS, TOKEN, WORKFLOW, served_appliance
from tests.faults.process_helpers import DRAW
from tests.support.appliance import DEMO_CLIP, ROOT, Served, clean_env
from tests.support.processes import free_port
from tests.support.rtsp import RtspServerFactory
from tests.support.warm_cli import run_appliance

BROKEN = '{"name": "broken", "blocks": [{"id": "a", "type": "no_such_block"}], "outputs": {}}'


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_appliance(tmp_path_factory.mktemp("cli")) as served:
        served.wait_for(lambda: json.loads(served.get("/ready")[1])["ready"], 30, "/ready")
        yield served


def appliance(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m appliance ARGS` from the repository root, with only `env` configuring it
    (tests/support/warm_cli.py)."""
    return run_appliance(args, timeout=30, cwd=ROOT, env=clean_env(**env))


def against(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    return appliance(*args, "--url", served.url, "--token", TOKEN)


def test_streams_list_prints_a_table_and_json(served: Served) -> None:
    done = against(served, "streams", "list")
    assert done.returncode == 0, done.stderr
    head, *rows = done.stdout.splitlines()
    assert head.split() == [
        "id",
        "state",
        "fps",
        "dropped",
        "p50",
        "ms",
        "workflow",
        "last",
        "error",
    ]
    (row,) = rows
    assert row.split()[0] == "people-cam" and row.split()[-2:] == ["people_counter", "-"]

    done = against(served, "streams", "list", "--json")
    assert done.returncode == 0, done.stderr
    assert [s["id"] for s in json.loads(done.stdout)["streams"]] == ["people-cam"]


def test_add_restart_remove_a_stream(served: Served) -> None:
    relative = str(WORKFLOW.relative_to(ROOT))  # a local file: sent as an absolute path
    done = against(served, "streams", "add", "--id", "cli-cam", "--source", str(DEMO_CLIP),
                   "--workflow", relative, "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["workflow"] == "people_counter"

    done = against(served, "streams", "restart", "cli-cam")
    assert (done.returncode, done.stdout.split()[:2]) == (0, ["restarted", "cli-cam:"])
    done = against(served, "streams", "remove", "cli-cam")
    assert (done.returncode, done.stdout) == (0, "removed cli-cam\n")


def test_status_reads_the_environment(served: Served) -> None:
    done = appliance("status", APPLIANCE_URL=served.url, APPLIANCE_API_TOKEN=TOKEN)
    assert done.returncode == 0, done.stderr
    first, *rest = done.stdout.splitlines()
    assert first == f"appliance {served.url}: ok, ready"
    # When it started, as people read it: `up 12s, since 2026-12-01T05:02:29.045Z`.
    assert re.fullmatch(r"up (\d+[dhms] ?){1,2}, since \d{4}-\d\d-\d\dT[\d:.]{12}Z", rest[0])
    assert "  person: tf_od" in "\n".join(rest)
    assert "streams: 1, 1 running" in rest

    done = appliance("status", "--json", APPLIANCE_URL=served.url, APPLIANCE_API_TOKEN=TOKEN)
    report = json.loads(done.stdout)
    assert (report["ready"]["ready"], report["models"][0]["id"]) == (True, "person")
    started = datetime.fromisoformat(report["ready"]["started_at"])
    assert started.utcoffset() == timedelta(0)  # UTC, said so
    uptime = datetime.now(UTC) - started
    assert abs(uptime.total_seconds() - report["ready"]["uptime_s"]) < 10


@pytest.mark.parametrize(
    ("args", "first_line"),
    [
        (("streams", "remove", "nope"), "error: 404 not_found: "),
        (("streams", "add", "--id", "people-cam", "--source", "x.mp4", "--workflow", str(WORKFLOW)),
         "error: 409 conflict: "),
        (("streams", "add", "--id", "bad", "--source", "x.mp4", "--workflow", BROKEN),
         "error: 422 invalid: "),
    ],
)  # fmt: skip
def test_api_errors_exit_1_with_the_message(
    served: Served, args: tuple[str, ...], first_line: str
) -> None:
    done = against(served, *args)
    assert done.returncode == 1
    assert done.stderr.startswith(first_line), done.stderr
    if "422" in first_line:  # details: one indented line per problem
        assert "  " in done.stderr and "no_such_block" in done.stderr


def test_a_wrong_token_exits_1_saying_how_to_pass_one(served: Served) -> None:
    done = appliance("streams", "list", "--url", served.url, "--token", "guess-4711")
    assert done.returncode == 1
    assert done.stderr.startswith("error: 401 unauthorized: ")
    assert "hint: the token given with --token was refused" in done.stderr
    assert "--token TOKEN or $APPLIANCE_API_TOKEN" in done.stderr
    assert "guess-4711" not in done.stderr  # the refused token is not echoed


def test_a_file_outside_the_roots_gets_the_roots_hint_not_the_token_one(
    served: Served, tmp_path: Path
) -> None:
    """Issue 30, item 2: a 403 from the file policy says where files may be and how to add
    a root; the token hint is for a 401 only (here: no token sent at all)."""
    outside = tmp_path / "mine.yaml"  # not under the served config's folder nor configs/
    outside.write_text(WORKFLOW.read_text(encoding="utf-8"), encoding="utf-8")
    done = against(served, "streams", "add", "--id", "mine", "--source", str(DEMO_CLIP),
                   "--workflow", str(outside))  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith("error: 403 forbidden: "), done.stderr
    fix = (
        f"outside the file roots (., {CONFIGS}; server.file_roots); put the file under one "
        "of them, or add its folder to server.file_roots in the config file and reload"
    )
    assert fix in done.stderr, done.stderr
    assert "a path in the config file itself is not limited by the roots" in done.stderr
    assert "hint: after editing server.file_roots, reload: SIGHUP" in done.stderr
    assert "token" not in done.stderr.lower(), done.stderr
    # Said once: the advice is in the message, not again in the details line.
    assert done.stderr.count("put the file under one of them") == 1, done.stderr

    done = appliance("streams", "list", "--url", served.url)  # no token
    assert done.stderr.startswith("error: 401 unauthorized: ")
    assert "hint: no token was sent; pass the appliance's API token" in done.stderr
    assert "file_roots" not in done.stderr


def test_an_unreachable_appliance_exits_4_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = appliance("status", "--url", url)
    assert done.returncode == 4
    port = url.rsplit(":", 1)[1]
    # In the words a camera's fault gets, and what to do about it.
    assert done.stderr.splitlines() == [
        f"error: cannot reach the appliance at {url}/health: cannot connect to "
        f"127.0.0.1:{port} (connection refused: nothing listens there)",
        "hint: is it running (`appliance serve --config FILE`)? --url or $APPLIANCE_URL "
        "names another one",
    ]


@pytest.mark.parametrize(
    "args",
    [("streams",), ("streams", "add", "--id", "x"), ("streams", "add", "--id", "x",
     "--source", "x.mp4", "--workflow", "{not json")],
)  # fmt: skip
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    done = appliance(*args)
    assert done.returncode == 2
    assert done.stderr


def test_streams_watch_prints_results_as_they_come(served: Served) -> None:
    done = against(served, "streams", "watch", "people-cam", "--count", "5", "--json")
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == 5 and {r["stream"] for r in results} == {"people-cam"}
    seqs = [r["seq"] for r in results]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    done = against(served, "streams", "watch", "people-cam", "--count", "2")
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("people-cam #") for line in lines), lines
    # The workflow's outputs: tracks as a count of detections, crossings as their JSON.
    assert " people: " in lines[0] and " detections, crossings: {" in lines[0], lines[0]
    missing = against(served, "streams", "watch", "nope", "--count", "1")
    assert missing.returncode == 1 and missing.stderr.startswith("error: 404 not_found")


@pytest.mark.rtsp
def test_a_cleared_error_shows_as_cleared_with_its_time(
    served: Served, rtsp_server: RtspServerFactory
) -> None:
    """Issue 30, item 5: a camera that was down and came back keeps its last error in
    `streams list`, marked cleared and dated, not as if it still held."""
    camera = rtsp_server()
    camera.stop()  # down when the stream starts: connection refused, retried
    backoff = {"initial_s": 0.2, "max_s": 0.5, "multiplier": 2.0, "jitter": 0.0}
    source = json.dumps({"url": camera.url, "backoff": backoff})
    done = against(served, "streams", "add", "--id", "door", "--source", source,
                   "--workflow", json.dumps(DRAW))  # fmt: skip
    assert done.returncode == 0, done.stderr
    try:
        held = _door_row(served, lambda row: "reconnecting" in row)
        # `(12:03:04Z) why`: its time, and no "cleared" while it holds.
        assert re.search(r"\(\d\d:\d\d:\d\dZ\) \S", held) and "cleared" not in held, held
        camera.start()
        row = _door_row(served, lambda row: "running" in row and "cleared" in row)
        assert re.search(r"\(\d\d:\d\d:\d\dZ, cleared\) \S", row), row
        stream = json.loads(against(served, "streams", "list", "--json").stdout)["streams"]
        (door,) = [s for s in stream if s["id"] == "door"]
        assert door["last_error"] and door["last_error_cleared"] is True, door
        assert datetime.fromisoformat(door["last_error_at"]).utcoffset() == timedelta(0)
    finally:
        against(served, "streams", "remove", "door")


def _door_row(served: Served, wanted: Callable[[str], bool], timeout_s: float = 20.0) -> str:
    """`streams list`'s row of the stream `door`, once `wanted` holds for it."""
    deadline = time.monotonic() + timeout_s
    row = ""
    while time.monotonic() < deadline:
        done = against(served, "streams", "list")
        rows = [r for r in done.stdout.splitlines() if r.startswith("door ")]
        row = rows[0] if rows else ""
        if wanted(row):
            return row
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for the row of door; last: {row!r}")
