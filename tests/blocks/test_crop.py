"""crop: padded, squared, clipped boxes cut out of real and synthetic frames."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import pytest
from pydantic import ValidationError

from pipelines.blocks.base import BuildContext
from pipelines.blocks.crop import CropBlock, CropParams
from pipelines.compiler import compile_workflow
from pipelines.registry import BUILTIN_BLOCKS, BlockRegistry
from pipelines.types import Crops, Detections, Image
from tests.blocks.tracking_clips import doc_example, frame, render
from tests.decoders.ort_runner import photo

CTX = BuildContext(models={})
# The documented examples run with `detect` replaced by a contour finder (no model).
DOC_REGISTRY = BlockRegistry(
    {**BUILTIN_BLOCKS, "contours": "tests.blocks.tracking_clips:ContoursBlock"}
)


def crop(image: Image, dets: Detections, **params: Any) -> Crops:
    step = CropBlock.build(CropParams.model_validate(params), CTX)()
    result: Crops = step(image, dets)
    return result


def boxes(*xyxy: tuple[float, ...], conf: tuple[float, ...] = ()) -> Detections:
    n = len(xyxy)
    return Detections.from_arrays(xyxy, conf or [0.9] * n, [0] * n, labels=["thing"])


@pytest.fixture(scope="module")
def gradient() -> Image:
    """960x540: every pixel distinct in (B, G) = (x mod 256, y mod 256), R = x // 256."""
    y, x = np.mgrid[0:540, 0:960]
    return np.dstack([x % 256, y % 256, x // 256]).astype(np.uint8)


def test_crops_are_views_of_the_exact_regions(gradient: Image) -> None:
    out = crop(gradient, boxes((100, 50, 200, 150), (300.2, 20.7, 340.5, 60.1)))
    assert len(out) == 2
    np.testing.assert_array_equal(out.images[0], gradient[50:150, 100:200])
    # Fractional edges round outwards: no partly covered pixel is lost.
    np.testing.assert_array_equal(out.images[1], gradient[20:61, 300:341])
    assert out.detections.xyxy.tolist() == [[100, 50, 200, 150], [300, 20, 341, 61]]
    assert all(np.shares_memory(im, gradient) for im in out.images)  # no copies
    assert out.detections.class_name == ("thing", "thing")


def test_padding_is_a_fraction_of_the_box_plus_pixels(gradient: Image) -> None:
    dets = boxes((100, 100, 200, 150))  # 100 x 50
    assert crop(gradient, dets, padding=0.1).detections.xyxy.tolist() == [[90, 95, 210, 155]]
    padded = crop(gradient, dets, padding=0.1, padding_px=8)
    assert padded.detections.xyxy.tolist() == [[82, 87, 218, 163]]
    np.testing.assert_array_equal(padded.images[0], gradient[87:163, 82:218])


def test_boxes_are_clipped_to_the_frame(gradient: Image) -> None:
    out = crop(gradient, boxes((-20, -10, 50, 40), (900, 500, 1000, 600)), padding_px=4)
    assert out.detections.xyxy.tolist() == [[0, 0, 54, 44], [896, 496, 960, 540]]
    assert [im.shape[:2] for im in out.images] == [(44, 54), (44, 64)]


def test_square_grows_the_short_side_and_moves_into_the_frame(gradient: Image) -> None:
    out = crop(gradient, boxes((100, 100, 200, 150), (0, 0, 100, 20)), square=True)
    # Centred; at the top edge the square slides down instead of being cut.
    assert out.detections.xyxy.tolist() == [[100, 75, 200, 175], [0, 0, 100, 100]]
    assert all(im.shape[:2] == (100, 100) for im in out.images)


def test_small_and_outside_boxes_are_skipped(gradient: Image) -> None:
    dets = boxes((10, 10, 15, 40), (100, 100, 140, 140), (2000, 10, 2100, 50))
    out = crop(gradient, dets, min_size=16)
    assert out.detections.xyxy.tolist() == [[100, 100, 140, 140]]
    # Even without min_size, a box wholly outside the frame gives no (empty) crop.
    assert len(crop(gradient, dets)) == 2


def test_max_crops_keeps_the_most_confident_in_order(gradient: Image) -> None:
    dets = boxes((0, 0, 10, 10), (20, 0, 30, 10), (40, 0, 50, 10), conf=(0.5, 0.2, 0.9))
    out = crop(gradient, dets, max_crops=2)
    assert out.detections.xyxy[:, 0].tolist() == [0, 40]
    assert out.detections.confidence.tolist() == pytest.approx([0.5, 0.9])


def test_tracks_keep_their_ids(gradient: Image) -> None:
    dets = Detections(
        xyxy=np.array([[5, 5, 50, 50], [60, 5, 90, 50]], np.float32),
        confidence=np.array([0.5, 0.6], np.float32),
        class_id=np.array([1, 2]),
        tracker_id=np.array([7, 9]),
    )
    out = crop(gradient, dets, max_crops=1)
    assert out.detections.tracker_id is not None
    assert out.detections.tracker_id.tolist() == [9]


def test_no_detections_give_no_crops(gradient: Image) -> None:
    out = crop(gradient, Detections.empty(), padding=0.5)
    assert len(out) == 0 and len(out.detections) == 0


def test_real_photo_crop_is_the_face_region() -> None:
    image = photo("astronaut")  # 512x512
    out = crop(image, boxes((160, 40, 300, 200)), padding=0.25, square=True)
    (x1, y1, x2, y2) = out.detections.xyxy[0].astype(int).tolist()
    assert (x2 - x1, y2 - y1) == (240, 240)  # 160 tall + 2 x 25 % = 240, squared
    np.testing.assert_array_equal(out.images[0], image[y1:y2, x1:x2])
    small = cv2.resize(out.images[0], (24, 24))
    assert small.std() > 20  # real texture, not a blank region


@pytest.mark.parametrize("bad", [{"padding": -0.1}, {"min_size": 0}, {"max_crops": 0}])
def test_invalid_parameters_are_rejected(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CropParams.model_validate(bad)


def test_the_documented_example_compiles_and_runs() -> None:
    run = compile_workflow(doc_example("crop"), CTX, DOC_REGISTRY).instantiate()
    image = render([(20, 30, 60, 70), (100, 40, 110, 50)])  # 40 px square and 10 px
    out: Crops = run.run(frame(image)).outputs["faces"]
    # 10 % padding each side, square; the 10 px box (12 px padded) is under min_size 24.
    assert out.detections.xyxy.tolist() == [[16, 26, 64, 74]]
    assert out.images[0].shape == (48, 48, 3)
