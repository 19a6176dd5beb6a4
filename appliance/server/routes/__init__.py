"""The route table: every route of the server, in the order /openapi.json lists them."""

from __future__ import annotations

from appliance.server.routes import (
    config,
    meta,
    models,
    probes,
    profiling,
    sinks,
    streams,
    workflows,
)
from appliance.server.routing import Route

ROUTES: tuple[Route, ...] = (
    *probes.ROUTES,
    *meta.ROUTES,
    *streams.ROUTES,
    *workflows.ROUTES,
    *models.ROUTES,
    *sinks.ROUTES,
    *config.ROUTES,
    *profiling.ROUTES,
)

# Paths the auth policy may open without a token (`server.open_probes`).
PROBES = frozenset(r.path for r in ROUTES if r.probe)

__all__ = ["PROBES", "ROUTES", "Route"]
