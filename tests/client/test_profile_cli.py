"""`appliance profile` as a user runs it, and the client's profiling calls, against a
live `appliance serve`: a real window on the demo camera, its trace on disk."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.client import ApplianceAPIError, ApplianceClient
from tests.client import TOKEN, served_appliance
from tests.client.test_cli_client import against, appliance
from tests.support.appliance import Served
from tests.support.processes import free_port


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_appliance(tmp_path_factory.mktemp("profile")) as served:
        client = ApplianceClient(served.url, token=TOKEN, timeout=20)
        served.wait_for(lambda: client.stream("people-cam").frames_processed > 0, 30, "frames")
        yield served


def test_profile_writes_the_windows_trace(served: Served, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    done = against(served, "profile", "--duration", "1", "--streams", "people-cam", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {out} (")
    trace = json.loads(out.read_text(encoding="utf-8"))
    runs = [e for e in trace["traceEvents"] if e.get("name") == "workflow.run"]
    assert runs and {e["args"]["stream"] for e in runs} == {"people-cam"}


def test_the_client_starts_follows_and_downloads_a_window(served: Served) -> None:
    client = ApplianceClient(served.url, token=TOKEN, timeout=20)
    window = client.start_profiling(1)
    assert (window.state, window.duration_s, window.streams) == ("running", 1, None)
    with pytest.raises(ApplianceAPIError) as busy:
        client.start_profiling(1, ["people-cam"], ort_operators=True)
    assert (busy.value.status, busy.value.details) == (409, [window.id])
    with pytest.raises(ApplianceAPIError) as early:
        client.profiling_trace(window.id)
    assert early.value.status == 409
    served.wait_for(lambda: client.profiling_window(window.id).state != "running", 30, "end")
    assert client.profiling_window(window.id).state == "done"
    assert client.profiling_trace(window.id)["traceEvents"]
    with pytest.raises(ApplianceAPIError) as unknown:
        client.profiling_window("nope")
    assert (unknown.value.status, unknown.value.code) == (404, "not_found")


@pytest.mark.parametrize(
    "args", [("--duration", "1", "--streams", "no-such-cam"), ("--duration", "0")]
)
def test_a_refused_window_exits_1(served: Served, args: tuple[str, ...], tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    done = against(served, "profile", *args, "-o", str(out))
    assert done.returncode == 1
    assert done.stderr.startswith("error: 422 invalid: "), done.stderr
    assert not out.exists()


def test_an_unreachable_appliance_exits_4(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = appliance("profile", "--url", url, "--duration", "1", "-o", str(tmp_path / "t.json"))
    assert done.returncode == 4
    assert url in done.stderr
