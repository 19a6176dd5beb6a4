"""Inputs of bench/blocks.py: frames of configs/media/demo.mp4, synthetic detections and
tracks on smooth periodic paths, and each block compiled as a workflow compiles it.

The paths repeat every `PERIOD` frames without a jump, so a bench can replay a sequence
for as long as it runs: a tracker keeps its tracks, a counter sees tracks cross its line
again and again, and the cost measured is the steady state, not the first frames.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import av
import numpy as np
from _common import ROOT  # first: puts the repository on sys.path for `tests`

from pipelines.blocks.base import BlockType, BuildContext, StepFactory, stateless
from pipelines.compiler import compile_workflow
from pipelines.models import ModelHandle
from pipelines.registry import BUILTIN_BLOCKS, BlockRegistry
from pipelines.types import Detections, Frame, Image

DEMO = ROOT / "configs" / "media" / "demo.mp4"
PERIOD = 60  # frames: every path is back where it started after this many
FPS = 15  # the demo clip's rate: capture times of the frames made here
LABELS = ("person", "car", "bicycle")  # class names of the synthetic detections


def demo_frames(count: int) -> list[Image]:
    """The first `count` frames of the demo clip (960x540, BGR), decoded with PyAV."""
    frames: list[Image] = []
    with av.open(str(DEMO)) as container:
        for decoded in container.decode(video=0):
            frames.append(np.ascontiguousarray(decoded.to_ndarray(format="bgr24")))
            if len(frames) == count:
                break
    return frames


def frame(image: Image, seq: int = 0) -> Frame:
    """A Frame as a grabber hands it on, captured at `seq` / FPS seconds."""
    return Frame("bench", seq, seq / FPS, seq / FPS, seq / FPS, image)


def moving_boxes(
    n: int,
    size: tuple[int, int],
    heights: tuple[float, float],
    aspect: tuple[float, float],
    seed: int,
    reach: float = 0.2,
) -> list[np.ndarray[Any, np.dtype[np.float32]]]:
    """`PERIOD` frames of n xyxy boxes in a `size` (width, height) frame: each object of
    a height in `heights` px and width/height in `aspect` moves on its own ellipse (up to
    `reach` of the frame's width and height each way), with a pixel of detector jitter."""
    width, height = size
    rng = np.random.default_rng(seed)
    h = rng.uniform(*heights, n)
    w = h * rng.uniform(*aspect, n)
    cx, cy = rng.uniform(0.15, 0.85, n) * width, rng.uniform(0.2, 0.8, n) * height
    ax, ay = rng.uniform(0.1, 1, (2, n)) * reach * np.array([[width], [height]])
    phase = rng.uniform(0, 2 * np.pi, n)
    turns = rng.choice([-1, 1], n)  # some go round one way, some the other
    out = []
    for t in range(PERIOD):
        angle = phase + turns * 2 * np.pi * t / PERIOD
        x, y = cx + ax * np.cos(angle), cy + ay * np.sin(angle)
        jitter = rng.normal(0, 1.0, (n, 4))
        box = np.stack([x - w / 2, y - h / 2, x + w / 2, y + h / 2], axis=1) + jitter
        out.append(np.clip(box, 0, [width, height, width, height]).astype(np.float32))
    return out


def detections(
    boxes: Sequence[np.ndarray[Any, np.dtype[np.float32]]],
    confidence: tuple[float, float],
    seed: int,
    tracks: bool = False,
) -> list[Detections]:
    """Detections of the boxes of each frame: a class per object (LABELS, with names), a
    confidence per object and frame in `confidence`; ids 1..n when `tracks`."""
    rng = np.random.default_rng(seed)
    n = len(boxes[0])
    classes = rng.integers(0, len(LABELS), n)
    out = []
    for xyxy in boxes:
        dets = Detections.from_arrays(xyxy, rng.uniform(*confidence, n), classes, LABELS)
        if tracks:
            ids = np.arange(1, n + 1, dtype=np.int64)
            dets = Detections(dets.xyxy, dets.confidence, dets.class_id, dets.class_name, ids)
        out.append(dets)
    return out


class Given(BlockType):
    """What the block under test reads in its workflow (the bench calls the block's step
    with its own values): hands its input on."""

    type_name = "given"
    inputs = {"image": ("image", "frame")}
    outputs = {"value": "any"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        return stateless(passthrough)


def passthrough(value: Any) -> Any:
    return value


REGISTRY = BlockRegistry({**BUILTIN_BLOCKS, "given": f"{__name__}:Given"})


def compiled_block(
    block: Mapping[str, Any], models: Mapping[str, ModelHandle] | None = None
) -> StepFactory:
    """The step factory of `block` (its type, parameters, inputs naming `given`) compiled
    in the workflow given -> block; each call makes one stream's step, the callable the
    executor calls per frame with the block's inputs in declared order (and the Frame
    last when the block wants one)."""
    doc = {
        "name": "bench",
        "blocks": [{"id": "given", "type": "given"}, {"id": "measured", **block}],
        "outputs": {"out": "measured"},
    }
    compiled = compile_workflow(doc, BuildContext(models=models or {}), REGISTRY)
    return compiled.steps[compiled.block_ids.index("measured")].factory
