"""The rolling writer on its own: a file written in flushes reads back as one closed
trace with each thread named once, appears under its name only when its period ends,
and a failed period is counted once and dropped, never raised."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from appliance.profiling.rolling import CHUNK, RollingWriter
from appliance.profiling.tracer import Tracer
from tests.support import tracecheck


def spans_on_threads(tracer: Tracer, start: float, count: int) -> None:
    """`count` spans from this thread and `count` from another (two named tracks)."""

    def record() -> None:
        for i in range(count):
            tracer.span("x", "block", start + i, start + i + 0.5)

    record()
    worker = threading.Thread(target=record, name="other")
    worker.start()
    worker.join()


@pytest.mark.parametrize("compress", [False, True])
def test_a_file_written_in_flushes_is_one_closed_trace(tmp_path: Path, compress: bool) -> None:
    tracer = Tracer()
    writer = RollingWriter(tracer, tmp_path, rotate_s=600, compress=compress)
    rolling = tmp_path / "rolling"
    for k in range(3):  # three flushes, one of them over several chunks
        spans_on_threads(tracer, 10.0 * k, CHUNK + 7 if k == 1 else 5)
        writer.flush()
        pending = list(rolling.iterdir())
        assert [p.suffix for p in pending] == [".tmp"]  # not under its name before the end
    path = writer.rotate()
    assert path is not None and path.parent == rolling
    assert [p.name for p in rolling.iterdir()] == [path.name]
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if compress else raw)
    tracecheck.check(doc)
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 2 * (5 + CHUNK + 7 + 5)
    named = [e["tid"] for e in doc["traceEvents"] if e["name"] == "thread_name"]
    assert sorted(named) == sorted({e["tid"] for e in spans})  # each track named, once
    assert len(named) == 4  # this thread and three others, one per flush
    assert sum(e["name"] == "process_name" for e in doc["traceEvents"]) == 1


def test_a_period_ends_by_time_and_only_with_events(tmp_path: Path) -> None:
    tracer = Tracer()
    writer = RollingWriter(tracer, tmp_path, rotate_s=0.05)
    writer.flush()  # nothing recorded: no file
    assert not (tmp_path / "rolling").exists()
    tracer.span("x", "block", 1.0, 1.5)
    writer.flush()
    threading.Event().wait(0.06)
    writer.flush()  # the period has lasted rotate_s: the file is closed
    files = list((tmp_path / "rolling").iterdir())
    assert [f.suffix for f in files] == [".json"]
    tracecheck.load(files[0])


def test_a_failed_period_is_counted_once_and_dropped(tmp_path: Path) -> None:
    blocker = tmp_path / "traces"
    blocker.write_text("a file where the trace folder should be")
    errors = Counter("errors", "", registry=CollectorRegistry())
    tracer = Tracer()
    writer = RollingWriter(tracer, blocker, rotate_s=600, errors=errors)
    for k in range(3):
        tracer.span("x", "block", float(k), k + 0.5)
        writer.flush()
    assert writer.rotate() is None
    assert errors._value.get() == 1  # one file lost, not one error per flush
    assert writer.last_error is not None and str(blocker) in writer.last_error
    blocker.unlink()  # the folder can be made again: the next period is written
    tracer.span("y", "block", 5.0, 5.5)
    path = writer.rotate()
    assert path is not None
    assert [e["name"] for e in tracecheck.load(path)["traceEvents"] if e["ph"] == "X"] == ["y"]
    assert writer.last_error is None


def test_a_folder_replaced_by_a_file_while_a_period_is_open_loses_only_that_period(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "traces"
    errors = Counter("errors", "", registry=CollectorRegistry())
    tracer = Tracer()
    writer = RollingWriter(tracer, folder, rotate_s=600, errors=errors)
    tracer.span("x", "block", 0.0, 0.5)
    writer.flush()  # the period's file is open in the folder
    folder.rename(tmp_path / "moved")
    folder.write_text("a file where the trace folder was")
    assert writer.rotate() is None  # its close and its clean-up both fail: no exception
    assert errors._value.get() == 1
    assert writer.last_error is not None and str(folder) in writer.last_error
    folder.unlink()
    tracer.span("y", "block", 5.0, 5.5)
    assert writer.rotate() is not None  # the next period is written


def test_a_half_written_file_of_a_dead_process_is_removed(tmp_path: Path) -> None:
    rolling = tmp_path / "rolling"
    rolling.mkdir()
    stale = rolling / "trace-20260101T000000.000000Z.json.tmp"
    stale.write_text('{"traceEvents":[')
    tracer = Tracer()
    tracer.span("x", "block", 1.0, 1.5)
    path = RollingWriter(tracer, tmp_path).rotate()
    assert path is not None and not stale.exists()
