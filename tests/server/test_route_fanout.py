"""Every route declares how `serve --workers` answers it (`Route.workers`), and the
gateway answers each as declared: no route reaches a worker by a silent default.

The gateway here is the real one (appliance/workers/gateway.py) in front of two fake
workers: small aiohttp apps on the Unix sockets the gateway's clients dial, each saying
which worker it is. No worker process is started.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from appliance.policy.roles import Role
from appliance.server.auth import AuthPolicy
from appliance.server.routes import ROUTES
from appliance.server.routing import Fanout, Reply, Route
from appliance.workers.clients import WorkerClients
from appliance.workers.gateway import OWN, Gateway, GatewayPlanError, build_gateway, plan
from appliance.workers.procs import WorkerSet

STREAMS = {0: ["cam-a"], 1: ["cam-b"]}  # worker index -> the streams it runs
SESSION = "s-1"  # a WebRTC session held by worker 1
TOKEN = "fanout-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_every_route_declares_how_the_gateway_answers_it() -> None:
    undeclared = [f"{r.method} {r.path}" for r in ROUTES if not isinstance(r.workers, Fanout)]
    assert undeclared == []
    # The rule the gateway's old default applied, now a declaration: a stream's routes
    # go to the worker that runs it.
    under_a_stream = [r for r in ROUTES if r.path.startswith("/v1/streams/{id}")]
    assert under_a_stream
    assert {r.workers for r in under_a_stream} == {Fanout.OWNER}


def test_the_gateway_has_a_handler_for_every_route() -> None:
    planned = plan()
    assert [route for route, _ in planned] == list(ROUTES)
    assert all(callable(handler) for _, handler in planned)


async def _unused(request: web.Request) -> web.Response:
    """Never called: a route for the declarations' checks."""
    raise AssertionError


def _route(path: str, **kwargs: Any) -> Route:
    kwargs.setdefault("role", Role.VIEWER)
    return Route("GET", path, _unused, "A route", (Reply(200, "ok"),), **kwargs)


def test_a_route_without_a_declaration_fails_at_import() -> None:
    with pytest.raises(TypeError, match="workers"):
        _route("/v1/new")
    with pytest.raises(TypeError, match="role"):
        Route("GET", "/v1/new", _unused, "A route", (Reply(200, "ok"),), workers=Fanout.ANY)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="route GET /v1/new: role='admin' is not a Role"):
        _route("/v1/new", workers=Fanout.ANY, role="admin")
    with pytest.raises(TypeError, match="route GET /v1/new: workers=None is not a Fanout"):
        _route("/v1/new", workers=None)
    with pytest.raises(TypeError, match="route GET /v1/things: OWNER needs a stream"):
        _route("/v1/things", workers=Fanout.OWNER)


def test_a_route_the_gateway_cannot_answer_fails_its_build_named() -> None:
    merged = _route("/v1/new", workers=Fanout.MERGE)  # no merge handler in OWN
    with pytest.raises(GatewayPlanError, match=r"GET /v1/new is declared MERGE .*'_unused'"):
        plan([*ROUTES, merged])
    # A handler left behind for a route no longer declared to be answered there.
    forwarded = [
        dataclasses.replace(r, workers=Fanout.ANY) if r.operation_id == "get_regressions" else r
        for r in ROUTES
    ]
    with pytest.raises(GatewayPlanError, match=r"OWN\['get_regressions'\]"):
        plan(forwarded)
    assert "get_regressions" in OWN


# -- the gateway in front of fake workers -----------------------------------------------
def fake_worker(index: int) -> web.Application:
    """A worker that says who it is; it runs STREAMS[index] and worker 1 holds SESSION."""

    async def streams(request: web.Request) -> web.Response:
        return web.json_response({"streams": [{"id": s} for s in STREAMS[index]]})

    async def add(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"id": body["id"], "worker": index}, status=201)

    async def session(request: web.Request) -> web.Response:
        if index == 1 and request.match_info["sid"] == SESSION:
            return web.Response(status=204)
        return web.json_response({"error": {"code": "not_found"}}, status=404)

    async def anything(request: web.Request) -> web.Response:
        return web.json_response({"worker": index, "path": request.path})

    app = web.Application()
    app.router.add_get("/v1/streams", streams)
    app.router.add_post("/v1/streams", add)
    app.router.add_delete("/v1/webrtc/{sid}", session)
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


@pytest.fixture
def alive() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Stand-ins for the worker processes, so that each worker reads as `up`."""
    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in STREAMS
    ]
    yield sleepers
    for sleeper in sleepers:
        sleeper.kill()
        sleeper.wait()


@contextlib.asynccontextmanager
async def gateway_over_fakes(
    folder: Path, alive: list[subprocess.Popen[bytes]]
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """The real gateway app in front of fake workers on their sockets in `folder`."""
    workers = WorkerSet(lambda i: [], len(STREAMS), folder)  # never started
    clients = WorkerClients(workers, TOKEN, 5.0)
    runners = []
    try:
        for worker, sleeper in zip(workers.workers, alive, strict=True):
            runners.append(web.AppRunner(fake_worker(worker.index)))
            await runners[-1].setup()
            await web.UnixSite(runners[-1], str(worker.socket)).start()
            worker.process = sleeper
        await clients.open()
        policy = AuthPolicy.admin_only(TOKEN)
        app = build_gateway(Gateway(clients, policy, None), 1 << 20)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            yield client
    finally:
        await clients.close()
        for runner in runners:
            await runner.cleanup()


async def ask(
    client: TestClient[web.Request, web.Application], method: str, path: str, **kw: Any
) -> tuple[int, Any]:
    async with client.request(method, path, headers=AUTH, **kw) as resp:
        body = await resp.json() if resp.content_type == "application/json" else None
        return resp.status, body


def test_each_kind_of_route_is_answered_as_declared(
    tmp_path: Path, alive: list[subprocess.Popen[bytes]]
) -> None:
    async def check() -> None:
        async with gateway_over_fakes(tmp_path, alive) as gateway:
            await answers_as_declared(gateway)

    asyncio.run(check())


async def answers_as_declared(gateway: TestClient[web.Request, web.Application]) -> None:
    # OWNER: the worker that lists the stream.
    assert await ask(gateway, "GET", "/v1/streams/cam-b") == (
        200,
        {"worker": 1, "path": "/v1/streams/cam-b"},
    )
    assert (await ask(gateway, "GET", "/v1/streams/cam-a/latest"))[1]["worker"] == 0
    # MERGE: every worker's list, each item with its worker.
    status, body = await ask(gateway, "GET", "/v1/streams")
    assert status == 200
    assert body == {"streams": [{"id": "cam-a", "worker": 0}, {"id": "cam-b", "worker": 1}]}
    # PLACE: a new stream on the least loaded worker (a tie here: the sharding weight).
    status, body = await ask(gateway, "POST", "/v1/streams", json={"id": "cam-new"})
    assert status == 201 and body["worker"] in (0, 1)
    # HOLDER: worker 0 answers 404, worker 1 holds the session.
    assert (await ask(gateway, "DELETE", f"/v1/webrtc/{SESSION}"))[0] == 204
    assert (await ask(gateway, "DELETE", "/v1/webrtc/nobody"))[0] == 404
    # ANY: each live worker in turn.
    answered = {(await ask(gateway, "GET", "/docs"))[1]["worker"] for _ in range(2)}
    assert answered == {0, 1}
    # GATEWAY: the gateway's own liveness, with its workers.
    status, body = await ask(gateway, "GET", "/health")
    assert [w["index"] for w in body["workers"]] == [0, 1]
    # PER_PROCESS: 501, no worker asked.
    status, body = await ask(gateway, "GET", "/v1/tune")
    assert status == 501 and body["error"]["code"] == "not_implemented"
