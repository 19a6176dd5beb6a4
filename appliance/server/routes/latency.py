"""A stream's recent per-block latency (appliance/blocklatency.py): exact percentiles
over its last frames, for the web viewer and for a quick look without a scraper."""

from __future__ import annotations

from aiohttp import web

from appliance.blocklatency import StreamLatency
from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Reply, Route
from appliance.status import as_json


async def get_latency(request: web.Request) -> web.Response:
    """The workflow's and each block's p50 and p99 (ms), in workflow order, over the
    stream's last frames (at most `window`), and their rate; a restart starts a fresh
    window. A block that did not run in the window (gated by `rate_limit`) has nulls."""
    report = await in_thread(runtime_of(request).stream_latency, request.match_info["id"])
    return web.json_response(as_json(report))


ROUTES = (
    Route("GET", "/v1/streams/{id}/latency", get_latency, "Get a stream's per-block latency",
          (Reply(200, "recent latency per block", StreamLatency),)),
)  # fmt: skip
