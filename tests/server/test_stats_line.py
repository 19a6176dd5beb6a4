"""The serve log's stats line (appliance/server/serve.py `stream_line`): its rate is the
frames processed over its own interval, so a clip that ended or a camera that stalled
shows at once as a drop, not hidden in the mean since start (issue 30, item 5)."""

from __future__ import annotations

from dataclasses import replace

from appliance.observe.status import Latency, StreamStatus
from appliance.server.serve import stream_line

STARTED = StreamStatus(
    id="cam1",
    state="running",
    url="rtsp://cam/stream",
    workflow="people_counter",
    fps=14.92,  # the mean since start, as the stream reports it
    source_fps=15.0,
    frames_processed=223,
    frames_dropped=3,
    frames_failed=0,
    latency_ms=Latency(41.0, 80.0),
    detections=0,
    reconnects=0,
    last_error=None,
    providers={},
    outputs=[],
    sinks={},
    transitions=[],
)


def test_the_rate_is_over_the_interval_since_the_previous_line() -> None:
    # The clip ended: 14 frames in the last 5 s while the mean since start is still ~15.
    ended = replace(STARTED, state="stopped", frames_processed=237)
    line = stream_line(ended, STARTED, 5.0)
    assert line == (
        "cam1 stopped: 2.8 fps over the last 5.0 s (source 15.0); since start 237 processed, "
        "3 dropped; age p50 41 ms"
    )
    assert "14.9" not in line
    # Nothing since: the next line says 0.
    assert "0.0 fps over the last 5.0 s" in stream_line(ended, ended, 5.0)


def test_a_first_line_and_a_restarted_stream() -> None:
    # The first line has no interval: the mean, said to be one.
    first = stream_line(STARTED)
    assert first.startswith("cam1 running: 14.92 fps on average since start (source 15.0); ")
    # Replaced after a stall, its count began again: the frames of the new one only.
    restarted = replace(STARTED, frames_processed=20)
    assert "4.0 fps over the last 5.0 s" in stream_line(restarted, STARTED, 5.0)
