"""`appliance tune` over the API: POST /v1/tune on a real appliance (in-process, the demo
clip as a live camera, the real person detector), followed by GET, cancelled by DELETE
and by the server's shutdown, with the starting settings back each time; refused
requests named field by field; `client_tune.run_remote` against it; and the 501 the
`serve --workers` gateway answers.

The tunes are tiny: one knob of two values, windows of 1 s (the least allowed) and
0.2 s to settle, so each runs in seconds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from appliance.cli.tune_remote import run_remote
from appliance.client import ApplianceAPIError
from appliance.server.auth import AuthPolicy
from appliance.server.routes.tune import TUNE
from appliance.workers.clients import WorkerClients
from appliance.workers.gateway import Gateway, build_gateway
from appliance.workers.procs import WorkerSet
from tests.server.conftest import TOKEN, config_doc, demo_stream
from tests.server.live import LiveServer, Reply, wait_for, write_yaml

WAIT_S = 30.0
# allow_spinning: true or false, each window 1 s; the budget (the least allowed) ends it.
TINY = {"knobs": {"allow_spinning": None}, "window_s": 1, "settle_s": 0.2, "budget_s": 10}
# The batch size from the config's 4 to 1 and back: GET /v1/models shows which runs.
BATCH = {"knobs": {"max_batch_size": [1]}, "window_s": 1, "settle_s": 0.2, "budget_s": 60}
FINAL = {"done", "cancelled", "interrupted", "failed"}


def start_server(folder: Path) -> LiveServer:
    live = LiveServer(write_yaml(folder, config_doc(demo_stream("cam"))), token=TOKEN).start()
    wait_for(lambda: live.stream("cam")["frames_processed"] > 0, WAIT_S, "cam processing")
    return live


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("tune-api"))
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
def idle(server: LiveServer) -> Iterator[LiveServer]:
    """The server with no tune running, before and after the test."""
    finished(server)
    yield server
    if server.get_json("/v1/tune")["state"] == "running":
        server.call("DELETE", "/v1/tune")
    finished(server)


def finished(server: LiveServer) -> dict[str, Any]:
    """GET /v1/tune once the tune has ended."""
    wait_for(lambda: server.get_json("/v1/tune")["state"] != "running", WAIT_S, "the tune's end")
    return dict(server.get_json("/v1/tune"))


def batch_size(server: LiveServer) -> int:
    (person,) = server.get_json("/v1/models")["models"]
    return int(person["batching"]["max_batch_size"])


def spinning(server: LiveServer) -> bool:
    spec, _ = server.runtime.pool.specs()["person"]
    return spec.session.allow_spinning


def test_a_tune_reports_its_progress_and_ends_with_its_candidates(idle: LiveServer) -> None:
    server, before = idle, spinning(idle)
    started = server.call("POST", "/v1/tune", json_body=TINY)
    assert started.status == 202, started.body
    assert started.json()["state"] == "running"
    assert started.json()["request"]["knobs"] == {"allow_spinning": None}
    again = server.call("POST", "/v1/tune", json_body=TINY)
    assert again.status == 409
    assert again.error["message"] == "a tune is already running"
    assert "the tune started at" in again.error["details"][0]

    seen: list[dict[str, Any]] = []

    def progress_shown() -> bool:
        seen.append(server.get_json("/v1/tune"))
        return seen[-1]["progress"] is not None

    wait_for(progress_shown, WAIT_S, "the tune's progress")
    assert seen[-1]["state"] == "running"
    assert {"current", "windows", "elapsed_s", "remaining_s", "best"} <= set(seen[-1]["progress"])

    final = finished(server)
    assert final["state"] == "done", final
    result = final["result"]
    assert result["outcome"] in ("done", "budget")
    assert [k["key"] for k in result["knobs"]] == ["person.allow_spinning"]
    assert result["candidates"][0]["knob"] == "person.allow_spinning"
    assert result["candidates"][0]["windows"]
    assert spinning(server) is before  # not applied: the starting settings run again


def test_a_cancel_puts_the_starting_settings_back(idle: LiveServer) -> None:
    server = idle
    assert batch_size(server) == 4
    assert server.call("POST", "/v1/tune", json_body=BATCH).status == 202
    wait_for(lambda: batch_size(server) == 1, WAIT_S, "the candidate batch size 1")
    cancel = server.call("DELETE", "/v1/tune")
    assert cancel.status == 202
    assert "starting settings are being restored" in cancel.json()["note"]
    final = finished(server)
    assert final["state"] == "cancelled"
    assert final["result"]["outcome"] == "interrupted"
    assert batch_size(server) == 4
    nothing = server.call("DELETE", "/v1/tune")
    assert nothing.status == 409
    assert nothing.error["details"] == ["state: cancelled"]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"knobs": {"nope": None}}, "knobs.nope: unknown knob 'nope'"),
        ({"knobs": {"faces.max_batch_size": None}},
         "knobs.faces.max_batch_size: model 'faces' is not running (running: person)"),
        ({"knobs": {"max_batch_size": ["big"]}}, "knobs.max_batch_size.0: 'big'"),
        ({"budget_s": 0}, "budget_s:"),
        ({"objective": "x"}, "objective:"),
        ({"window_s": 61}, "window_s:"),
        ({"knobs": {f"k{i}.allow_spinning": None for i in range(33)}}, "knobs:"),
    ],
)  # fmt: skip
def test_a_bad_request_is_422_naming_the_field(
    idle: LiveServer, body: dict[str, Any], detail: str
) -> None:
    reply = idle.call("POST", "/v1/tune", json_body=body)
    assert reply.status == 422, reply.body
    assert any(d.startswith(detail) for d in reply.error["details"]), reply.error
    assert idle.get_json("/v1/tune")["state"] != "running"


@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
def test_the_token_is_needed(server: LiveServer, method: str) -> None:
    reply: Reply = server.call(method, "/v1/tune", json_body=TINY, token=None)
    assert reply.status == 401
    assert server.get_json("/v1/tune")["state"] != "running"


def test_run_remote_follows_a_tune_to_its_result(idle: LiveServer) -> None:
    shown: list[dict[str, Any]] = []
    final = run_remote(idle.url, TOKEN, TINY, shown.append, threading.Event())
    assert final["state"] == "done"
    assert final["result"]["candidates"]
    assert shown and all("current" in p for p in shown)


def test_run_remote_cancels_when_stopped_and_waits_for_the_end(idle: LiveServer) -> None:
    """Stopped (Ctrl-C) once the candidate batch size 1 is being measured."""
    stop, shown = threading.Event(), list[str]()

    def show(progress: dict[str, Any]) -> None:
        shown.append(progress["current"])
        if progress["current"] == "person.max_batch_size=1":
            stop.set()

    final = run_remote(idle.url, TOKEN, BATCH, show, stop, poll_s=0.2)
    assert final["state"] == "cancelled"
    assert final["result"]["candidates"][0]["value"] == 1
    assert batch_size(idle) == 4


def test_run_remote_raises_the_servers_refusal(idle: LiveServer) -> None:
    with pytest.raises(ApplianceAPIError) as refused:
        run_remote(idle.url, TOKEN, {"knobs": {"nope": None}}, print, threading.Event())
    assert refused.value.status == 422
    assert "knobs.nope" in refused.value.details[0]


def test_a_shutdown_interrupts_the_tune_and_puts_the_settings_back(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        assert server.get_json("/v1/tune")["state"] == "idle"
        assert server.call("POST", "/v1/tune", json_body=BATCH).status == 202
        wait_for(lambda: batch_size(server) == 1, WAIT_S, "the candidate batch size 1")
    finally:
        assert server.stop()  # a clean shutdown: the tune thread ended in time
    assert server.app is not None
    assert server.app[TUNE].status()["state"] == "interrupted"
    spec, _ = server.runtime.pool.specs()["person"]
    assert spec.batching.max_batch_size == 4
    assert not [t for t in threading.enumerate() if t.name == "tune"]


def test_the_workers_gateway_answers_501(tmp_path: Path) -> None:
    """`serve --workers`: the gateway's own answer, no worker asked."""
    workers = WorkerSet(lambda i: [], 1, tmp_path)  # never started
    policy = AuthPolicy.admin_only(TOKEN)
    gateway = Gateway(WorkerClients(workers, TOKEN, 5.0), policy, None)

    async def ask() -> list[tuple[int, dict[str, Any]]]:
        runner = web.AppRunner(build_gateway(gateway, 1 << 20))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        answers = []
        try:
            async with aiohttp.ClientSession() as http:
                for method in ("POST", "GET", "DELETE"):
                    async with http.request(method, f"http://127.0.0.1:{port}/v1/tune",
                                            json=TINY, headers={"Authorization": f"Bearer {TOKEN}"}
                                            ) as resp:  # fmt: skip
                        answers.append((resp.status, await resp.json()))
        finally:
            await runner.cleanup()
        return answers

    for status, body in asyncio.run(ask()):
        assert status == 501
        assert body["error"]["code"] == "not_implemented"
        assert "appliance tune --config FILE" in body["error"]["message"]


def test_progress_is_fresh_while_running(idle: LiveServer) -> None:
    """Each GET shows the latest progress: its elapsed time grows while the tune runs."""
    assert idle.call("POST", "/v1/tune", json_body=BATCH).status == 202
    elapsed: list[float] = []

    def grown() -> bool:
        progress = idle.get_json("/v1/tune")["progress"]
        if progress is not None:
            elapsed.append(progress["elapsed_s"])
        return len(set(elapsed)) >= 2

    # A progress is reported before each window (at least 1 s apart, at least three in
    # this tune): polled every 50 ms, a later one has a later elapsed time.
    wait_for(grown, WAIT_S, "a second progress")
    assert elapsed == sorted(elapsed)
