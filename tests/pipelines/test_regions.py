"""The lines and zones a compiled workflow counts against (CompiledWorkflow.regions), as
viewers get them from GET /v1/streams/{id}/scene: the documented examples' own points and
units, in workflow order, and none for a workflow without counters."""

from __future__ import annotations

from pipelines.blocks.base import BuildContext
from pipelines.compiler import compile_workflow
from tests.blocks.tracking_clips import REGISTRY, doc_example


def test_counters_declare_their_line_and_zone() -> None:
    doc = doc_example("line_counter")
    zone = next(b for b in doc_example("zone_counter")["blocks"] if b["type"] == "zone_counter")
    line = next(b for b in doc["blocks"] if b["type"] == "line_counter")
    doc["blocks"].append({**zone, "id": "dock", "tracks": line["tracks"]})
    doc["blocks"].append({**line, "id": "door_px", "line": [[10, 20], [300, 20]], "units": "px"})
    doc["outputs"].update(dock="dock", door_px="door_px")
    compiled = compile_workflow(doc, BuildContext(models={}), REGISTRY)
    regions = [r.to_json() for r in compiled.regions]
    assert [(r["block"], r["kind"]) for r in regions] == [
        (line["id"], "line"), ("dock", "zone"), ("door_px", "line")]  # fmt: skip
    assert regions[0]["points"] == [list(map(float, p)) for p in line["line"]]
    assert regions[1]["points"] == [list(map(float, p)) for p in zone["zone"]]
    assert [r["units"] for r in regions] == ["norm", "norm", "px"]


def test_a_workflow_without_counters_has_none() -> None:
    doc = {"name": "w", "blocks": [{"id": "d", "type": "contours"}], "outputs": {"d": "d"}}
    assert compile_workflow(doc, BuildContext(models={}), REGISTRY).regions == ()
