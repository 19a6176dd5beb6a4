"""WebRTC viewers: answer a viewer's offer with the stream's annotated video (and its
predictions on a data channel), and end a session. The sessions live in
appliance/server/webrtc/; these handlers only translate."""

from __future__ import annotations

from aiohttp import web

from appliance.errors import UnknownSessionError
from appliance.policy.roles import Role
from appliance.server.bodies import parse_json
from appliance.server.errors import BadRequestError
from appliance.server.routing import Fanout, Reply, Route
from appliance.server.schemas import WebRtcAnswer, WebRtcOffer
from appliance.server.webrtc.sessions import OfferError, WebRtcSessions

WEBRTC = web.AppKey("webrtc", WebRtcSessions)


async def open_webrtc(request: web.Request) -> web.Response:
    """Answer a WebRTC offer with the stream's `video` output, newest frame first (a slow
    viewer gets fewer frames, never older ones), at most `max_fps`, scaled down to
    `max_width`; on a `predictions` data channel the viewer opened, each result as JSON
    (the MQTT sink's message); on a `frames` channel, each video frame's RTP timestamp
    and the result it shows. 429 past webrtc.max_sessions(_per_stream)."""
    body = await parse_json(request, WebRtcOffer)
    sessions = request.app[WEBRTC]
    try:
        session_id, sdp = await sessions.open(
            request.match_info["id"], body.sdp, body.max_fps, body.max_width, body.video == "raw"
        )
    except OfferError as exc:
        raise BadRequestError(str(exc)) from exc
    answer = WebRtcAnswer(sdp=sdp, type="answer", session_id=session_id)
    return web.json_response(answer.model_dump(), status=201)


async def close_webrtc(request: web.Request) -> web.Response:
    """End a WebRTC session (a viewer that leaves without this is closed when its
    connection fails)."""
    session_id = request.match_info["session_id"]
    if not await request.app[WEBRTC].close(session_id):
        raise UnknownSessionError(session_id)
    return web.Response(status=204)


ROUTES = (
    Route(
        "POST",
        "/v1/streams/{id}/webrtc",
        open_webrtc,
        "Watch a stream over WebRTC",
        (Reply(201, "the answer", WebRtcAnswer),),
        errors=(429,),
        body={"application/json": WebRtcOffer},
        tag="webrtc",
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
    Route(
        "DELETE",
        "/v1/webrtc/{session_id}",
        close_webrtc,
        "End a WebRTC session",
        (Reply(204, "closed"),),
        tag="webrtc",
        role=Role.VIEWER,
        workers=Fanout.HOLDER,
    ),
)
