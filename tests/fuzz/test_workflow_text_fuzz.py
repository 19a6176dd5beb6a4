"""Fuzz target: workflow documents from YAML/JSON text (pipelines/spec.py
`parse_workflow_text`, then pipelines.compiler `compile_workflow`), beyond
tests/pipelines/test_compiler_fuzz.py, which starts from Python documents.

Property: any text (dumped random workflows, their truncations and byte-level edits of the
shipped workflow files, YAML-ish noise) either compiles or raises WorkflowError naming
its origin and at least one `location: message` problem; never another exception, never
a hang. The shipped workflows, as text, compile (the mutation seed is real).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from pipelines.blocks.base import BuildContext
from pipelines.compiler import compile_workflow
from pipelines.errors import WorkflowError
from pipelines.registry import BUILTIN_BLOCKS
from pipelines.spec import parse_workflow_text
from tests.fuzz.support import DOCUMENTS, fuzz, no_hang

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [p.read_text() for p in sorted((ROOT / "configs" / "workflows").glob("*.yaml"))]
CONTEXT = BuildContext(models={})  # a block naming a model gets "unknown model": a WorkflowError

BLOCKS = st.fixed_dictionaries(
    {"id": st.sampled_from(["a", "b", "frame", "1x", ""]),
     "type": st.sampled_from([*BUILTIN_BLOCKS, "nope"])},
    optional={"image": st.sampled_from(["frame", "a", "a.image"]),
              "detections": st.sampled_from(["a", "b.detections"]), "x": DOCUMENTS},
)  # fmt: skip
WORKFLOWS = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=6) | DOCUMENTS,
        "blocks": st.lists(BLOCKS, max_size=4) | DOCUMENTS,
        "outputs": st.dictionaries(st.text(max_size=4), st.sampled_from(["a", "b.x"])),
        "models": DOCUMENTS,
    },
)


def _edits(text: str) -> st.SearchStrategy[str]:
    """`text` with a few spans replaced by YAML-ish noise."""
    noise = st.text(alphabet="{}[]:,-&*!|>'\"#\n x1", max_size=6)
    edit = st.tuples(st.integers(0, len(text)), st.integers(0, 8), noise)

    def apply(edits: list[tuple[int, int, str]]) -> str:
        out = text
        for at, width, new in edits:
            out = out[:at] + new + out[at + width :]
        return out

    return st.lists(edit, min_size=1, max_size=3).map(apply)


TEXTS = st.one_of(
    WORKFLOWS.map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
    st.tuples(WORKFLOWS.map(yaml.safe_dump), st.integers(0, 200)).map(lambda t: t[0][: t[1]]),
    st.sampled_from(SHIPPED).flatmap(_edits),
    st.text(alphabet="{}[]:,-&*!|>'\"#\n abtyp", max_size=40),
)


def check(text: str) -> None:
    try:
        with no_hang():
            doc = parse_workflow_text(text, "fuzz.yaml")
    except WorkflowError as exc:  # the text: named by its origin
        assert str(exc).startswith("fuzz.yaml: ") and exc.problems, str(exc)
        assert all(isinstance(p, str) and ": " in p for p in exc.problems)
        return
    assert isinstance(doc, dict)
    try:
        with no_hang():
            compile_workflow(doc, CONTEXT)
    except WorkflowError as exc:  # the document: named by the workflow's name
        assert exc.problems and all(isinstance(p, str) and ": " in p for p in exc.problems)
        assert not [p for p in exc.problems if "failed to build" in p], exc.problems


def test_shipped_workflows_parse() -> None:
    for text in SHIPPED:
        doc = parse_workflow_text(text, "shipped")
        assert doc["blocks"]


@fuzz(150)
@given(TEXTS)
def test_any_workflow_text(text: str) -> None:
    check(text)
