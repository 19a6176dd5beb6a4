"""Streams at runtime: list, inspect, add, remove, restart.

Adding compiles the workflow (maybe loading its models) and starts two threads; removing
joins them: both run off the loop, one change at a time (the runtime's control lock).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from appliance.config import StreamConfig
from appliance.errors import UnknownStreamError
from appliance.runtime import Runtime
from appliance.server.bodies import parse_json
from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Reply, Route
from appliance.server.schemas import Removed, Stream, StreamDetail, StreamList
from appliance.streams import Stream as RunningStream


def stream_json(rt: Runtime, stream: RunningStream, *, detail: bool = False) -> dict[str, Any]:
    """The API's `Stream`: the runtime's summary plus the providers of its models."""
    models = rt.models
    providers = {m: list(models[m].info.providers) for m in stream.workflow.models if m in models}
    outputs = [o.sink for o in stream.cfg.outputs]
    body = {"id": stream.id, **stream.summary(), "providers": providers, "outputs": outputs}
    if detail:
        body["transitions"] = list(stream.history())
    return body


def _find(rt: Runtime, stream_id: str) -> RunningStream:
    stream = rt.streams.get(stream_id)
    if stream is None:
        raise UnknownStreamError(stream_id)
    return stream


async def list_streams(request: web.Request) -> web.Response:
    """Every stream with its state and figures."""
    rt = runtime_of(request)
    return web.json_response({"streams": [stream_json(rt, s) for s in list(rt.streams.values())]})


async def get_stream(request: web.Request) -> web.Response:
    """One stream, with its recent state transitions (time, state, reason)."""
    rt = runtime_of(request)
    return web.json_response(stream_json(rt, _find(rt, request.match_info["id"]), detail=True))


async def add_stream(request: web.Request) -> web.Response:
    """Start a stream, described as in the config file; relative workflow paths resolve
    against the config file's directory. Nothing starts unless the stream and its
    workflow are valid."""
    cfg = await parse_json(request, StreamConfig)
    rt = runtime_of(request)
    stream = await in_thread(rt.add_stream, cfg, requested=True)
    location = {"Location": f"/v1/streams/{stream.id}"}
    return web.json_response(stream_json(rt, stream), status=201, headers=location)


async def remove_stream(request: web.Request) -> web.Response:
    """Stop a stream and join its threads (3 s at most); its metrics go with it."""
    stream_id = request.match_info["id"]
    joined = await in_thread(runtime_of(request).remove_stream, stream_id)
    return web.json_response({"id": stream_id, "removed": True, "threads_joined": joined})


async def restart_stream(request: web.Request) -> web.Response:
    """Stop and start a stream again, recompiling its workflow if the file changed."""
    rt = runtime_of(request)
    stream = await in_thread(rt.restart_stream, request.match_info["id"])
    return web.json_response(stream_json(rt, stream))


ROUTES = (
    Route("GET", "/v1/streams", list_streams, "List streams",
          (Reply(200, "every stream", StreamList),)),
    Route("POST", "/v1/streams", add_stream, "Add a stream",
          (Reply(201, "started", Stream),), errors=(403, 409),
          body={"application/json": StreamConfig}),
    Route("GET", "/v1/streams/{id}", get_stream, "Get a stream",
          (Reply(200, "the stream", StreamDetail),)),
    Route("DELETE", "/v1/streams/{id}", remove_stream, "Remove a stream",
          (Reply(200, "stopped and removed", Removed),)),
    Route("POST", "/v1/streams/{id}/restart", restart_stream, "Restart a stream",
          (Reply(200, "restarted", Stream),), errors=(403, 413, 422)),
)  # fmt: skip
