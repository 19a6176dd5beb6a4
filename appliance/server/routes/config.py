"""Config reload, over HTTP and on SIGHUP (serve.py): one path for both."""

from __future__ import annotations

from aiohttp import web

from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Reply, Route
from appliance.server.schemas import Reloaded


async def reload(request: web.Request) -> web.Response:
    """Re-read the config file: streams added, removed or changed there are started,
    stopped or restarted; unchanged ones and streams added over the API keep running.
    Everything is validated before anything changes."""
    plan = await in_thread(runtime_of(request).reload)
    return web.json_response(plan.summary())


ROUTES = (
    Route("POST", "/v1/config/reload", reload, "Reload the config file",
          (Reply(200, "applied", Reloaded),), errors=(403, 409, 413, 422), tag="config"),
)  # fmt: skip
