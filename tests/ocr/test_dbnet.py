"""The `dbnet` decoder on the bundled PP-OCRv4 detector, behind the real batcher, plus
exact synthetic probability maps.

Measured once (onnxruntime CPU): on the 960x540 overlay frame the caption's box is
[65.5, 119.6, 527.5, 151.4] at 0.887 (IoU 0.90 with its ink) and the time stamp's
[501.6, 472.1, 869.4, 503.7] at 0.846 (IoU 0.88); on the grass photo 0.83 and 0.78
(IoU 0.90 and 0.81). The grass, astronaut and camera photos peak at 0.0002, 0.11 and
0.00002: nothing near the 0.3 binary threshold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import cv2
import numpy as np
import pytest

from appliance.models import ModelBatcher
from pipelines.decoders import DecodeOptions, Decoder, DecoderError, build_decoder
from pipelines.decoders.dbnet import UNCLIP_RATIO
from pipelines.types import Detections, Image
from tests.decoders.ort_runner import bundled, iou, photo
from tests.ocr import Line, draw_line, grass, grass_frame, overlay_frame, start_models, stop_models

BOX_THRESH = 0.6  # PaddleOCR's det_db_box_thresh, what read_text.yaml sets


@pytest.fixture(scope="module")
def text_det() -> Iterator[ModelBatcher]:
    models = start_models()
    yield models["text_det"]
    stop_models(models)


@pytest.fixture(scope="module")
def decoder(text_det: ModelBatcher) -> Decoder:
    return build_decoder(text_det.info, DecodeOptions(confidence=BOX_THRESH))


def detect(handle: ModelBatcher, decoder: Decoder, image: Image) -> Detections:
    """preprocess -> batcher -> decode, as the detect block does per frame."""
    sample, transform = decoder.preprocess(image)
    return decoder.decode(handle.submit(sample).result(30), transform)


def assert_finds(dets: Detections, lines: Sequence[Line], min_iou: float = 0.75) -> None:
    """One box per drawn line, each overlapping its line's ink by at least `min_iou`."""
    assert len(dets) == len(lines)
    assert dets.class_name == ("text",) * len(lines)
    assert (dets.confidence >= BOX_THRESH).all()
    for line in lines:
        assert max(iou(box, line.box) for box in dets.xyxy.tolist()) > min_iou, line


def test_finds_both_lines_on_a_plain_frame(text_det: ModelBatcher, decoder: Decoder) -> None:
    image, lines = overlay_frame()
    assert_finds(detect(text_det, decoder, image), lines)


def test_finds_both_lines_on_a_photo(text_det: ModelBatcher, decoder: Decoder) -> None:
    image, lines = grass_frame()
    assert_finds(detect(text_det, decoder, image), lines)


@pytest.mark.parametrize("name", ["grass", "astronaut", "camera"])
def test_no_text_no_boxes(text_det: ModelBatcher, decoder: Decoder, name: str) -> None:
    image = grass() if name == "grass" else photo(name)
    assert len(detect(text_det, decoder, image)) == 0


def test_large_frames_are_scaled_down_and_boxes_scaled_back(
    text_det: ModelBatcher, decoder: Decoder
) -> None:
    image = np.full((1080, 1920, 3), 235, np.uint8)
    line = draw_line(image, "CAMERA 07 PARKING", (120, 300), 3.2, 20, 6)
    sample, transform = decoder.preprocess(image)
    assert sample.shape == (3, 544, 960)  # long side 960, 540 rounded up to 544
    assert (transform.scale_x, transform.scale_y) == (0.5, 544 / 1080)
    assert_finds(detect(text_det, decoder, image), [line])


def test_sample_is_bgr_imagenet_normalised(decoder: Decoder) -> None:
    image = np.zeros((540, 960, 3), np.uint8)
    image[..., 0] = 255  # blue: PP-OCR feeds cv2's BGR planes in that order
    sample, _ = decoder.preprocess(image)
    assert sample.shape == (3, 544, 960) and sample.dtype == np.float32
    expected = [(1 - 0.485) / 0.229, -0.456 / 0.224, -0.406 / 0.225]
    np.testing.assert_allclose(np.asarray(sample, np.float32)[:, 100, 100], expected, rtol=1e-5)


def test_configured_size_is_used(text_det: ModelBatcher) -> None:
    info = dataclasses.replace(text_det.info, input_size=(640, 384))
    sample, transform = build_decoder(info, DecodeOptions()).preprocess(grass())
    assert sample.shape == (3, 384, 640)
    assert (transform.scale_x, transform.scale_y) == (640 / 960, 384 / 540)


def test_configured_size_must_be_multiples_of_32(text_det: ModelBatcher) -> None:
    info = dataclasses.replace(text_det.info, input_size=(500, 300))
    with pytest.raises(DecoderError) as err:
        build_decoder(info, DecodeOptions())
    assert str(err.value) == (
        "model 'text_det': decoder 'dbnet' needs an input size in multiples of 32; "
        "the configured input_size is 500x300"
    )


def test_rejects_the_person_detector() -> None:
    info = bundled("person_ssdlite").info("dbnet", model_id="people")
    with pytest.raises(DecoderError) as err:
        build_decoder(info, DecodeOptions())
    message = str(err.value)
    assert message.startswith(
        "model 'people': decoder 'dbnet' expects one output [N,1,H,W] (the text probability "
        "map); the model has "
    )
    assert "detection_boxes:0 float32 [" in message


def synthetic_map() -> list[np.ndarray]:
    """A 64x128 map: a 0.9 bar at x 10..60, y 20..30; a 0.5 bar (above the binary
    threshold, below the box threshold); a 2-pixel speck; a 0.8 bar rotated 30 degrees."""
    prob = np.zeros((64, 128), np.float32)
    prob[20:31, 10:61] = 0.9
    prob[45:56, 10:61] = 0.5
    prob[5:7, 100:101] = 0.95
    rotated = np.zeros_like(prob)
    corners = cv2.boxPoints(((95.0, 40.0), (40.0, 8.0), 30.0))
    cv2.fillPoly(rotated, [np.rint(corners).astype(np.int32)], 0.8)
    return [np.maximum(prob, rotated)[None]]


def test_decodes_a_map_as_paddleocr_does(decoder: Decoder) -> None:
    _, transform = decoder.preprocess(np.zeros((64, 128, 3), np.uint8))
    dets = decoder.decode(synthetic_map(), transform)
    assert len(dets) == 2  # the 0.5 bar and the speck are dropped
    # Mean probability in the min-area rect: exact for the bar; the rotated one's rect
    # also takes in anti-diagonal edge pixels left at 0 by the rasterisation.
    assert dets.confidence[0] == pytest.approx(0.9)
    assert 0.6 < dets.confidence[1] < 0.8
    # The bar's min-area rect is its pixel centres: 50 x 10 px around (35, 25); it grows
    # by area * 1.5 / perimeter = 500 * 1.5 / 120 = 6.25 px on every side.
    d = 50 * 10 * UNCLIP_RATIO / 120
    np.testing.assert_allclose(dets.xyxy[0], [10 - d, 20 - d, 60 + d, 30 + d], atol=1e-3)
    # The rotated bar: its axis-aligned extent around the centre, after growing.
    x1, y1, x2, y2 = dets.xyxy[1]
    assert ((x1 + x2) / 2, (y1 + y2) / 2) == pytest.approx((95, 40), abs=1)
    assert x2 - x1 > 40 and y2 - y1 > 8 + 2 * 3


def test_max_detections_keeps_the_best(text_det: ModelBatcher) -> None:
    one = build_decoder(text_det.info, DecodeOptions(confidence=0.6, max_detections=1))
    _, transform = one.preprocess(np.zeros((64, 128, 3), np.uint8))
    assert one.decode(synthetic_map(), transform).confidence.tolist() == pytest.approx(
        [0.9], abs=0.02
    )
