"""`line_counter`: known paths with known crossings, and a real H.264 clip end to end."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines.blocks.base import BuildContext, StepFn
from pipelines.blocks.line_counter import LineCounterBlock, LineCounterParams
from pipelines.types import Detections
from tests.blocks.tracking_clips import (
    blank,
    dets,
    doc_example,
    frame,
    instantiate,
    render,
    run_clip,
    write_h264,
)

IMAGE = blank(160, 120)
LINE = [[20, 60], [140, 60]]  # horizontal, drawn left to right: moving down is "in"
Point = tuple[float, float]


def counter(**params: Any) -> StepFn:
    p = LineCounterParams.model_validate({"line": LINE, "anchor": "bottom_center", **params})
    return LineCounterBlock.build(p, BuildContext(models={}))()


def feet(*points: Point, ids: Sequence[int] = ()) -> Detections:
    """Tracks whose bottom-centre anchors are `points` (20×30 px boxes)."""
    boxes = [(x - 10, y - 30, x + 10, y) for x, y in points]
    return dets(*boxes, ids=ids or range(1, len(points) + 1))


def walk(ys: Sequence[float], x: float = 80) -> list[Detections]:
    return [feet((x, y)) for y in ys]


def run(step: StepFn, frames: Sequence[Detections]) -> list[dict[str, int]]:
    return [step(d, frame(IMAGE, i)) for i, d in enumerate(frames)]


def steps(start: float, stop: float, by: float = 5) -> list[float]:
    """start, start ± by, ..., stop (inclusive), towards stop."""
    n = round(abs(stop - start) / by)
    return [float(v) for v in np.linspace(start, stop, n + 1)]


def test_counts_every_crossing_by_direction() -> None:
    ys = steps(30, 90) + steps(85, 30) + steps(35, 90)  # down, up, down
    out = run(counter(), walk(ys))
    assert out[-1] == {"in": 2, "out": 1, "total": 3}
    # min_frames_on_side=2: the first down-crossing counts on the 2nd frame past 60 + 2 px.
    first = next(i for i, c in enumerate(out) if c["total"])
    assert ys[first - 2 : first + 1] == [60.0, 65.0, 70.0]


def test_jitter_across_the_line_does_not_double_count() -> None:
    ys = [40.0, 50.0] + [56.0, 64.0] * 6 + [70.0, 80.0]  # flicker ±4 px, then go down
    assert run(counter(), walk(ys))[-1] == {"in": 1, "out": 0, "total": 1}
    # Control: without the debounce, every flicker is a crossing.
    naive = run(counter(min_frames_on_side=1, margin_px=0), walk(ys))[-1]
    assert naive == {"in": 6, "out": 5, "total": 11}


def test_jitter_inside_the_margin_changes_nothing() -> None:
    ys = [40.0, 58.5, 61.5, 58.5, 61.5, 60.0, 61.0, 40.0]
    assert run(counter(min_frames_on_side=1, margin_px=2), walk(ys))[-1]["total"] == 0
    assert run(counter(min_frames_on_side=1, margin_px=1), walk(ys))[-1]["total"] == 4


def test_going_around_the_end_of_the_line_does_not_count() -> None:
    around = walk(steps(30, 90), x=150)  # past the end at x=140
    back = [feet((x, 90.0)) for x in steps(145, 80)]
    up = walk(steps(85, 30))  # then up through the segment
    assert run(counter(), around + back + up)[-1] == {"in": 0, "out": 1, "total": 1}


def test_swapping_the_points_swaps_in_and_out() -> None:
    down = walk(steps(30, 90))
    assert run(counter(), down)[-1] == {"in": 1, "out": 0, "total": 1}
    assert run(counter(line=LINE[::-1]), down)[-1] == {"in": 0, "out": 1, "total": 1}


def test_normalised_and_pixel_lines_count_the_same() -> None:
    ys = steps(30, 90) + steps(85, 30)
    norm = [[20 / 160, 0.5], [140 / 160, 0.5]]
    assert run(counter(line=norm), walk(ys)) == run(counter(units="px"), walk(ys))
    assert run(counter(line=norm, units="norm"), walk(ys))[-1]["total"] == 2


def test_tracks_are_counted_independently_in_one_frame() -> None:
    xs = [30.0, 50.0, 70.0, 90.0, 110.0]
    above = feet(*[(x, 40.0) for x in xs])
    below = feet(*[(x, 80.0) for x in xs])
    late = feet(*[(x, 80.0) for x in xs], ids=[6, 7, 8, 9, 10])  # first seen below
    out = run(counter(), [above, above, below, below, late, late])
    assert out[-1] == {"in": 5, "out": 0, "total": 5}


def test_state_of_long_unseen_ids_is_forgotten() -> None:
    gap = [Detections.empty()] * 10
    path = walk([40.0]) + gap + walk([80.0, 85.0])
    assert run(counter(), path)[-1]["total"] == 1  # consecutive observations, 10 apart
    assert run(counter(forget_after_frames=5), path)[-1]["total"] == 0


def test_returns_a_new_dict_every_frame() -> None:
    step = counter()
    a = step(feet((80, 40)), frame(IMAGE, 0))
    b = step(feet((80, 40)), frame(IMAGE, 1))
    assert a == b and a is not b


def test_a_segment_needs_exactly_two_points() -> None:
    with pytest.raises(ValueError, match="line"):
        LineCounterParams.model_validate({"line": [[0, 0], [1, 1], [2, 2]]})


def test_real_h264_clip_through_the_compiler(tmp_path: Path) -> None:
    # A 16×16 white square sweeps right, left, right across a vertical line at x=80; a
    # second square sits still left of the line. p1→p2 points down the image, so its
    # right-hand side (as seen on screen) is x < 80: moving right is "out".
    xs = steps(30, 130) + steps(125, 30) + steps(35, 130)
    images = [render([(x - 8, 52, x + 8, 68), (10, 90, 26, 106)]) for x in xs]
    clip = write_h264(tmp_path / "sweep.mp4", images)
    doc = {
        "name": "door",
        "blocks": [
            {"id": "blobs", "type": "contours"},
            {"id": "tracks", "type": "track", "detections": "blobs"},
            {
                "id": "door",
                "type": "line_counter",
                "tracks": "tracks",
                "line": [[80, 10], [80, 110]],
                "units": "px",
                "anchor": "center",
            },
        ],
        "outputs": {"counts": "door"},
    }
    counts = run_clip(clip, doc, "counts")
    assert len(counts) == len(xs) == 61
    assert counts[20] == {"in": 0, "out": 1, "total": 1}  # x=130: the first sweep is done
    assert counts[40] == {"in": 1, "out": 1, "total": 2}
    assert counts[-1] == {"in": 1, "out": 2, "total": 3}


def test_the_documented_example_compiles_and_runs() -> None:
    # The documented line runs left to right at y = 0.6 × 120 = 72 px: walking down is in.
    run = instantiate(doc_example("line_counter"))
    feet_y = [50, 58, 66, 74, 82, 90]
    images = [render([(70, y - 30, 90, y)]) for y in feet_y]
    out = [run.run(frame(img, f)).outputs["door"] for f, img in enumerate(images)]
    assert out[-1] == {"in": 1, "out": 0, "total": 1}
