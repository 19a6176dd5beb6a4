"""The model-free cases of bench/blocks.py: each block run as docs/workflows.md describes
its cost (frame size, boxes, tracks, regions, options), through its compiled step.

A case's `call(i)` does frame i's work of one block, the way the executor calls it; the
inputs replay a `PERIOD`-frame sequence (bench/_block_data.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cv2
from _block_data import (
    PERIOD,
    compiled_block,
    detections,
    frame,
    moving_boxes,
)

from pipelines.blocks.base import StepFn
from pipelines.types import Frame, Image

DEMO_SIZE = (960, 540)  # the demo clip's frames
BOXES = 20  # "20 boxes per frame", "20 tracks per frame"
REGIONS = 10  # "10 boxes", "10 regions", "10 crops" of about 100x100 px
COUNTS = {"in": 3, "out": 1, "total": 4}  # what a line counter hands annotate
DOOR = [[0.1, 0.6], [0.9, 0.6]]  # the line of the page's line_counter example


@dataclass
class Case:
    """One cost the page states: `call(i)` runs frame i's work once."""

    key: str  # the metric's name, its unit last: filter_all_criteria_20_boxes_ms
    call: Callable[[int], object]
    reps: int  # timed samples per round in a full run
    batch: int = 1  # calls per timed sample: sub-µs work is timed over a loop
    reset: Callable[[], None] | None = None  # before each round, untimed

    @property
    def per_ns(self) -> float:
        """The metric's unit per nanosecond."""
        return 1e-3 if self.key.endswith("_us") else 1e-6


def cases(images: list[Image]) -> list[Case]:
    """Every model-free case, on the demo clip's `images`."""
    frames = [frame(images[t % len(images)], t) for t in range(PERIOD)]
    return [
        *filters(frames),
        track(),
        *counters(frames),
        crop(images),
        *blur(images),
        *annotate(images),
        rate_limit(images[0]),
    ]


def filters(frames: list[Frame]) -> list[Case]:
    """20 boxes of three classes; every criterion and a zone (the page's example,
    widened to every size bound), and a class filter alone."""
    boxes = moving_boxes(BOXES, DEMO_SIZE, heights=(30, 250), aspect=(0.3, 1.2), seed=1)
    dets = detections(boxes, confidence=(0.2, 0.95), seed=2)
    every = {
        "classes": ["person", 1],
        "min_confidence": 0.4,
        "min_area": 600,
        "max_area": 60_000,
        "min_width": 10,
        "max_width": 400,
        "min_height": 40,
        "max_height": 400,
        "zone": [[0.05, 0.55], [0.95, 0.55], [0.95, 1.0], [0.05, 1.0]],
        "zone_anchor": "bottom_center",
    }
    out = []
    for name, params in (("all_criteria", every), ("class_only", {"classes": ["person"]})):
        step = compiled_block({"type": "filter", "detections": "given", **params})()
        out.append(Case(f"filter_{name}_{BOXES}_boxes_ms", per_frame(step, dets, frames), 200))
    return out


def per_frame(step: StepFn, values: list[Any], frames: list[Frame]) -> Callable[[int], object]:
    """Frame i's call of a step that reads one value and the Frame."""
    return lambda i: step(values[i % PERIOD], frames[i % PERIOD])


def on_image(step: StepFn, images: list[Image], dets: list[Any]) -> Callable[[int], object]:
    """Frame i's call of a step that reads an image and detections."""
    return lambda i: step(images[i % len(images)], dets[i % PERIOD])


def track() -> Case:
    """ByteTrack with its defaults on 20 boxes per frame at 1280x720, scores 0.3-0.95
    (some weak boxes take the second stage); one tracker for the whole run."""
    boxes = moving_boxes(BOXES, (1280, 720), (60, 300), (0.3, 0.6), seed=3, reach=0.1)
    dets = detections(boxes, confidence=(0.3, 0.95), seed=4)
    step = compiled_block({"type": "track", "detections": "given"})()
    return Case(f"track_{BOXES}_boxes_1280x720_ms", lambda i: step(dets[i % PERIOD]), reps=100)


def counters(frames: list[Frame]) -> list[Case]:
    """20 tracks per frame, many crossing the line and the zone of the page's examples."""
    boxes = moving_boxes(BOXES, DEMO_SIZE, heights=(60, 200), aspect=(0.3, 0.6), seed=5)
    tracks = detections(boxes, confidence=(0.5, 0.95), seed=6, tracks=True)
    blocks = {
        "line_counter": {"line": DOOR, "margin_px": 3, "min_frames_on_side": 2},
        "zone_counter": {
            "zone": [[0.55, 0.45], [0.95, 0.45], [0.95, 0.98], [0.55, 0.98]],
            "min_frames": 2,
            "lost_after_frames": 30,
        },
    }
    out = []
    for kind, params in blocks.items():
        step = compiled_block({"type": kind, "tracks": "given", **params})()
        out.append(Case(f"{kind}_{BOXES}_tracks_ms", per_frame(step, tracks, frames), reps=200))
    return out


def regions(seed: int, tracks: bool = False) -> list[Any]:
    """10 boxes of about 100x100 px per 960x540 frame."""
    boxes = moving_boxes(REGIONS, DEMO_SIZE, heights=(90, 110), aspect=(0.9, 1.1), seed=seed)
    return detections(boxes, confidence=(0.5, 0.95), seed=seed + 1, tracks=tracks)


def crop(images: list[Image]) -> Case:
    step = compiled_block({"type": "crop", "detections": "given", "padding": 0.1, "square": True})()
    dets = regions(seed=7)
    return Case(f"crop_{REGIONS}_boxes_padding_square_ms", on_image(step, images, dets), 200)


def blur(images: list[Image]) -> list[Case]:
    """The frame copy alone; each method on 10 regions with padding 0.1 (the copy
    included: the block's whole step); OpenCV's GaussianBlur against stack blur with a
    151 px kernel on a 300 px square."""
    dets = regions(seed=9)
    out = [Case("frame_copy_960x540_ms", lambda i: images[i % len(images)].copy(), reps=200)]
    for method in ("fill", "pixelate", "gaussian"):
        step = compiled_block(
            {"type": "blur", "detections": "given", "method": method, "padding": 0.1}
        )()
        reps = 100 if method == "gaussian" else 200
        out.append(Case(f"blur_{method}_{REGIONS}_regions_ms", on_image(step, images, dets), reps))

    def face(i: int) -> Image:
        return images[i % len(images)][120:420, 330:630]  # a view, as the block blurs one

    out += [
        Case("gaussianblur_k151_300px_ms", lambda i: cv2.GaussianBlur(face(i), (151, 151), 0), 10),
        Case("stackblur_k151_300px_ms", lambda i: cv2.stackBlur(face(i), (151, 151)), reps=100),
    ]
    return out


def annotate(images: list[Image]) -> list[Case]:
    """10 boxes without labels; 10 tracks with the default labels, the page's example
    line and zone, and counts."""
    plain = compiled_block({"type": "annotate", "detections": "given", "labels": []})()
    full = compiled_block(
        {
            "type": "annotate",
            "detections": "given",
            "counts": "given",
            "lines": [{"name": "door", "points": DOOR}],
            "zones": [{"name": "till", "points": [[100, 80], [400, 80], [400, 300], [100, 300]]}],
        }
    )()
    boxes, tracks = regions(seed=11), regions(seed=11, tracks=True)
    return [
        Case(
            f"annotate_{REGIONS}_boxes_no_labels_ms",
            lambda i: plain(images[i % len(images)], boxes[i % PERIOD], None, None),
            reps=200,
        ),
        Case(
            f"annotate_{REGIONS}_boxes_labels_line_zone_counts_ms",
            lambda i: full(images[i % len(images)], tracks[i % PERIOD], COUNTS, None),
            reps=200,
        ),
    ]


def rate_limit(image: Image) -> Case:
    """`every_s: 1.0` (the page's example) on frames 1/15 s apart: 1 in 15 passes. Each
    round starts a fresh stream's step on frames whose capture clock only goes forward."""
    factory = compiled_block({"type": "rate_limit", "value": "given", "every_s": 1.0})
    reps, batch = 20, 1000
    frames = [frame(image, t) for t in range(reps * batch)]
    state = {"step": factory()}

    def reset() -> None:
        state["step"] = factory()

    def call(i: int) -> object:
        return state["step"](image, frames[i % len(frames)])

    return Case("rate_limit_every_s_us", call, reps=reps, batch=batch, reset=reset)
