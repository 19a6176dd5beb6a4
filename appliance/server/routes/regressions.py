"""The regression watch over the API (appliance/watch/): what got slower, since when, with
the evidence; and a stream's baselines learned again after an intended change."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from appliance.observe.status import as_json
from appliance.policy.roles import Role
from appliance.server.context import in_thread, runtime_of
from appliance.server.routing import Fanout, Reply, Route
from appliance.watch.report import WatchReport


@dataclass(frozen=True, slots=True)
class Rebaselined:
    """The rows of the stream that learn their baseline again, from now."""

    stream: str
    rows: list[str]
    learn_s: float


async def get_regressions(request: web.Request) -> web.Response:
    """The host's state, every active regression (block, model, queue wait, frame age,
    host) with its numbers, change and evidence window, and the ended ones, newest first."""
    report = await in_thread(runtime_of(request).regressions)
    return web.json_response(as_json(report))


async def rebaseline(request: web.Request) -> web.Response:
    """Forget the stream's baselines (its blocks, frame age and the models it runs) and
    learn them again from now, after a change that was meant: their regressions end."""
    rt = runtime_of(request)
    stream_id = request.match_info["id"]
    rows = await in_thread(rt.rebaseline, stream_id)
    body = Rebaselined(stream_id, rows, rt.config.profiling.watch.learn_s)
    return web.json_response(as_json(body), status=202)


ROUTES = (
    Route(
        "GET",
        "/v1/regressions",
        get_regressions,
        "List regressions",
        (Reply(200, "the watch's regressions", WatchReport),),
        tag="profiling",
        role=Role.VIEWER,
        workers=Fanout.MERGE,
    ),
    Route(
        "POST",
        "/v1/streams/{id}/baseline",
        rebaseline,
        "Learn a stream's baseline again",
        (Reply(202, "learning from now", Rebaselined),),
        tag="profiling",
        role=Role.OPERATOR,
        audit="baseline.reset",
        workers=Fanout.OWNER,
    ),
)
