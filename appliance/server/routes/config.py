"""Config reload, over HTTP and on SIGHUP (serve.py): one path for both."""

from __future__ import annotations

from aiohttp import web

from appliance.server.context import CONTROL, RUNTIME, in_thread
from appliance.server.routing import Reply, Route
from appliance.server.schemas import Reloaded


async def reload_config(app: web.Application) -> dict[str, list[str]]:
    """Apply the config file as it is now; raises what `Runtime.reload` raises, with
    nothing changed (ConfigError, WorkflowError, ModelLoadError, ReloadError)."""
    async with app[CONTROL]:
        plan = await in_thread(app[RUNTIME].reload)
    return plan.summary()


async def reload(request: web.Request) -> web.Response:
    """Re-read the config file: streams added, removed or changed there are started,
    stopped or restarted; unchanged ones and streams added over the API keep running.
    Everything is validated before anything changes."""
    return web.json_response(await reload_config(request.app))


ROUTES = (
    Route("POST", "/v1/config/reload", reload, "Reload the config file",
          (Reply(200, "applied", Reloaded),), errors=(403, 409, 413, 422), tag="config"),
)  # fmt: skip
