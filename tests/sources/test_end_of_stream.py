"""A camera whose stream ends (GStreamer's RTSP server playing a clip once: it sends RTCP
BYE at the clip's end and keeps the session open) is reconnected at once, not when the
stall timeout runs out, and runs again when the camera serves again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.sources import StreamState
from tests.sources import WAIT_S, Harness, Run
from tests.sources.test_rtsp_source import start_camera
from tests.support.rtsp import RtspServerFactory

pytestmark = pytest.mark.rtsp

STALL_S = 5.0  # the default: what noticed the end before
PROMPT_S = 1.0  # the end of the stream to `reconnecting`, at most


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(resolve_path=lambda p: tmp_path / p)
    yield h
    h.stop_all()


def watch_until_reconnecting(run: Run) -> tuple[float, str, float]:
    """Take frames until the stream reconnects: (the last frame's arrival, the reason,
    the `reconnecting` state's time), all on time.perf_counter()."""
    last_frame = 0.0
    deadline = time.perf_counter() + WAIT_S
    while StreamState.RECONNECTING not in run.states.states:
        assert time.perf_counter() < deadline, f"still no reconnect: {run.states.events}"
        frame = run.slot.get(0.1)
        if frame is not None:
            last_frame = frame.capture_mono  # a camera's frame: its arrival
    _, reason, at = run.states.wait_for(StreamState.RECONNECTING, timeout=0)
    while (frame := run.slot.get(0)) is not None and frame.capture_mono < at:
        last_frame = frame.capture_mono  # left in the slot when the state changed
    return last_frame, reason, at


@pytest.mark.parametrize(
    "reader, transport, says",
    [("rtp", "tcp", "RTCP BYE"), ("rtp", "udp", "RTCP BYE"), ("ffmpeg", "tcp", "end of stream")],
)
def test_the_end_of_a_stream_reconnects_at_once_and_it_runs_again(
    reader: str, transport: str, says: str, harness: Harness, rtsp_server: RtspServerFactory
) -> None:
    """RTCP BYE (the RTP reader) or FFmpeg's EOF (it ends at BYE too) is `reconnecting`
    within PROMPT_S of the last frame, with the reason naming the end of the stream; the
    reconnect plays the clip again (the server gives each session its own playback)."""
    server = rtsp_server(once=True)  # a 2 s clip
    run = start_camera(harness, server.url, reader, stall_timeout_s=STALL_S, transport=transport)
    run.states.wait_for(StreamState.RUNNING)

    last_frame, reason, at = watch_until_reconnecting(run)
    assert last_frame > 0.0, run.states.events
    assert at - last_frame < PROMPT_S, f"{at - last_frame:.2f} s after the last frame: {reason}"
    assert "end of stream" in reason and says in reason and "stalled" not in reason, reason
    assert server.url in reason  # which camera, credentials masked

    index = run.states.states.index(StreamState.RECONNECTING)
    run.states.wait_for(StreamState.RUNNING, after=index, timeout=WAIT_S)
    assert len(run.take(3)) == 3
    assert run.grabber.stats.reconnects >= 1
