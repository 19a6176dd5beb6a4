"""Liveness, readiness and Prometheus metrics: what orchestrators and scrapers poll.

Liveness fails only when the process can no longer work (its runtime stopped, its stream
supervisor dead or wedged): an orchestrator restarts the container for that and nothing
less. A camera down or a stream stalled is a readiness matter, and the supervisor's job.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from appliance.runtime import Runtime
from appliance.server.auth import INSECURE
from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Reply, Route
from appliance.server.schemas import Health, Ready
from appliance.sources import StreamState


async def health(request: web.Request) -> web.Response:
    """Liveness: 200 while the process can work (its event loop answers this, its runtime
    runs and its stream supervisor checks); 503 with the reason when it cannot. One
    stream down or stalled is no reason: the supervisor restarts a stalled one."""
    problem = runtime_of(request).liveness_problem()
    if problem is None:
        return web.json_response({"status": "ok"})
    return web.json_response({"status": "down", "reason": problem}, status=503)


async def ready(request: web.Request) -> web.Response:
    """Readiness: models loaded, every stream past `starting`, none stalled (a stalled
    stream counts until its restarted stream processes a frame), the runtime alive.
    `insecure`: the API is open without a token on an exposed address."""
    rt = runtime_of(request)
    waiting = [s.id for s in list(rt.streams.values()) if s.state == StreamState.STARTING]
    stalled = rt.stalled()
    ok = not waiting and not stalled and rt.liveness_problem() is None
    profiling = {
        "enabled": rt.tracer.enabled,
        "trace_dir": str(rt.trace_writer.directory),
        "window_active": rt.windows.active,
        "last_write_error": rt.trace_writer.last_error,
    }
    body = {
        "ready": ok,
        "models": sorted(rt.models),
        "waiting": waiting,
        "stalled": stalled,
        "insecure": request.app.get(INSECURE, False),
        "sinks": {s.name: s.state for s in rt.outputs.statuses()},
        "profiling": profiling,
    }
    return web.json_response(body, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text format: streams, blocks, models, batches."""
    body = await in_thread(_exposition, runtime_of(request))
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _exposition(rt: Runtime) -> bytes:
    rt.sync_metrics()
    return bytes(generate_latest(rt.metrics.registry))


TEXT = CONTENT_TYPE_LATEST.split(";")[0]
ROUTES = (
    Route("GET", "/health", health, "Liveness",
          (Reply(200, "alive", Health), Reply(503, "the runtime cannot work", Health)),
          probe=True, tag="probes"),
    Route("GET", "/ready", ready, "Readiness",
          (Reply(200, "ready", Ready),
           Reply(503, "streams starting or stalled, or the runtime down", Ready)),
          probe=True, tag="probes"),
    Route("GET", "/metrics", metrics, "Prometheus metrics",
          (Reply(200, "Prometheus text exposition", {"type": "string"}, TEXT),),
          probe=True, tag="probes"),
)  # fmt: skip
