"""The sinks results go to: state, queue depth and delivery counters."""

from __future__ import annotations

from aiohttp import web

from appliance.outputs import status_json
from appliance.server.context import runtime_of
from appliance.server.routing import Reply, Route
from appliance.server.schemas import SinkList


async def list_sinks(request: web.Request) -> web.Response:
    """Every sink of the config, with its state and counters (last error masked)."""
    statuses = runtime_of(request).outputs.statuses()
    return web.json_response({"sinks": [status_json(s) for s in statuses]})


ROUTES = (
    Route("GET", "/v1/sinks", list_sinks, "List sinks",
          (Reply(200, "every sink", SinkList),), tag="sinks"),
)  # fmt: skip
