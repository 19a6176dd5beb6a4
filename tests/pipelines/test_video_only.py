"""A run without video (nobody watches the stream) leaves out the steps that only draw,
and nothing else: the same tracks and counts frame by frame, no image at all rather than a
stale or unblurred one."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from pipelines.blocks.base import BlockType, BuildContext, StepFactory
from pipelines.compiler import compile_workflow
from pipelines.executor import CompiledWorkflow
from pipelines.registry import BUILTIN_BLOCKS, BlockRegistry
from pipelines.types import Detections, Frame

W, H = 320, 240


class Walkers(BlockType):
    """Two people walking across the frame in opposite directions, one box each: a real
    tracker and line counter get something to follow without a model."""

    type_name = "walkers"
    outputs = {"detections": "detections"}
    wants_frame = True

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        def walkers(frame: Frame) -> Detections:
            x = 10.0 + 6.0 * frame.seq  # px per frame
            boxes = [[x, 60, x + 40, 160], [W - 50 - x, 80, W - 10 - x, 180]]
            return Detections.from_arrays(boxes, [0.9, 0.8], [0, 0])

        return lambda: walkers


REGISTRY = BlockRegistry({**BUILTIN_BLOCKS, "walkers": f"{__name__}:Walkers"})

COUNTER: dict[str, Any] = {
    "name": "counter",
    "blocks": [
        {"id": "people", "type": "walkers"},
        {"id": "tracks", "type": "track", "detections": "people", "min_hits": 1},
        {"id": "door", "type": "line_counter", "tracks": "tracks",
         "line": [[0.5, 0.0], [0.5, 1.0]], "anchor": "center"},
        {"id": "hidden", "type": "blur", "detections": "tracks", "method": "fill"},
        {"id": "drawn", "type": "annotate", "image": "hidden", "detections": "tracks",
         "counts": "door"},
    ],
    "outputs": {"video": "drawn", "people": "tracks", "door": "door"},
}  # fmt: skip


def compiled(doc: dict[str, Any]) -> CompiledWorkflow:
    return compile_workflow(doc, BuildContext(models={}), REGISTRY)


def frame(seq: int) -> Frame:
    image = np.full((H, W, 3), 255, np.uint8)
    return Frame("cam", seq, None, time.time(), time.perf_counter(), image)


def test_only_drawing_that_feeds_nothing_but_the_video_is_left_out() -> None:
    wf = compiled(COUNTER)
    assert sorted(wf.block_ids[i] for i in wf.video_only) == ["drawn", "hidden"]
    # The blurred image is an output of its own: the blur must run, the drawing need not.
    both = {**COUNTER, "outputs": {**COUNTER["outputs"], "blurred": "hidden"}}
    assert [compiled(both).block_ids[i] for i in compiled(both).video_only] == ["drawn"]
    # A block that reads the blurred image (here, a second drawing shown as an output)
    # keeps the blur running too.
    reread = {
        **COUNTER,
        "blocks": [*COUNTER["blocks"], {"id": "boxes", "type": "annotate", "image": "hidden"}],
        "outputs": {**COUNTER["outputs"], "boxes": "boxes"},
    }
    assert [compiled(reread).block_ids[i] for i in compiled(reread).video_only] == ["drawn"]
    # No video output, nothing to leave out (the frame itself is the video).
    plain = {**COUNTER, "blocks": COUNTER["blocks"][:3], "outputs": {"door": "door"}}
    assert compiled(plain).video_only == frozenset()


def test_tracks_and_counts_are_the_same_whether_anyone_watches() -> None:
    wf = compiled(COUNTER)
    lit, dark = wf.instantiate(), wf.instantiate()
    drawn = dark_count = 0
    for seq in range(60):
        watched = seq % 7 in (3, 4)  # a viewer comes and goes on the dark run
        a, b = lit.run(frame(seq)), dark.run(frame(seq), video=watched)
        tracks_a, tracks_b = a.outputs["people"], b.outputs["people"]
        assert np.array_equal(tracks_a.xyxy, tracks_b.xyxy)
        assert np.array_equal(tracks_a.tracker_id, tracks_b.tracker_id)
        assert a.outputs["door"] == b.outputs["door"]
        if watched:
            drawn += 1
            assert np.array_equal(a.drawn(), b.drawn())  # the same drawing, no stale parts
        else:
            dark_count += 1
            assert b.image is None
            assert b.predictions_json() == a.predictions_json()  # no `video: null` either
            spans = dict(zip(wf.block_ids, b.block_spans, strict=True))
            assert spans["hidden"] is None and spans["drawn"] is None
            assert spans["tracks"] is not None and spans["door"] is not None
    assert lit.run(frame(60)).outputs["door"] == {"in": 1, "out": 1, "total": 2}
    assert drawn and dark_count


def test_a_frame_nobody_watched_never_shows_the_faces_a_blur_would_hide() -> None:
    wf = compiled(COUNTER)
    run = wf.instantiate()
    watched = run.run(frame(5))
    hidden = watched.drawn()
    x1 = 10 + 6 * 5  # the first walker's box, filled black by the blur
    assert np.all(hidden[70:150, x1 + 5 : x1 + 35] == 0)
    unwatched = run.run(frame(6), video=False)
    assert unwatched.image is None  # not the frame as captured, not the last drawn one
    try:
        unwatched.drawn()
    except ValueError as exc:
        assert "cam#6" in str(exc)
    else:
        raise AssertionError("drawn() gave an image nobody drew")
    assert unwatched.captured() is not None  # the raw frame stays for who may see it


def test_cpu_timed_runs_leave_out_the_same_steps() -> None:
    wf = compiled(COUNTER)
    run = wf.instantiate(time.thread_time_ns)
    result = run.run(frame(3), video=False)
    cpu = dict(zip(wf.block_ids, result.block_cpu_ns, strict=True))
    assert cpu["hidden"] == 0 and cpu["drawn"] == 0 and cpu["tracks"] > 0
    assert result.image is None


def test_the_first_watched_frame_is_drawn_even_while_its_inputs_are_rate_limited() -> None:
    # The boxes reach the drawing through a rate limit: on most frames the drawing's
    # inputs are stale and it keeps its last image. A frame nobody watched left no image
    # to keep, so the first watched frame after it draws whatever its inputs say.
    limited = {
        **COUNTER,
        "blocks": [
            {"id": "people", "type": "walkers"},
            {"id": "slow", "type": "rate_limit", "value": "people", "every_n_frames": 5},
            {"id": "drawn", "type": "annotate", "detections": "slow"},
        ],
        "outputs": {"video": "drawn", "people": "people"},
    }
    run = compiled(limited).instantiate()
    assert run.run(frame(0)).image is not None  # the limit passes the first frame
    assert run.run(frame(1), video=False).image is None
    watched = run.run(frame(2))  # `slow` is stale on frame 2: drawn all the same
    assert watched.image is not None
    assert run.run(frame(3)).image is watched.image  # then the last image is kept again
