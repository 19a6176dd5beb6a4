"""The loaded models: interface, providers actually obtained, batching and counters."""

from __future__ import annotations

from aiohttp import web

from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Reply, Route
from appliance.server.schemas import ModelList
from appliance.status import as_json


async def list_models(request: web.Request) -> web.Response:
    """Every loaded model, from the config's `models:` and from workflows' own."""
    models = await in_thread(runtime_of(request).models_status)
    return web.json_response({"models": as_json(models)})


ROUTES = (
    Route("GET", "/v1/models", list_models, "List models",
          (Reply(200, "every loaded model", ModelList),), tag="models"),
)  # fmt: skip
