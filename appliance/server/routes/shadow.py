"""A stream's shadow: a candidate workflow run on its live frames and compared with it.

Starting one compiles its workflow (maybe loading models) off the loop, through the
API's file policy and limits, as adding a stream does (appliance/runtime/shadows.py).
"""

from __future__ import annotations

import base64
from typing import Any

from aiohttp import web

from appliance.policy.roles import Role
from appliance.runtime.promotion import PromoteRequest
from appliance.runtime.shadow import ShadowSpec
from appliance.runtime.shadowframe import ComparedFrame
from appliance.server.bodies import parse_json
from appliance.server.context import in_thread, runtime_of
from appliance.server.errors import ApiError
from appliance.server.routes.results import JPEG_QUALITY
from appliance.server.routing import Fanout, Reply, Route
from appliance.server.schemas import Promoted, RolledBack, ShadowFrame, ShadowReport
from sinks.messages import encode_jpeg

PATH = "/v1/streams/{id}/shadow"


async def start_shadow(request: web.Request) -> web.Response:
    """Run a candidate workflow on the stream's frames beside its live one (every Nth
    frame, or at most `max_fps`), its results compared with the live results of the same
    frames and never sent to the stream's sinks."""
    spec = await parse_json(request, ShadowSpec)
    stream_id = request.match_info["id"]
    shadow = await in_thread(runtime_of(request).shadows.start, stream_id, spec)
    location = {"Location": PATH.format(id=stream_id)}
    return web.json_response(shadow.report(), status=201, headers=location)


async def get_shadow(request: web.Request) -> web.Response:
    """The shadow's comparison so far: agreement, misses and extras with examples, counts
    and latency against the live workflow."""
    shadow = runtime_of(request).shadows.find(request.match_info["id"])
    return web.json_response(await in_thread(shadow.report))


class NothingComparedError(ApiError):
    """The shadow runs but has compared no frame yet (its first pair is on its way)."""

    status = 404


async def shadow_frame(request: web.Request) -> web.Response:
    """The newest frame the shadow compared, for drawing both sides on it: the live and
    the candidate results as sinks send them, the live detections the candidate missed and
    its extra ones (rows per output), and the frame itself as a JPEG data URL, all in one
    answer so that the image and both overlays are of the same frame. 404 before the
    shadow compared its first frame."""
    stream_id = request.match_info["id"]
    shadow = runtime_of(request).shadows.find(stream_id)
    compared = shadow.compared()
    if compared is None:
        raise NothingComparedError(f"stream {stream_id!r}: its shadow has compared no frame yet")
    return web.json_response(await in_thread(_frame_json, compared, shadow.spec.iou))


def _frame_json(compared: ComparedFrame, iou: float) -> dict[str, Any]:
    jpeg = base64.b64encode(encode_jpeg(compared.image, JPEG_QUALITY)).decode("ascii")
    return {**compared.to_json(iou), "image": f"data:image/jpeg;base64,{jpeg}"}


async def stop_shadow(request: web.Request) -> web.Response:
    """Stop the shadow: its final report."""
    rt = runtime_of(request)
    shadow = await in_thread(rt.shadows.stop, request.match_info["id"])
    return web.json_response(shadow.report())


async def promote_shadow(request: web.Request) -> web.Response:
    """Switch the stream to its shadow's workflow at a frame boundary: no frame lost,
    sequence numbers go on, each result names the workflow version that made it. Gates
    in the body refuse a candidate that fails them (409 naming each); the workflow it
    replaces stays ready for `rollback_s`."""
    gates = await parse_json(request, PromoteRequest)
    rt = runtime_of(request)
    return web.json_response(await in_thread(rt.shadows.promote, request.match_info["id"], gates))


async def rollback_shadow(request: web.Request) -> web.Response:
    """Switch the stream back to the workflow its last promotion replaced (within its
    `rollback_s`), at a frame boundary as a promotion does."""
    rt = runtime_of(request)
    return web.json_response(await in_thread(rt.shadows.rollback, request.match_info["id"]))


ROUTES = (
    Route(
        "POST",
        PATH,
        start_shadow,
        "Start a shadow workflow on a stream",
        (Reply(201, "started", ShadowReport),),
        errors=(403, 404, 409, 413, 422),
        body={"application/json": ShadowSpec},
        role=Role.ADMIN,
        audit="shadow.start",
        workers=Fanout.OWNER,
    ),
    Route(
        "GET",
        PATH,
        get_shadow,
        "Get a stream's shadow comparison",
        (Reply(200, "the shadow and its comparison", ShadowReport),),
        errors=(404,),
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
    Route(
        "GET",
        PATH + "/frame",
        shadow_frame,
        "Get the newest frame a stream's shadow compared",
        (Reply(200, "both results of one frame, and the frame", ShadowFrame),),
        errors=(404,),
        tag="results",  # like a stream's latest result: 404 until there is one
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
    Route(
        "DELETE",
        PATH,
        stop_shadow,
        "Stop a stream's shadow",
        (Reply(200, "stopped: its final comparison", ShadowReport),),
        errors=(404,),
        role=Role.OPERATOR,
        audit="shadow.stop",
        workers=Fanout.OWNER,
    ),
    Route(
        "POST",
        PATH + "/promote",
        promote_shadow,
        "Promote a stream's shadow",
        (Reply(200, "switched", Promoted),),
        errors=(404, 409, 413, 422),
        body={"application/json": PromoteRequest},
        role=Role.ADMIN,
        audit="shadow.promote",
        workers=Fanout.OWNER,
    ),
    Route(
        "POST",
        PATH + "/rollback",
        rollback_shadow,
        "Roll a stream back to the workflow before its promotion",
        (Reply(200, "switched back", RolledBack),),
        errors=(404,),
        role=Role.OPERATOR,
        audit="shadow.rollback",
        workers=Fanout.OWNER,
    ),
)
