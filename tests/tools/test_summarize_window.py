"""`appliance trace summarize` on a real profiling window over two models: every operator
row names its own model, and the header names each figure (issue 30, item 7)."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from appliance.config import parse_config
from appliance.runtime.runtime import Runtime
from tests.blocks.classifier_model import classifier_model
from tests.support.appliance import DEMO_CLIP, person_model
from tests.tools import node, run_cli, span, write_trace

# ORT names the colour classifier's three unnamed nodes after their op and index.
COLOUR_NODES = {
    "colours/GlobalAveragePool_0": "GlobalAveragePool",
    "colours/Flatten_1": "Flatten",
    "colours/MatMul_2": "MatMul",
}


def stream(stream_id: str, block: dict[str, str]) -> dict[str, object]:
    return {
        "id": stream_id,
        "source": {"url": str(DEMO_CLIP), "pace": "realtime", "loop": True},
        "workflow": {"name": stream_id, "blocks": [block], "outputs": {"out": block["id"]}},
    }


@pytest.fixture(scope="module")
def window_trace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 1 s window with operators over stream `people` (model person, ssdlite) and
    stream `colour` (model colours, a 3-node classifier of the whole frame)."""
    folder = tmp_path_factory.mktemp("window")
    (folder / "colours.onnx").write_bytes(classifier_model((32, 32)))
    doc = {
        # Every batch profiled, at most 3 per model: both models' operators in 1 s.
        "profiling": {
            "dir": "traces",
            "max_window_s": 5,
            "ort_sample_every_n_batches": 1,
            "ort_max_runs_per_window": 3,
        },
        "models": {
            "person": person_model(),
            "colours": {"path": str(folder / "colours.onnx"), "providers": ["cpu"]},
        },
        "streams": [
            stream("people", {"id": "people", "type": "detect", "model": "person"}),
            stream("colour", {"id": "colour", "type": "classify", "model": "colours"}),
        ],
    }
    rt = Runtime(parse_config(doc, folder))
    rt.start()
    try:
        window = rt.start_profiling(1.0, None, ort_operators=True)
        done = threading.Event()
        for _ in range(400):  # 20 s at most on a loaded machine
            if rt.profiling_window(window.id).state != "running":
                break
            done.wait(0.05)
        assert rt.profiling_window(window.id).state == "done"
        yield rt.profiling_trace(window.id)
    finally:
        rt.stop()


def test_every_operator_row_names_its_model(
    window_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = json.loads(window_trace.read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") == "Node"]
    assert {e["args"]["model"] for e in ops} == {"person", "colours"}  # the trace says so
    code, out, _ = run_cli(["trace", "summarize", str(window_trace), "--json"], capsys)
    assert code == 0
    nodes = json.loads(out)["nodes"]
    by_model: dict[str, set[str]] = defaultdict(set)
    for key, stats in nodes.items():
        by_model[stats["model"]].add(key)
    assert set(by_model) == {"person", "colours"}, by_model  # none is "-"
    assert by_model["colours"] == set(COLOUR_NODES)
    assert {k: nodes[k]["op"] for k in COLOUR_NODES} == COLOUR_NODES
    assert len(by_model["person"]) > 10 and all(k.startswith("person/") for k in by_model["person"])
    assert "Conv" in {nodes[k]["op"] for k in by_model["person"]}
    # A model's node shares add up within that model (each rounded to 0.01), not across both.
    for keys in by_model.values():
        assert sum(nodes[k]["share"] for k in keys) == pytest.approx(100, abs=0.01 * len(keys))
    # The table names the model in each row.
    _, table, _ = run_cli(["trace", "summarize", str(window_trace), "--top", "0"], capsys)
    rows = table.split("\nnodes (model/node)")[1].split("\n\n")[0].splitlines()[1:]
    assert {row.split()[0] for row in rows} == set(nodes)


def test_the_header_names_each_figure(
    window_trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["trace", "summarize", str(window_trace)], capsys)
    assert code == 0
    header = out.splitlines()[0]
    fp = json.loads(run_cli(["trace", "summarize", str(window_trace), "--json"], capsys)[1])
    # The header prints the --json output's own figures, so it is compared with them, not
    # with a sum of per-block totals that were each rounded to 1 us (such a sum can cross
    # a 0.05 ms boundary the unrounded total does not: 360.4 against 360.5 in one run).
    model_ms = sum(m["total_ms"] for m in fp["models"].values())
    assert header == (
        f"{window_trace}: window 1.0 s; {fp['block_ms']:.1f} ms of block time over 2 streams; "
        f"{model_ms:.1f} ms of session.run over 2 models"
    )
    # ... and the total is the blocks' totals, each off by at most half a microsecond.
    block_ms = sum(b["total_ms"] for b in fp["blocks"].values())
    assert fp["window_s"] == 1.0
    assert fp["block_ms"] == pytest.approx(block_ms, abs=0.0005 * (len(fp["blocks"]) + 1))


def test_nodes_without_a_model_take_their_session_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A window trace written before operators named their model: each node belongs to
    the session.run span that holds it on its own track; one in none is model "-"."""
    events = [
        {**span("model", "session.run", 1000, 500, model="person"), "tid": 7},
        {**span("model", "session.run", 1000, 500, model="colours"), "tid": 8},
        {**node("conv", "Conv", 100), "ts": 1100, "tid": 7},
        {**node("conv", "Conv", 300), "ts": 1200, "tid": 8},  # same name, other model
        {**node("late", "Relu", 100), "ts": 1450, "tid": 7},  # ends after its run
    ]
    path = write_trace(tmp_path / "old.json", events)
    nodes = json.loads(run_cli(["trace", "summarize", str(path), "--json"], capsys)[1])["nodes"]
    assert {k: (n["model"], n["total_us"]) for k, n in nodes.items()} == {
        "colours/conv": ("colours", 300),
        "person/conv": ("person", 100),
        "late": ("-", 100),
    }
