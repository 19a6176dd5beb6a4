"""A stream's recent per-block latency (appliance/observe/blocklatency.py): exact percentiles
over its last frames, for the web viewer and for a quick look without a scraper; and
the lines and zones its workflow counts, for the viewer's overlay."""

from __future__ import annotations

from aiohttp import web

from appliance.observe.blocklatency import StreamLatency
from appliance.observe.status import as_json
from appliance.policy.roles import Role
from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Fanout, Reply, Route
from appliance.server.schemas import Scene


async def get_latency(request: web.Request) -> web.Response:
    """The workflow's and each block's p50 and p99 (ms), in workflow order, over the
    stream's last frames (at most `window`), and their rate; a restart starts a fresh
    window. A block that did not run in the window (gated by `rate_limit`) has nulls."""
    report = await in_thread(runtime_of(request).stream_latency, request.match_info["id"])
    return web.json_response(as_json(report))


async def get_scene(request: web.Request) -> web.Response:
    """The lines and zones the stream's workflow counts against (its `line_counter` and
    `zone_counter` blocks), for a viewer that draws them over the video."""
    stream_id = request.match_info["id"]
    regions = await in_thread(runtime_of(request).stream_regions, stream_id)
    return web.json_response({"stream": stream_id, "regions": [r.to_json() for r in regions]})


ROUTES = (
    Route(
        "GET",
        "/v1/streams/{id}/latency",
        get_latency,
        "Get a stream's per-block latency",
        (Reply(200, "recent latency per block", StreamLatency),),
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
    Route(
        "GET",
        "/v1/streams/{id}/scene",
        get_scene,
        "Get a stream's lines and zones",
        (Reply(200, "what its workflow counts against", Scene),),
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
)
