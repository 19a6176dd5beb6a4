"""YOLO decoder: layout detection, exact decoding of synthetic heads, a real YOLOv8 export.

The real model (classes Normal, Fall; a person detector) measured once on onnxruntime CPU:
cameraman 'Normal' 0.78 at [0, 74, 327, 507], astronaut 'Normal' 0.59 at [0, 29, 380, 511].
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pipelines.decoders import DecodeOptions, DecoderError, build_decoder
from pipelines.decoders.yolo import HeadLayout, YoloDecoder, head_layout
from pipelines.models import Dim, ModelInfo, TensorInfo
from tests.decoders.ort_runner import OrtRunner, bundled, iou, pasted, photo, runner, shifted

OFFSET = (300, 20)


def head_info(
    shape: tuple[Dim, ...],
    labels: tuple[str, ...] = (),
    dtype: str = "float32",
    input_size: tuple[int, int] | None = None,
) -> ModelInfo:
    """A hand-made interface for head shapes no real model here has."""
    return ModelInfo(
        id="det",
        path="det.onnx",
        inputs=(TensorInfo("images", (1, 3, 640, 640), dtype),),
        outputs=(TensorInfo("output0", shape, dtype),),
        decoder="yolo",
        labels=labels,
        input_size=input_size,
    )


TWO = ("a", "b")


@pytest.mark.parametrize(
    ("shape", "labels", "layout"),
    [
        ((1, 6, 8400), TWO, HeadLayout(channels_first=True, objectness=False, num_classes=2)),
        ((1, 8400, 6), TWO, HeadLayout(channels_first=False, objectness=False, num_classes=2)),
        ((1, 8400, 7), TWO, HeadLayout(channels_first=False, objectness=True, num_classes=2)),
        ((1, 7, 8400), TWO, HeadLayout(channels_first=True, objectness=True, num_classes=2)),
        ((1, 84, 8400), (), HeadLayout(channels_first=True, objectness=False, num_classes=80)),
        (("n", 84, "a"), (), HeadLayout(channels_first=True, objectness=False, num_classes=80)),
        ((1, 25200, 85), (), HeadLayout(channels_first=False, objectness=True, num_classes=80)),
        (("n", "a", 85), (), HeadLayout(channels_first=False, objectness=True, num_classes=80)),
    ],
)
def test_head_layout_from_declared_shape(
    shape: tuple[Dim, ...], labels: tuple[str, ...], layout: HeadLayout
) -> None:
    assert head_layout(head_info(shape, labels), len(labels) or None) == layout


@pytest.mark.parametrize(
    ("shape", "labels", "message"),
    [
        (
            (1, 84, 8400),
            TWO,
            "expects output 0 [N,6,A] or [N,A,6] (v8/v11) or [N,A,7] (v5) for 2 labels; "
            "the model has output0 float32 [1,84,8400]",
        ),
        (("n", "c", "a"), (), "with fixed channels; the model has output0 float32 [n,c,a]"),
        ((1, 8400), (), "the model has output0 float32 [1,8400]"),
    ],
)
def test_head_layout_rejects_unreadable_heads(
    shape: tuple[Dim, ...], labels: tuple[str, ...], message: str
) -> None:
    with pytest.raises(DecoderError, match=re.escape(message)):
        build_decoder(head_info(shape, labels), DecodeOptions())


def v8_head() -> np.ndarray:
    """[6, 8400]: cx, cy, w, h, score a, score b per anchor (model-input pixels)."""
    head = np.zeros((6, 8400), np.float32)
    head[:, 10] = [100, 300, 50, 80, 0.9, 0.0]  # kept
    head[:, 20] = [105, 300, 50, 80, 0.8, 0.1]  # IoU 0.82 with anchor 10, same class: gone
    head[:, 30] = [100, 300, 50, 80, 0.0, 0.7]  # same box, other class: kept
    head[:, 40] = [600, 200, 40, 40, 0.1, 0.3]  # below the threshold
    head[:, 50] = [620, 150, 60, 40, 0.6, 0.0]  # reaches into the padding and off the edge
    return head


# a 1280x720 frame letterboxed to 640x640: scale 0.5, 140 px of padding on top
V8_EXPECTED = ([[150, 240, 250, 400], [150, 240, 250, 400], [1180, 0, 1280, 60]], [0.9, 0.7, 0.6])


@pytest.mark.parametrize("channels_first", [True, False])
def test_decodes_a_v8_head_exactly(channels_first: bool) -> None:
    shape = (1, 6, 8400) if channels_first else (1, 8400, 6)
    decoder = build_decoder(head_info(shape, TWO), DecodeOptions(confidence=0.5))
    _, transform = decoder.preprocess(np.zeros((720, 1280, 3), np.uint8))
    head = v8_head() if channels_first else np.ascontiguousarray(v8_head().T)
    dets = decoder.decode([head], transform)
    np.testing.assert_allclose(dets.xyxy, V8_EXPECTED[0], atol=1e-3)
    np.testing.assert_allclose(dets.confidence, V8_EXPECTED[1], atol=1e-6)
    assert dets.class_id.tolist() == [0, 1, 0]
    assert dets.class_name == ("a", "b", "a")


def test_decodes_a_v5_head_with_objectness() -> None:
    head = np.zeros((25200, 7), np.float32)  # cx, cy, w, h, obj, score a, score b
    head[0] = [100, 300, 50, 80, 0.9, 0.1, 0.9]  # 0.81 b
    head[1] = [105, 300, 50, 80, 0.8, 0.05, 0.95]  # 0.76 b, overlaps row 0: gone
    head[2] = [400, 300, 50, 80, 0.6, 0.5, 0.5]  # obj passes, 0.3 does not
    head[3] = [400, 100, 50, 80, 0.4, 0.0, 1.0]  # obj below the threshold
    head[4] = [300, 300, 20, 20, 1.0, 0.7, 0.1]  # 0.7 a
    decoder = build_decoder(head_info((1, 25200, 7), TWO), DecodeOptions(confidence=0.5))
    _, transform = decoder.preprocess(np.zeros((480, 640, 3), np.uint8))  # 80 px pad on top
    dets = decoder.decode([head], transform)
    np.testing.assert_allclose(dets.xyxy, [[75, 180, 125, 260], [290, 210, 310, 230]])
    np.testing.assert_allclose(dets.confidence, [0.81, 0.7], atol=1e-6)
    assert dets.class_id.tolist() == [1, 0]


def test_float16_model_gets_float16_samples_and_decodes() -> None:
    decoder = build_decoder(head_info((1, 6, 8400), TWO, "float16"), DecodeOptions())
    sample, transform = decoder.preprocess(np.zeros((720, 1280, 3), np.uint8))
    assert sample.dtype == np.float16
    assert sample.shape == (3, 640, 640)
    assert sample[0, 0, 0] == np.float16(114 / 255)
    dets = decoder.decode([v8_head().astype(np.float16)], transform)
    np.testing.assert_allclose(dets.xyxy, V8_EXPECTED[0], atol=0.5)


def test_configured_size_must_match_a_fixed_model_size() -> None:
    with pytest.raises(DecoderError) as err:
        build_decoder(head_info((1, 6, 8400), TWO, input_size=(320, 320)), DecodeOptions())
    assert str(err.value) == (
        "model 'det': decoder 'yolo' expects the configured input_size 320x320; "
        "the model has a fixed input size 640x640"
    )


def test_rejects_a_tf_od_model() -> None:
    info = bundled("person_ssdlite").info("yolo", model_id="people")
    with pytest.raises(DecoderError) as err:
        build_decoder(info, DecodeOptions())
    assert str(err.value) == (
        "model 'people': decoder 'yolo' expects one input float32|float16 [N,3,H,W] "
        "(NCHW RGB); the model has input image_tensor:0 uint8 [unk__2120,unk__2121,unk__2122,3]"
    )


@pytest.fixture(scope="module")
def yolo(yolov8_fixed_batch_model: Path) -> OrtRunner:
    return runner(yolov8_fixed_batch_model)


def test_real_export_reads_as_v8_with_its_metadata_names(yolo: OrtRunner) -> None:
    decoder = yolo.decoder("yolo")
    assert isinstance(decoder, YoloDecoder)
    assert decoder.layout == HeadLayout(channels_first=True, objectness=False, num_classes=2)
    sample, _ = decoder.preprocess(photo("camera"))
    assert sample.shape == (3, 640, 640)
    assert sample.dtype == yolo.info("yolo").input.dtype


@pytest.mark.parametrize(
    ("name", "min_score", "box"),
    [("camera", 0.6, [0, 74, 327, 507]), ("astronaut", 0.45, [0, 29, 380, 511])],
)
def test_real_export_finds_the_person(
    yolo: OrtRunner, name: str, min_score: float, box: list[float]
) -> None:
    dets = yolo.detect(yolo.decoder("yolo", DecodeOptions(confidence=0.4)), photo(name))
    assert len(dets) >= 1
    assert dets.confidence[0] >= min_score
    assert dets.class_name[0] in {"Normal", "Fall"}
    assert iou(dets.xyxy[0].tolist(), box) > 0.9


def test_real_export_box_follows_the_photo_into_a_larger_frame(yolo: OrtRunner) -> None:
    decoder = yolo.decoder("yolo", DecodeOptions(confidence=0.4))
    alone = yolo.detect(decoder, photo("camera"))
    inside = yolo.detect(decoder, pasted(photo("camera"), OFFSET))
    assert iou(inside.xyxy[0].tolist(), shifted(alone.xyxy[0].tolist(), OFFSET)) > 0.85
