"""annotate: boxes, labels, lines, zones, counts and OCR text drawn on a copy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pipelines.blocks._draw import PALETTE, WHITE, bgr
from pipelines.blocks.annotate import AnnotateBlock, AnnotateParams
from pipelines.blocks.base import BuildContext
from pipelines.compiler import compile_workflow
from pipelines.registry import BUILTIN_BLOCKS, BlockRegistry
from pipelines.types import Detections, Frame, Image, Texts
from tests.blocks.tracking_clips import blank, doc_example, render
from tests.decoders.ort_runner import photo

CTX = BuildContext(models={})
GREY = 90
BOX = (100, 100, 300, 250)  # x1, y1, x2, y2 px
# The documented examples run with `detect` replaced by a contour finder (no model).
DOC_REGISTRY = BlockRegistry(
    {**BUILTIN_BLOCKS, "contours": "tests.blocks.tracking_clips:ContoursBlock"}
)


def annotate(
    image: Image,
    detections: Detections | None = None,
    counts: Any = None,
    text: Texts | None = None,
    **params: Any,
) -> Image:
    step = AnnotateBlock.build(AnnotateParams.model_validate(params), CTX)()
    result: Image = step(image, detections, counts, text)
    return result


def dets(
    class_id: int = 2, tracker_id: int | None = None, box: tuple[int, ...] = BOX
) -> Detections:
    d = Detections.from_arrays([box], [0.87], [class_id], labels=["a", "b", "person"])
    if tracker_id is None:
        return d
    return Detections(d.xyxy, d.confidence, d.class_id, d.class_name, np.array([tracker_id]))


@pytest.fixture
def grey() -> Image:
    return np.full((540, 960, 3), GREY, np.uint8)


def edge_colours(out: Image, box: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The pixel in the middle of the left, right and bottom edges of `box`."""
    x1, y1, x2, y2 = box
    ym, xm = (y1 + y2) // 2, (x1 + x2) // 2
    return [tuple(out[ym, x1]), tuple(out[ym, x2]), tuple(out[y2, xm])]


def test_box_edges_in_the_class_colour_and_input_unchanged(grey: Image) -> None:
    out = annotate(grey, dets(class_id=2))
    assert out is not grey and np.all(grey == GREY)  # never drawn on the input
    assert edge_colours(out, BOX) == [PALETTE[2]] * 3
    assert PALETTE[2] == bgr("#E15759")  # Tableau red, in BGR
    x1, y1, x2, y2 = BOX
    assert np.all(out[y1 + 5 : y2 - 5, x1 + 5 : x2 - 5] == GREY)  # inside untouched


def test_label_tab_sits_on_the_top_edge(grey: Image) -> None:
    x1, y1 = BOX[:2]
    out = annotate(grey, dets(), labels=["class", "confidence"], font_scale=0.5)
    tab = out[y1 - 14 : y1 - 2, x1 : x1 + 60].reshape(-1, 3)
    colours = {tuple(c) for c in tab.tolist()}
    assert tuple(PALETTE[2]) in colours  # the tab's fill
    assert tuple(WHITE) in colours  # text, in the contrasting colour
    bare = annotate(grey, dets(), labels=[])
    assert np.all(bare[y1 - 14 : y1 - 2, x1 : x1 + 60] == GREY)


def test_tracks_are_coloured_by_track_id(grey: Image) -> None:
    tracked = dets(class_id=2, tracker_id=13)
    assert edge_colours(annotate(grey, tracked), BOX) == [PALETTE[13 % 10]] * 3
    by_class = annotate(grey, tracked, color_by="class")
    assert edge_colours(by_class, BOX) == [PALETTE[2]] * 3


def test_lines_and_zones_in_pixels_or_normalised(grey: Image) -> None:
    out = annotate(
        grey,
        lines=[{"name": "door", "points": [[0.1, 0.5], [0.9, 0.5]]}],  # normalised
        zones=[{"name": "till", "points": [[500, 50], [700, 50], [700, 200], [500, 200]]}],
    )
    assert tuple(out[270, 480]) == PALETTE[-1]  # y = 0.5 x 540, x = 0.5 x 960
    assert tuple(out[125, 500]) == PALETTE[-2]  # the zone's left edge
    assert tuple(out[125, 700]) == PALETTE[-2]  # right edge: the polygon is closed
    assert np.all(out[100:180, 520:680] == GREY)  # inside the zone untouched
    assert tuple(PALETTE[-1]) in {tuple(c) for c in out[250:268, 96:140].reshape(-1, 3).tolist()}


def test_counts_are_written_top_left(grey: Image) -> None:
    corner = (slice(0, 60), slice(0, 200))
    assert np.all(annotate(grey)[corner] == GREY)
    out = annotate(grey, counts={"in": 3, "out": 1, "total": 4})
    colours = {tuple(c) for c in out[corner].reshape(-1, 3).tolist()}
    assert {(0, 0, 0), (255, 255, 255)} <= colours  # white text on black tabs
    assert np.all(out[100:, 300:] == GREY)  # nothing else drawn


def test_ocr_text_regions_in_white(grey: Image) -> None:
    region = (400, 300, 600, 350)
    texts = Texts(("AB12",), np.array([0.9], np.float32), dets(box=region))
    out = annotate(grey, text=texts)
    assert edge_colours(out, region) == [WHITE] * 3


def test_real_photo(grey: Image) -> None:
    image = photo("astronaut")
    before = image.copy()
    face = (180, 60, 290, 190)
    out = annotate(image, dets(class_id=0, box=face), thickness=3)
    np.testing.assert_array_equal(image, before)
    assert edge_colours(out, face) == [PALETTE[0]] * 3


def test_compiles_with_every_optional_input_left_out(grey: Image) -> None:
    workflow = compile_workflow(
        {
            "blocks": [
                {"id": "drawn", "type": "annotate", "lines": [{"points": [[0, 10], [959, 10]]}]}
            ],
            "outputs": {"video": "drawn"},
        },
        CTX,
    )
    frame = Frame("cam", 0, None, 0.0, 0.0, grey)
    result = workflow.instantiate().run(frame)
    assert tuple(result.drawn()[10, 480]) == PALETTE[-1]
    assert np.all(grey == GREY)


def test_the_documented_example_compiles_and_runs() -> None:
    run = compile_workflow(doc_example("annotate"), CTX, DOC_REGISTRY).instantiate()
    image = render([(100, 20, 130, 50)], width=320, height=240)
    video = run.run(Frame("cam", 0, None, 0.0, 0.0, image)).drawn()
    assert np.array_equal(image, render([(100, 20, 130, 50)], width=320, height=240))
    assert tuple(video[144, 200]) == PALETTE[-1]  # the door line at 0.6 x 240 px
    assert tuple(video[150, 100]) == PALETTE[-2]  # the till zone's left edge (px)
    corner = {tuple(c) for c in video[0:40, 0:60].reshape(-1, 3).tolist()}
    assert {(0, 0, 0), (255, 255, 255)} <= corner  # the door's counts
    assert np.array_equal(video[200:, 0:90], blank(320, 240)[200:, 0:90])
