"""Streams at runtime: list, inspect, add, remove, restart.

Adding compiles the workflow (maybe loading its models) and starts two threads; removing
joins them: both run off the loop, one change at a time (the runtime's control lock). With
`server.state_dir`, both are kept there before they are answered, and restored at start
(appliance/runtime/state.py); a change that cannot be kept is undone and answered 503.
"""

from __future__ import annotations

from aiohttp import web

from appliance.config import StreamConfig
from appliance.observe.status import StreamStatus, as_json
from appliance.policy.roles import Role
from appliance.server.audit import audit_target
from appliance.server.bodies import parse_json
from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Fanout, Reply, Route
from appliance.server.schemas import Removed, StreamList


async def list_streams(request: web.Request) -> web.Response:
    """Every stream with its state, figures and recent state transitions."""
    statuses = await in_thread(runtime_of(request).streams_status)
    return web.json_response({"streams": as_json(statuses)})


async def get_stream(request: web.Request) -> web.Response:
    """One stream, with its recent state transitions (time, state, reason)."""
    rt = runtime_of(request)
    return web.json_response(as_json(await in_thread(rt.stream_status, request.match_info["id"])))


async def add_stream(request: web.Request) -> web.Response:
    """Start a stream, described as in the config file; relative workflow paths resolve
    against the config file's directory. Nothing starts unless the stream and its
    workflow are valid."""
    cfg = await parse_json(request, StreamConfig)
    audit_target(request, cfg.id)
    rt = runtime_of(request)
    stream = await in_thread(rt.add_stream, cfg, requested=True)
    location = {"Location": f"/v1/streams/{stream.id}"}
    body = as_json(rt.stream_status(stream.id))
    return web.json_response(body, status=201, headers=location)


async def remove_stream(request: web.Request) -> web.Response:
    """Stop a stream and join its threads (3 s at most); its metrics go with it."""
    stream_id = request.match_info["id"]
    joined = await in_thread(runtime_of(request).remove_stream, stream_id, requested=True)
    return web.json_response({"id": stream_id, "removed": True, "threads_joined": joined})


async def restart_stream(request: web.Request) -> web.Response:
    """Stop and start a stream again, recompiling its workflow if the file changed."""
    rt = runtime_of(request)
    stream = await in_thread(rt.restart_stream, request.match_info["id"])
    return web.json_response(as_json(rt.stream_status(stream.id)))


ROUTES = (
    Route(
        "GET",
        "/v1/streams",
        list_streams,
        "List streams",
        (Reply(200, "every stream", StreamList),),
        role=Role.VIEWER,
        workers=Fanout.MERGE,
    ),
    Route(
        "POST",
        "/v1/streams",
        add_stream,
        "Add a stream",
        (Reply(201, "started", StreamStatus),),
        errors=(403, 409, 503),
        body={"application/json": StreamConfig},
        role=Role.ADMIN,
        audit="stream.add",
        workers=Fanout.PLACE,
    ),
    Route(
        "GET",
        "/v1/streams/{id}",
        get_stream,
        "Get a stream",
        (Reply(200, "the stream", StreamStatus),),
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
    Route(
        "DELETE",
        "/v1/streams/{id}",
        remove_stream,
        "Remove a stream",
        (Reply(200, "stopped and removed", Removed),),
        errors=(503,),
        role=Role.ADMIN,
        audit="stream.remove",
        workers=Fanout.OWNER,
    ),
    Route(
        "POST",
        "/v1/streams/{id}/restart",
        restart_stream,
        "Restart a stream",
        (Reply(200, "restarted", StreamStatus),),
        errors=(403, 413, 422),
        role=Role.OPERATOR,
        audit="stream.restart",
        workers=Fanout.OWNER,
    ),
)
