"""Data types that flow through a workflow: frames in, detections and results out.

These are the only types `sinks/` may import. They are validated once at construction
(supervision's `Detections` practice) so that code downstream can trust their shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
Image = npt.NDArray[np.uint8]


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded video frame, as a grabber hands it to a worker.

    `capture_time` is wall-clock seconds (time.time()) when the frame arrived: for a live
    source, when the demuxer handed over its data (so its age includes decoding); for a
    file, when the grabber released it (after pacing). `capture_mono` is the same instant
    on time.perf_counter(), used for frame age.
    `pts` is the presentation time in seconds from the source, or None when it has none.
    """

    stream_id: str
    seq: int
    pts: float | None
    capture_time: float
    capture_mono: float
    image: Image  # H x W x 3, BGR, uint8

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def height(self) -> int:
        return int(self.image.shape[0])


_EMPTY_NAMES: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Detections:
    """N boxes in pixel xyxy coordinates of the frame they were found in.

    Arrays are validated in __post_init__; transformations return new objects.
    """

    xyxy: FloatArray  # (N, 4) float32
    confidence: FloatArray  # (N,) float32
    class_id: IntArray  # (N,) int64
    class_name: tuple[str, ...] = _EMPTY_NAMES  # N names, or () when the model has no labels
    tracker_id: IntArray | None = None  # (N,) int64, set by trackers
    landmarks: FloatArray | None = None  # (N, K, 2) float32, e.g. CenterFace's 5 points

    def __post_init__(self) -> None:
        n = _check_shape("xyxy", self.xyxy, (None, 4))
        _check_shape("confidence", self.confidence, (n,))
        _check_shape("class_id", self.class_id, (n,))
        if self.class_name and len(self.class_name) != n:
            raise ValueError(f"class_name: expected {n} names, got {len(self.class_name)}")
        if self.tracker_id is not None:
            _check_shape("tracker_id", self.tracker_id, (n,))
        if self.landmarks is not None:
            _check_shape("landmarks", self.landmarks, (n, None, 2))

    def __len__(self) -> int:
        return int(self.xyxy.shape[0])

    @classmethod
    def empty(cls) -> Detections:
        return cls(
            xyxy=np.zeros((0, 4), np.float32),
            confidence=np.zeros((0,), np.float32),
            class_id=np.zeros((0,), np.int64),
        )

    @classmethod
    def from_arrays(
        cls,
        xyxy: npt.ArrayLike,
        confidence: npt.ArrayLike,
        class_id: npt.ArrayLike,
        labels: Sequence[str] = (),
        landmarks: npt.ArrayLike | None = None,
    ) -> Detections:
        """Build from any array-likes; names come from `labels[class_id]` when given."""
        ids = np.asarray(class_id, dtype=np.int64).reshape(-1)
        names: tuple[str, ...] = ()
        if labels:
            names = tuple(labels[i] if 0 <= i < len(labels) else str(i) for i in ids.tolist())
        return cls(
            xyxy=np.asarray(xyxy, dtype=np.float32).reshape(-1, 4),
            confidence=np.asarray(confidence, dtype=np.float32).reshape(-1),
            class_id=ids,
            class_name=names,
            landmarks=None
            if landmarks is None
            else np.asarray(landmarks, dtype=np.float32).reshape(len(ids), -1, 2),
        )

    def select(self, index: npt.NDArray[np.bool_] | npt.NDArray[np.intp]) -> Detections:
        """A new Detections with the rows picked by a boolean mask or an index array."""
        idx = np.asarray(index)
        rows = np.flatnonzero(idx) if idx.dtype == np.bool_ else idx
        return Detections(
            xyxy=self.xyxy[rows],
            confidence=self.confidence[rows],
            class_id=self.class_id[rows],
            class_name=tuple(self.class_name[i] for i in rows.tolist()) if self.class_name else (),
            tracker_id=None if self.tracker_id is None else self.tracker_id[rows],
            landmarks=None if self.landmarks is None else self.landmarks[rows],
        )

    def to_json(self) -> list[dict[str, Any]]:
        """Compact JSON-ready rows: box rounded to 0.1 px, confidence to 1e-3."""
        out: list[dict[str, Any]] = []
        boxes = np.round(self.xyxy.astype(np.float64), 1).tolist()
        confs = np.round(self.confidence.astype(np.float64), 3).tolist()
        ids = self.class_id.tolist()
        tracks = None if self.tracker_id is None else self.tracker_id.tolist()
        for i, box in enumerate(boxes):
            row: dict[str, Any] = {"box": box, "confidence": confs[i], "class_id": ids[i]}
            if self.class_name:
                row["class"] = self.class_name[i]
            if tracks is not None:
                row["track_id"] = tracks[i]
            out.append(row)
        return out


def _check_shape(name: str, arr: np.ndarray[Any, Any], shape: tuple[int | None, ...]) -> int:
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    if arr.ndim != len(shape) or any(
        want is not None and got != want for got, want in zip(arr.shape, shape, strict=True)
    ):
        want_s = "(" + ", ".join("N" if w is None else str(w) for w in shape) + ")"
        raise ValueError(f"{name}: expected shape {want_s}, got {arr.shape}")
    return int(arr.shape[0])


@dataclass(frozen=True, slots=True)
class Crops:
    """Image regions cut from a frame, one per detection (`detections` holds the boxes
    actually cut, padding included, in the frame's pixels)."""

    images: tuple[Image, ...]
    detections: Detections

    def __post_init__(self) -> None:
        if len(self.images) != len(self.detections):
            raise ValueError(f"crops: {len(self.images)} images for {len(self.detections)} boxes")

    def __len__(self) -> int:
        return len(self.images)

    def to_json(self) -> list[dict[str, Any]]:
        return self.detections.to_json()


@dataclass(frozen=True, slots=True)
class Classifications:
    """Top-k classes per input (one row per crop, or one row for a whole frame)."""

    class_id: IntArray  # (N, k) int64, best first
    confidence: FloatArray  # (N, k) float32
    class_name: tuple[tuple[str, ...], ...] = ()  # N rows of k names, or ()

    def __post_init__(self) -> None:
        n = _check_shape("class_id", self.class_id, (None, None))
        _check_shape("confidence", self.confidence, (n, self.class_id.shape[1]))
        if self.class_name and len(self.class_name) != n:
            raise ValueError(f"class_name: expected {n} rows, got {len(self.class_name)}")

    def __len__(self) -> int:
        return int(self.class_id.shape[0])

    def to_json(self) -> list[list[dict[str, Any]]]:
        ids = self.class_id.tolist()
        confs = np.round(self.confidence.astype(np.float64), 3).tolist()
        return [
            [
                {
                    "class_id": c,
                    "confidence": p,
                    **({"class": self.class_name[i][j]} if self.class_name else {}),
                }
                for j, (c, p) in enumerate(zip(ids[i], confs[i], strict=True))
            ]
            for i in range(len(ids))
        ]


@dataclass(frozen=True, slots=True)
class Texts:
    """Recognised text, one entry per region (`detections` holds the regions)."""

    text: tuple[str, ...]
    confidence: FloatArray  # (N,) float32, mean character probability
    detections: Detections

    def __post_init__(self) -> None:
        n = len(self.detections)
        if len(self.text) != n:
            raise ValueError(f"text: expected {n} strings, got {len(self.text)}")
        _check_shape("confidence", self.confidence, (n,))

    def __len__(self) -> int:
        return len(self.text)

    def to_json(self) -> list[dict[str, Any]]:
        rows = self.detections.to_json()
        confs = np.round(self.confidence.astype(np.float64), 3).tolist()
        for row, text, conf in zip(rows, self.text, confs, strict=True):
            row["text"], row["text_confidence"] = text, conf
        return rows


@dataclass(slots=True)
class FrameResult:
    """What a workflow run produces for one frame, handed to the output fan-out.

    `outputs` maps the workflow's declared output names to values (Detections, counts,
    scalars); `image` is the workflow's `video` output (the frame itself when none).
    `block_spans` holds each block's (start, end) on time.perf_counter(), in workflow
    order; None for a block skipped on this frame.
    """

    stream_id: str
    seq: int
    pts: float | None
    capture_time: float
    capture_mono: float
    start_mono: float  # the workflow run's start, time.perf_counter()
    done_mono: float
    image: Image | None  # None: nobody watched, so nothing drew it (WorkflowRun.run)
    outputs: Mapping[str, Any]
    block_spans: Sequence[tuple[float, float] | None] = field(default_factory=tuple)
    # Each block's thread CPU ns, in workflow order (0: skipped); empty unless the run
    # was asked to measure it (`CompiledWorkflow.instantiate(cpu_clock=True)`).
    block_cpu_ns: Sequence[int] = field(default_factory=tuple)
    # The frame as captured, before any block drew on it (blocks that draw copy it): what
    # a viewer asking for the raw video gets. None: the same as `image`.
    source_image: Image | None = None
    # The workflow version that made it (CompiledWorkflow.version): after a switch of
    # workflow (a shadow promoted), consumers see which results are whose.
    version: str = ""

    def drawn(self) -> Image:
        """The `video` output's image; ValueError when the run drew none (nobody watched:
        WorkflowRun.run's `video`)."""
        if self.image is None:
            raise ValueError(f"{self.stream_id}#{self.seq}: nothing drew this frame's video")
        return self.image

    def captured(self) -> Image:
        """The frame as captured, before any block drew on it."""
        return self.drawn() if self.source_image is None else self.source_image

    @property
    def age_seconds(self) -> float:
        """Capture to result, seconds."""
        return self.done_mono - self.capture_mono

    def predictions_json(self) -> dict[str, Any]:
        """The outputs as JSON-ready values (Detections become lists of rows)."""
        out: dict[str, Any] = {}
        for key, value in self.outputs.items():
            if isinstance(value, np.ndarray):
                continue  # images do not go into predictions
            to_json = getattr(value, "to_json", None)
            out[key] = to_json() if callable(to_json) else value
        return out


def iso_utc(epoch_s: float) -> str:
    """`2026-12-01T04:03:37.123Z`: a wall-clock time (seconds since the epoch) as people
    read it, ISO 8601 in UTC, rounded to the millisecond as `round(t, 3)` rounds it
    (isoformat alone would truncate: 1796104205.9399998, which is round(t, 3) = .94 as a
    float, would read .939)."""
    stamp = datetime.fromtimestamp(round(epoch_s, 3), UTC)  # to the µs: .940000
    return stamp.isoformat(timespec="milliseconds")[:-6] + "Z"
