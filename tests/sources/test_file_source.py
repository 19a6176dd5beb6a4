"""Files through a real Grabber: pacing, newest-frame dropping, looping, failures, stop."""

from __future__ import annotations

import itertools
import shutil
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.sources import StreamState
from tests.sources import Harness, assert_stops
from tests.support.media import MakeClip, frame_index

FPS = 30


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    h = Harness(resolve_path=lambda p: (tmp_path / p).resolve())
    yield h
    h.stop_all()


def test_realtime_file_gives_a_slow_consumer_the_newest_frame(
    harness: Harness, make_clip: MakeClip
) -> None:
    clip = make_clip(fps=FPS, seconds=2.0)
    run = harness.start(str(clip), loop=False, pace="realtime")
    work_s = 0.1  # the consumer takes ~3 frame intervals per frame
    frames = run.drain(work_s=work_s)

    seqs = [f.seq for f in frames]
    assert len(frames) >= 5
    assert seqs == sorted(set(seqs)) and max(b - a for a, b in itertools.pairwise(seqs)) > 1
    assert all(frame_index(f.image) == f.seq for f in frames)  # the image is that frame
    assert run.slot.produced == 2 * FPS
    assert run.slot.dropped == run.slot.produced - len(frames)
    # Released at their pts, like a camera: frame n leaves ~n/30 s after frame 0.
    first, last = frames[0], frames[-1]
    assert last.capture_mono - first.capture_mono >= 0.9 * (last.seq - first.seq) / FPS
    run.states.wait_for(StreamState.STOPPED)
    assert run.states.events[-1][:2] == (StreamState.STOPPED, "end of file")
    stats = run.grabber.stats
    assert stats.frames == 2 * FPS and stats.reconnects == 0 and stats.last_error is None
    assert stats.fps is not None and FPS / 2 < stats.fps < FPS * 2  # the source's rate
    assert 0 < stats.last_frame_mono <= run.slot.last_put_mono  # the heartbeat


def test_realtime_frames_are_fresh_when_taken(harness: Harness, make_clip: MakeClip) -> None:
    run = harness.start(str(make_clip(fps=FPS, seconds=2.0)), loop=False)
    ages = []
    for _ in range(10):
        frame = run.take(1)[0]
        ages.append(time.perf_counter() - frame.capture_mono)
    # The slot holds one frame, at most one interval old; generous for a busy CI box.
    assert max(ages) < 2 / FPS + 0.5


def test_fast_file_gives_every_frame_once_in_order(harness: Harness, make_clip: MakeClip) -> None:
    run = harness.start(str(make_clip(fps=FPS, seconds=1.0)), loop=False, pace="fast")
    frames = run.drain()
    assert [f.seq for f in frames] == list(range(FPS))
    assert [frame_index(f.image) for f in frames] == list(range(FPS))
    assert run.slot.dropped == 0
    assert frames[0].image.shape == (120, 160, 3) and frames[0].pts == 0.0
    assert run.states.states == [StreamState.STARTING, StreamState.RUNNING, StreamState.STOPPED]
    assert run.states.events[-1][1] == "end of file"
    assert run.grabber.stats.frames == FPS


def test_looping_file_continues_seq_past_the_clip(harness: Harness, make_clip: MakeClip) -> None:
    run = harness.start(str(make_clip(fps=FPS, seconds=1.0)), loop=True, pace="fast")
    frames = run.take(int(2.5 * FPS))
    assert [f.seq for f in frames] == list(range(len(frames)))
    assert [frame_index(f.image) for f in frames] == [i % FPS for i in range(len(frames))]
    assert run.states.states == [StreamState.STARTING, StreamState.RUNNING]  # one RUNNING
    assert_stops(run.grabber)
    assert run.states.events[-1][:2] == (StreamState.STOPPED, "stopped")


def test_corrupt_file_fails_naming_the_path(harness: Harness, corrupt_clip: Path) -> None:
    run = harness.start(str(corrupt_clip))
    _, reason, _ = run.states.wait_for(StreamState.FAILED)
    assert str(corrupt_clip) in reason and "Invalid data" in reason
    assert run.drain() == []  # the thread ended and closed the slot
    assert run.states.states == [StreamState.STARTING, StreamState.FAILED]


def test_truncated_file_fails_after_the_frames_it_has(
    harness: Harness, truncated_clip: Path
) -> None:
    run = harness.start(str(truncated_clip), pace="fast")
    frames = run.drain()
    _, reason, _ = run.states.wait_for(StreamState.FAILED)
    assert str(truncated_clip) in reason and "truncated" in reason
    assert 0 < len(frames) < 2 * FPS
    assert [f.seq for f in frames] == list(range(len(frames)))
    assert StreamState.RECONNECTING not in run.states.states  # files never reconnect


def test_file_without_decodable_frames_fails_instead_of_looping(
    harness: Harness, keyless_clip: Path
) -> None:
    run = harness.start(str(keyless_clip), loop=True)
    _, reason, _ = run.states.wait_for(StreamState.FAILED)
    assert str(keyless_clip) in reason and "no video frames" in reason


def test_file_without_video_fails(harness: Harness, tmp_path: Path) -> None:
    path = tmp_path / "tone.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(8000)
        wav.writeframes(bytes(1600))  # 0.1 s of silence
    run = harness.start(str(path))
    _, reason, _ = run.states.wait_for(StreamState.FAILED)
    assert str(path) in reason and "no video stream" in reason


def test_missing_file_fails_naming_it(harness: Harness, tmp_path: Path) -> None:
    run = harness.start("no/such/clip.mp4")
    _, reason, _ = run.states.wait_for(StreamState.FAILED)
    assert str(tmp_path / "no/such/clip.mp4") in reason and "not found" in reason


def test_a_missing_camera_device_is_retried_like_a_camera(harness: Harness) -> None:
    run = harness.start("/dev/video99", backoff={"initial_s": 0.05, "jitter": 0.0})
    _, reason, _ = run.states.wait_for(StreamState.RECONNECTING, after=2)
    assert "/dev/video99" in reason
    assert StreamState.FAILED not in run.states.states


def test_relative_paths_are_resolved_by_the_caller(
    harness: Harness, make_clip: MakeClip, tmp_path: Path
) -> None:
    shutil.copy(make_clip(), tmp_path / "clip.mp4")
    run = harness.start("clip.mp4", pace="fast", loop=False)
    assert len(run.drain()) == FPS


def test_stop_while_playing_realtime(harness: Harness, make_clip: MakeClip) -> None:
    run = harness.start(str(make_clip(seconds=2.0)))
    run.states.wait_for(StreamState.RUNNING)
    assert_stops(run.grabber)
    assert run.states.events[-1][:2] == (StreamState.STOPPED, "stopped")


def test_stop_while_put_blocks_on_a_consumer_that_never_comes(
    harness: Harness, make_clip: MakeClip
) -> None:
    run = harness.start(str(make_clip()), pace="fast")
    run.states.wait_for(StreamState.RUNNING)
    assert_stops(run.grabber)
    assert run.slot.closed


def test_stop_after_the_thread_ended(harness: Harness, corrupt_clip: Path) -> None:
    run = harness.start(str(corrupt_clip))
    run.states.wait_for(StreamState.FAILED)
    assert_stops(run.grabber)
    assert run.states.states == [StreamState.STARTING, StreamState.FAILED]
