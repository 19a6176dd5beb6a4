"""`filter`: each criterion on boxes with known sizes, classes, scores and positions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pipelines.blocks.base import BuildContext, StepFn
from pipelines.blocks.filter import FilterBlock, FilterParams
from pipelines.errors import WorkflowError
from pipelines.types import Detections
from tests.blocks.tracking_clips import blank, dets, doc_example, frame, instantiate, render

IMAGE = blank(160, 120)
# Five boxes: (x1, y1, x2, y2), class, score. Sizes 10×10, 20×10, 10×40, 40×40, 60×20.
ROWS = [
    ((0, 0, 10, 10), 0, 0.30),
    ((50, 50, 70, 60), 1, 0.60),
    ((100, 10, 110, 50), 2, 0.90),
    ((60, 70, 100, 110), 1, 0.95),
    ((90, 95, 150, 115), 0, 0.45),
]
LABELS = ("person", "car", "dog")


def boxes() -> Detections:
    return Detections.from_arrays(
        [r[0] for r in ROWS], [r[2] for r in ROWS], [r[1] for r in ROWS], LABELS
    )


def keep(**params: Any) -> StepFn:
    return FilterBlock.build(FilterParams.model_validate(params), BuildContext(models={}))()


def kept(step: StepFn, d: Detections | None = None, image: Any = IMAGE) -> list[int]:
    """Indices (into ROWS) of the boxes the filter keeps, found by their left edge."""
    out = step(boxes() if d is None else d, frame(image))
    lefts = [r[0][0] for r in ROWS]
    return [lefts.index(int(x)) for x in out.xyxy[:, 0]]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"classes": ["car"]}, [1, 3]),
        ({"classes": [2]}, [2]),
        ({"classes": ["person", 2]}, [0, 2, 4]),
        ({"min_confidence": 0.6}, [1, 2, 3]),
        ({"min_area": 400}, [2, 3, 4]),  # px²: 10×40=400 is kept (bounds are inclusive)
        ({"max_area": 200}, [0, 1]),
        ({"min_width": 20, "max_width": 40}, [1, 3]),
        ({"min_height": 20}, [2, 3, 4]),
        ({"max_height": 10}, [0, 1]),
        ({"classes": ["car"], "min_area": 1000}, [3]),  # every criterion must pass
        ({}, [0, 1, 2, 3, 4]),
    ],
)
def test_each_criterion(params: dict[str, Any], expected: list[int]) -> None:
    assert kept(keep(**params)) == expected


def test_zone_anchor_center_or_feet() -> None:
    zone = [[0, 57], [160, 57], [160, 120], [0, 120]]  # the lower part of the frame, px
    # Box 2 (y 10..50) is wholly above; box 1 (y 50..60) has its centre (y=55) above the
    # edge and its feet (y=60) below; boxes 3 and 4 are inside either way.
    assert kept(keep(zone=zone, zone_anchor="center")) == [3, 4]
    assert kept(keep(zone=zone)) == [1, 3, 4]  # bottom_center by default


def test_normalised_and_pixel_zones_give_the_same_result() -> None:
    px = [[30, 40], [130, 40], [130, 100], [30, 100]]
    norm = [[x / 160, y / 120] for x, y in px]
    # Feet: box 1 (60, 60) and box 2 (105, 50) are inside; 0, 3 and 4 are not.
    assert kept(keep(zone=norm)) == kept(keep(zone=px, units="px")) == [1, 2]
    # Normalised points follow the frame size: on 320×240 the zone is (60..260, 80..200).
    assert kept(keep(zone=norm), image=blank(320, 240)) == [3, 4]
    assert kept(keep(zone=px, units="px"), image=blank(320, 240)) == [1, 2]


def test_tracks_keep_their_ids_and_empty_input_passes() -> None:
    d = boxes()
    tracks = Detections(d.xyxy, d.confidence, d.class_id, d.class_name, np.arange(1, 6))
    out = keep(classes=["car"])(tracks, frame(IMAGE))
    assert out.tracker_id is not None and out.tracker_id.tolist() == [2, 4]
    empty = Detections.empty()
    assert keep(min_area=1)(empty, frame(IMAGE)) is empty


def test_nothing_removed_returns_the_input_itself() -> None:
    d = boxes()
    assert keep(min_confidence=0.1)(d, frame(IMAGE)) is d


def test_names_do_not_match_when_the_model_has_no_labels() -> None:
    d = dets((0, 0, 10, 10))  # class 0 named "object"
    unnamed = Detections(d.xyxy, d.confidence, d.class_id)
    assert len(keep(classes=["object"])(d, frame(IMAGE))) == 1
    assert len(keep(classes=["object"])(unnamed, frame(IMAGE))) == 0
    assert len(keep(classes=[0])(unnamed, frame(IMAGE))) == 1


def test_inverted_bounds_are_rejected_with_both_values() -> None:
    with pytest.raises(ValueError, match=r"min_area \(500.0\) exceeds max_area \(100.0\)"):
        FilterParams(min_area=500, max_area=100)


def test_through_the_compiler_on_a_rendered_frame() -> None:
    doc: dict[str, Any] = {
        "blocks": [
            {"id": "blobs", "type": "contours"},
            {"id": "big", "type": "filter", "detections": "blobs", "min_area": 300},
        ],
        "outputs": {"big": "big"},
    }
    image = render([(10, 10, 20, 20), (60, 60, 90, 80)])  # 100 px² and 600 px²
    out = instantiate(doc).run(frame(image)).outputs["big"]
    assert out.xyxy.tolist() == [[60, 60, 90, 80]]
    with pytest.raises(WorkflowError, match="min_area"):
        instantiate({**doc, "blocks": [doc["blocks"][0], {**doc["blocks"][1], "min_area": -1}]})


def test_the_documented_example_compiles_and_runs() -> None:
    doc = doc_example("filter")
    run = instantiate(doc)
    tall_low = render([(20, 60, 40, 110)])  # 50 px tall, feet inside the zone
    assert len(run.run(frame(tall_low)).outputs["people"]) == 0  # class "object" ≠ person
    doc["blocks"][1]["classes"] = ["object"]
    kept = instantiate(doc).run(frame(tall_low)).outputs["people"]
    assert kept.xyxy.tolist() == [[20, 60, 40, 110]]
