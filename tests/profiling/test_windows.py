"""On-demand profiling windows through the real runtime: a window's trace holds what ran
during it, and with ort_operators ONNX Runtime's operators inside their session.run."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from appliance.config import parse_config
from appliance.errors import (
    UnknownWindowError,
    WindowBusyError,
    WindowNotReadyError,
    WindowRequestError,
)
from appliance.observe.status import WindowStatus, as_json
from appliance.runtime.runtime import Runtime
from tests.support import tracecheck
from tests.support.appliance import DEMO_CLIP, person_model


@pytest.fixture
def runtime(tmp_path: Path) -> Any:
    doc = {
        # Every 3rd batch of a window on the profiled session: enough runs of both kinds
        # in a 1 s window on a loaded machine (the default, 16, might sample none). Not
        # every 2nd: the two streams' batches alternate, and one stream's would be all.
        # At most 4: a 1 s window of two 15 fps streams has at least 15 batches.
        "profiling": {"dir": "traces", "rotate_s": 600, "max_window_s": 5,
                      "ort_sample_every_n_batches": 3, "ort_max_runs_per_window": 4},
        "models": {"person": person_model()},
        "streams": [
            {"id": s, "source": {"url": str(DEMO_CLIP), "pace": "realtime", "loop": True},
             "workflow": {"name": "people",
                          "blocks": [{"id": "people", "type": "detect", "model": "person"}],
                          "outputs": {"people": "people"}}}
            for s in ("a", "b")
        ],
    }  # fmt: skip
    rt = Runtime(parse_config(doc, tmp_path))
    rt.start()
    yield rt
    rt.stop()


def wait_done(rt: Runtime, window_id: str) -> WindowStatus:
    done = threading.Event()
    for _ in range(200):
        status = rt.profiling_window(window_id)
        if status.state != "running":
            return status
        done.wait(0.05)
    raise AssertionError("window did not end")


def test_a_window_with_operators(runtime: Runtime) -> None:
    status = runtime.start_profiling(1.0, ["a"], ort_operators=True)
    assert status.state == "running"
    with pytest.raises(WindowBusyError) as busy:
        runtime.start_profiling(1.0, None, False)
    assert busy.value.running_id == status.id
    with pytest.raises(WindowNotReadyError):
        runtime.profiling_trace(status.id)
    assert wait_done(runtime, status.id).state == "done"
    path = runtime.profiling_trace(status.id)
    assert path.parent.name == "windows"
    doc = tracecheck.load(path)
    tracecheck.check(doc)  # operators nest inside their session.run spans
    events = doc["traceEvents"]
    runs = [e for e in events if e["name"] == "workflow.run"]
    assert runs and {e["args"]["stream"] for e in runs} == {"a"}  # only the asked stream
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert "frame_age_ms:a" in counters and "frame_age_ms:b" not in counters  # nor its ages
    assert "batch_size:person" in counters  # the model's batches are shared by both
    spans = [e for e in events if e["name"] == "session.run"]
    sampled = [s for s in spans if s["args"].get("ort_profiled")]
    ops = [e for e in events if e.get("cat") == "Node"]
    assert ops and sampled and len(sampled) < len(spans)  # every 3rd run, not all
    # How ORT's runs met ours: each sampled run of stream "a" found its span and moved
    # by less than one millisecond to sit inside it (runs of stream "b" are left out of
    # a window for "a"), and every operator was in one of ORT's runs.
    placement = doc["otherData"]["operators"]
    assert placement["runs"] == len(sampled) and placement["operators"] == len(ops)
    assert placement["orphans"] == 0 and placement["max_shift_us"] < 1000, placement
    # ORT's memory is bounded: at most 4 runs profiled a window (a busy machine may run
    # fewer sampled batches in the window's second than that).
    assert 0 < placement["runs"] + placement["runs_left_out"] <= 4
    for op in ops:
        inside = [s for s in spans if s["tid"] == op["tid"] and s["ts"] <= op["ts"] and
                  op["ts"] + op["dur"] <= s["ts"] + s["dur"]]  # fmt: skip
        assert len(inside) == 1 and inside[0]["args"].get("ort_profiled"), op  # sampled only
        assert op["args"]["op_name"]
    # Every sampled run holds operators; no other run does.
    assert all(any(s["ts"] <= o["ts"] <= s["ts"] + s["dur"] for o in ops) for s in sampled)
    # A frame the window covered, whose model run ORT profiled: its own trace is cut from
    # the window's, the operators with it.
    profiled = [r for r in runs if any(r["ts"] <= s["ts"] <= r["ts"] + r["dur"] for s in sampled)]
    assert profiled
    found = runtime.frame_trace("a", profiled[0]["args"]["seq"], around=0)
    assert found.source == f"window:{status.id}"
    tracecheck.check(found.doc)
    assert any(e.get("cat") == "Node" for e in found.doc["traceEvents"])
    # The batcher is back on its own session: later frames still run.
    processed = runtime.stream_status("a").frames_processed
    for _ in range(200):  # 10 s at most: a loaded machine runs a few frames a second
        if runtime.stream_status("a").frames_processed > processed:
            break
        threading.Event().wait(0.05)
    assert runtime.stream_status("a").frames_processed > processed


def test_bad_window_requests(runtime: Runtime) -> None:
    for duration in (0, -1, 6):
        with pytest.raises(WindowRequestError, match="duration_s"):
            runtime.start_profiling(duration, None, False)
    with pytest.raises(WindowRequestError, match="unknown stream"):
        runtime.start_profiling(1, ["nope"], False)
    with pytest.raises(UnknownWindowError):
        runtime.profiling_window("nope")
    status = runtime.start_profiling(0.2, None, False)
    assert json.loads(json.dumps(as_json(status)))["trace"] == f"/v1/profiling/{status.id}/trace"


def test_only_the_newest_windows_and_their_traces_are_kept(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from appliance.profiling import windows

    monkeypatch.setattr(windows, "KEEP_WINDOWS", 2)
    ids = []
    for _ in range(3):
        ids.append(runtime.start_profiling(0.05, ["a"], ort_operators=False).id)
        assert wait_done(runtime, ids[-1]).state == "done"
    first = runtime.profiler.windows.directory / "windows" / f"window-{ids[0]}.json"
    assert not first.exists()  # the oldest window's trace went with it
    with pytest.raises(UnknownWindowError):
        runtime.profiling_window(ids[0])
    assert all(runtime.profiling_trace(i).is_file() for i in ids[1:])
