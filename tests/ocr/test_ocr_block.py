"""The `ocr` block and configs/workflows/read_text.yaml on the bundled PP-OCRv4 models:
text detection -> crops -> recognition, through the compiler, executor and batchers.

Measured once (onnxruntime CPU, 2 cores): the overlay frame reads "CAMERA 07 PARKING"
at 0.975 and "2026-11-29 14:30" at 1.000; the grass photo "CAMERA 07 PARKING" at 0.972
and "2026-11-29 14:30" at 0.963.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from appliance.models import ModelBatcher, load_model
from pipelines.blocks.base import BlockBuildError, BuildContext
from pipelines.blocks.ocr import CtcReader, OcrBlock, OcrParams
from pipelines.compiler import compile_workflow, parse_workflow
from pipelines.errors import WorkflowError
from pipelines.executor import WorkflowRun
from pipelines.spec import ModelSpec, read_workflow_file
from pipelines.types import Crops, Detections, Frame, Image, Texts
from tests.decoders.ort_runner import iou
from tests.ocr import (
    BATCHING,
    MODELS,
    READ_TEXT,
    Line,
    grass_frame,
    overlay_frame,
    start_models,
    stop_models,
    with_metadata,
)

CROP_PADDING = 4  # px, as read_text.yaml pads its crops


@pytest.fixture(scope="module")
def models() -> Iterator[dict[str, ModelBatcher]]:
    started = start_models()
    yield started
    stop_models(started)


@pytest.fixture(scope="module")
def read_text(models: Mapping[str, ModelBatcher]) -> WorkflowRun:
    spec = parse_workflow(read_workflow_file(READ_TEXT))
    return compile_workflow(spec, BuildContext(models=models)).instantiate()


@pytest.fixture(scope="module")
def reader(models: Mapping[str, ModelBatcher]) -> CtcReader:
    return CtcReader(models["text_rec"].info, 320)


def frame(image: Image) -> Frame:
    return Frame("cam", 0, None, 0.0, 0.0, image)


def read(workflow: WorkflowRun, image: Image) -> Texts:
    texts = workflow.run(frame(image)).outputs["text"]
    assert isinstance(texts, Texts)
    return texts


def cut(image: Image, boxes: Sequence[Sequence[int]]) -> Crops:
    """Crops of `boxes` (xyxy px) padded as the workflow pads them, confidence 1."""
    padded = np.array(boxes, np.int64) + np.array([-1, -1, 1, 1]) * CROP_PADDING
    images = tuple(image[y1:y2, x1:x2] for x1, y1, x2, y2 in padded.tolist())
    return Crops(images, Detections.from_arrays(padded, np.ones(len(boxes)), [0] * len(boxes)))


def assert_reads(texts: Texts, lines: Sequence[Line], normalise: bool = False) -> None:
    """Each line read once, confidently, from a box around its ink."""

    def norm(text: str) -> str:
        return text.replace(" ", "") if normalise else text

    assert sorted(map(norm, texts.text)) == sorted(norm(line.text) for line in lines)
    assert (texts.confidence > 0.9).all()
    for text, box in zip(texts.text, texts.detections.xyxy.tolist(), strict=True):
        line = next(line for line in lines if norm(line.text) == norm(text))
        assert iou(box, line.box) > 0.5


def test_reads_a_plain_frame_exactly(read_text: WorkflowRun) -> None:
    image, lines = overlay_frame()
    assert_reads(read(read_text, image), lines)


def test_reads_text_on_a_photo(read_text: WorkflowRun) -> None:
    # Compared without spaces: PP-OCRv4's recogniser (trained mostly on Chinese, which
    # has no spaces between words) misses narrow gaps now and then. This photo's time
    # stamp reads "2026-11-2914:30" with 0, 2 or 8 px of crop padding and exactly with
    # the workflow's 4, so the exact string would be luck, not a property.
    image, lines = grass_frame()
    assert_reads(read(read_text, image), lines, normalise=True)


def test_workflow_outputs_the_lines_too(read_text: WorkflowRun) -> None:
    image, lines = overlay_frame()
    outputs = read_text.run(frame(image)).outputs
    assert isinstance(outputs["lines"], Detections) and len(outputs["lines"]) == len(lines)
    assert [row["text"] for row in outputs["text"].to_json()] == list(outputs["text"].text)


def test_a_frames_crops_run_as_one_batch(models: Mapping[str, ModelBatcher]) -> None:
    rec = models["text_rec"]
    step = OcrBlock.build(OcrParams(model="text_rec"), BuildContext(models=models))()
    image, lines = overlay_frame()
    batches, samples = rec.batches, rec.samples
    texts = step(cut(image, [line.box for line in lines]), frame(image))
    assert texts.text == tuple(line.text for line in lines)
    assert (rec.batches - batches, rec.samples - samples) == (1, 2)


def test_unreadable_crops_are_dropped(models: Mapping[str, ModelBatcher]) -> None:
    ctx = BuildContext(models=models)
    image, lines = overlay_frame()
    crops = cut(image, [(600, 200, 900, 240), lines[0].box])  # plain background, then text
    texts = OcrBlock.build(OcrParams(model="text_rec"), ctx)()(crops, frame(image))
    assert texts.text == (lines[0].text,)
    np.testing.assert_array_equal(texts.detections.xyxy, crops.detections.xyxy[1:])
    every = OcrBlock.build(OcrParams(model="text_rec", min_confidence=0.0), ctx)()
    assert every(crops, frame(image)).text == (lines[0].text,)  # nothing read is no reading


def test_min_confidence_drops_less_certain_readings(models: Mapping[str, ModelBatcher]) -> None:
    ctx = BuildContext(models=models)
    image, lines = overlay_frame()
    crops = cut(image, [line.box for line in lines])
    every = OcrBlock.build(OcrParams(model="text_rec", min_confidence=0.0), ctx)()
    conf = every(crops, frame(image)).confidence
    assert conf[0] != conf[1]
    middle = float(conf.mean())
    surer = OcrBlock.build(OcrParams(model="text_rec", min_confidence=middle), ctx)()
    texts = surer(crops, frame(image))
    assert texts.text == (lines[int(conf.argmax())].text,)
    assert texts.confidence.tolist() == [conf.max()]


def test_no_crops_no_text(models: Mapping[str, ModelBatcher]) -> None:
    step = OcrBlock.build(OcrParams(model="text_rec"), BuildContext(models=models))()
    empty = Crops((), Detections.empty())
    assert len(step(empty, frame(np.zeros((8, 8, 3), np.uint8)))) == 0


def test_sample_keeps_aspect_and_pads_right(reader: CtcReader) -> None:
    crop = np.zeros((24, 40, 3), np.uint8)
    crop[..., 0] = 255  # blue: channels stay in the frame's BGR order, as in PaddleOCR
    sample = reader.sample(crop)
    assert sample.shape == (3, 48, 320) and sample.dtype == np.float32
    assert (sample[:, :, :80] == np.array([1.0, -1.0, -1.0]).reshape(3, 1, 1)).all()
    assert not sample[:, :, 80:].any()  # 0 after normalisation: mid-grey padding


def test_long_crops_are_squeezed_to_max_width(reader: CtcReader) -> None:
    sample = reader.sample(np.full((30, 900, 3), 255, np.uint8))
    assert sample.shape == (3, 48, 320)
    assert (sample == 1.0).all()


def test_ctc_greedy_decoding(reader: CtcReader) -> None:
    a, b = (int(np.flatnonzero(reader.symbols == c)[0]) for c in "AB")
    space = len(reader.symbols) - 1
    assert reader.symbols[space] == " " and reader.symbols[0] == ""
    steps: list[tuple[int, float]] = [
        (a, 0.9),
        (a, 0.7),
        (0, 0.99),
        (a, 0.8),
        (b, 0.6),
        (b, 0.9),
        (space, 0.55),
    ]
    probs = np.zeros((2, len(steps), len(reader.symbols)), np.float32)
    for t, (cls, p) in enumerate(steps):
        probs[0, t, cls] = p
        probs[0, t, 0 if cls else 1] = 1 - p  # the runner-up
    probs[1, :, 0] = 1.0  # only blanks
    text, conf = reader.decode(probs)
    # A A -> A, a blank, A, B B -> B, a trailing space (kept for the mean, then stripped)
    assert text == ["AAB", ""]
    assert conf.tolist() == pytest.approx([(0.9 + 0.8 + 0.6 + 0.55) / 4, 0.0])


def build_error(models: Mapping[str, ModelBatcher], model: str) -> str:
    with pytest.raises(BlockBuildError) as err:
        OcrBlock.build(OcrParams(model=model), BuildContext(models=models))
    assert err.value.field == "model"
    return str(err.value)


def rec_copy(tmp_path: Path, metadata: Mapping[str, str]) -> dict[str, ModelBatcher]:
    """The recogniser with other metadata, as model 'rec' (its batcher never started)."""
    path = with_metadata(MODELS / "ppocr_v4_rec.onnx", tmp_path / "rec.onnx", metadata)
    loaded = load_model("rec", ModelSpec(path=path, providers=["cpu"]), Path)
    return {"rec": ModelBatcher(loaded, BATCHING)}


def test_rejects_a_recogniser_without_symbols(tmp_path: Path) -> None:
    assert build_error(rec_copy(tmp_path, {"author": "me"}), "rec") == (
        "model 'rec' has no 'character' metadata (the CTC symbol list, one per line, as "
        "PaddleOCR exports carry it); metadata keys: author"
    )


def test_rejects_symbols_that_do_not_fit_the_output(tmp_path: Path) -> None:
    assert build_error(rec_copy(tmp_path, {"character": "a\nb\nc"}), "rec") == (
        "model 'rec': metadata 'character' has 3 symbols, but the output has 6625 classes, "
        "which needs 6624 symbols (+ blank) or 6623 (+ blank and space)"
    )


def test_rejects_a_detector_as_recogniser(models: Mapping[str, ModelBatcher]) -> None:
    spec = parse_workflow(read_workflow_file(READ_TEXT)).model_dump()
    spec["blocks"][2]["model"] = "text_det"
    with pytest.raises(WorkflowError) as err:
        compile_workflow(spec, BuildContext(models=models))
    assert err.value.problems == [
        "blocks[2].model: model 'text_det': block 'ocr' expects one output [N,T,C] "
        "(per-time-step class probabilities, C fixed); the model has sigmoid_0.tmp_0 "
        "float32 [p2o.DynamicDimension.3,1,p2o.DynamicDimension.4,p2o.DynamicDimension.5]"
    ]


def test_unknown_model_lists_the_known_ones(models: Mapping[str, ModelBatcher]) -> None:
    assert build_error(models, "txt_rec") == (
        "unknown model 'txt_rec' (models: text_det, text_rec)"
    )
