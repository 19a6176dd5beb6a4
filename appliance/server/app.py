"""The HTTP application: the route table (routes/) behind two middlewares, errors
outermost (errors.py) and auth inside it (auth.py), and the OpenAPI document of exactly
these routes (openapi.py). Handlers stay thin; runtime work leaves the loop."""

from __future__ import annotations

import asyncio
import dataclasses

from aiohttp import web

from appliance.runtime import Runtime
from appliance.server.auth import AuthPolicy, auth_middleware
from appliance.server.context import CONTROL, MAX_BODY, OPENAPI, RUNTIME
from appliance.server.errors import REFUSALS, error_middleware
from appliance.server.openapi import build_openapi
from appliance.server.routes import PROBES, ROUTES

__all__ = ["RUNTIME", "build_app"]


def build_app(runtime: Runtime, policy: AuthPolicy) -> web.Application:
    """The application for `runtime`, guarded by `policy` (see AuthPolicy.for_bind)."""
    policy = dataclasses.replace(policy, open_paths=PROBES)
    max_body = runtime.config.server.max_body_bytes
    app = web.Application(
        client_max_size=max_body, middlewares=[error_middleware, auth_middleware(policy)]
    )
    app[RUNTIME] = runtime
    app[CONTROL] = asyncio.Lock()
    app[MAX_BODY] = max_body
    app[REFUSALS] = {"limit_hits": runtime.metrics.limit_hits,
                     "file_refusals": runtime.metrics.file_refusals}  # fmt: skip
    for route in ROUTES:
        # add_route, not add_get: no implicit HEAD routes the document would not list.
        app.router.add_route(route.method, route.path, route.handler, name=route.operation_id)
    app[OPENAPI] = build_openapi(ROUTES, policy)
    return app
