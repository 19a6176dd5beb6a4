"""The sinks results go to: state, queue depth and delivery counters."""

from __future__ import annotations

from aiohttp import web

from appliance.server.context import runtime_of
from appliance.server.routing import Reply, Route
from appliance.server.schemas import SinkList
from appliance.status import as_json


async def list_sinks(request: web.Request) -> web.Response:
    """Every sink of the config, with its state and counters (last error masked)."""
    return web.json_response({"sinks": as_json(runtime_of(request).sinks_status())})


ROUTES = (
    Route("GET", "/v1/sinks", list_sinks, "List sinks",
          (Reply(200, "every sink", SinkList),), tag="sinks"),
)  # fmt: skip
