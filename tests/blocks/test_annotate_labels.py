"""annotate: where the names of zones go on a real video frame (issue 30, item 8e): at
the zone, inside the frame, never under the counts box. A name's pixels are what changes
between the frame drawn with the named zone and with the same zone unnamed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
import pytest

from pipelines.blocks._draw import PALETTE, label_size, text_lines_rect
from pipelines.blocks.annotate import COUNTS_ORIGIN, AnnotateBlock, AnnotateParams
from pipelines.blocks.base import BuildContext
from pipelines.types import Image
from tests.support.appliance import DEMO_CLIP

SCALE = 0.5  # annotate's default font_scale
COUNTS = {"entrance": {"in": 12, "out": 3}, "total": 15}
NAME = "entrance"


@pytest.fixture(scope="module")
def frame() -> Image:
    """The demo clip's first frame (960x540 BGR)."""
    clip = cv2.VideoCapture(str(DEMO_CLIP))
    ok, image = clip.read()
    clip.release()
    assert ok
    return np.ascontiguousarray(image)


def drawn(
    image: Image, name: str, points: Sequence[Sequence[float]], counts: Any = COUNTS
) -> Image:
    params = AnnotateParams.model_validate({"zones": [{"name": name, "points": points}]})
    out: Image = AnnotateBlock.build(params, BuildContext(models={}))()(image, None, counts, None)
    return out


def name_pixels(
    image: Image, points: Sequence[Sequence[float]], counts: Any = COUNTS
) -> np.ndarray:
    """(y, x) of every pixel the zone's name changed."""
    named, unnamed = drawn(image, NAME, points, counts), drawn(image, "", points, counts)
    return np.argwhere(np.any(named != unnamed, axis=2))


def label_area() -> int:
    w, h = label_size(NAME, SCALE)
    return w * h


def test_a_zone_at_the_corner_is_named_below_the_counts_box(frame: Image) -> None:
    """The issue's case: a zone from (0, 0), whose name hid under the counts box."""
    zone = [[0.0, 0.0], [0.5, 0.0], [0.5, 0.6], [0.0, 0.6]]  # normalised: 480 x 324 px
    ys, xs = name_pixels(frame, zone).T
    box = text_lines_rect(["entrance: in 12, out 3", "total: 15"], COUNTS_ORIGIN, SCALE)
    assert box is not None and box[:2] == COUNTS_ORIGIN
    y2 = box[3]
    assert ys.min() >= y2 and xs.max() < 480 and ys.max() < 324  # below it, in the zone
    # All of it shows: the name's tab is as large as drawn, none of it covered (its own
    # zone's colour where it meets the outline is the only part that may not change).
    assert len(ys) >= 0.9 * label_area()
    colours = {tuple(c) for c in drawn(frame, NAME, zone)[ys, xs].tolist()}
    assert PALETTE[-1] in colours  # the tab in the zone's colour


def test_a_zone_is_named_at_its_own_top_left(frame: Image) -> None:
    zone = [[700, 400], [900, 300], [940, 500], [650, 520]]  # px; first point not the top
    ys, xs = name_pixels(frame, zone).T
    assert ys.min() >= 300 and xs.min() >= 650  # inside the zone's bounding box, at its top
    assert ys.min() < 300 + 10 and xs.min() < 650 + 10
    assert len(ys) >= 0.9 * label_area()


def test_a_name_that_would_leave_the_frame_is_kept_inside(frame: Image) -> None:
    zone = [[930, 525], [959, 525], [959, 539], [930, 539]]  # a sliver at the corner
    ys, xs = name_pixels(frame, zone, counts=None).T
    w, h = label_size(NAME, SCALE)
    # All of it, shifted left and up to fit: its tab starts its own size from the frame's
    # edges and reaches them (the zone's outline, in the tab's colour, may hide the last).
    assert (xs.min(), ys.min()) == (960 - w, 540 - h)
    assert xs.max() >= 960 - 3 and ys.max() >= 540 - 3
