"""The RTSP connection our RTP reader holds (aiortsp's, rtp.py runs the session on it),
and why an open failed, in the user's words rather than aiortsp's.

aiortsp's connection prints a traceback on stderr when the peer does not speak RTSP,
and its close only starts closing: an rtsps connection's socket stays open until the
camera answers TLS's close_notify, which a loop closed before it never sees.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from typing import Any

from aiortsp.rtsp.connection import RTSPConnection
from aiortsp.rtsp.errors import RTSPConnectionError, RTSPResponseError

from appliance.sources.config import SourceConfig
from appliance.sources.problems import answered, no_answer, not_rtsp
from appliance.sources.pyav import describe
from appliance.sources.reach import connect_problem
from appliance.sources.tls import untrusted

CLOSE_TIMEOUT_S = 2.0  # TEARDOWN and socket close; a dead camera must not hold a stop


class Connection(RTSPConnection):  # type: ignore[misc]
    """aiortsp's connection, without the traceback it prints on stderr (traceback.
    print_exc) when the peer does not speak RTSP: the open fails with the same
    RTSPConnectionError, caused by the parser's ValueError (`open_problem` reads it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gone = asyncio.Event()  # connection_lost: the transport is closed
        parse = self.parser.parse

        def checked(data: bytes) -> Iterator[Any]:
            try:
                yield from parse(data)
            except ValueError as exc:
                self._not_rtsp(exc)

        self.parser.parse = checked

    async def __aexit__(self, *exc: object) -> None:
        """Close, and wait for the transport to be gone (its close_notify exchanged, for
        rtsps: a loop closed before leaves the socket open), aborting it after
        CLOSE_TIMEOUT_S / 2 (a peer that never answers the close), or at once when the
        wait itself is cancelled (the stop's whole CLOSE_TIMEOUT_S ran out during it)."""
        transport = self._transport
        self.close()
        if transport is None:
            return
        try:
            await asyncio.wait_for(self._gone.wait(), CLOSE_TIMEOUT_S / 2)
        except TimeoutError:
            pass  # aborted below
        finally:
            if not self._gone.is_set():  # a cancelled wait must not leave the socket either
                transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._gone.set()

    def _not_rtsp(self, cause: ValueError) -> None:
        error = RTSPConnectionError("invalid data received from RTSP connection")
        error.__cause__ = cause
        if not self.result.done():
            self.result.set_exception(error)
        if self._transport:
            self._transport.close()  # mid-session: the reader sees the connection end


def open_problem(exc: Exception, cfg: SourceConfig) -> str:
    """What went wrong while opening, in the user's terms rather than the library's."""
    if isinstance(exc, TimeoutError):
        return no_answer(cfg.url, cfg.open_timeout_s)
    if isinstance(exc, RTSPConnectionError):
        cause = exc.__cause__
        if isinstance(cause, ssl.SSLCertVerificationError):  # a ValueError too: first
            return untrusted(cause)
        if isinstance(cause, ValueError):  # aiortsp's parser: the bytes were not RTSP
            return not_rtsp(cfg.url)
        return connect_problem(cfg.url, cause or exc)
    if isinstance(exc, RTSPResponseError) and exc.response is not None:
        return answered(int(exc.response.status), exc.response.status_msg)
    return describe(exc)
