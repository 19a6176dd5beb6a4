"""classify: a real ONNX colour classifier run through a real ModelBatcher."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from appliance.models import BatchRecord, ModelBatcher, load_model
from pipelines.blocks.base import BlockBuildError, BuildContext
from pipelines.blocks.classify import ClassifyBlock, ClassifyParams
from pipelines.compiler import compile_workflow
from pipelines.models import ModelHandle
from pipelines.registry import BUILTIN_BLOCKS, BlockRegistry
from pipelines.spec import BatchingSpec, ModelSpec
from pipelines.types import Classifications, Crops, Detections, Frame, Image
from tests.blocks.classifier_model import classifier_model
from tests.blocks.tracking_clips import blank, doc_example
from tests.decoders.ort_runner import photo
from tests.support.models import MODELS

FRAME = Frame("cam", 0, None, 0.0, 0.0, np.zeros((1, 1, 3), np.uint8))
RED, GREEN, BLUE = (0, 0, 255), (0, 255, 0), (255, 0, 0)  # BGR, as frames are
# No wait for company: a frame's crops are queued together (submit_many), so they share
# one batch without any timing.
BATCH_DELAY_MS = 0.0
# The documented examples run with `detect` replaced by a contour finder (no model).
DOC_REGISTRY = BlockRegistry(
    {**BUILTIN_BLOCKS, "contours": "tests.blocks.tracking_clips:ContoursBlock"}
)


def handle(path: Path, model_id: str = "colours", **config: Any) -> ModelBatcher:
    cfg = ModelSpec.model_validate(
        {"path": path, "providers": ["cpu"], "session": {"intra_op_threads": 1}, **config}
    )
    batching = BatchingSpec(max_batch_size=8, max_queue_delay_ms=BATCH_DELAY_MS)
    return ModelBatcher(load_model(model_id, cfg, Path.resolve), batching)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("classifier")
    (folder / "fixed.onnx").write_bytes(classifier_model((32, 32)))
    (folder / "dynamic.onnx").write_bytes(classifier_model(("w", "h")))
    return folder


@pytest.fixture(scope="module")
def batcher(model_dir: Path) -> Iterator[ModelBatcher]:
    with handle(model_dir / "fixed.onnx") as running:
        yield running


def classify(
    runner: ModelHandle, image: Image, crops: Crops | None = None, **params: Any
) -> Classifications:
    ctx = BuildContext(models={"colours": runner})
    p = ClassifyParams.model_validate({"model": "colours", **params})
    result: Classifications = ClassifyBlock.build(p, ctx)()(image, crops, FRAME)
    return result


def solid(color: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> Image:
    return np.full((size[1], size[0], 3), color, np.uint8)


def test_whole_image_is_one_row(batcher: ModelBatcher) -> None:
    out = classify(batcher, solid(RED))
    assert out.class_name == (("red",),) and out.class_id.tolist() == [[0]]
    # Logits (4, -2, -2) are not probabilities, so softmax: e^4 / (e^4 + 2 e^-2).
    assert out.confidence[0, 0] == pytest.approx(np.exp(4) / (np.exp(4) + 2 * np.exp(-2)))


def test_crops_are_classified_in_one_batch(batcher: ModelBatcher) -> None:
    frame = np.full((540, 960, 3), 128, np.uint8)
    frame[100:200, 100:250] = BLUE
    frame[300:420, 500:560] = GREEN
    boxes = Detections.from_arrays([[100, 100, 250, 200], [500, 300, 560, 420]], [0.9, 0.8], [0, 0])
    crops = Crops((frame[100:200, 100:250], frame[300:420, 500:560]), boxes)
    records: list[BatchRecord] = []
    batcher.on_batch = records.append
    try:
        out = classify(batcher, frame, crops, top_k=3)
    finally:
        batcher.on_batch = None
    assert [names[0] for names in out.class_name] == ["blue", "green"]
    assert [r.batch_size for r in records] == [2]  # both crops in one session.run
    assert np.all(np.diff(out.confidence, axis=1) <= 0)  # best first
    assert out.confidence.sum(axis=1) == pytest.approx([1.0, 1.0])


def test_channel_order_and_raw_scores(batcher: ModelBatcher) -> None:
    # Fed BGR, the model reads the red frame's first plane (blue = 0)... as blue.
    assert classify(batcher, solid(RED), channel_order="BGR").class_name == (("blue",),)
    raw = classify(batcher, solid(GREEN), softmax=False, top_k=3)
    assert raw.confidence.tolist() == [[4.0, -2.0, -2.0]]  # the logits themselves
    assert raw.class_name == (("green", "red", "blue"),)  # ties keep class order


def test_mean_std_and_scale_normalise_pixels(batcher: ModelBatcher) -> None:
    # Grey 128 -> (128/255 - 0.5) / 0.25 ≈ 0.008 per channel: logits ≈ 0, probabilities 1/3.
    out = classify(batcher, solid((128, 128, 128)), mean=[0.5] * 3, std=[0.25] * 3, top_k=3)
    assert out.confidence[0] == pytest.approx([1 / 3] * 3, abs=1e-3)
    pure = classify(batcher, solid(BLUE), scale=2 / 255, softmax=False)  # means 2.0
    assert pure.confidence.tolist() == [[8.0]]


def test_real_photo_and_empty_crops(batcher: ModelBatcher) -> None:
    astronaut = photo("astronaut")  # mean RGB (142, 106, 96): a red cast overall
    assert classify(batcher, astronaut).class_name == (("red",),)
    empty = classify(batcher, astronaut, Crops((), Detections.empty()), top_k=2)
    assert empty.class_id.shape == (0, 2) and len(empty) == 0


def test_dynamic_size_model_needs_input_size(model_dir: Path) -> None:
    with handle(model_dir / "dynamic.onnx") as dynamic:
        with pytest.raises(BlockBuildError, match=r"'colours' has no fixed input size") as err:
            classify(dynamic, solid(RED))
        assert err.value.field == "input_size"
        out = classify(dynamic, solid(BLUE), input_size=[24, 16])
        assert out.class_name == (("blue",),)


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"input_size": [64, 64]}, "input_size", r"does not match model 'colours'.*\[32, 32\]"),
        ({"top_k": 4}, "top_k", "top_k 4 is more than model 'colours''s 3 classes"),
        ({"model": "colors"}, "model", r"unknown model 'colors' \(models: colours\)"),
    ],
)
def test_build_errors_name_the_model(
    batcher: ModelBatcher, params: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(BlockBuildError, match=message) as err:
        classify(batcher, solid(RED), **params)
    assert err.value.field == field


def test_models_of_the_wrong_shape_are_refused(model_dir: Path) -> None:
    with handle(MODELS / "person_ssdlite.onnx", "person", decoder="tf_od") as detector:
        ctx = BuildContext(models={"person": detector})
        with pytest.raises(BlockBuildError, match=r"model 'person': block 'classify' expects"):
            ClassifyBlock.build(ClassifyParams(model="person"), ctx)
    with (
        handle(model_dir / "fixed.onnx", labels=["a", "b"]) as mislabelled,
        pytest.raises(BlockBuildError, match="has 2 labels but its output"),
    ):
        classify(mislabelled, solid(RED))


def test_detect_crop_classify_through_the_compiler(batcher: ModelBatcher) -> None:
    workflow = {
        "blocks": [
            {"id": "people", "type": "detect", "model": "person", "confidence": 0.5},
            {"id": "cut", "type": "crop", "detections": "people", "square": True},
            {"id": "colour", "type": "classify", "model": "colours", "crops": "cut", "top_k": 3},
            {"id": "scene", "type": "classify", "model": "colours"},  # the whole frame
        ],
        "outputs": {"cut": "cut", "colour": "colour", "scene": "scene"},
    }
    with handle(MODELS / "person_ssdlite.onnx", "person", decoder="tf_od") as person:
        ctx = BuildContext(models={"colours": batcher, "person": person})
        run = compile_workflow(workflow, ctx).instantiate()
        frame = np.full((540, 960, 3), BLUE, np.uint8)
        frame[14:526, 400:912] = photo("astronaut")  # the person, in a blue room
        out = run.run(Frame("cam", 0, None, 0.0, 0.0, frame)).outputs
    assert len(out["cut"]) == 1  # one astronaut, one crop, one row
    assert out["colour"].class_name[0][0] == "red"  # her orange suit and the red flag
    assert out["scene"].class_name == (("blue",),)  # mostly the blue room
    assert out["colour"].class_id.shape == (1, 3)


def test_the_documented_example_compiles_and_runs(batcher: ModelBatcher) -> None:
    ctx = BuildContext(models={"colours": batcher})
    run = compile_workflow(doc_example("classify"), ctx, DOC_REGISTRY).instantiate()
    image = blank(320, 240)
    image[40:100, 30:110] = (255, 170, 170)  # light blue (BGR): bright enough to be found
    image[150:200, 200:300] = (170, 170, 255)  # light red
    out = run.run(Frame("cam", 0, None, 0.0, 0.0, image)).outputs
    assert out["cars"].detections.xyxy[:, 0].tolist() == [200, 30]  # contour order
    assert [row[0] for row in out["colour"].class_name] == ["red", "blue"]
    assert out["colour"].class_id.shape == (2, 2)  # top_k: 2
