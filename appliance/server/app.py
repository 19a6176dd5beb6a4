"""The HTTP application: the route table (routes/) behind two middlewares, errors
outermost (errors.py) and auth inside it (auth.py), and the OpenAPI document of exactly
these routes (openapi.py). Handlers stay thin; runtime work leaves the loop."""

from __future__ import annotations

from aiohttp import web

from appliance.runtime.runtime import Runtime
from appliance.server.audit import audit_middleware
from appliance.server.auth import AuthPolicy, auth_middleware
from appliance.server.context import (
    MAX_BODY,
    OPENAPI,
    RUNTIME,
    WATCHERS,
    WORK_SLOTS,
)
from appliance.server.crosssite import CrossSite, cross_site_middleware
from appliance.server.errors import REFUSALS, error_middleware
from appliance.server.limits import Watchers, WorkSlots, timeout_middleware
from appliance.server.openapi import build_openapi
from appliance.server.routes import ROUTES, STREAMING
from appliance.server.routes.tune import TUNE
from appliance.server.routes.webrtc import WEBRTC
from appliance.server.routing import known_query
from appliance.server.webrtc.sessions import WebRtcSessions
from appliance.tune.job import TuneJob

__all__ = ["RUNTIME", "build_app"]


def build_app(
    runtime: Runtime, policy: AuthPolicy, bind_host: str | None = None
) -> web.Application:
    """The application for `runtime`, guarded by `policy` (see AuthPolicy.for_bind);
    `bind_host`, the address served on, is WebRTC's host candidate by default."""
    policy = policy.with_routes(ROUTES)
    max_body = runtime.config.server.max_body_bytes
    limits = runtime.limits
    middlewares = [
        audit_middleware(runtime.audit, ROUTES),  # outermost: it sees the answer sent
        error_middleware,
        cross_site_middleware(CrossSite.for_bind(runtime.config.server, bind_host)),
        auth_middleware(policy),
        timeout_middleware(limits.request_timeout_s, STREAMING),
    ]
    app = web.Application(client_max_size=max_body, middlewares=middlewares)
    slots = app[WORK_SLOTS] = WorkSlots(limits.max_concurrent_runs)
    app[WATCHERS] = Watchers(limits.max_watchers)
    app.on_cleanup.append(lambda _: _close(slots))
    app[RUNTIME] = runtime
    app[MAX_BODY] = max_body
    metrics = runtime.metrics
    app[REFUSALS] = {"limit_hits": metrics.limit_hits, "file_refusals": metrics.file_refusals}
    for route in ROUTES:
        # add_route, not add_get: no implicit HEAD routes the document would not list.
        handler = known_query(route)
        app.router.add_route(route.method, route.path, handler, name=route.operation_id)
    app[OPENAPI] = build_openapi(ROUTES, policy)
    sessions = app[WEBRTC] = WebRtcSessions(runtime, runtime.config.webrtc, bind_host)
    app.on_shutdown.append(lambda _: sessions.close_all())
    app[TUNE] = TuneJob(runtime)  # stopped by Server.shutdown, before the streams
    return app


async def _close(slots: WorkSlots) -> None:
    slots.close()
