"""The RTP reader's RTSP connection (appliance/sources/rtsp.py) closes its socket before
the reader's loop is closed, even from an rtsps camera that never answers TLS's
close_notify while the stop's own time (rtp.py's `_shut`) runs out during the wait: a
socket left open is a descriptor leaked at every stop, and an unclosed-transport
ResourceWarning later. The camera is a real loopback TLS server that reads the raw bytes
after its handshake and answers nothing.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import threading

import pytest
import trustme

from appliance.sources.rtsp import CLOSE_TIMEOUT_S, Connection
from tests.sources import WAIT_S


class SilentTlsCamera:
    """One TLS handshake on 127.0.0.1, then the raw bytes read and nothing answered;
    `ended` is set once the client's socket is closed (EOF or reset). Its thread
    (`silent-tls-camera`) ends then, or after WAIT_S; `stop()` joins it."""

    def __init__(self, tls: ssl.SSLContext) -> None:
        self._tls = tls
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(WAIT_S)
        self.port = self._listener.getsockname()[1]
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="silent-tls-camera")
        self._thread.start()

    def stop(self) -> None:
        self._thread.join(WAIT_S)
        self._listener.close()

    def _serve(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:  # no client came
            return
        # After the handshake the TLS layer is left unused: a close_notify goes unanswered.
        with (
            self._tls.wrap_socket(sock, server_side=True) as secure,
            socket.socket(fileno=os.dup(secure.fileno())) as raw,
        ):
            raw.settimeout(WAIT_S)
            try:
                while raw.recv(4096):  # the client's close_notify, then its end
                    pass
            except ConnectionResetError:  # aborted: the end too
                pass
            except TimeoutError:
                return
            self.ended.set()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def test_a_close_cut_short_while_the_camera_ignores_close_notify_still_closes_the_socket(
    ca: trustme.CA,
) -> None:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    camera = SilentTlsCamera(server)
    loop = asyncio.new_event_loop()
    try:
        # Made on its loop, as the reader makes it (aiortsp's connection makes a Future).
        connection = loop.run_until_complete(_opened(camera.port, client))
        # Cut short before the connection's own wait for the close ends (half of it): a
        # stop whose time ran out, as a slow TEARDOWN leaves it.
        with pytest.raises(TimeoutError):
            closing = connection.__aexit__(None, None, None)
            loop.run_until_complete(asyncio.wait_for(closing, CLOSE_TIMEOUT_S / 20))
        assert camera.ended.wait(WAIT_S), "the camera's connection is still open"
    finally:
        loop.close()
        camera.stop()


async def _opened(port: int, tls: ssl.SSLContext) -> Connection:
    connection = Connection("127.0.0.1", port, ssl=tls, timeout=WAIT_S)
    await connection.__aenter__()
    return connection
