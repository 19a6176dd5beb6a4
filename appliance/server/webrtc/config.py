"""The config's `webrtc:` section: WebRTC viewers (docs/api.md, "WebRTC"), read once at start."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, IPvAnyAddress

from appliance.strict import Strict

MiB = 1024 * 1024
IceUrl = Annotated[str, Field(min_length=1, max_length=512)]  # stun:host:port, turn:...


class IceServerConfig(Strict):
    """A STUN or TURN server offered to WebRTC peers (RTCIceServer)."""

    urls: Annotated[list[IceUrl], Field(min_length=1, max_length=8)]
    username: Annotated[str | None, Field(max_length=256)] = None
    # A TURN secret: repr=False keeps it out of logs and error messages.
    credential: Annotated[str | None, Field(max_length=256, repr=False)] = None


class WebRtcConfig(Strict):
    """WebRTC viewers (docs/api.md, "WebRTC"). Read once at start."""

    # STUN/TURN for peers behind NAT. None by default: a public server nobody configured
    # would learn who watches which appliance (aiortc's own default is Google's STUN).
    ice_servers: Annotated[list[IceServerConfig], Field(max_length=8)] = Field(default_factory=list)
    # The addresses offered as host candidates; empty: the server's bind address when it
    # is a single one (127.0.0.1 offers only loopback), else every interface's but
    # loopback (aioice's rule, for 0.0.0.0, :: or a host name). An appliance with several
    # NICs bound to 0.0.0.0 names the viewers' network here.
    host_addresses: Annotated[list[IPvAnyAddress], Field(max_length=16)] = Field(
        default_factory=list
    )
    max_sessions: Annotated[int, Field(ge=1, le=256)] = 16
    max_sessions_per_stream: Annotated[int, Field(ge=1, le=256)] = 4
    # A peer that has not connected by then is closed and its resources freed.
    connect_timeout_s: Annotated[float, Field(gt=0, le=120)] = 15.0
    max_fps: Annotated[float, Field(gt=0, le=120)] = 30.0  # per session, unless it asks less
    # Predictions wait in the data channel's buffer up to this much; past it a message is
    # skipped (and counted), never queued without bound.
    max_buffered_bytes: Annotated[int, Field(ge=1024, le=16 * MiB)] = 256 * 1024
