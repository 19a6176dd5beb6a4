"""The compiler: every problem reported with its location; valid graphs ordered and bound."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from pipelines.blocks.base import BlockParams, BlockType, BuildContext, StepFactory, stateless
from pipelines.compiler import compile_workflow, parse_workflow, workflow_digest
from pipelines.errors import TooManyBlocksError, WorkflowError
from pipelines.registry import BlockRegistry
from pipelines.types import Frame


class InvertParams(BlockParams):
    amount: int = 255


class Invert(BlockType):
    """image -> image: a real, tiny block to exercise the compiler without a model."""

    type_name = "invert"
    Params = InvertParams
    inputs = {"image": ("image", "frame")}
    outputs = {"image": "image"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        amount = np.uint8(params.amount)
        return stateless(lambda image: amount - image)


class Brightness(BlockType):
    """image -> (mean, max): two outputs, returned as a tuple."""

    type_name = "brightness"
    inputs = {"image": ("image", None)}
    outputs = {"mean": "scalar", "max": "scalar"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        return stateless(lambda image: (float(image.mean()), int(image.max())))


class StreamName(BlockType):
    """Uses the Frame the executor passes to blocks that ask for it."""

    type_name = "stream_name"
    outputs = {"name": "scalar"}
    wants_frame = True

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        return stateless(lambda frame: frame.stream_id)


class Same(BlockType):
    """value -> value, of the kind it reads (`like:`): a pass-through, as filter is."""

    type_name = "same"
    inputs = {"value": ("any", None)}
    outputs = {"value": "like:value"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        return stateless(lambda value: value)


REGISTRY = BlockRegistry(
    {
        "invert": f"{__name__}:Invert",
        "same": f"{__name__}:Same",
        "brightness": f"{__name__}:Brightness",
        "stream_name": f"{__name__}:StreamName",
        "detect": "pipelines.blocks.detect:DetectBlock",
        "broken": "no.such.module:Block",
    }
)
CTX = BuildContext(models={})


def compile_(doc: dict[str, Any]) -> Any:
    return compile_workflow(doc, CTX, REGISTRY)


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(WorkflowError) as info:
        compile_(doc)
    return info.value.problems


def frame(value: int = 10) -> Frame:
    image = np.full((4, 6, 3), value, np.uint8)
    return Frame("cam1", 7, 0.5, time.time(), time.perf_counter(), image)


def test_runs_blocks_in_dependency_order_whatever_the_file_order() -> None:
    wf = compile_(
        {
            "name": "t",
            "blocks": [
                {"id": "stats", "type": "brightness", "image": "twice"},
                {"id": "twice", "type": "invert", "image": "once"},
                {"id": "once", "type": "invert", "amount": 100},
                {"id": "who", "type": "stream_name"},
            ],
            "outputs": {"video": "once", "mean": "stats.mean", "max": "stats.max", "who": "who"},
        }
    )
    assert wf.block_ids == ("once", "who", "twice", "stats")  # Kahn levels, file order within
    result = wf.instantiate().run(frame(10))
    assert result.outputs["mean"] == 255 - (100 - 10)
    assert result.outputs["max"] == 165
    assert result.outputs["who"] == "cam1"
    assert int(result.drawn()[0, 0, 0]) == 90  # the `video` output
    assert len(result.block_spans) == 4
    assert all(t1 >= t0 for t0, t1 in result.block_spans)
    assert (result.stream_id, result.seq) == ("cam1", 7)


def test_each_blocks_cpu_time_is_recorded_when_asked() -> None:
    """The regression watch's own-cost measure: each block's thread CPU ns, in workflow
    order, only on a run asked to measure it (two clock reads a block)."""
    wf = compile_(
        {
            "name": "t",
            "blocks": [
                {"id": "once", "type": "invert"},
                {"id": "stats", "type": "brightness", "image": "once"},
            ],
            "outputs": {"video": "once", "mean": "stats.mean"},
        }
    )
    assert wf.instantiate().run(frame()).block_cpu_ns == ()
    run = wf.instantiate(cpu_clock=time.thread_time_ns)
    big = Frame("cam1", 1, 0.0, time.time(), time.perf_counter(), np.ones((720, 1280, 3), np.uint8))
    cpu = run.run(big).block_cpu_ns
    assert len(cpu) == 2 and all(ns > 0 for ns in cpu)
    # Bounded by the frame's own CPU: the blocks ran on this thread, nowhere else.
    started = time.thread_time_ns()
    cpu = run.run(big).block_cpu_ns
    assert sum(cpu) <= time.thread_time_ns() - started
    run.measure_cpu(False)
    assert run.run(big).block_cpu_ns == ()


def test_every_problem_is_reported_with_its_location() -> None:
    found = problems(
        {
            "name": "bad",
            "blocks": [
                {"id": "people", "type": "invert"},
                {"id": "b", "type": "invert", "image": "peple"},
                {"id": "c", "type": "invrt"},
                {"id": "d", "type": "invert", "amount": "lots"},
                {"id": "e", "type": "invert", "colour": "red"},
                {"id": "people", "type": "invert"},
                {"id": "f", "type": "brightness"},
                {"id": "g", "type": "qqqq", "image": "c"},
            ],
            "outputs": {"x": "nowhere.image", "y": "people.nope", "z": "c.image"},
        }
    )
    text = "\n".join(found)
    assert "blocks[1].image: unknown block 'peple' (did you mean 'people'?)" in found
    assert "blocks[2].type: unknown block type 'invrt' (did you mean 'invert'?)" in text
    assert "blocks[7].type: unknown block type 'qqqq' (known: brightness, broken, detect, " in text
    assert any(p.startswith("blocks[3].amount:") and "'lots'" in p for p in found)
    assert "blocks[4].colour: unknown parameter (known: amount)" in found
    assert "blocks[5].id: duplicate id 'people' (first at blocks[0])" in found
    assert "blocks[6].image: required input is missing" in found
    assert "outputs.x: unknown block 'nowhere'" in text
    assert "outputs.y: block 'people' has no output 'nope' (outputs: image)" in found
    # One message per root cause: nothing about 'c' or 'g' past their types (their
    # readers, `outputs.z`), and no "never used" for blocks a broken reference left unread.
    assert len(found) == 9, found


def test_unused_blocks_are_rejected_and_outputs_count_as_use() -> None:
    doc = {
        "blocks": [
            {"id": "a", "type": "invert"},
            {"id": "b", "type": "invert", "image": "a"},
            {"id": "c", "type": "invert"},
        ],
        "outputs": {"video": "b"},
    }
    assert problems(doc) == [
        "blocks[2]: the output of 'c' is never used "
        "(use it in another block or in `outputs`, or remove the block)"
    ]


def test_optional_inputs_and_subkinds() -> None:
    class Maybe(BlockType):
        type_name = "maybe"
        inputs = {"image": ("image", "frame"), "extra": ("detections", "")}
        outputs = {"has_extra": "scalar"}

        @classmethod
        def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
            return stateless(lambda image, extra: extra is not None)

    registry = BlockRegistry({"maybe": f"{__name__}:Maybe"})
    globals()["Maybe"] = Maybe
    wf = compile_workflow(
        {"blocks": [{"id": "m", "type": "maybe"}], "outputs": {"m": "m"}}, CTX, registry
    )
    assert wf.instantiate().run(frame()).outputs["m"] is False


def test_cycles_are_named() -> None:
    found = problems(
        {
            "blocks": [
                {"id": "a", "type": "invert", "image": "b"},
                {"id": "b", "type": "invert", "image": "a"},
            ],
            "outputs": {"video": "a"},
        }
    )
    assert found == ["blocks[0]: cycle a → b → a"]


def test_kinds_are_checked_between_outputs_and_inputs() -> None:
    found = problems(
        {
            "blocks": [
                {"id": "s", "type": "brightness", "image": "frame"},
                {"id": "i", "type": "invert", "image": "s.mean"},
            ],
            "outputs": {"video": "s.max"},
        }
    )
    assert "blocks[1].image: expected image, got scalar from 's.mean'" in found
    assert "outputs.video: expected image, got scalar from 's.max'" in found


def test_structure_errors_and_missing_outputs() -> None:
    assert (
        problems({"blocks": [{"type": "invert"}], "outputs": {}})[0]
        == "blocks[0].id: Field required"
    )
    assert problems({"blocks": []}) == [
        "outputs: at least one output is required (e.g. `people: people`)"
    ]
    assert "(top): expected a mapping" in problems([1, 2])[0]  # type: ignore[arg-type]


def test_a_block_type_that_cannot_be_imported_is_a_located_error() -> None:
    found = problems({"blocks": [{"id": "x", "type": "broken"}], "outputs": {"x": "x"}})
    assert found[0].startswith("blocks[0].type: block type 'broken': cannot import")


def test_detect_with_an_undeclared_model_is_a_compile_error() -> None:
    found = problems(
        {"blocks": [{"id": "p", "type": "detect", "model": "person"}], "outputs": {"p": "p"}}
    )
    assert found == ["blocks[0].model: unknown model 'person' (models: none)"]


def test_digest_ignores_formatting_but_not_content() -> None:
    a = parse_workflow(
        {"name": "w", "blocks": [{"id": "x", "type": "invert"}], "outputs": {"v": "x"}}
    )
    b = parse_workflow(
        {"outputs": {"v": "x"}, "blocks": [{"type": "invert", "id": "x"}], "name": "w"}
    )
    c = parse_workflow(
        {"name": "w", "blocks": [{"id": "x", "type": "invert", "amount": 1}], "outputs": {"v": "x"}}
    )
    assert workflow_digest(a) == workflow_digest(b) != workflow_digest(c)


def test_a_misspelt_parameter_gets_a_did_you_mean() -> None:
    """`min_heigth` on a filter: the near miss is named; a far one lists what there is."""
    with pytest.raises(WorkflowError) as caught:
        compile_workflow(
            {
                "blocks": [
                    {
                        "id": "f",
                        "type": "filter",
                        "detections": "d.detections",
                        "min_heigth": 3,
                        "tint": 1,
                    },
                    {"id": "d", "type": "detect", "model": "m"},
                ],
                "outputs": {"x": "f"},
            },
            CTX,
        )
    found = caught.value.problems
    assert "blocks[0].min_heigth: unknown parameter (did you mean 'min_height'?)" in found
    far = next(p for p in found if p.startswith("blocks[0].tint:"))
    assert "(known: " in far and "min_height" in far


# -- deep and large graphs (issue 23): iterative, linear walks and a cap on blocks -------
GENEROUS_S = 10.0  # linear compiles take well under a second; the quadratic ones took minutes


def chain(n: int, first: str = "frame") -> dict[str, Any]:
    """n pass-through blocks, each reading the one before; the first reads `first`."""
    blocks = [{"id": f"b{i}", "type": "same", "value": f"b{i - 1}"} for i in range(n)]
    blocks[0]["value"] = first
    return {"name": "chain", "blocks": blocks, "outputs": {"video": f"b{n - 1}"}}


def test_a_chain_of_5000_blocks_compiles_and_runs_without_recursion() -> None:
    """Each block's kind comes from the one before it, 5000 deep: once a RecursionError
    past ~1000 blocks, and cubic time below (900 blocks: 3 s)."""
    t0 = time.perf_counter()
    wf = compile_(chain(5000))
    assert time.perf_counter() - t0 < GENEROUS_S
    assert wf.block_ids == tuple(f"b{i}" for i in range(5000))
    assert int(wf.instantiate().run(frame(42)).image[0, 0, 0]) == 42  # an image all through


def test_a_long_cycle_is_reported_as_one_cycle() -> None:
    doc = chain(3000, first="b2999")  # b0 reads the last: one circle of 3000 blocks
    t0 = time.perf_counter()
    found = problems(doc)
    assert time.perf_counter() - t0 < GENEROUS_S
    ids = ["b0", *(f"b{i}" for i in range(2999, 0, -1)), "b0"]
    assert found == ["blocks[0]: cycle " + " → ".join(ids)]


def test_many_misspelt_references_are_all_reported_in_bounded_time() -> None:
    """Each did-you-mean compares a name with every block's: hints stop past a budget,
    so 2000 misspellings among 2000 blocks are not 4 million comparisons (20 s)."""
    blocks = [{"id": f"block{i}", "type": "invert", "image": f"blok{i}x"} for i in range(2000)]
    t0 = time.perf_counter()
    found = problems({"blocks": blocks, "outputs": {"video": "block0"}})
    assert time.perf_counter() - t0 < GENEROUS_S
    assert len(found) == 2000
    assert found[0] == "blocks[0].image: unknown block 'blok0x' (did you mean 'block0'?)"
    assert found[-1] == "blocks[1999].image: unknown block 'blok1999x'"


def test_more_blocks_than_the_cap_are_refused_on_the_count_alone() -> None:
    """Not one block is looked at: malformed ones too give the count, not 11 problems."""
    with pytest.raises(TooManyBlocksError) as caught:
        compile_workflow({"name": "big", "blocks": [{}] * 11}, CTX, REGISTRY, max_blocks=10)
    assert (caught.value.count, caught.value.limit, caught.value.name) == (11, 10, "big")
    assert caught.value.problems == ["blocks: 11 blocks, more than the 10 allowed"]
    assert compile_workflow(chain(10), CTX, REGISTRY, max_blocks=10).block_ids[-1] == "b9"
    with pytest.raises(TooManyBlocksError):  # a parsed spec is counted too
        compile_workflow(parse_workflow(chain(11)), CTX, REGISTRY, max_blocks=10)
