"""The HTTP application: health, readiness, Prometheus metrics and stream status.

The control API proper (auth, stream management, OpenAPI) grows here in its own modules;
handlers stay thin and read the runtime's state, never run CPU work on the loop.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from appliance.runtime import Runtime

RUNTIME = web.AppKey("runtime", Runtime)


def build_app(runtime: Runtime) -> web.Application:
    app = web.Application(client_max_size=1 << 20)  # 1 MiB bodies: JSON only so far
    app[RUNTIME] = runtime
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/streams", list_streams)
    app.router.add_get("/v1/streams/{id}", get_stream)
    return app


async def health(request: web.Request) -> web.Response:
    """Liveness: the process and its event loop answer."""
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """Readiness: models loaded and every stream has reported a state past `starting`."""
    rt = request.app[RUNTIME]
    waiting = [s.id for s in rt.streams.values() if s.state.value == "starting"]
    body: dict[str, Any] = {"ready": not waiting, "models": sorted(rt.models), "waiting": waiting}
    return web.json_response(body, status=200 if not waiting else 503)


async def metrics(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    rt.sync_metrics()
    body = generate_latest(rt.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def list_streams(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    streams = [{"id": s.id, **s.summary()} for s in rt.streams.values()]
    return web.json_response({"streams": streams})


async def get_stream(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    stream = rt.streams.get(request.match_info["id"])
    if stream is None:
        msg = f"unknown stream {request.match_info['id']!r}"
        return web.json_response({"error": {"code": "not_found", "message": msg}}, status=404)
    return web.json_response({"id": stream.id, **stream.summary(), "transitions": stream.history()})
