"""On-demand profiling windows: start one, follow it, download its Chrome trace.

The window runs on its own thread (appliance.profiling.windows); these handlers only
start it, read its status and serve its finished trace file, all off the loop.
"""

from __future__ import annotations

from aiohttp import web

from appliance.observe.status import WindowStatus, as_json
from appliance.policy.roles import Role
from appliance.server.audit import audit_target
from appliance.server.bodies import parse_json
from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Fanout, Reply, Route
from appliance.server.schemas import CHROME_TRACE, ProfilingRequest


async def start_profiling(request: web.Request) -> web.Response:
    """Start a profiling window of `duration_s` seconds (at most `profiling.max_window_s`)
    over the given streams (all by default), with ONNX Runtime's operator events if
    `ort_operators`. Answers at once; one window at a time (409 names the running one)."""
    body = await parse_json(request, ProfilingRequest)
    rt = runtime_of(request)
    streams = list(body.streams) if body.streams is not None else None
    window = await in_thread(rt.start_profiling, body.duration_s, streams, body.ort_operators)
    audit_target(request, window.id)
    location = {"Location": f"/v1/profiling/{window.id}"}
    return web.json_response(as_json(window), status=202, headers=location)


async def get_profiling(request: web.Request) -> web.Response:
    """A window's state: `running`, `done` (its trace is ready) or `failed` (with `error`)."""
    window = await in_thread(runtime_of(request).profiling_window, request.match_info["id"])
    return web.json_response(as_json(window))


async def get_profiling_trace(request: web.Request) -> web.Response:
    """The finished window's Chrome trace; 409 while it runs or if it failed."""
    path = await in_thread(runtime_of(request).profiling_trace, request.match_info["id"])
    data = await in_thread(path.read_bytes)
    return web.Response(body=data, content_type="application/json")


ROUTES = (
    Route(
        "POST",
        "/v1/profiling",
        start_profiling,
        "Start a profiling window",
        (Reply(202, "started", WindowStatus),),
        errors=(409,),
        body={"application/json": ProfilingRequest},
        tag="profiling",
        role=Role.OPERATOR,
        audit="profiling.start",
        workers=Fanout.MERGE,
    ),
    Route(
        "GET",
        "/v1/profiling/{id}",
        get_profiling,
        "Get a profiling window",
        (Reply(200, "the window's status", WindowStatus),),
        tag="profiling",
        role=Role.OPERATOR,
        workers=Fanout.MERGE,
    ),
    Route(
        "GET",
        "/v1/profiling/{id}/trace",
        get_profiling_trace,
        "Get a window's trace",
        (Reply(200, "the Chrome trace", CHROME_TRACE),),
        errors=(409,),
        tag="profiling",
        role=Role.OPERATOR,
        workers=Fanout.MERGE,
    ),
)
