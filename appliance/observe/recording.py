"""Headless outputs of `appliance run`: every result as a JSON line, and each stream's
`video` output as an H.264 file. Both are in-process subscribers of the outputs.

Unlike sinks, recordings lose nothing: a run that is asked to save every result saves
every result. The JSON writer appends a short line per result (a buffered write, no
fsync). The video recorder encodes on a thread of its own per stream, behind a queue of
`VIDEO_QUEUE` frames; when the encoder falls behind, the worker waits for it, so the
recording slows the run instead of dropping frames.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from fractions import Fraction
from pathlib import Path
from typing import IO

import av

from pipelines.types import FrameResult, Image
from sinks.messages import prediction

log = logging.getLogger("appliance.recording")

VIDEO_QUEUE = 32  # frames waiting for the encoder (640x480: 30 MB)
STOP_TIMEOUT_S = 30.0  # to encode what is queued and close the file
# x264 defaults but fast: a recording must keep up with the workflow on a small CPU.
X264_OPTIONS = {"preset": "veryfast", "crf": "23"}
TIME_BASE = Fraction(1, 1000)  # frame timestamps in milliseconds of capture time
NOMINAL_FPS = 30  # the container's nominal rate; the timestamps carry the real one


class JsonLines:
    """`--save-json FILE.jsonl`: one `sinks.messages.prediction` document per line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = path.open("w", encoding="utf-8")
        self._lock = threading.Lock()  # workers of several streams write to one file
        self.lines = 0

    def __call__(self, result: FrameResult) -> None:
        line = json.dumps(prediction(result), separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self.lines += 1

    def close(self) -> None:
        with self._lock:
            self._file.close()


class VideoRecorder:
    """`--save-video FILE.mp4`: one stream's `video` output, encoded on its own thread.

    Frames are stamped with their capture times (milliseconds from the first), so the
    file plays at the camera's pace whatever the workflow skipped (variable frame rate).
    """

    def __init__(self, path: Path, stream_id: str) -> None:
        self.path = path
        self.frames = 0
        self._queue: queue.Queue[tuple[Image, float] | None] = queue.Queue(VIDEO_QUEUE)
        self._thread = threading.Thread(target=self._run, name=f"record:{stream_id}")
        self.error: str | None = None  # set by the thread: before it starts
        self._thread.start()

    def __call__(self, result: FrameResult) -> None:
        if self.error is None and result.image is not None:  # drawn: held (headless.py)
            # The source's own timestamp where it has one (a file's pts keeps its pace
            # under `pace: fast`); waits while the encoder is behind.
            stamp = result.pts if result.pts is not None else result.capture_mono
            self._queue.put((result.image, stamp))

    def close(self) -> bool:
        """Encode what is queued, close the file; True when the thread ended."""
        self._queue.put(None)
        self._thread.join(STOP_TIMEOUT_S)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            self._encode()
        except (av.FFmpegError, OSError, ValueError) as exc:
            self.error = f"{self.path}: {exc}"
            log.error("recording stopped: %s", self.error)
            while self._queue.get() is not None:  # let the worker and close() go on
                pass

    def _encode(self) -> None:
        item = self._queue.get()
        if item is None:
            return
        height, width = (d & ~1 for d in item[0].shape[:2])  # yuv420p needs even sizes
        start, last_pts = item[1], -1
        with av.open(str(self.path), "w") as out:
            stream = out.add_stream("libx264", rate=NOMINAL_FPS, options=X264_OPTIONS)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            stream.codec_context.time_base = TIME_BASE
            while item is not None:
                image, captured = item
                frame = av.VideoFrame.from_ndarray(image[:height, :width], "bgr24")
                last_pts = frame.pts = max(last_pts + 1, round((captured - start) * 1000))
                frame.time_base = TIME_BASE
                out.mux(stream.encode(frame))
                self.frames += 1
                item = self._queue.get()
            out.mux(stream.encode(None))


def video_path(path: Path, stream_id: str, several: bool) -> Path:
    """FILE.mp4 for one stream; FILE-<stream>.mp4 each when the run has several."""
    return path.with_name(f"{path.stem}-{stream_id}{path.suffix}") if several else path
