"""MJPEG over HTTP through a real Grabber, against a small real multipart server."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import cv2
import pytest

from appliance.sources import StreamState
from tests.sources import WAIT_S, Harness
from tests.support.media import frame_index, pattern_frame

FPS = 15
BOUNDARY = "frame"


class _MjpegHandler(http.server.BaseHTTPRequestHandler):
    """Streams numbered JPEG frames as multipart/x-mixed-replace until the server stops."""

    stop = threading.Event()  # replaced per server by the fixture

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
        self.end_headers()
        index = 0
        while not self.stop.wait(1 / FPS):  # the camera's frame interval
            ok, jpeg = cv2.imencode(".jpg", pattern_frame(index, 160, 120))
            assert ok
            head = f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {jpeg.size}\r\n"
            try:
                self.wfile.write(head.encode() + b"\r\n" + jpeg.tobytes() + b"\r\n")
            except OSError:  # the client went away
                return
            index += 1

    def log_message(self, format: str, *args: object) -> None:
        pass


class MjpegCamera:
    def __init__(self) -> None:
        self._stop = threading.Event()  # one per camera: handlers of this server read it
        handler = type("Handler", (_MjpegHandler,), {"stop": self._stop})
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="mjpeg-camera", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(WAIT_S)


@pytest.fixture
def mjpeg_camera() -> Iterator[MjpegCamera]:
    camera = MjpegCamera()
    yield camera
    camera.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(resolve_path=lambda p: tmp_path / p)
    yield h
    h.stop_all()


@pytest.mark.parametrize("path", ["/video.mjpg", "/live"])  # named by the URL, or by the header
def test_mjpeg_camera_delivers_numbered_frames(
    harness: Harness, mjpeg_camera: MjpegCamera, path: str
) -> None:
    run = harness.start(f"http://{mjpeg_camera.address}{path}", open_timeout_s=5.0)
    run.states.wait_for(StreamState.RUNNING)
    frames = run.take(4)
    indices = [frame_index(f.image) for f in frames]
    assert indices == sorted(set(indices))
    assert frames[0].image.shape == (120, 160, 3)


def test_mjpeg_camera_going_away_is_a_reconnect(
    harness: Harness, mjpeg_camera: MjpegCamera
) -> None:
    backoff = {"initial_s": 0.1, "max_s": 0.5, "jitter": 0.0}
    run = harness.start(f"http://{mjpeg_camera.address}/video.mjpg", backoff=backoff)
    run.states.wait_for(StreamState.RUNNING)
    mjpeg_camera.close()
    _, reason, _ = run.states.wait_for(StreamState.RECONNECTING)
    assert mjpeg_camera.address in reason
