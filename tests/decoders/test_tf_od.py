"""TF Object Detection API decoder on the bundled SSDLite person model and real photos.

Measured once (onnxruntime CPU): astronaut person 0.92 at [3, 32, 373, 509], cameraman
0.99 at [1, 68, 302, 512], grass nothing above 0.02; asserted with tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.decoders import DecodeOptions, DecoderError, build_decoder
from pipelines.decoders.tf_od import labels_by_id
from tests.decoders.ort_runner import OrtRunner, bundled, iou, pasted, photo, shifted

OFFSET = (300, 20)  # where the photo lands in the 960x540 canvas


@pytest.fixture(scope="module")
def ssd() -> OrtRunner:
    return bundled("person_ssdlite")


@pytest.mark.parametrize(
    ("name", "min_score", "box"),
    [("astronaut", 0.85, [3, 32, 373, 509]), ("camera", 0.95, [1, 68, 302, 512])],
)
def test_finds_the_person_in_a_photo(
    ssd: OrtRunner, name: str, min_score: float, box: list[float]
) -> None:
    dets = ssd.detect(ssd.decoder("tf_od", labels=["person"]), photo(name))
    assert len(dets) == 1
    assert dets.confidence[0] >= min_score
    assert dets.class_id.tolist() == [1]
    assert dets.class_name == ("person",)
    np.testing.assert_allclose(dets.xyxy[0], box, atol=8)


def test_astronaut_box_covers_the_left_middle(ssd: OrtRunner) -> None:
    dets = ssd.detect(ssd.decoder("tf_od"), photo("astronaut"))
    x1, y1, x2, y2 = dets.xyxy[0].tolist()
    # the figure fills the left and middle of the 512 px photo
    assert 100 < (x1 + x2) / 2 < 256
    assert 150 < (y1 + y2) / 2 < 350


def test_grass_has_nobody(ssd: OrtRunner) -> None:
    assert len(ssd.detect(ssd.decoder("tf_od"), photo("grass"))) == 0


def test_box_follows_the_photo_into_a_larger_frame(ssd: OrtRunner) -> None:
    decoder = ssd.decoder("tf_od")
    alone = ssd.detect(decoder, photo("camera"))
    inside = ssd.detect(decoder, pasted(photo("camera"), OFFSET))
    assert len(inside) == 1
    # the graph sees the 960x540 canvas squeezed to 300x300, so the box moves a little
    assert iou(inside.xyxy[0].tolist(), shifted(alone.xyxy[0].tolist(), OFFSET)) > 0.85


def test_sample_is_rgb_uint8_at_one_size_for_any_frame(ssd: OrtRunner) -> None:
    decoder = ssd.decoder("tf_od")
    blue = np.zeros((540, 960, 3), np.uint8)
    blue[..., 0] = 255  # BGR
    sample, _ = decoder.preprocess(blue)
    assert sample.shape == (300, 300, 3)
    assert sample.dtype == np.uint8
    assert sample[0, 0].tolist() == [0, 0, 255]
    assert decoder.preprocess(photo("camera"))[0].shape == (300, 300, 3)
    sized = ssd.decoder("tf_od", input_size=(320, 240))
    assert sized.preprocess(blue)[0].shape == (240, 320, 3)


def synthetic_outputs(count: int) -> list[np.ndarray]:
    """Model order: num_detections, boxes, scores, classes (as person_ssdlite declares)."""
    boxes = np.zeros((100, 4), np.float32)
    boxes[:3] = [[0.1, 0.2, 0.5, 0.6], [0.0, 0.0, 1.0, 0.5], [0.5, 0.5, 0.6, 0.6]]
    scores = np.zeros(100, np.float32)
    scores[:3] = [0.9, 0.8, 0.7]
    classes = np.ones(100, np.float32)
    classes[:3] = [3.0, 1.0, 2.0]
    return [np.array(count, np.float32), boxes, scores, classes]


@pytest.mark.parametrize(
    "labels", [["person", "bicycle", "car"], ["???", "person", "bicycle", "car"]]
)
def test_label_rule_accepts_label_maps_with_or_without_background(
    ssd: OrtRunner, labels: list[str]
) -> None:
    decoder = ssd.decoder("tf_od", labels=labels)
    _, transform = decoder.preprocess(np.zeros((200, 100, 3), np.uint8))
    dets = decoder.decode(synthetic_outputs(3), transform)
    assert dets.class_id.tolist() == [3, 1, 2]  # the model's own ids
    assert dets.class_name == ("car", "person", "bicycle")
    # [ymin, xmin, ymax, xmax] normalised -> xyxy pixels of the 100x200 frame
    np.testing.assert_allclose(dets.xyxy[0], [20, 20, 60, 100], atol=1e-3)


def test_num_detections_confidence_and_max_detections(ssd: OrtRunner) -> None:
    info = ssd.info("tf_od")
    transform = build_decoder(info, DecodeOptions()).preprocess(photo("grass"))[1]

    def scores(count: int, options: DecodeOptions) -> list[float]:
        decoder = build_decoder(info, options)
        return list(decoder.decode(synthetic_outputs(count), transform).confidence.tolist())

    assert scores(2, DecodeOptions(confidence=0.5)) == pytest.approx([0.9, 0.8])
    assert scores(3, DecodeOptions(confidence=0.75)) == pytest.approx([0.9, 0.8])
    assert scores(3, DecodeOptions(confidence=0.5, max_detections=1)) == pytest.approx([0.9])


def test_labels_by_id() -> None:
    assert labels_by_id(["person"]) == ("background", "person")
    assert labels_by_id(["background", "person"]) == ("background", "person")
    assert labels_by_id([]) == ()


def test_rejects_a_centerface_model() -> None:
    info = bundled("centerface").info("tf_od", model_id="faces")
    with pytest.raises(DecoderError) as err:
        build_decoder(info, DecodeOptions())
    assert str(err.value) == (
        "model 'faces': decoder 'tf_od' expects outputs detection_boxes/detection_scores/"
        "detection_classes/num_detections; the model has 537, 538, 539, 540"
    )
