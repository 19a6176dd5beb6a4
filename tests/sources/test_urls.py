"""URL handling: credentials masked everywhere, kinds chosen by URL, MJPEG detected."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from appliance.sources import mask_url, source_kind
from appliance.sources.http import http_format


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("rtsp://admin:hunter2@10.0.0.5:554/live", "rtsp://***:***@10.0.0.5:554/live"),
        ("rtsps://u:p@cam/x", "rtsps://***:***@cam/x"),
        ("http://user@cam/video.mjpg", "http://***:***@cam/video.mjpg"),
        ("rtsp://u:p@ss@cam/x", "rtsp://***:***@cam/x"),  # "@" inside the password
        ("rtsp://10.0.0.5/live", "rtsp://10.0.0.5/live"),
        ("/media/clip.mp4", "/media/clip.mp4"),
        (
            "failed 'rtsp://a:b@h1/x' then 'http://c:d@h2/y'",
            "failed 'rtsp://***:***@h1/x' then 'http://***:***@h2/y'",
        ),
        ("mail me at a@b.c", "mail me at a@b.c"),
    ],
)
def test_mask_url(text: str, masked: str) -> None:
    assert mask_url(text) == masked


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("rtsp://cam/x", "rtsp"),
        ("RTSPS://cam/x", "rtsp"),
        ("http://cam/video.mjpg", "http"),
        ("https://cdn/live.m3u8", "http"),
        ("/dev/video0", "v4l2"),
        ("/dev/video12", "v4l2"),
        ("/dev/videos/clip.mp4", "file"),
        ("media/clip.mp4", "file"),
        ("/abs/clip.mkv", "file"),
    ],
)
def test_source_kind(url: str, kind: str) -> None:
    assert source_kind(url) == kind


@pytest.mark.parametrize(
    ("url", "fmt"),
    [
        ("http://cam/video.mjpg", "mpjpeg"),
        ("http://cam/mjpg/video.mjpg", "mpjpeg"),
        ("http://cam:8080/?action=stream", "mpjpeg"),
        ("https://cdn/live/index.m3u8", None),
        ("http://host/clip.mp4", None),
    ],
)
def test_http_format_from_the_url(url: str, fmt: str | None) -> None:
    assert http_format(url, timeout_s=0.01) == fmt  # decided without a request


class _Headers(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the Content-Type named by the path, and records the auth."""

    seen_auth: list[str | None] = []  # shared with the test

    def do_GET(self) -> None:
        self.seen_auth.append(self.headers.get("Authorization"))
        self.send_response(200)
        kind = "multipart/x-mixed-replace; boundary=frame" if "cam" in self.path else "video/mp2t"
        self.send_header("Content-Type", kind)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def header_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Headers)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_http_format_from_the_content_type(header_server: str) -> None:
    assert http_format(f"http://{header_server}/cam", timeout_s=5) == "mpjpeg"
    assert http_format(f"http://{header_server}/stream", timeout_s=5) is None


def test_http_probe_sends_url_credentials_as_basic_auth(header_server: str) -> None:
    _Headers.seen_auth.clear()
    assert http_format(f"http://user:pa%40ss@{header_server}/cam", timeout_s=5) == "mpjpeg"
    assert _Headers.seen_auth == ["Basic dXNlcjpwYUBzcw=="]  # base64("user:pa@ss")


def test_http_probe_of_a_dead_server_leaves_it_to_ffmpeg() -> None:
    from tests.support.processes import free_port

    assert http_format(f"http://127.0.0.1:{free_port()}/x", timeout_s=2) is None
