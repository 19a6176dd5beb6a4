"""Preprocessing in the graph against preprocessing on the host, frame by frame.

Each bundled model is loaded twice by `load_model` (`preprocess: host` and `graph`), its
decoder built from each `ModelInfo` as the compiler does, and the real frames of
configs/media/demo.mp4 run through preprocess -> session.run -> decode. The composed
prologue computes what numpy computes (tests/models/test_prologue.py shows it bit for
bit), so the tolerances below only absorb ORT choosing other kernels for the other graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from appliance.models import LoadedModel, ModelLoadError, load_model
from pipelines.decoders import (
    DecodeOptions,
    Decoder,
    DecoderError,
    build_decoder,
    decoder_prologue,
)
from pipelines.decoders.prologue import Prologue
from pipelines.spec import ModelSpec
from pipelines.types import Detections, FloatArray, Image
from tests.support.models import MODELS

DEMO = MODELS.parent / "media" / "demo.mp4"
FRAMES = 40  # of the clip's 240 (960x540, 15 fps): >= 30 as issue 31 asks
# Halved (as a 480x270 camera sends them): a quarter of the inference on the 2-core test
# machine; 270 rows still need CenterFace's stride padding (to 288).
SIZE = (480, 270)
BOX_TOLERANCE_PX = 1e-3
SCORE_TOLERANCE = 1e-5
# Low thresholds, so that every frame has detections to compare (the clip's faces and
# signs are small): what matters here is equality, not quality.
OPTIONS = {
    "centerface": DecodeOptions(confidence=0.2),
    "dbnet": DecodeOptions(confidence=0.3),
    "yolo": DecodeOptions(confidence=0.05),
}


@pytest.fixture(scope="module")
def frames() -> list[Image]:
    """FRAMES frames spread over the clip (both figures cross it), decoded as the sources
    decode them (BGR uint8 HxWx3), each with a camera's time stamp burnt in: text for
    DBNet to find."""
    with av.open(str(DEMO)) as container:
        decoded = [
            np.asarray(f.to_ndarray(format="bgr24"), np.uint8) for f in container.decode(video=0)
        ]
    spread = decoded[:: max(1, len(decoded) // FRAMES)][:FRAMES]
    chosen = [
        np.asarray(cv2.resize(f, SIZE, interpolation=cv2.INTER_AREA), np.uint8) for f in spread
    ]
    for index, image in enumerate(chosen):
        stamp = f"CAM 01  2026-12-02 12:00:{index:02d}"
        cv2.putText(image, stamp, (10, 24), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 255), 2)
    return chosen


def _load(path: Path, decoder: str, preprocess: str) -> LoadedModel:
    spec = ModelSpec.model_validate(
        {
            "path": path,
            "decoder": decoder,
            "providers": ["cpu"],
            "preprocess": preprocess,
            "session": {"intra_op_threads": 2, "warmup": False},
        }
    )
    return load_model(path.stem, spec, Path.resolve)


Run = tuple[list[FloatArray], Detections]  # one frame's raw outputs and its detections


def _detect(model: LoadedModel, decoder: Decoder, images: list[Image]) -> Iterator[Run]:
    for image in images:
        sample, transform = decoder.preprocess(image)
        outputs = model.session.run(model.output_names, {model.input_name: sample[None]})
        raw = [np.asarray(o[0], np.float32) for o in outputs]
        yield raw, decoder.decode(raw, transform)


def _both(path: Path, kind: str, images: list[Image]) -> list[tuple[Run, Run]]:
    runs = []
    for preprocess in ("host", "graph"):
        model = _load(path, kind, preprocess)
        assert (model.info.prologue is not None) == (preprocess == "graph")
        runs.append(list(_detect(model, build_decoder(model.info, OPTIONS[kind]), images)))
    return list(zip(runs[0], runs[1], strict=True))


def _assert_same(pairs: list[tuple[Run, Run]], frames_with_detections: int) -> None:
    found = sum(len(host) > 0 for (_, host), _ in pairs)
    assert found >= frames_with_detections  # something to compare
    for index, ((host_raw, host), (graph_raw, graph)) in enumerate(pairs):
        for want, got in zip(host_raw, graph_raw, strict=True):
            np.testing.assert_allclose(got, want, atol=SCORE_TOLERANCE, err_msg=f"frame {index}")
        assert len(graph) == len(host), f"frame {index}"
        np.testing.assert_allclose(graph.xyxy, host.xyxy, atol=BOX_TOLERANCE_PX, rtol=0)
        np.testing.assert_allclose(graph.confidence, host.confidence, atol=SCORE_TOLERANCE)
        np.testing.assert_array_equal(graph.class_id, host.class_id)
        if host.landmarks is not None:
            assert graph.landmarks is not None
            np.testing.assert_allclose(graph.landmarks, host.landmarks, atol=BOX_TOLERANCE_PX)


@pytest.mark.parametrize("kind", ["centerface", "dbnet"])
def test_graph_and_host_detect_the_same_in_every_frame(kind: str, frames: list[Image]) -> None:
    path = MODELS / ("centerface.onnx" if kind == "centerface" else "ppocr_v4_det.onnx")
    _assert_same(_both(path, kind, frames), frames_with_detections=FRAMES // 2)


def test_yolo_graph_and_host_detect_the_same(
    yolov8_fixed_batch_model: Path, frames: list[Image]
) -> None:
    """A fixed 640x640 input: the letterbox stays on the host, the scaling moves."""
    _assert_same(_both(yolov8_fixed_batch_model, "yolo", frames[:6]), frames_with_detections=3)


def test_centerface_hands_over_the_frame_itself(frames: list[Image]) -> None:
    """At the frame's own size the stride padding is in the graph: no host copy."""
    model = _load(MODELS / "centerface.onnx", "centerface", "graph")
    sample, transform = build_decoder(model.info, DecodeOptions()).preprocess(frames[0])

    assert sample is frames[0]
    assert model.info.prologue == Prologue(
        "float32", "NCHW", reverse_channels=True, pad_multiple=32
    )
    assert (transform.scale_x, transform.scale_y, transform.pad_x, transform.pad_y) == (1, 1, 0, 0)
    outputs = model.session.run(model.output_names, {model.input_name: sample[None]})
    assert outputs[0].shape == (1, 1, 288 // 4, 480 // 4)  # padded 270 -> 288 in the graph


def test_graph_samples_are_contiguous_bgr_bytes(frames: list[Image]) -> None:
    model = _load(MODELS / "ppocr_v4_det.onnx", "dbnet", "graph")
    # A strided 224x256 view: multiples of 32 already, so no resize copies it.
    view = frames[0][:256, :448:2]
    sample, _ = build_decoder(model.info, DecodeOptions()).preprocess(view)

    assert sample.dtype == np.uint8 and sample.shape == (256, 224, 3)
    assert sample.flags.c_contiguous
    np.testing.assert_array_equal(sample, view)


def test_host_keeps_the_float_sample(frames: list[Image]) -> None:
    model = _load(MODELS / "centerface.onnx", "centerface", "host")
    sample, _ = build_decoder(model.info, DecodeOptions()).preprocess(frames[0])

    assert model.info.prologue is None
    assert sample.dtype == np.float32 and sample.shape == (3, 288, 480)
    assert model.session.get_inputs()[0].type == "tensor(float)"


def test_a_prologue_other_than_the_decoders_is_refused() -> None:
    """The decoder and the session must agree on what the graph does."""
    model = _load(MODELS / "centerface.onnx", "centerface", "graph")
    other = dataclasses.replace(model.info, prologue=Prologue("float32", "NCHW"))
    with pytest.raises(DecoderError, match=r"'centerface'.*expects the graph prologue"):
        build_decoder(other, DecodeOptions())


def test_tf_od_has_no_prologue() -> None:
    """Its sample is uint8 already: nothing to move, so auto stays on the host."""
    model = _load(MODELS / "person_ssdlite.onnx", "tf_od", "auto")

    assert model.info.prologue is None
    assert decoder_prologue(model.info) is None
    with pytest.raises(ModelLoadError, match=r"preprocess 'graph': decoder 'tf_od' has no pixel"):
        _load(MODELS / "person_ssdlite.onnx", "tf_od", "graph")
