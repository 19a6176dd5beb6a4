"""The loaded models: interface, providers actually obtained, batching and counters."""

from __future__ import annotations

import dataclasses

from aiohttp import web

from appliance.observe.status import as_json
from appliance.policy.files import shown_path
from appliance.policy.roles import Role
from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Fanout, Reply, Route
from appliance.server.schemas import ModelList


async def list_models(request: web.Request) -> web.Response:
    """Every loaded model, from the config's `models:` and from workflows' own."""
    rt = runtime_of(request)
    models = await in_thread(rt.models_status)
    # Paths as the config's folder sees them, not the host's layout (where possible).
    shown = [dataclasses.replace(m, path=shown_path(rt.config, m.path)) for m in models]
    return web.json_response({"models": as_json(shown)})


ROUTES = (
    Route(
        "GET",
        "/v1/models",
        list_models,
        "List models",
        (Reply(200, "every loaded model", ModelList),),
        tag="models",
        role=Role.ADMIN,
        workers=Fanout.MERGE,
    ),
)
