"""The sinks results go to: state, queue depth and delivery counters."""

from __future__ import annotations

import dataclasses
import os

from aiohttp import web

from appliance.config import AppConfig
from appliance.observe.status import SinkStatus, as_json
from appliance.policy.files import shown_path
from appliance.policy.roles import Role
from appliance.server.context import runtime_of
from appliance.server.routing import Fanout, Reply, Route
from appliance.server.schemas import SinkList


async def list_sinks(request: web.Request) -> web.Response:
    """Every sink of the config, with its state and counters (last error masked)."""
    rt = runtime_of(request)
    sinks = [_shown_files(rt.config, s) for s in rt.sinks_status()]
    return web.json_response({"sinks": as_json(sinks)})


def _shown_files(config: AppConfig, status: SinkStatus) -> SinkStatus:
    """The absolute paths among a sink's details (a webhook's dead-letter file, kept in
    the traces folder) named as the config names that folder, not by the host's layout."""
    named = config.profiling.dir
    extra = {
        k: shown_path(config, v, named) if isinstance(v, str) and os.path.isabs(v) else v
        for k, v in status.extra.items()
    }
    return dataclasses.replace(status, extra=extra)


ROUTES = (
    Route(
        "GET",
        "/v1/sinks",
        list_sinks,
        "List sinks",
        (Reply(200, "every sink", SinkList),),
        tag="sinks",
        role=Role.OPERATOR,
        workers=Fanout.MERGE,
    ),
)
