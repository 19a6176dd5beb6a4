"""The clock camera (tests/support/clock_camera.py): stamps that survive H.264, an emission
log that resolves them, a real RTSP stream decoded with PyAV, and the appliance's own
RTSP source read against it: results in frame order, always near the newest frame."""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Protocol

import av
import cv2
import numpy as np
import pytest

from appliance.config import parse_config
from appliance.runtime.runtime import Runtime
from pipelines.types import FrameResult
from tests.sources import FAST_PROBE, WAIT_S
from tests.support import clock_camera_server as layout
from tests.support.appliance import MODELS
from tests.support.clock_camera import (
    ClockCamera,
    EmissionLog,
    Image,
    background_file,
    read_stamp,
)

SIZES = [(640, 480), (320, 240), (160, 120)]
INDICES = [0, 1, 2, 255, 4096, 0x5A5A, 65535, 65536, 70_000, 1_234_567]


class CameraFactory(Protocol):
    def __call__(self, width: int, height: int, fps: int) -> ClockCamera: ...


@pytest.fixture
def clock_camera(_gst_rtsp_available: None, tmp_path: Path) -> Iterator[CameraFactory]:
    """Factory: clock_camera(width, height, fps) -> a started ClockCamera, stopped at the end."""
    cameras: list[ClockCamera] = []

    def start(width: int, height: int, fps: int) -> ClockCamera:
        camera = ClockCamera(width, height, fps, workdir=tmp_path)
        cameras.append(camera)
        return camera.start()

    yield start
    for camera in cameras:
        crashed = bool(camera.url) and not camera.running  # it had started
        camera.stop()
        assert not crashed, f"clock camera exited by itself:\n{camera.log()}"


def bgr(frames: layout.Frames, index: int) -> Image:
    """Frame `index` as the camera draws it (I420), converted to BGR like a decoder's output."""
    i420 = np.frombuffer(frames.frame(index), np.uint8).reshape(-1, frames.width)
    return np.asarray(cv2.cvtColor(i420, cv2.COLOR_YUV2BGR_I420), np.uint8)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_stamps_read_back_modulo_65536(width: int, height: int) -> None:
    frames = layout.Frames(width, height, background_file(width, height).read_bytes())
    assert [read_stamp(bgr(frames, i)) for i in INDICES] == [i % 65536 for i in INDICES]


def test_frames_without_a_valid_stamp_read_as_none() -> None:
    grey = np.full((480, 640, 3), 110, np.uint8)
    noise = np.random.default_rng(7).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    flipped = bgr(layout.Frames(640, 480, None), 0x1234)
    last_block = slice(19 * layout.block_px(640), 20 * layout.block_px(640))
    flipped[: layout.band_rows(480), last_block] ^= 0xFF  # one check bit inverted
    assert read_stamp(flipped) is None
    assert read_stamp(grey) is None
    assert read_stamp(noise) is None


@pytest.mark.parametrize(("width", "height"), [(640, 480), (160, 120)])
def test_stamps_survive_x264_ultrafast_zerolatency(width: int, height: int) -> None:
    frames = layout.Frames(width, height, background_file(width, height).read_bytes())
    codec = av.CodecContext.create("libx264", "w")
    codec.width, codec.height, codec.pix_fmt = width, height, "yuv420p"
    codec.time_base = Fraction(1, 15)
    codec.options = {"preset": "ultrafast", "tune": "zerolatency", "g": "15", "bf": "0"}
    decoder = av.CodecContext.create("h264", "r")
    indices = range(60_000, 60_030)  # the camera's rate control settles on these frames
    decoded = []
    for i in indices:
        frame = av.VideoFrame.from_ndarray(bgr(frames, i), format="bgr24").reformat(
            format="yuv420p"
        )
        frame.pts = i
        for packet in codec.encode(frame):
            decoded += [f.to_ndarray(format="bgr24") for f in decoder.decode(packet)]
    assert [read_stamp(image) for image in decoded] == list(indices)


def test_the_emission_log_resolves_wrapped_stamps(tmp_path: Path) -> None:
    path = tmp_path / "emitted.txt"
    log = EmissionLog(path)
    assert log.latest() is None  # no file yet: nothing emitted
    path.write_text("".join(f"{i} {1000 + i / 15:.6f}\n" for i in range(65530, 65540)) + "6554")
    assert log.latest() == 65539  # the partial last line waits
    with path.open("a") as f:
        f.write(f"0 {1000 + 65540 / 15:.6f}\n")
    assert log.latest() == 65540
    assert log.resolve(65535) == 65535
    assert log.resolve(4) == 65540  # the stamp wrapped: 65540 % 65536
    assert log.emitted(65540) == pytest.approx(1000 + 65540 / 15)
    assert log.emitted(12) is None
    assert log.newest_at(1000 + 65533.5 / 15) == 65533
    assert log.newest_at(0.0) is None


@pytest.mark.rtsp
@pytest.mark.parametrize(("width", "height", "fps"), [(640, 480, 15), (160, 120, 30)])
def test_a_decoded_stream_reads_consecutive_indices_emitted_just_before(
    clock_camera: CameraFactory, width: int, height: int, fps: int
) -> None:
    camera = clock_camera(width, height, fps)
    seen: list[tuple[int | None, float]] = []
    options = {"rtsp_transport": "tcp", **FAST_PROBE}
    with av.open(camera.url, options=options, timeout=WAIT_S) as container:
        for frame in itertools.islice(container.decode(video=0), 45):
            image = frame.to_ndarray(format="bgr24")
            seen.append((camera.frame_index(image), time.time()))
    indices = [i for i, _ in seen]
    assert None not in indices
    read = [i for i in indices if i is not None]
    steps = [b - a for a, b in itertools.pairwise(read)]
    assert min(steps) >= 1 and statistics.median(steps) == 1  # a reader that keeps up
    emitted = [camera.emitted(i) for i in read]
    times = [t for t in emitted if t is not None]
    assert len(times) == len(read)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) > 0
    assert 0.5 / fps < statistics.median(gaps) < 2 / fps  # paced by the camera's clock
    latency = [t - e for (_, t), e in zip(seen, times, strict=True)]
    assert min(latency) > 0  # decoded after it was sent: one wall clock, causality
    assert statistics.median(latency[15:]) < 1.0  # after the probe's backlog


class Collector:
    """A subscriber: each result's frame index (read from its image) and wall time."""

    def __init__(self, camera: ClockCamera, n: int) -> None:
        self.rows: list[tuple[int | None, float]] = []
        self.enough = threading.Event()
        self._camera, self._n = camera, n

    def __call__(self, result: FrameResult) -> None:
        now = time.time()
        self.rows.append((self._camera.frame_index(result.captured()), now))
        if len(self.rows) >= self._n:
            self.enough.set()


@pytest.mark.rtsp
def test_the_appliance_processes_the_newest_frame_in_order(
    clock_camera: CameraFactory, tmp_path: Path
) -> None:
    fps = 30
    camera = clock_camera(320, 240, fps)
    # CenterFace at 960x544 runs slower than 30 fps on a small CPU: frames must be skipped,
    # not queued, for results to stay near the newest frame.
    faces = {
        "path": str(MODELS / "centerface.onnx"),
        "decoder": "centerface",
        "input_size": [960, 544],
        "providers": ["cpu"],
    }
    detect = {"id": "faces", "type": "detect", "model": "faces"}
    workflow = {"name": "faces", "blocks": [detect], "outputs": {"faces": "faces"}}
    source = {"url": camera.url, "options": FAST_PROBE}
    stream = {"id": "cam", "source": source, "workflow": workflow}
    doc = {"models": {"faces": faces}, "streams": [stream]}
    runtime = Runtime(parse_config(doc, tmp_path))
    got = Collector(camera, 40)
    runtime.outputs.subscribe(got)
    runtime.start()
    try:
        assert got.enough.wait(WAIT_S)
    finally:
        runtime.stop()
    rows = got.rows[10:]  # after the probe's backlog and the model's first runs
    indices = [i for i, _ in rows if i is not None]
    assert len(indices) == len(rows)  # every result's frame carries its stamp
    assert indices == sorted(set(indices))  # frame order, no frame twice
    behind = []  # frames emitted after the processed one, when its result came out
    for index, at in rows:
        newest = camera.emissions.newest_at(at)
        assert index is not None and newest is not None
        behind.append(newest - index)
    # Taking the newest frame keeps a result within the workflow's time plus a frame or
    # two of the camera; a queue would fall further behind with every result, past one
    # second's worth of frames within seconds. That second is a loose bound on purpose.
    assert max(behind) <= fps, behind
