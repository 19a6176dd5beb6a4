"""A camera with a clock, for tests and benches: latency measured from the camera's emission.

    with ClockCamera(640, 480, fps=15, workdir=tmp) as camera:
        ...                                   # a pipeline reads camera.url (RTSP)
        index = camera.frame_index(image)     # the frame's index, from its pixels
        latency = time.time() - camera.emitted(index)

tests/support/clock_camera_server.py (run with Debian's /usr/bin/python3, which has
GStreamer's RTSP server) encodes a live H.264 stream whose frames carry their index in a
band of black/white blocks on top, over pictures from the demo clip (faces and persons,
so that detectors do realistic work), and logs the wall time at which each index left
its RTP payloader. Wall time (time.time()), because the camera and the pipeline under
test are different processes, and a result's time is taken in the latter: on one machine
both read the same clock, whatever NTP does to it between the two readings (microseconds).

This module imports only the standard library and numpy at the top, so that the bench's
reference environment (bench/_reference.py) can use `read_stamp`; PyAV and OpenCV load
only to render the background. The pytest fixture lives with the tests that use it.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import subprocess
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from tests.support import clock_camera_server as layout
from tests.support.processes import end_process, read_line

SYSTEM_PYTHON = "/usr/bin/python3"
SCRIPT = Path(__file__).with_name("clock_camera_server.py")
ROOT = Path(__file__).resolve().parents[2]
DEMO_CLIP = ROOT / "configs" / "media" / "demo.mp4"
CACHE = ROOT / "tests" / ".cache" / "clock_camera"  # git-ignored
READY_TIMEOUT_S = 15.0  # GStreamer's first start loads plugins: ~1 s, more on a busy box
BACKGROUND_PICTURES = 32  # demo clip frames cycled by the camera (15 MB at 640x480)
_THRESHOLD, _MARGIN = 128, 48  # a block reads 1 above 128; within ±48 of it is no stamp

Image = npt.NDArray[np.uint8]


def read_stamp(image: npt.NDArray[Any]) -> int | None:
    """The 16-bit stamp drawn into a BGR frame, or None when the band holds no valid stamp.

    Each block is read as the mean of its central half (H.264 blurs edges); a block too
    close to mid-grey, or a check nibble that does not match, means no stamp.
    """
    height, width = image.shape[:2]
    rows, block = layout.band_rows(height), layout.block_px(width)
    if block == 0:
        return None
    band = image[rows // 4 : 3 * rows // 4, : layout.BLOCKS * block]
    cells = band.reshape(band.shape[0], layout.BLOCKS, block, -1)
    levels = cells[:, :, block // 4 : 3 * block // 4].mean(axis=(0, 2, 3))
    if np.any(np.abs(levels - _THRESHOLD) < _MARGIN):
        return None
    word = 0
    for on in (levels > _THRESHOLD).tolist():
        word = word << 1 | int(on)
    stamp = word >> layout.CHECK_BITS
    check = word & ((1 << layout.CHECK_BITS) - 1)
    return stamp if check == layout.check_nibble(stamp) else None


class EmissionLog:
    """The camera's log of "INDEX WALL_TIME" lines, read as it grows. Thread-safe.

    Indices are the camera's ticks since it started (unwrapped); a frame's stamp is its
    index modulo 65536, resolved to the emitted index nearest to the newest one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._times: dict[int, float] = {}
        self._order: list[tuple[float, int]] = []  # (time, index), in emission order
        self._partial = b""
        self._offset = 0
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Read the lines appended since the last call (a partial last line waits)."""
        with self._lock, contextlib.suppress(FileNotFoundError), self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
            self._offset += len(data)
            *lines, self._partial = (self._partial + data).split(b"\n")
            for line in lines:
                index, at = line.split()
                self._times[int(index)] = float(at)
                self._order.append((float(at), int(index)))

    def latest(self) -> int | None:
        """The newest index emitted so far."""
        self.refresh()
        return self._order[-1][1] if self._order else None

    def resolve(self, stamp: int) -> int | None:
        """The emitted index whose stamp is `stamp`, nearest to the newest index."""
        newest = self.latest()
        if newest is None:
            return None
        half = layout.MODULUS // 2
        return newest + (stamp - newest + half) % layout.MODULUS - half

    def emitted(self, index: int) -> float | None:
        """Wall time (s) at which frame `index` left the camera; None if it never did."""
        if index not in self._times:
            self.refresh()
        return self._times.get(index)

    def newest_at(self, when: float) -> int | None:
        """The newest index emitted at or before wall time `when`."""
        self.refresh()
        at = bisect.bisect_right(self._order, (when, float("inf")))
        return self._order[at - 1][1] if at else None


class ClockCamera:
    """One clock camera process on 127.0.0.1 (a free port); a context manager."""

    def __init__(
        self,
        width: int = 640,
        height: int = 480,
        fps: int = 15,
        *,
        workdir: Path,
        path: str = "/stream",
        background: bool = True,
    ) -> None:
        self.width, self.height, self.fps = width, height, fps
        self._path = path
        self._background = background
        self.emissions = EmissionLog(workdir / f"emitted-{id(self):x}.txt")
        self._log_path = workdir / f"clock-camera-{id(self):x}.log"
        self._proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> ClockCamera:
        """Start the server and wait for its READY line (it listens then)."""
        args = [SYSTEM_PYTHON, str(SCRIPT), "--size", f"{self.width}x{self.height}"]
        args += ["--fps", str(self.fps), "--path", self._path]
        args += ["--emissions", str(self.emissions.path)]
        if self._background:
            args += ["--background", str(background_file(self.width, self.height))]
        with self._log_path.open("a") as log:  # the child keeps its own descriptor
            self._proc = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True
            )
        assert self._proc.stdout is not None
        line = read_line(self._proc.stdout, READY_TIMEOUT_S)
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"clock camera did not start: {line!r}\n{self.log()}")
        self.url = line.split()[1]
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a few seconds."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        end_process(proc)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def frame_index(self, image: npt.NDArray[Any]) -> int | None:
        """The index of a decoded frame from this camera; None if its stamp is unreadable."""
        stamp = read_stamp(image)
        return None if stamp is None else self.emissions.resolve(stamp)

    def emitted(self, index: int) -> float | None:
        """Wall time (s) at which frame `index` was emitted."""
        return self.emissions.emitted(index)

    def log(self) -> str:
        return self._log_path.read_text(errors="replace")[-4000:]

    def __enter__(self) -> ClockCamera:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def background_file(width: int, height: int, count: int = BACKGROUND_PICTURES) -> Path:
    """Raw I420 frames of the demo clip at width x height (cached), the band rows left free."""
    path = CACHE / f"demo_{width}x{height}_{count}.i420"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_bytes(b"".join(_render(width, height, count)))
        partial.rename(path)  # atomic: a concurrent reader never sees half a file
    return path


def _render(width: int, height: int, count: int) -> list[bytes]:
    """`count` frames spread over the demo clip, cropped to fill the rows below the band."""
    import av
    import cv2

    with av.open(str(DEMO_CLIP)) as clip:
        frames = [np.asarray(f.to_ndarray(format="bgr24"), np.uint8) for f in clip.decode(video=0)]
    rows = layout.band_rows(height)
    out = []
    for i in range(count):
        scene = _crop_to(frames[i * len(frames) // count], width / (height - rows))
        canvas = np.zeros((height, width, 3), np.uint8)
        canvas[rows:] = cv2.resize(scene, (width, height - rows), interpolation=cv2.INTER_AREA)
        out.append(cv2.cvtColor(canvas, cv2.COLOR_BGR2YUV_I420).tobytes())
    return out


def _crop_to(image: Image, aspect: float) -> Image:
    """The centred crop of `image` with width/height = `aspect`."""
    h, w = image.shape[:2]
    if w / h > aspect:
        keep = round(h * aspect)
        return image[:, (w - keep) // 2 : (w + keep) // 2]
    keep = round(w / aspect)
    return image[(h - keep) // 2 : (h + keep) // 2]
