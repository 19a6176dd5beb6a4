"""`zone_counter`: enter/exit counts on known paths, and a real H.264 clip end to end."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.blocks.base import BuildContext, StepFn
from pipelines.blocks.zone_counter import ZoneCounterBlock, ZoneCounterParams
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
ZONE = [[40, 30], [120, 30], [120, 90], [40, 90]]  # px
Point = tuple[float, float]
ODD = st.integers(0, 79).map(lambda k: 2 * k + 1)  # px; never on the zone's even edges


def counter(**params: Any) -> StepFn:
    p = ZoneCounterParams.model_validate({"zone": ZONE, "anchor": "center", **params})
    return ZoneCounterBlock.build(p, BuildContext(models={}))()


def at(*points: Point, ids: Sequence[int] = ()) -> Detections:
    """Tracks centred on `points` (10×10 px boxes), ids 1.. unless given."""
    boxes = [(x - 5, y - 5, x + 5, y + 5) for x, y in points]
    return dets(*boxes, ids=ids or range(1, len(points) + 1))


def run(step: StepFn, frames: Sequence[Detections]) -> list[dict[str, int]]:
    return [step(d, frame(IMAGE, i)) for i, d in enumerate(frames)]


def counts(inside: int, entered: int, exited: int) -> dict[str, int]:
    return {"inside": inside, "entered": entered, "exited": exited}


def test_a_track_passing_through_enters_then_exits() -> None:
    xs = [10.0, 20, 30, 50, 60, 80, 100, 110, 130, 140, 150]  # zone spans x 40..120
    out = run(counter(), [at((x, 60)) for x in xs])
    # min_frames=2: entry registers on the 2nd frame inside (x=60), exit at x=140.
    assert out[3] == counts(0, 0, 0) and out[4] == counts(1, 1, 0)
    assert out[8] == counts(1, 1, 0) and out[9] == counts(0, 1, 1)
    assert out[-1] == counts(0, 1, 1)


def test_a_track_first_seen_inside_has_entered() -> None:
    assert run(counter(), [at((80, 60))]) == [counts(1, 1, 0)]


def test_a_track_lost_inside_exits_after_lost_after_frames() -> None:
    seen = [at((80, 60))] * 3
    gone = [Detections.empty()] * 6
    out = run(counter(lost_after_frames=4), seen + gone)
    assert [c["inside"] for c in out] == [1, 1, 1, 1, 1, 1, 1, 0, 0]
    assert out[-1] == counts(0, 1, 1)
    # Back within lost_after_frames: still the same visit, nothing counted twice.
    back = run(counter(lost_after_frames=10), seen + gone + seen)
    assert back[-1] == counts(1, 1, 0)


def test_jitter_on_the_edge_does_not_double_count() -> None:
    xs = [20.0, 30] + [38, 42] * 5 + [60, 80]  # the edge is x=40
    assert run(counter(), [at((x, 60)) for x in xs])[-1] == counts(1, 1, 0)
    naive = run(counter(min_frames=1), [at((x, 60)) for x in xs])[-1]
    assert naive == counts(1, 5, 4)


def test_normalised_and_pixel_zones_agree() -> None:
    norm = [[x / 160, y / 120] for x, y in ZONE]
    path = [at((x, 60), (80, y)) for x, y in zip(range(0, 160, 8), range(0, 120, 6), strict=True)]
    assert run(counter(zone=norm), path) == run(counter(units="px"), path)
    assert run(counter(zone=norm), path)[-1]["entered"] == 2


def test_bottom_center_anchor_uses_the_feet() -> None:
    # A 10 px box centred at y=26: its centre is above the top edge (y=30), its feet
    # (y=31) are inside.
    assert counter(anchor="bottom_center")(at((80, 26)), frame(IMAGE))["inside"] == 1
    assert counter()(at((80, 26)), frame(IMAGE))["inside"] == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.integers(1, 4), ODD.map(lambda k: min(k, 159)), ODD.map(lambda k: min(k, 119))
            ),
            max_size=4,
        ),
        min_size=1,
        max_size=25,
    )
)
def test_inside_equals_entered_minus_exited_and_the_latest_truth(
    frames: list[list[tuple[int, int, int]]],
) -> None:
    step = counter(min_frames=1, lost_after_frames=1000)
    latest: dict[int, bool] = {}  # without debounce or loss: each id's last observation
    for seq, rows in enumerate(frames):
        unique = {i: (x, y) for i, x, y in rows}
        tracks = at(*unique.values(), ids=list(unique)) if unique else Detections.empty()
        out = step(tracks, frame(IMAGE, seq))
        latest.update({i: 40 < x < 120 and 30 < y < 90 for i, (x, y) in unique.items()})
        assert out["inside"] == out["entered"] - out["exited"]
        assert out["inside"] == sum(latest.values())


def test_real_h264_clip_through_the_compiler(tmp_path: Path) -> None:
    # Square A crosses the zone (x 60..100) left to right; square B walks in and stays.
    a = [4.0 + 6 * f for f in range(25)]  # centre x; inside for frames 10..15
    b = [min(10.0 + 3 * f, 80.0) for f in range(25)]  # inside from frame 17
    boxes = [[(x - 8, 20, x + 8, 36), (x2 - 8, 80, x2 + 8, 96)] for x, x2 in zip(a, b, strict=True)]
    images = [render(pair) for pair in boxes]
    clip = write_h264(tmp_path / "zone.mp4", images)
    doc = {
        "name": "zone",
        "blocks": [
            {"id": "blobs", "type": "contours"},
            {"id": "tracks", "type": "track", "detections": "blobs"},
            {
                "id": "zone",
                "type": "zone_counter",
                "tracks": "tracks",
                "zone": [[60 / 160, 0], [100 / 160, 0], [100 / 160, 1], [60 / 160, 1]],
                "anchor": "center",
            },
        ],
        "outputs": {"counts": "zone"},
    }
    out = run_clip(clip, doc, "counts")
    assert len(out) == 25
    # min_frames=2: each change registers on the second frame past the edge.
    assert out[10] == counts(0, 0, 0)
    assert out[11] == counts(1, 1, 0)
    assert out[16] == counts(1, 1, 0) and out[17] == counts(0, 1, 1)
    assert out[18] == counts(1, 2, 1)
    assert out[-1] == counts(1, 2, 1)


def test_the_documented_example_compiles_and_runs() -> None:
    # The documented zone is x 0.55..0.95, y 0.45..0.98 of the frame: 88..152, 54..117.6.
    run = instantiate(doc_example("zone_counter"))
    xs = range(60, 125, 8)  # px; slow enough for the tracker (IoU between frames)
    out = [run.run(frame(render([(x - 10, 60, x + 10, 100)]), f)) for f, x in enumerate(xs)]
    assert out[-1].outputs["queue"] == counts(1, 1, 0)
