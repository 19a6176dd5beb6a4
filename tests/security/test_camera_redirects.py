"""A camera's credentials go to that camera's origin only (issue 39, item 5): an HTTP camera
that redirects to another host, or from https to plain http, must not hand its password
on. Real loopback servers on both ends record every byte they receive; the whole open
runs (the appliance's content-type probe, then FFmpeg), as a stream would.

Before, the probe (urllib's redirect handler) copied the Authorization header to wherever
the camera sent it: the server on 127.0.0.2 received the password. FFmpeg itself drops
its credentials at a redirect.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import trustme

from appliance.sources.config import SourceConfig
from appliance.sources.http import http_format
from appliance.sources.opener import open_source
from tests.security.cameras import (
    WAIT_S,
    Answer,
    RecordingServer,
    basic,
    header,
    mjpeg,
    server_context,
)

USER = "admin"
PW = f"pw-{uuid.uuid4().hex}"
SEEN_AS = (PW.encode(), base64.b64encode(f"{USER}:{PW}".encode()))  # as sent, or in Basic


def challenged(then: bytes | Iterable[bytes]) -> Answer:
    """A camera's answer: 401 (Basic) to a request without the credentials, `then` to one
    with them, as cameras and FFmpeg do it (FFmpeg sends them only when challenged)."""

    def answer(head: bytes) -> bytes | Iterable[bytes]:
        if header(head, "Authorization") != basic(USER, PW):
            return (
                b'HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm="cam"\r\n'
                b"Content-Length: 0\r\n\r\n"
            )
        return then

    return answer


def redirect(to: str) -> bytes:
    return f"HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n".encode()


def assert_no_credentials(got: bytes) -> None:
    assert b"authorization" not in got.lower(), got
    for secret in SEEN_AS:
        assert secret not in got, got


@pytest.fixture
def servers() -> Iterator[list[RecordingServer]]:
    started: list[RecordingServer] = []
    yield started
    for server in started:
        server.stop()


def opened_frame(cfg: SourceConfig) -> None:
    """Open the source as a stream does and take one frame."""
    source = open_source(cfg, Path)
    try:
        assert next(source.frames(), None) is not None
    finally:
        source.close()


def test_a_redirect_to_another_host_gets_no_credentials(
    servers: list[RecordingServer], caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = RecordingServer("127.0.0.2", lambda head: mjpeg())
    servers.append(elsewhere)
    target = elsewhere.url("http", path="/video")
    camera = RecordingServer("127.0.0.1", challenged(redirect(target)))
    servers.append(camera)
    caplog.set_level(logging.DEBUG, "appliance.sources")

    opened_frame(SourceConfig(url=camera.url("http", f"{USER}:{PW}", "/live")))

    assert basic(USER, PW).encode() in camera.received()  # the camera itself got them
    assert_no_credentials(elsewhere.received())
    # Said at DEBUG: which origin the credentials were kept from.
    dropped = [r.getMessage() for r in caplog.records if "credentials" in r.getMessage()]
    assert any(f"another origin (http://127.0.0.2:{elsewhere.port})" in m for m in dropped)
    assert not any(PW in r.getMessage() for r in caplog.records)


def test_a_redirect_from_https_to_http_gets_no_credentials(
    servers: list[RecordingServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The system's store, as OpenSSL (and the appliance) read it: the test CA only.
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "system.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "system.pem"))
    plain = RecordingServer("127.0.0.1", lambda head: mjpeg())
    servers.append(plain)
    answer = challenged(redirect(plain.url("http", path="/video")))
    camera = RecordingServer("127.0.0.1", answer, tls=server_context(ca, "127.0.0.1"))
    servers.append(camera)

    opened_frame(SourceConfig(url=camera.url("https", f"{USER}:{PW}", "/live")))

    assert basic(USER, PW).encode() in camera.received()  # over TLS, to the camera
    assert_no_credentials(plain.received())


def test_a_redirect_within_the_camera_keeps_them_and_the_probe_answers(
    servers: list[RecordingServer],
) -> None:
    stream = challenged(
        b"HTTP/1.1 200 OK\r\nContent-Type: multipart/x-mixed-replace; boundary=x\r\n"
        b"Content-Length: 0\r\n\r\n"
    )

    def answer(head: bytes) -> bytes | Iterable[bytes] | None:
        if head.startswith(b"GET /live "):
            return redirect(camera.url("http", path="/stream"))  # the same origin
        return stream(head)

    camera = RecordingServer("127.0.0.1", answer)
    servers.append(camera)

    url = camera.url("http", f"{USER}:{PW}", "/live")
    assert http_format(url, WAIT_S) == "mpjpeg"  # the stream's Content-Type, authorized
    heads = camera.received().split(b"\r\n\r\n")
    assert any(h.startswith(b"GET /stream ") and basic(USER, PW).encode() in h for h in heads)
