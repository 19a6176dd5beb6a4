"""CenterFace decoder on the bundled model and real photos, plus exact synthetic maps.

Measured once (onnxruntime CPU): astronaut face 0.93 at [181.5, 58.2, 269.9, 177.8];
pasted at (300, 20) into 960x540, 0.93 at [481.2, 76.8, 570.8, 198.8].
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.decoders import DecodeOptions, DecoderError, build_decoder
from pipelines.types import Detections
from tests.decoders.ort_runner import OrtRunner, bundled, pasted, photo, shifted

ASTRONAUT_FACE = [181.5, 58.2, 269.9, 177.8]
OFFSET = (300, 20)


@pytest.fixture(scope="module")
def centerface() -> OrtRunner:
    return bundled("centerface")


@pytest.fixture(scope="module")
def astronaut(centerface: OrtRunner) -> Detections:
    return centerface.detect(centerface.decoder("centerface"), photo("astronaut"))


def test_finds_the_astronaut_face(astronaut: Detections) -> None:
    assert len(astronaut) == 1
    assert astronaut.confidence[0] >= 0.85
    assert astronaut.class_id.tolist() == [0]
    assert astronaut.class_name == ("face",)
    np.testing.assert_allclose(astronaut.xyxy[0], ASTRONAUT_FACE, atol=5)


def test_landmarks_sit_inside_the_face(astronaut: Detections) -> None:
    assert astronaut.landmarks is not None
    points = astronaut.landmarks[0]  # eyes, nose, mouth corners as (x, y)
    x1, y1, x2, y2 = astronaut.xyxy[0]
    assert points.shape == (5, 2)
    assert ((points[:, 0] > x1) & (points[:, 0] < x2)).all()
    assert ((points[:, 1] > y1) & (points[:, 1] < y2)).all()
    left_eye, right_eye, nose, mouth_left, mouth_right = points
    assert left_eye[0] < right_eye[0] and mouth_left[0] < mouth_right[0]
    assert max(left_eye[1], right_eye[1]) < nose[1] < min(mouth_left[1], mouth_right[1])


def test_box_and_landmarks_follow_the_photo_into_a_larger_frame(
    centerface: OrtRunner, astronaut: Detections
) -> None:
    dets = centerface.detect(centerface.decoder("centerface"), pasted(photo("astronaut"), OFFSET))
    assert len(dets) == 1
    # full resolution either way, so the face moves by the offset to within 2 px
    np.testing.assert_allclose(dets.xyxy[0], shifted(astronaut.xyxy[0].tolist(), OFFSET), atol=2)
    assert dets.landmarks is not None and astronaut.landmarks is not None
    np.testing.assert_allclose(dets.landmarks[0], astronaut.landmarks[0] + OFFSET, atol=2)


def test_configured_size_letterboxes_and_maps_back(centerface: OrtRunner) -> None:
    decoder = centerface.decoder("centerface", input_size=(640, 384))
    sample, transform = decoder.preprocess(photo("astronaut"))
    assert sample.shape == (3, 384, 640)
    assert transform.scale_x == transform.scale_y == 0.75
    dets = centerface.detect(decoder, photo("astronaut"))
    assert len(dets) == 1
    np.testing.assert_allclose(dets.xyxy[0], ASTRONAUT_FACE, atol=10)


def test_grass_has_no_face(centerface: OrtRunner) -> None:
    assert len(centerface.detect(centerface.decoder("centerface"), photo("grass"))) == 0


def test_sample_is_the_frame_padded_to_multiples_of_32(centerface: OrtRunner) -> None:
    sample, _ = centerface.decoder("centerface").preprocess(pasted(photo("camera"), OFFSET))
    assert sample.shape == (3, 544, 960)
    assert sample.dtype == np.float32
    assert sample[:, 540:].max() == 0  # bottom padding
    assert sample[:, 0, 0].tolist() == [90, 90, 90]  # 0..255, not normalised


def synthetic_maps() -> list[np.ndarray]:
    """16x16 maps (a 64x64 input): a face at cell (y 5, x 7), a weaker copy one cell to
    the right, a small face at (12, 12) and a cell below the threshold."""
    heat = np.zeros((1, 16, 16), np.float32)
    scale = np.zeros((2, 16, 16), np.float32)
    offset = np.zeros((2, 16, 16), np.float32)
    marks = np.zeros((10, 16, 16), np.float32)
    for (y, x), score in {(5, 7): 0.9, (5, 8): 0.6, (12, 12): 0.55, (0, 0): 0.4}.items():
        heat[0, y, x] = score
        scale[:, y, x] = [math.log(20 / 4), math.log(16 / 4)]  # 20 px high, 16 px wide
        offset[:, y, x] = [0.1, 0.2]  # y, x in cells
    scale[:, 12, 12] = 0.0  # 4x4 px
    marks[0::2, 5, 7] = [0.1, 0.2, 0.3, 0.4, 0.5]  # y fractions of the box height
    marks[1::2, 5, 7] = [0.0, 0.2, 0.4, 0.6, 0.8]  # x fractions of the box width
    return [heat, scale, offset, marks]


def test_decodes_maps_as_the_reference_decoder(centerface: OrtRunner) -> None:
    decoder = centerface.decoder("centerface", DecodeOptions(confidence=0.5, nms_iou=0.3))
    _, transform = decoder.preprocess(np.zeros((64, 64, 3), np.uint8))
    dets = decoder.decode(synthetic_maps(), transform)
    assert dets.confidence.tolist() == pytest.approx([0.9, 0.55])
    # centre = (cell + offset + 0.5) * 4 = (30.8, 22.4); size 16 x 20
    np.testing.assert_allclose(dets.xyxy[0], [22.8, 12.4, 38.8, 32.4], atol=1e-4)
    np.testing.assert_allclose(dets.xyxy[1], [48.8, 48.4, 52.8, 52.4], atol=1e-4)
    assert dets.landmarks is not None
    # point j = (x1 + lm[2j+1] * w, y1 + lm[2j] * h)
    expected = [
        [22.8 + 16 * fx, 12.4 + 20 * fy]
        for fx, fy in zip([0.0, 0.2, 0.4, 0.6, 0.8], [0.1, 0.2, 0.3, 0.4, 0.5], strict=True)
    ]
    np.testing.assert_allclose(dets.landmarks[0], expected, atol=1e-4)


def test_configured_size_must_be_multiples_of_32(centerface: OrtRunner) -> None:
    info = centerface.info("centerface", model_id="faces", input_size=(500, 300))
    with pytest.raises(DecoderError) as err:
        build_decoder(info, DecodeOptions())
    assert str(err.value) == (
        "model 'faces': decoder 'centerface' needs an input size in multiples of 32; "
        "the configured input_size is 500x300"
    )


def test_rejects_a_tf_od_model() -> None:
    info = bundled("person_ssdlite").info("centerface", model_id="people")
    with pytest.raises(
        DecoderError, match="model 'people': decoder 'centerface' expects outputs heatmap"
    ):
        build_decoder(info, DecodeOptions())
