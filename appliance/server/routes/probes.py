"""Liveness, readiness and Prometheus metrics: what orchestrators and scrapers poll."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from appliance.runtime import Runtime
from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Reply, Route
from appliance.server.schemas import Health, Ready
from appliance.sources import StreamState


async def health(request: web.Request) -> web.Response:
    """Liveness: the process and its event loop answer."""
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    """Readiness: models loaded and every stream has reported a state past `starting`."""
    rt = runtime_of(request)
    waiting = [s.id for s in list(rt.streams.values()) if s.state == StreamState.STARTING]
    profiling = {
        "enabled": rt.tracer.enabled,
        "trace_dir": str(rt.trace_writer.directory),
        "window_active": rt.windows.active,
        "last_write_error": rt.trace_writer.last_error,
    }
    body = {"ready": not waiting, "models": sorted(rt.models), "waiting": waiting,
            "profiling": profiling}  # fmt: skip
    return web.json_response(body, status=503 if waiting else 200)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text format: streams, blocks, models, batches."""
    body = await in_thread(_exposition, runtime_of(request))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _exposition(rt: Runtime) -> bytes:
    rt.sync_metrics()
    return bytes(generate_latest(rt.metrics.registry))


TEXT = CONTENT_TYPE_LATEST.split(";")[0]
ROUTES = (
    Route("GET", "/health", health, "Liveness", (Reply(200, "alive", Health),),
          probe=True, tag="probes"),
    Route("GET", "/ready", ready, "Readiness",
          (Reply(200, "ready", Ready), Reply(503, "models or streams still starting", Ready)),
          probe=True, tag="probes"),
    Route("GET", "/metrics", metrics, "Prometheus metrics",
          (Reply(200, "Prometheus text exposition", {"type": "string"}, TEXT),),
          probe=True, tag="probes"),
)  # fmt: skip
