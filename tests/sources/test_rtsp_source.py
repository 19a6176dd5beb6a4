"""RTSP through a real Grabber against a real GStreamer RTSP server: outages, stalls, secrets."""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.sources import SourceError, StreamState
from appliance.sources.config import SourceConfig
from appliance.sources.opener import open_source
from appliance.sources.pyav import PyAVSource
from appliance.sources.rtp import RtpSource
from tests.sources import FAST_PROBE, WAIT_S, Harness, Run, assert_stops
from tests.support.media import MakeClip
from tests.support.processes import free_port
from tests.support.rtsp import RtspServerFactory

pytestmark = pytest.mark.rtsp

# Quick retries keep outage tests short; production defaults are 0.5 s growing to 10 s.
QUICK_RETRY = {"initial_s": 0.1, "max_s": 0.5, "multiplier": 2.0, "jitter": 0.0}
STALL_S = 1.5


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(resolve_path=lambda p: tmp_path / p)
    yield h
    h.stop_all()


class SilentCamera:
    """A TCP listener that accepts RTSP clients and never answers: a camera hung at boot."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"rtsp://127.0.0.1:{self._server.getsockname()[1]}/stream"
        self.connected = threading.Event()
        self._clients: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="silent-camera", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed at teardown
            while True:
                self._clients.append(self._server.accept()[0])
                self.connected.set()

    def close(self) -> None:
        self._server.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone does not
        self._server.close()
        for client in self._clients:
            client.close()
        self._thread.join(WAIT_S)


@pytest.fixture
def silent_camera() -> Iterator[SilentCamera]:
    camera = SilentCamera()
    yield camera
    camera.close()


@pytest.fixture(params=["rtp", "ffmpeg"])
def reader(request: pytest.FixtureRequest) -> str:
    """Every test runs with both RTSP readers: ours (RTP, the default for H.264) and
    FFmpeg's (`reader: ffmpeg`, or any FFmpeg `options`)."""
    return str(request.param)


def start_camera(harness: Harness, url: str, reader: str, **cfg: Any) -> Run:
    options: dict[str, Any] = {
        "backoff": QUICK_RETRY,
        "stall_timeout_s": STALL_S,
        "open_timeout_s": 3.0,
    }
    if reader == "ffmpeg":
        options |= {"reader": "ffmpeg", "options": FAST_PROBE}
    return harness.start(url, **{**options, **cfg})


def _slowed(frames: Any, seconds: float) -> Any:
    def slow(self: Any) -> Iterator[Any]:
        for item in frames(self):
            time.sleep(seconds)
            yield item

    return slow


def test_frames_arrive_and_the_state_is_running(
    reader: str, harness: Harness, rtsp_server: RtspServerFactory
) -> None:
    server = rtsp_server()
    run = start_camera(harness, server.url, reader)
    _, reason, _ = run.states.wait_for(StreamState.RUNNING)
    frames = run.take(5)
    assert server.url in reason
    assert [f.seq for f in frames] == sorted({f.seq for f in frames})
    assert frames[0].image.shape == (120, 160, 3) and frames[0].stream_id == "cam"
    assert run.states.states[:2] == [StreamState.STARTING, StreamState.RUNNING]
    # A camera frame is dated by its arrival, on both clocks alike (so its age counts
    # decoding): times grow, and the wall and monotonic dates name the same instant.
    assert all(a.capture_mono < b.capture_mono for a, b in itertools.pairwise(frames))
    offset = time.time() - time.perf_counter()
    assert all(abs(f.capture_time - (f.capture_mono + offset)) < 0.05 for f in frames)


def test_a_camera_frame_is_as_old_as_its_arrival(
    reader: str, harness: Harness, rtsp_server: RtspServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Time spent after the data arrived (decoding, converting) counts in the frame's
    age: here every frame takes 0.2 s more after its arrival."""
    slow_s = 0.2
    for kind in (PyAVSource, RtpSource):
        monkeypatch.setattr(kind, "frames", _slowed(kind.frames, slow_s))
    run = start_camera(harness, rtsp_server().url, reader)
    frame = run.take(2)[-1]
    assert time.perf_counter() - frame.capture_mono >= slow_s


def test_the_served_clip_loops_like_a_camera(
    reader: str, harness: Harness, rtsp_server: RtspServerFactory, make_clip: MakeClip
) -> None:
    server = rtsp_server(make_clip(fps=15, seconds=1.0))
    run = start_camera(harness, server.url, reader)
    while run.take(1)[0].seq < 40:  # ~2.7 s: past the end of the 15-frame clip twice
        pass
    assert StreamState.RECONNECTING not in run.states.states


def test_udp_transport_from_a_live_encoder(
    reader: str, harness: Harness, rtsp_server: RtspServerFactory
) -> None:
    server = rtsp_server(pattern="160x120@15")  # videotestsrc + x264enc, is-live
    run = start_camera(harness, server.url, reader, transport="udp")
    run.states.wait_for(StreamState.RUNNING)
    assert len(run.take(5)) == 5


def test_outage_reconnects_and_frames_resume_on_the_same_port(
    reader: str, harness: Harness, rtsp_server: RtspServerFactory
) -> None:
    """A camera that goes away closes its connection: that is noticed at once, not when
    the stall timeout (30 s here) runs out, and frames resume once it is back."""
    server = rtsp_server()
    run = start_camera(harness, server.url, reader, stall_timeout_s=30.0)
    run.states.wait_for(StreamState.RUNNING)
    before = run.take(3)[-1].seq

    gone = time.monotonic()
    server.stop()
    at, reason, _ = run.states.wait_for(StreamState.RECONNECTING)
    assert time.monotonic() - gone < 5.0, reason  # the RTP reader waited for its stall check
    assert server.url in reason and "retrying in" in reason

    server.start()
    run.states.wait_for(StreamState.RUNNING, after=at)
    after = run.take(3)
    assert all(f.seq > before for f in after)  # seq keeps counting across reconnects
    assert run.grabber.stats.reconnects >= 1


def test_unreachable_camera_keeps_retrying_with_growing_delays(
    reader: str, harness: Harness
) -> None:
    url = f"rtsp://127.0.0.1:{free_port()}/stream"  # nothing listens there
    backoff = {"initial_s": 0.05, "max_s": 10.0, "multiplier": 2.0, "jitter": 0.0}
    run = start_camera(harness, url, reader, backoff=backoff)
    run.states.wait_for(StreamState.RECONNECTING, after=5)  # STARTING + 5 retries

    retries = [(r, t) for s, r, t in run.states.events if s is StreamState.RECONNECTING]
    delays = [float(re.findall(r"retrying in ([\d.]+) s", r)[0]) for r, _ in retries]
    assert delays[:5] == [0.05, 0.1, 0.2, 0.4, 0.8]
    for (_, t0), (_, t1), delay in zip(retries, retries[1:], delays, strict=False):
        assert t1 - t0 >= delay  # it really waited before the next attempt
    assert "connection refused" in retries[0][0].lower()
    assert set(run.states.states) == {StreamState.STARTING, StreamState.RECONNECTING}
    assert run.grabber.stats.retry_delay_s == delays[-1]


def test_a_camera_that_stops_sending_is_detected_as_stalled(
    reader: str, harness: Harness, rtsp_server: RtspServerFactory
) -> None:
    server = rtsp_server()
    run = start_camera(harness, server.url, reader)
    run.states.wait_for(StreamState.RUNNING)
    run.take(2)

    server.suspend()  # sockets stay open, nothing is sent: a hung camera
    at, reason, _ = run.states.wait_for(StreamState.RECONNECTING)
    assert "stalled" in reason
    # Not before the stall timeout, by the reader's own count of the silence.
    assert float(re.findall(r"no frame for ([\d.]+) s", reason)[0]) >= STALL_S

    server.resume()
    run.states.wait_for(StreamState.RUNNING, after=at)
    assert len(run.take(2)) == 2


def test_credentials_never_reach_reasons_or_logs(
    reader: str, harness: Harness, rtsp_server: RtspServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server = rtsp_server(auth="user:hunter2")
    good = start_camera(
        harness, server.url_with_credentials("user", "hunter2"), reader, stream_id="good"
    )
    bad = start_camera(
        harness, server.url_with_credentials("user", "letmein9"), reader, stream_id="bad"
    )
    _, running, _ = good.states.wait_for(StreamState.RUNNING)
    _, refused, _ = bad.states.wait_for(StreamState.RECONNECTING)
    assert "***:***@127.0.0.1" in running and "401" in refused
    server.stop()  # errors of a running stream, too
    good.states.wait_for(StreamState.RECONNECTING)
    harness.stop_all()

    reasons = [r for run in (good, bad) for _, r, _ in run.states.events]
    logged = [r.getMessage() for r in caplog.records] + [caplog.text]
    stats = [str(run.grabber.stats) for run in (good, bad)]
    for text in reasons + logged + stats:
        assert "hunter2" not in text and "letmein9" not in text


def test_stop_while_running(reader: str, harness: Harness, rtsp_server: RtspServerFactory) -> None:
    run = start_camera(harness, rtsp_server().url, reader)
    run.states.wait_for(StreamState.RUNNING)
    assert_stops(run.grabber)
    assert run.states.events[-1][:2] == (StreamState.STOPPED, "stopped")


def test_stop_while_opening_a_hung_camera(
    reader: str, harness: Harness, silent_camera: SilentCamera
) -> None:
    run = start_camera(harness, silent_camera.url, reader, open_timeout_s=30.0)
    assert silent_camera.connected.wait(WAIT_S)  # av.open now waits for an answer
    assert_stops(run.grabber)
    assert run.states.states == [StreamState.STARTING, StreamState.STOPPED]


def test_a_camera_that_never_answers_times_out_and_retries(
    reader: str, harness: Harness, silent_camera: SilentCamera
) -> None:
    run = start_camera(harness, silent_camera.url, reader, open_timeout_s=0.5)
    _, reason, _ = run.states.wait_for(StreamState.RECONNECTING)
    port = silent_camera.url.split(":")[2].split("/")[0]
    assert f"no answer from 127.0.0.1:{port} within 0.5 s" in reason
    assert silent_camera.url in reason


def test_stop_while_waiting_to_retry(reader: str, harness: Harness) -> None:
    url = f"rtsp://127.0.0.1:{free_port()}/stream"
    run = start_camera(harness, url, reader, backoff={"initial_s": 60.0, "max_s": 60.0})
    run.states.wait_for(StreamState.RECONNECTING)
    assert_stops(run.grabber)
    assert run.states.events[-1][:2] == (StreamState.STOPPED, "stopped")


def test_stop_while_stalled(reader: str, harness: Harness, rtsp_server: RtspServerFactory) -> None:
    server = rtsp_server()
    run = start_camera(harness, server.url, reader, stall_timeout_s=30.0)
    run.states.wait_for(StreamState.RUNNING)
    server.suspend()
    assert_stops(run.grabber)


def test_a_port_that_does_not_speak_rtsp_is_named_as_such(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A URL pointing at some other service (here a bare HTTP answer): the error says
    the port answered but not in RTSP, not the parser's bare ValueError, and no
    traceback reaches stderr (aiortsp prints one itself)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        cfg = SourceConfig(url=f"rtsp://127.0.0.1:{port}/live", open_timeout_s=3)
        with pytest.raises(SourceError) as refused:
            open_source(cfg, Path, stop=threading.Event())
    assert f"127.0.0.1:{port} answered, but not in RTSP" in str(refused.value)
    assert "Traceback" not in capfd.readouterr().err


def test_a_camera_fault_is_named_by_its_kind_whichever_reader_meets_it(
    reader: str, rtsp_server: RtspServerFactory
) -> None:
    """Nothing listening, an unknown host, a wrong password, a wrong path: each named as
    such (not in FFmpeg's or aiortsp's words), with the URL masked, by both readers."""
    server = rtsp_server(auth="admin:s3cret-ok")
    port = free_port()
    cases = {
        f"rtsp://admin:s3cret-no@127.0.0.1:{port}/stream":
            f"cannot connect to 127.0.0.1:{port} (connection refused",
        "rtsp://admin:s3cret-no@camera.invalid/stream": "cannot resolve host 'camera.invalid'",
        server.url_with_credentials("admin", "s3cret-no"):
            "the server answered 401 Unauthorized (wrong or missing user name or password",
        server.url_with_credentials("admin", "s3cret-ok").replace("/stream", "/nothing"):
            "the server answered 404 Not Found (no such path on this server",
    }  # fmt: skip
    extra: dict[str, Any] = (
        {"reader": "ffmpeg", "options": FAST_PROBE} if reader == "ffmpeg" else {}
    )
    for url, expected in cases.items():
        cfg = SourceConfig(url=url, open_timeout_s=5, **extra)
        with pytest.raises(SourceError) as refused:
            open_source(cfg, Path, stop=threading.Event())
        message = str(refused.value)
        assert expected in message, (url, message)
        assert "s3cret" not in message  # the URL is masked
