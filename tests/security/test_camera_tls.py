"""A TLS camera's certificate is checked before its password is sent (issue 39, item 5):
`https://` and `rtsps://` sources verify the server's certificate against the system's
store or `source.tls.ca_file`, through every reader that may take them (the appliance's
content-type probe, FFmpeg's HTTP and RTSP readers, our RTP reader); `source.tls.verify:
false` is the explicit, logged opt-out.

Every camera here is a real loopback TLS server with a certificate from a test CA the
appliance is not told about, and it records every byte it receives after the handshake:
an untrusted camera receives none. Before, FFmpeg did not check certificates at all: the
https camera and the rtsps camera read by FFmpeg received the password.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from appliance.sources import SourceError, StreamState
from appliance.sources.config import SourceConfig, SourceTlsConfig
from appliance.sources.opener import open_source
from tests.security.cameras import (
    WAIT_S,
    Answer,
    RecordingServer,
    TlsProxy,
    basic,
    header,
    mjpeg,
    server_context,
)
from tests.server.live import LiveServer
from tests.sources import FAST_PROBE, Harness
from tests.state.conftest import DRAW, config_doc, write_config
from tests.support.rtsp import RtspServerFactory

USER = "admin"
PW = f"pw-{uuid.uuid4().hex}"
CREDENTIALS = basic(USER, PW).encode()
# Each reader that may open the source: the probe and FFmpeg's HTTP reader (a path the
# URL does not name as MJPEG), FFmpeg's alone, our RTP reader, FFmpeg's RTSP reader.
HTTPS_PATHS = ["/live", "/video.mjpg"]
RTSP_READERS: list[dict[str, Any]] = [{}, {"reader": "ffmpeg", "options": FAST_PROBE}]


def http_camera(head: bytes) -> Any:
    """401 without the credentials (as FFmpeg expects a challenge), MJPEG with them."""
    if header(head, "Authorization") != basic(USER, PW):
        return b'HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm="c"\r\n\r\n'
    return mjpeg()


def rtsp_camera(head: bytes) -> bytes:
    """An RTSP camera that asks for the credentials and has nothing behind them."""
    cseq = header(head, "CSeq") or "0"
    if header(head, "Authorization") is None:
        return (
            f'RTSP/1.0 401 Unauthorized\r\nCSeq: {cseq}\r\nWWW-Authenticate: Basic realm="c"'
            "\r\n\r\n"
        ).encode()
    return f"RTSP/1.0 404 Not Found\r\nCSeq: {cseq}\r\n\r\n".encode()


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> Path:
    path = tmp_path / "cameras-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture
def cameras(ca: trustme.CA) -> Iterator[Any]:
    """cameras(answer, *names) -> a started TLS RecordingServer on 127.0.0.1 whose
    certificate names `names` (default: 127.0.0.1); all stopped at teardown."""
    started: list[RecordingServer] = []

    def start(answer: Answer, *names: str) -> RecordingServer:
        context = server_context(ca, *(names or ("127.0.0.1",)))
        server = RecordingServer("127.0.0.1", answer, tls=context)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def assert_untouched(camera: RecordingServer) -> None:
    """Every connection ended with nothing sent after its handshake."""
    connections = camera.wait_closed(1)
    assert camera.received() == b"", camera.received()[:200]
    assert all(not c.received for c in connections)


def refused(cfg: SourceConfig) -> str:
    with pytest.raises(SourceError) as caught:
        open_source(cfg, Path)
    message = str(caught.value)
    assert PW not in message
    return message


def one_frame(cfg: SourceConfig, resolve: Any = Path) -> None:
    source = open_source(cfg, resolve)
    try:
        assert next(source.frames(), None) is not None
    finally:
        source.close()


@pytest.mark.parametrize("path", HTTPS_PATHS)
def test_an_https_camera_with_an_untrusted_certificate_never_sees_the_password(
    cameras: Any, path: str
) -> None:
    camera = cameras(http_camera)
    message = refused(SourceConfig(url=camera.url("https", f"{USER}:{PW}", path)))
    assert_untouched(camera)
    assert "certificate" in message and "source.tls" in message, message


@pytest.mark.parametrize("path", HTTPS_PATHS)
def test_an_https_camera_signed_by_the_ca_file_is_read(
    cameras: Any, ca_file: Path, path: str
) -> None:
    camera = cameras(http_camera)
    url = camera.url("https", f"{USER}:{PW}", path)
    one_frame(SourceConfig(url=url, tls=SourceTlsConfig(ca_file=ca_file)))
    assert CREDENTIALS in camera.received()  # it was the camera that got them


def test_a_certificate_for_another_name_is_refused_even_from_the_ca_file(
    cameras: Any, ca_file: Path
) -> None:
    camera = cameras(http_camera, "camera.example")
    url = camera.url("https", f"{USER}:{PW}", "/live")
    message = refused(SourceConfig(url=url, tls=SourceTlsConfig(ca_file=ca_file)))
    assert_untouched(camera)
    assert "certificate" in message, message


@pytest.mark.parametrize("reader", RTSP_READERS, ids=["rtp", "ffmpeg"])
def test_an_rtsps_camera_with_an_untrusted_certificate_never_sees_the_password(
    cameras: Any, reader: dict[str, Any]
) -> None:
    camera = cameras(rtsp_camera)
    url = camera.url("rtsps", f"{USER}:{PW}", "/stream")
    message = refused(SourceConfig(url=url, open_timeout_s=5, **reader))
    assert_untouched(camera)
    assert "certificate" in message and "source.tls" in message, message


@pytest.mark.rtsp
@pytest.mark.parametrize("reader", RTSP_READERS, ids=["rtp", "ffmpeg"])
def test_an_rtsps_camera_signed_by_the_ca_file_is_read(
    rtsp_server: RtspServerFactory, ca: trustme.CA, ca_file: Path, reader: dict[str, Any]
) -> None:
    camera = rtsp_server(auth=f"{USER}:{PW}")
    proxy = TlsProxy(camera.port, server_context(ca, "127.0.0.1"))
    try:
        url = proxy.url(f"{USER}:{PW}", camera.path)
        one_frame(SourceConfig(url=url, tls=SourceTlsConfig(ca_file=ca_file), **reader))
    finally:
        proxy.stop()
    assert proxy.handshakes and proxy.handshakes[0] is None
    assert CREDENTIALS in bytes(proxy.received)


def test_verify_false_reads_an_untrusted_camera_and_says_so_once(
    cameras: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    camera = cameras(http_camera)
    url = camera.url("https", f"{USER}:{PW}", "/live")
    harness = Harness(resolve_path=lambda p: tmp_path / p)
    caplog.set_level(logging.WARNING, "appliance.sources")
    try:
        run = harness.start(url, stream_id="lobby", tls={"verify": False})
        run.states.wait_for(StreamState.RUNNING, timeout=WAIT_S)
    finally:
        harness.stop_all()
    assert CREDENTIALS in camera.received()
    warnings = [r.getMessage() for r in caplog.records if "verify" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "'lobby'" in warnings[0] and "source.tls.verify" in warnings[0]
    assert PW not in caplog.text and base64.b64encode(PW.encode()).decode() not in caplog.text


def test_a_ca_file_that_is_no_certificate_is_named(cameras: Any, tmp_path: Path) -> None:
    camera = cameras(http_camera)
    (tmp_path / "notes.txt").write_text("not a certificate\n")
    url = camera.url("https", f"{USER}:{PW}", "/video.mjpg")
    message = refused(SourceConfig(url=url, tls=SourceTlsConfig(ca_file=tmp_path / "notes.txt")))
    assert "source.tls.ca_file" in message and "notes.txt" in message, message
    assert camera.connections == []  # refused before anything connects


def api_camera(stream_id: str, **source: Any) -> dict[str, Any]:
    """An https camera that is never opened: refused before."""
    url = "https://127.0.0.1:9/video.mjpg"
    return {"id": stream_id, "source": {"url": url, **source}, "workflow": DRAW}


def test_a_ca_file_named_over_the_api_must_lie_under_the_file_roots(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, ca: trustme.CA
) -> None:
    outside = tmp_path_factory.mktemp("elsewhere") / "ca.pem"
    ca.cert_pem.write_to_path(str(outside))
    server = LiveServer(write_config(tmp_path / "config.yaml", config_doc())).start()
    try:
        body = api_camera("a", tls={"ca_file": str(outside)})
        reply = server.call("POST", "/v1/streams", json_body=body)
        assert reply.status == 403, reply.body
        assert "source.tls.ca_file" in reply.error["message"]
        assert "outside the file roots" in reply.error["message"]
        # FFmpeg's own name for it is no way around the roots.
        body = api_camera("b", options={"ca_file": str(outside)})
        reply = server.call("POST", "/v1/streams", json_body=body)
        assert reply.status == 422, reply.body
        assert any(d.startswith("source.options.ca_file: ") for d in reply.error["details"])
        assert server.get_json("/v1/streams")["streams"] == []
    finally:
        server.stop()
