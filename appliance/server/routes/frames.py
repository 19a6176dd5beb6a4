"""From a latency figure to the frames behind it (docs/exemplars.md): a frame's trace,
which an exemplar's link and a row of the slowest frames open, and a stream's slowest
frames of a period (appliance/observe/slowest.py, appliance/profiling/frametrace.py)."""

from __future__ import annotations

import re
import time
from datetime import datetime

from aiohttp import web

from appliance.observe.slowest import DEFAULT_SINCE_S, PER_SLOT, SLOT_S, SLOTS, SlowestReport
from appliance.observe.status import as_json
from appliance.policy.roles import Role
from appliance.profiling.frametrace import AROUND, MAX_AROUND
from appliance.server.context import in_thread, runtime_of
from appliance.server.errors import InvalidError
from appliance.server.routing import Fanout, Reply, Route
from pipelines.types import iso_utc

_DURATION = re.compile(r"(\d{1,7})([smh])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
MAX_SEQ = 2**53  # JSON's exact integers


def whole(request: web.Request, name: str, lo: int, hi: int, default: int) -> int:
    """`?name=N` in lo..hi (422 otherwise), `default` when not given."""
    given = request.query.getall(name, [])
    if not given:
        return default
    text = given[0]
    if len(given) > 1 or not (text.isascii() and text.isdigit() and len(text) < 10):
        raise InvalidError(f"{name}: a whole number", [f"{name}: expected {lo}..{hi}"])
    value = int(text)
    if not lo <= value <= hi:
        raise InvalidError(f"{name}: {value} is not in {lo}..{hi}", [f"{name}: {value}"])
    return value


def since_of(request: web.Request, now: float) -> float:
    """`?since=`: a time (ISO 8601, with its offset) or a span back from now (`90s`,
    `15m`, `1h`); the last hour when not given. Epoch seconds."""
    given = request.query.getall("since", [])
    if not given:
        return now - DEFAULT_SINCE_S
    text = given[0]
    span = _DURATION.fullmatch(text) if len(given) == 1 else None
    if span is not None:
        return now - int(span[1]) * _UNIT_S[span[2]]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if len(given) > 1 or moment is None or moment.tzinfo is None:
        raise InvalidError(
            "since: a time with its offset (2026-12-07T15:00:00Z) or a span (90s, 15m, 1h)",
            [f"since: {text[:64]!r}"],
        )
    return moment.timestamp()


def seq_of(request: web.Request) -> int:
    text = request.match_info["seq"]
    if not (text.isascii() and text.isdigit() and len(text) <= 16) or int(text) > MAX_SEQ:
        raise InvalidError("seq: a frame's sequence number", [f"seq: {text[:32]!r}"])
    return int(text)


async def get_frame_trace(request: web.Request) -> web.Response:
    """A Chrome/Perfetto trace of frame `seq` and `around` frames of its stream either
    side: every thread's events over them (grab, workflow and blocks, the batcher's run
    it waited for, the other streams meanwhile), with ONNX Runtime's operators where a
    profiling window covered it. From memory while recent, from the rolling trace file
    that holds it afterwards; 404 naming the oldest frame still held once it has
    rotated away. Open it in https://ui.perfetto.dev or chrome://tracing."""
    stream_id, seq = request.match_info["id"], seq_of(request)
    around = whole(request, "around", 0, MAX_AROUND, AROUND)
    found = await in_thread(runtime_of(request).frame_trace, stream_id, seq, around)
    name = f"frame-{stream_id}-{seq}.json"
    headers = {"Content-Disposition": f'inline; filename="{name}"', "X-Trace-Source": found.source}
    return web.json_response(found.doc, headers=headers)


async def get_slowest(request: web.Request) -> web.Response:
    """The stream's slowest frames captured since `since` (default: the last hour), the
    slowest first: each one's workflow time, its blocks' times (the slowest named), the
    model runs it waited for (batch size, queue wait) and its trace. Kept in memory per
    stream: the 10 slowest of each minute of the last hour; a restart starts afresh."""
    stream_id, now = request.match_info["id"], time.time()
    since = since_of(request, now)
    limit = whole(request, "limit", 1, PER_SLOT, PER_SLOT)
    frames = await in_thread(runtime_of(request).slowest_frames, stream_id, since, limit)
    report = SlowestReport(stream_id, iso_utc(since), frames)
    return web.json_response(as_json(report))


_AROUND = {"type": "integer", "minimum": 0, "maximum": MAX_AROUND, "default": AROUND}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": PER_SLOT, "default": PER_SLOT}
_SINCE = {"type": "string", "maxLength": 64}
ROUTES = (
    Route(
        "GET",
        "/v1/streams/{id}/frames/{seq}/trace",
        get_frame_trace,
        "Get one frame's trace",
        (Reply(200, "Chrome trace of the frame and its neighbours", {"type": "object"}),),
        query={"around": (_AROUND, "frames of the stream either side")},
        tag="profiling",
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
    Route(
        "GET",
        "/v1/streams/{id}/slowest",
        get_slowest,
        "List a stream's slowest frames",
        (Reply(200, "the slowest frames of the period", SlowestReport),),
        query={
            "since": (_SINCE, f"a time or a span back ({SLOTS * SLOT_S / 3600:g} h at most)"),
            "limit": (_LIMIT, "how many frames"),
        },
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
)
