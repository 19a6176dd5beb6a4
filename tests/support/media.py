"""Real H.264 clips for tests, written with PyAV and cached for the session.

Every frame carries its index twice: as 12 black/white blocks across the top (robust to
H.264 compression, read back with `frame_index`) and as text for a human looking at it.
A bar moves across the rest so that consecutive frames differ like real video.

    def test_x(make_clip):
        clip = make_clip(width=160, height=120, fps=30, seconds=1.0)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import av
import cv2
import numpy as np
import numpy.typing as npt
import pytest

Image = npt.NDArray[np.uint8]
INDEX_BITS = 12  # frame indices up to 4095 (over two minutes at 30 fps)
_BAND = 0.25  # the top quarter of the frame holds the index blocks


class MakeClip(Protocol):
    def __call__(
        self,
        width: int = 160,
        height: int = 120,
        fps: int = 30,
        seconds: float = 1.0,
        *,
        faststart: bool = False,
    ) -> Path: ...


def pattern_frame(index: int, width: int, height: int) -> Image:
    """The BGR image of frame `index`: index blocks on top, a moving bar, the number."""
    image = np.full((height, width, 3), 96, np.uint8)
    band, block = int(height * _BAND), width // INDEX_BITS
    for bit in range(INDEX_BITS):
        on = (index >> (INDEX_BITS - 1 - bit)) & 1
        image[:band, bit * block : (bit + 1) * block] = 255 if on else 0
    x = (index * 4) % width
    image[band:, x : x + max(2, width // 20)] = (0, 200, 255)
    cv2.putText(image, str(index), (4, height - 6), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255,) * 3)
    return image


def frame_index(image: Image) -> int:
    """The index `pattern_frame` drew into an image, read from the centres of its blocks."""
    height, width = image.shape[:2]
    band, block = int(height * _BAND), width // INDEX_BITS
    value = 0
    for bit in range(INDEX_BITS):
        x = bit * block + block // 2
        value = (value << 1) | int(image[band // 2, x].mean() > 128)
    return value


def write_clip(
    path: Path,
    width: int,
    height: int,
    fps: int,
    seconds: float,
    *,
    faststart: bool,
    draw: Callable[[int, int, int], Image] = pattern_frame,
) -> Path:
    """An H.264 MP4: yuv420p, a keyframe every second (gop = fps), no B-frames; frame i
    is `draw(i, width, height)` (BGR), by default the numbered test pattern."""
    x264 = f"keyint={fps}:min-keyint={fps}:scenecut=0:bframes=0"
    muxer = {"movflags": "faststart"} if faststart else {}
    partial = path.with_suffix(".part.mp4")
    with av.open(str(partial), "w", options=muxer) as out:
        stream = out.add_stream("libx264", rate=fps, options={"x264-params": x264, "crf": "18"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(round(fps * seconds)):
            frame = av.VideoFrame.from_ndarray(draw(i, width, height), format="bgr24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    partial.rename(path)
    return path


@pytest.fixture(scope="session")
def make_clip(tmp_path_factory: pytest.TempPathFactory) -> MakeClip:
    """Factory of cached clips: make_clip(width, height, fps, seconds, *, faststart)."""
    root = tmp_path_factory.mktemp("clips")

    def make(
        width: int = 160,
        height: int = 120,
        fps: int = 30,
        seconds: float = 1.0,
        *,
        faststart: bool = False,
    ) -> Path:
        name = f"{width}x{height}_{fps}fps_{seconds:g}s{'_faststart' if faststart else ''}.mp4"
        path = root / name
        if not path.exists():
            write_clip(path, width, height, fps, seconds, faststart=faststart)
        return path

    return make


@pytest.fixture(scope="session")
def light_camera(make_clip: MakeClip) -> Path:
    """A cheap clip to loop as a live camera where a test needs a stream that runs, not
    what it shows: 320x240 at 5 fps. The demo clip (960x540, 15 fps) keeps about 0.7 of a
    core busy through the person detector, this one about 0.3, on the 2-core test box
    whose other core runs the test itself."""
    return make_clip(320, 240, fps=5, seconds=4.0)


@pytest.fixture(scope="session")
def truncated_clip(make_clip: MakeClip, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid clip cut in half: its index (moov, written first) promises frames whose
    bytes are missing, so it opens and decodes, then fails mid-file."""
    whole = make_clip(seconds=2.0, faststart=True)
    path = tmp_path_factory.mktemp("truncated") / "truncated.mp4"
    data = whole.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.fixture(scope="session")
def corrupt_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Garbage bytes named .mp4: no demuxer recognises them."""
    path = tmp_path_factory.mktemp("corrupt") / "corrupt.mp4"
    path.write_bytes(random.Random(1234).randbytes(64 * 1024))
    return path


@pytest.fixture(scope="session")
def keyless_clip(make_clip: MakeClip, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clip without its keyframes (Matroska): it demuxes fine but decodes to no frame."""
    path = tmp_path_factory.mktemp("keyless") / "keyless.mkv"
    with av.open(str(make_clip())) as src, av.open(str(path), "w") as out:
        video_in = src.streams.video[0]
        video_out = out.add_stream_from_template(video_in)
        for packet in src.demux(video_in):
            if packet.size and not packet.is_keyframe:
                packet.stream = video_out
                out.mux(packet)
    return path


def retimed(source: Path, path: Path, speed: int) -> Path:
    """`source`'s video, its packets copied with their timestamps divided by `speed`: the
    same pictures, played `speed` times as fast (a 15 fps clip at 30 fps)."""
    with av.open(str(source)) as src, av.open(str(path), "w") as out:
        video_in = src.streams.video[0]
        video_out = out.add_stream_from_template(video_in)
        for packet in src.demux(video_in):
            if packet.dts is None:  # the demuxer's empty packet at the end
                continue
            packet.dts //= speed
            packet.pts = None if packet.pts is None else packet.pts // speed
            packet.stream = video_out
            out.mux(packet)
    return path
