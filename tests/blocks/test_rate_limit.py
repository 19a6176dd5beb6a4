"""rate_limit: per-stream gating by frame count or capture time, through the executor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from appliance.models import ModelBatcher, load_model
from pipelines.blocks.base import SKIP, BlockType, BuildContext, StepFactory
from pipelines.blocks.rate_limit import RateLimitBlock, RateLimitParams
from pipelines.compiler import compile_workflow
from pipelines.errors import WorkflowError
from pipelines.registry import BUILTIN_BLOCKS, BlockRegistry
from pipelines.spec import BatchingSpec, ModelSpec
from pipelines.types import Crops, Detections, Frame, FrameResult, Image
from tests.blocks.classifier_model import classifier_model
from tests.blocks.tracking_clips import doc_example, render

CTX = BuildContext(models={})
IMAGE = np.zeros((4, 4, 3), np.uint8)


def frame(seq: int, t: float = 0.0, image: Image = IMAGE) -> Frame:
    return Frame("cam", seq, None, 1_700_000_000.0 + t, t, image)


def passed(params: dict[str, Any], times: list[float]) -> list[bool]:
    step = RateLimitBlock.build(RateLimitParams.model_validate(params), CTX)()
    return [step("v", frame(i, t)) is not SKIP for i, t in enumerate(times)]


def test_every_n_frames_passes_the_first_of_each_n() -> None:
    assert passed({"every_n_frames": 3}, [0.0] * 7) == [1, 0, 0, 1, 0, 0, 1]
    assert passed({"every_n_frames": 1}, [0.0] * 3) == [1, 1, 1]


def test_every_s_follows_capture_time_without_catch_up_bursts() -> None:
    times = [0.0, 0.3, 0.6, 0.9, 1.0, 1.2, 2.05, 5.0, 5.1, 6.0]
    # 1.0 is due; 2.05 is late (due 2.0), the next due stays 3.0; after the stall to
    # 5.0 the schedule restarts at 6.0 instead of passing 5.1 to catch up.
    assert passed({"every_s": 1.0}, times) == [1, 0, 0, 0, 1, 0, 1, 1, 0, 1]


def test_each_stream_has_its_own_state() -> None:
    factory = RateLimitBlock.build(RateLimitParams(every_n_frames=2), CTX)
    a, b = factory(), factory()
    assert [a("x", frame(i)) for i in range(3)] == ["x", SKIP, "x"]
    assert b("y", frame(0)) == "y"  # a fresh stream starts by passing


@pytest.mark.parametrize("params", [{}, {"every_n_frames": 2, "every_s": 1.0}])
def test_exactly_one_limit(params: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="exactly one of every_n_frames"):
        RateLimitParams.model_validate(params)


class MovingBox(BlockType):
    """A fresh detection every frame, 10 px further right per frame (x1 = 10 * seq)."""

    type_name = "moving_box"
    outputs = {"detections": "detections"}
    wants_frame = True

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        def boxes(frame: Frame) -> Detections:
            x = 10.0 * frame.seq
            return Detections.from_arrays([[x, 10, x + 20, 30]], [0.9], [0])

        return lambda: boxes


REGISTRY = BlockRegistry({**BUILTIN_BLOCKS, "moving_box": f"{__name__}:MovingBox"})
# The documented examples run with `detect` replaced by a contour finder (no model).
DOC_REGISTRY = BlockRegistry(
    {**BUILTIN_BLOCKS, "contours": "tests.blocks.tracking_clips:ContoursBlock"}
)
CHAIN = {
    "blocks": [
        {"id": "boxes", "type": "moving_box"},
        {"id": "limit", "type": "rate_limit", "value": "boxes", "every_n_frames": 3},
        {"id": "cut", "type": "crop", "detections": "limit"},
        {"id": "hidden", "type": "blur", "detections": "limit", "method": "fill"},
        {"id": "drawn", "type": "annotate", "image": "hidden", "detections": "boxes", "labels": []},
    ],
    "outputs": {"crops": "cut", "video": "drawn"},
}


def run_chain(n: int) -> list[FrameResult]:
    run = compile_workflow(CHAIN, CTX, REGISTRY).instantiate()
    image = np.full((120, 200, 3), 200, np.uint8)
    return [run.run(frame(i, image=image)) for i in range(n)]


def test_blocks_behind_the_limit_run_every_nth_frame() -> None:
    results = run_chain(6)
    ran = [[span is not None for span in r.block_spans] for r in results]
    # Order: boxes, limit, cut, hidden, drawn. cut and hidden read only the limit.
    assert [row[2] for row in ran] == [True, False, False, True, False, False]
    assert [row[3] for row in ran] == [True, False, False, True, False, False]
    assert all(row[0] and row[1] and row[4] for row in ran)  # fresh inputs: every frame
    crops: list[Crops] = [r.outputs["crops"] for r in results]
    # Held outputs are the very objects of the last run, with that frame's box.
    assert crops[1] is crops[0] and crops[2] is crops[0] and crops[4] is crops[3]
    assert [c.detections.xyxy[0, 0] for c in crops] == [0, 0, 0, 30, 30, 30]


def test_a_block_with_a_fresh_and_a_held_input_runs_with_the_held_value() -> None:
    results = run_chain(5)
    video = results[4].drawn()
    # The held blur (box of frame 3: x 30-50 filled black) under the fresh box of
    # frame 4 (x 40-60), drawn in class 0's colour.
    assert np.all(video[15:25, 32:38] == 0)  # inside frame 3's box, clear of frame 4's
    assert tuple(video[20, 60]) != (200, 200, 200)  # frame 4's right edge was drawn
    assert np.all(video[15:25, 70:190] == 200)


def test_a_limited_value_keeps_its_kind() -> None:
    wrong = {
        "blocks": [
            {"id": "limit", "type": "rate_limit", "value": "frame", "every_n_frames": 2},
            {"id": "cut", "type": "crop", "detections": "limit"},
        ],
        "outputs": {"crops": "cut"},
    }
    with pytest.raises(WorkflowError, match=r"detections: expected detections, got image"):
        compile_workflow(wrong, CTX)


def test_the_documented_example_compiles_and_runs(tmp_path: Path) -> None:
    path = tmp_path / "colours.onnx"
    path.write_bytes(classifier_model())
    cfg = ModelSpec.model_validate({"path": path, "providers": ["cpu"]})
    with ModelBatcher(load_model("colours", cfg, Path.resolve), BatchingSpec()) as colours:
        ctx = BuildContext(models={"colours": colours})
        run = compile_workflow(doc_example("rate_limit"), ctx, DOC_REGISTRY).instantiate()
        image = render([(20, 20, 60, 60)])
        results = [run.run(frame(i, t, image)) for i, t in enumerate([0.0, 0.5, 1.0, 1.5])]
    ids = run.workflow.block_ids
    ran = {b: [r.block_spans[ids.index(b)] is not None for r in results] for b in ids}
    assert ran["car_crops"] == ran["colour"] == [True, False, True, False]  # once a second
    assert ran["drawn"] == [True] * 4
    assert results[1].outputs["colour"] is results[0].outputs["colour"]  # held
