"""Property: any document either compiles or raises WorkflowError; never anything else.

A built-in block whose build raises something unexpected is a bug. The compiler reports it
as "failed to build" rather than crashing (a plugin may raise anything), so `check` fails
on that message. The mutations start from a workflow that compiles against a real model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.models import ModelBatcher, load_model
from pipelines.blocks.base import BuildContext
from pipelines.compiler import compile_workflow
from pipelines.errors import WorkflowError
from pipelines.registry import BUILTIN_BLOCKS
from pipelines.spec import BatchingSpec, ModelSpec
from tests.support.models import MODELS

IDS = st.sampled_from(["a", "b", "people", "frame", "x.y", "", "1bad", "tracks"])
REFS = st.sampled_from(["frame", "a", "b", "a.image", "b.detections", "people", "nope.x", ""])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5000), st.floats(allow_nan=True),
    st.text(max_size=8), REFS,
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
PARAM_KEYS = st.sampled_from(
    ["image", "detections", "tracks", "crops", "model", "confidence", "classes", "line",
     "zone", "padding", "method", "every_n_frames", "every_s", "value", "units", "junk"]
)  # fmt: skip
BLOCK = st.fixed_dictionaries(
    {"id": IDS, "type": st.sampled_from([*BUILTIN_BLOCKS, "nope", ""])},
    optional={"params": st.dictionaries(PARAM_KEYS, VALUES, max_size=4)},
).map(lambda b: {"id": b["id"], "type": b["type"], **cast(dict[str, Any], b.get("params", {}))})
DOCS = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.text(max_size=10), st.integers()),
        "blocks": st.one_of(st.lists(BLOCK, max_size=5), VALUES),
        "outputs": st.one_of(st.dictionaries(st.text(max_size=6), REFS, max_size=3), VALUES),
        "models": VALUES,
        "extra": VALUES,
    },
)


def _person() -> ModelBatcher:
    """The real person detector as a model handle (never started: nothing runs)."""
    cfg = ModelSpec.model_validate(
        {"path": MODELS / "person_ssdlite.onnx", "decoder": "tf_od", "providers": ["cpu"]}
    )
    return ModelBatcher(load_model("person", cfg, Path.resolve), BatchingSpec())


CONTEXT = BuildContext(models={"person": _person()})


def check(doc: Any) -> None:
    try:
        compile_workflow(doc, CONTEXT)
    except WorkflowError as exc:
        assert exc.problems, "a WorkflowError must name at least one problem"
        assert all(isinstance(p, str) and ": " in p for p in exc.problems)
        crashed = [p for p in exc.problems if "failed to build" in p]
        assert not crashed, crashed  # a built-in block raised something unexpected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(DOCS)
def test_random_documents(doc: dict[str, Any]) -> None:
    check(doc)


VALID: dict[str, Any] = {
    "name": "people",
    "blocks": [
        {"id": "people", "type": "detect", "model": "person", "confidence": 0.5},
        {"id": "tracks", "type": "track", "detections": "people"},
        {"id": "count", "type": "line_counter", "tracks": "tracks", "line": [[0, 0.5], [1, 0.5]]},
        {"id": "video", "type": "annotate", "detections": "tracks"},
    ],
    "outputs": {"video": "video", "count": "count"},
}


def test_the_valid_workflow_compiles() -> None:
    """The mutations below start from a workflow that compiles: they reach the blocks'
    builds, not only the first check that fails."""
    compiled = compile_workflow(VALID, CONTEXT)
    assert [step.block_id for step in compiled.steps] == ["people", "tracks", "count", "video"]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_valid_workflow(data: st.DataObject) -> None:
    import copy

    doc = copy.deepcopy(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        block = data.draw(st.sampled_from(doc["blocks"]))
        key = data.draw(PARAM_KEYS | st.sampled_from(["id", "type"]))
        if data.draw(st.booleans()) and key in block:
            del block[key]
        else:
            block[key] = data.draw(VALUES)
    check(doc)
