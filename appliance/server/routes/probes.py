"""Liveness, readiness and Prometheus metrics: what orchestrators and scrapers poll.

Liveness fails only when the process can no longer work (its runtime stopped, its stream
supervisor dead or wedged): an orchestrator restarts the container for that and nothing
less. A camera down or a stream stalled is a readiness matter, and the supervisor's job.
"""

from __future__ import annotations

import dataclasses

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import choose_encoder

from appliance.observe.openmetrics import CONTENT_TYPE as OPENMETRICS_CONTENT_TYPE
from appliance.observe.status import Readiness, as_json
from appliance.policy.files import shown_path
from appliance.policy.roles import Role
from appliance.server.auth import INSECURE
from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Fanout, Reply, Route
from appliance.server.schemas import Health
from appliance.server.tls import TLS


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
    `insecure`: the API is open without a token on an exposed address; `tls`: it is
    served over TLS."""
    rt = runtime_of(request)
    status = await in_thread(rt.status)
    # The trace folder as the config names it, not the host's absolute path.
    folder = shown_path(rt.config, status.profiling.trace_dir, rt.config.profiling.dir)
    profiling = dataclasses.replace(status.profiling, trace_dir=folder)
    status = dataclasses.replace(status, profiling=profiling)
    insecure, tls = request.app.get(INSECURE, False), TLS in request.app
    body = Readiness.of(status, insecure=insecure, tls=tls)
    return web.json_response(as_json(body), status=200 if body.ready else 503)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text format: streams, blocks, models, batches; OpenMetrics, with the
    latency histograms' exemplars, to a scraper that asks for it (Prometheus does)."""
    openmetrics = wants_openmetrics(request.headers.get("Accept", ""))
    body = await in_thread(runtime_of(request).metrics_text, openmetrics)
    kind = OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE_LATEST
    return web.Response(body=body, headers={"Content-Type": kind})


def wants_openmetrics(accept: str) -> bool:
    """prometheus_client's own choice (`choose_encoder`): OpenMetrics when the Accept
    header names it, the classic text format otherwise."""
    return choose_encoder(accept)[1].startswith("application/openmetrics-text")


TEXT = CONTENT_TYPE_LATEST.split(";")[0]
ROUTES = (
    Route(
        "GET",
        "/health",
        health,
        "Liveness",
        (Reply(200, "alive", Health), Reply(503, "the runtime cannot work", Health)),
        probe=True,
        tag="probes",
        role=Role.VIEWER,
        workers=Fanout.GATEWAY,
    ),
    Route(
        "GET",
        "/ready",
        ready,
        "Readiness",
        (
            Reply(200, "ready", Readiness),
            Reply(503, "streams starting or stalled, or the runtime down", Readiness),
        ),
        probe=True,
        tag="probes",
        role=Role.VIEWER,
        workers=Fanout.MERGE,
    ),
    Route(
        "GET",
        "/metrics",
        metrics,
        "Prometheus metrics",
        (
            Reply(
                200, "Prometheus text exposition (OpenMetrics if asked)", {"type": "string"}, TEXT
            ),
        ),
        probe=True,
        tag="probes",
        role=Role.VIEWER,
        workers=Fanout.MERGE,
    ),
)
