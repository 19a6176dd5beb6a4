"""On-demand profiling windows over HTTP, on a live server with a real model and the
bundled clip as a live camera: start, follow, download the trace; every refusal."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.conftest import WAIT_S, LiveFactory, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for

MAX_WINDOW_S = 5


@pytest.fixture(scope="module")
def server(module_server: LiveFactory) -> LiveServer:
    doc = {**config_doc(demo_stream("cam")), "profiling": {"max_window_s": MAX_WINDOW_S}}
    live = module_server(doc)
    wait_for(lambda: live.stream("cam")["frames_processed"] > 0, WAIT_S, "cam processing")
    return live


def start(server: LiveServer, **body: Any) -> dict[str, Any]:
    reply = server.call("POST", "/v1/profiling", json_body={"duration_s": 1, **body})
    assert reply.status == 202, reply.body
    window = reply.json()
    assert reply.headers["location"] == f"/v1/profiling/{window['id']}"
    return dict(window)


def finish(server: LiveServer, window_id: str) -> dict[str, Any]:
    """Poll the window until it has ended; its trace, asserting it is done."""
    path = f"/v1/profiling/{window_id}"
    wait_for(lambda: server.get_json(path)["state"] != "running", WAIT_S, "the window to end")
    status = server.get_json(path)
    assert status["state"] == "done", status
    trace = server.get_json(status["trace"])
    assert isinstance(trace, dict)
    return trace


def test_a_window_runs_then_serves_its_trace(server: LiveServer) -> None:
    window = start(server, streams=["cam"])
    assert window["state"] == "running"
    assert window["duration_s"] == 1 and window["streams"] == ["cam"]
    assert window["ort_operators"] is False
    assert window["trace"] == f"/v1/profiling/{window['id']}/trace"

    busy = server.call("POST", "/v1/profiling", json_body={"duration_s": 1})
    assert busy.status == 409, busy.body
    assert busy.error["code"] == "conflict" and busy.error["details"] == [window["id"]]
    early = server.call("GET", window["trace"])
    assert early.status == 409 and early.error["code"] == "conflict"

    trace = finish(server, window["id"])
    runs = [e for e in trace["traceEvents"] if e.get("name") == "workflow.run"]
    assert runs and all(e["args"]["stream"] == "cam" for e in runs)
    assert server.get_json(f"/v1/profiling/{window['id']}")["state"] == "done"


def test_ort_operators_are_in_the_trace(server: LiveServer) -> None:
    window = start(server, ort_operators=True)
    assert window["ort_operators"] is True
    events = finish(server, window["id"])["traceEvents"]
    assert any(e.get("cat") == "Node" for e in events)
    assert any(e.get("name") == "workflow.run" for e in events)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"duration_s": 0}, "duration_s"),
        ({"duration_s": -1}, "duration_s"),
        ({"duration_s": MAX_WINDOW_S + 1}, "duration_s"),
        ({"duration_s": 1, "streams": ["no-such-cam"]}, "no-such-cam"),
        ({"duration_s": "1"}, "duration_s"),
        ({}, "duration_s"),
    ],
)
def test_bad_windows_are_refused(server: LiveServer, body: dict[str, Any], where: str) -> None:
    reply = server.call("POST", "/v1/profiling", json_body=body)
    assert reply.status == 422, reply.body
    assert reply.error["code"] == "invalid"
    assert any(where in d for d in reply.error["details"]), reply.error


def test_unknown_windows_are_404(server: LiveServer) -> None:
    for path in ("/v1/profiling/nope", "/v1/profiling/nope/trace"):
        reply = server.call("GET", path)
        assert reply.status == 404, reply.body
        assert reply.error["code"] == "not_found" and "nope" in reply.error["message"]


def test_profiling_needs_the_token(server: LiveServer) -> None:
    reply = server.call("POST", "/v1/profiling", json_body={"duration_s": 1}, token=False)
    assert reply.status == 401
