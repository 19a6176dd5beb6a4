"""The route table: every route of the server, in the order /openapi.json lists them."""

from __future__ import annotations

from appliance.server.routes import (
    config,
    latency,
    meta,
    models,
    probes,
    profiling,
    regressions,
    results,
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
    *latency.ROUTES,
    *results.ROUTES,
    *workflows.ROUTES,
    *models.ROUTES,
    *sinks.ROUTES,
    *config.ROUTES,
    *profiling.ROUTES,
    *regressions.ROUTES,
    *tune.ROUTES,
    *webrtc.ROUTES,
    *viewer.ROUTES,
)

# Paths the auth policy may open without a token (`server.open_probes`).
PROBES = frozenset(r.path for r in ROUTES if r.probe)
# Paths open without a token whatever the policy: the web viewer (routes/viewer.py).
PUBLIC = frozenset(r.path for r in ROUTES if r.public)
# Paths that answer for as long as the client reads: no request time limit.
STREAMING = frozenset(r.path for r in ROUTES if r.streaming)

__all__ = ["PROBES", "PUBLIC", "ROUTES", "STREAMING", "Route"]
