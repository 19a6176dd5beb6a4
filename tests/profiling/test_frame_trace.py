"""A frame's trace (appliance/profiling/frametrace.py) from the tracer's own spans: cut
from the writer's recent flushes, then from the rolling file that holds it (the file
being written closed early for it), then a 404 naming the oldest frame held once its
file has rotated away. Every cut passes the strict checker: no flow to nowhere."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from appliance.errors import FrameNotHeldError
from appliance.models.batches import BatchRecord
from appliance.profiling.frameindex import FrameRanges
from appliance.profiling.frametrace import FrameTraces, RecentEvents, cut, read_trace
from appliance.profiling.hooks import StreamTrace, trace_batch
from appliance.profiling.rolling import RollingWriter
from appliance.profiling.tracer import Tracer
from pipelines.types import FrameResult
from tests.support import tracecheck

WORKFLOW: Any = types.SimpleNamespace(
    name="wf", block_ids=("people", "count"), block_types=("detect", "zone_counter")
)
FRAME_S = 0.1  # one frame's time on the synthetic clock (perf_counter s)


def frames(tracer: Tracer, trace: StreamTrace, seqs: range, t0: float = 1000.0) -> None:
    """Frames `seqs`, each grabbed, batched with another stream's sample, then run."""
    trace.bind()
    for seq in seqs:
        start = t0 + seq * FRAME_S
        trace.grabbed(seq, start, start + 0.01, start + 0.02)
        record = BatchRecord("person", 2, ("cam", "other"), (0.005, 0.001), start + 0.04, 0.02)
        trace_batch(tracer, record)
        spans = [(start + 0.03, start + 0.07), (start + 0.07, start + 0.08)]
        trace(
            FrameResult("cam", seq, None, 0.0, start, start + 0.03, start + 0.08, None, {}, spans)
        )


def setup(
    tmp_path: Path, ring: int = 100_000
) -> tuple[Tracer, StreamTrace, RollingWriter, FrameTraces]:
    tracer = Tracer()
    writer = RollingWriter(tracer, tmp_path, rotate_s=600, keep_files=2)
    recent = RecentEvents(ring)
    writer.listeners.append(recent)
    return tracer, StreamTrace(tracer, "cam", WORKFLOW), writer, FrameTraces(writer, recent)


def spans_of(doc: dict[str, Any], name: str) -> list[int]:
    return sorted(
        e["args"]["seq"]
        for e in doc["traceEvents"]
        if e["ph"] == "X" and e["name"] == name and e.get("args", {}).get("stream") == "cam"
    )


def test_a_recent_frame_comes_from_memory_with_its_neighbours_and_its_batch(
    tmp_path: Path,
) -> None:
    tracer, trace, writer, traces = setup(tmp_path)
    frames(tracer, trace, range(10))
    found = traces.trace("cam", 5, around=2)
    writer.rotate()
    assert found.source == "ring"
    tracecheck.check(found.doc)
    assert spans_of(found.doc, "workflow.run") == [3, 4, 5, 6, 7]
    assert spans_of(found.doc, "grab") == [3, 4, 5, 6, 7]
    names = {e["name"] for e in found.doc["traceEvents"]}
    assert {"people", "count", "session.run", "queue.wait", "read", "decode"} <= names
    threads = {e["args"]["name"] for e in found.doc["traceEvents"] if e["name"] == "thread_name"}
    assert "batch:person" in threads
    # Flows: each kept one has both ends (the frame's grab -> run, a wait -> its batch).
    ids = [e["id"] for e in found.doc["traceEvents"] if e["ph"] in ("s", "f")]
    assert ids and all(ids.count(i) == 2 for i in ids)
    binds = [e["bind_id"] for e in found.doc["traceEvents"] if "bind_id" in e]
    assert binds and all(binds.count(b) == 2 for b in binds)
    assert found.doc["otherData"]["frames"] == [3, 4, 5, 6, 7]


def test_a_cut_leaves_out_the_flows_whose_other_end_it_does_not_hold() -> None:
    x = {"ph": "X", "pid": 1, "tid": 1, "dur": 10, "args": {"stream": "cam", "seq": 1}}
    events = [
        {**x, "name": "grab", "ts": 0, "bind_id": 9, "flow_out": True},
        {**x, "name": "workflow.run", "ts": 100, "bind_id": 8, "flow_in": True},
        {"ph": "s", "name": "sample", "id": 7, "ts": 100, "pid": 1, "tid": 1},
    ]
    doc = cut(events, [], "cam", 1, around=0)
    assert doc is not None
    kept = doc["traceEvents"]
    assert [e["name"] for e in kept] == ["grab", "workflow.run"]
    assert all("bind_id" not in e and "flow_in" not in e and "flow_out" not in e for e in kept)


def test_an_older_frame_comes_from_its_rolling_file_then_404_once_rotated_away(
    tmp_path: Path,
) -> None:
    tracer, trace, writer, traces = setup(tmp_path, ring=50)  # the ring: the last flush only
    for k in range(4):  # four files of 20 frames each; two kept
        frames(tracer, trace, range(20 * k, 20 * k + 20))
        writer.rotate()
    frames(tracer, trace, range(80, 100))
    writer.flush()  # frames 80..99: in the ring, and in the file being written
    frames(tracer, trace, range(100, 120))  # the next flush: 80..99 leave the ring
    found = traces.trace("cam", 70)
    assert found.source.startswith("file:trace-")
    tracecheck.check(found.doc)
    assert spans_of(found.doc, "workflow.run") == [68, 69, 70, 71, 72]
    files = sorted((tmp_path / "rolling").glob("trace-*.json"))
    assert len(files) == 2  # 40..59 and 60..79: 0..39 rotated away
    doc = read_trace(files[-1])
    assert FrameRanges(doc["otherData"]["frames"]).holds("cam", 70)  # the file says so

    writer.flush()  # 100..119 flushed: 80..99 are only in the file being written
    before = len(list((tmp_path / "rolling").glob("trace-*.json")))
    found = traces.trace("cam", 85)  # that file is closed early for it
    assert found.source.startswith("file:") and spans_of(found.doc, "workflow.run")[2] == 85
    assert len(list((tmp_path / "rolling").glob("trace-*.json"))) == before  # 2 kept

    with pytest.raises(FrameNotHeldError) as refused:
        traces.trace("cam", 10)
    assert refused.value.oldest == 60  # the oldest file left holds 60..79
    with pytest.raises(FrameNotHeldError):
        traces.trace("cam", 10_000)  # never run: and no file was rotated for it
    assert len(list((tmp_path / "rolling").glob("trace-*.json"))) == before
    writer.rotate()


def test_a_file_written_before_a_restart_is_read_by_its_own_index(tmp_path: Path) -> None:
    tracer, trace, writer, _ = setup(tmp_path)
    frames(tracer, trace, range(30))
    writer.rotate()
    later = FrameTraces(RollingWriter(Tracer(), tmp_path), RecentEvents())  # a new process
    found = later.trace("cam", 12)
    assert found.source.startswith("file:") and spans_of(found.doc, "workflow.run")[2] == 12
