"""The route table: every route of the server, in the order /openapi.json lists them."""

from __future__ import annotations

from appliance.server.routes import (
    access,
    config,
    frames,
    latency,
    meta,
    models,
    probes,
    profiling,
    regressions,
    results,
    shadow,
    sinks,
    streams,
    tune,
    viewer,
    webrtc,
    workflows,
)
from appliance.server.routing import Route

ROUTES: tuple[Route, ...] = (
    *probes.ROUTES,
    *meta.ROUTES,
    *streams.ROUTES,
    *shadow.ROUTES,
    *latency.ROUTES,
    *frames.ROUTES,
    *results.ROUTES,
    *workflows.ROUTES,
    *models.ROUTES,
    *sinks.ROUTES,
    *config.ROUTES,
    *profiling.ROUTES,
    *regressions.ROUTES,
    *tune.ROUTES,
    *access.ROUTES,
    *webrtc.ROUTES,
    *viewer.ROUTES,
)

# Paths that answer for as long as the client reads: no request time limit.
STREAMING = frozenset(r.path for r in ROUTES if r.streaming)

__all__ = ["ROUTES", "STREAMING", "Route"]
