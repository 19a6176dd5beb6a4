"""Where a profiled run's time goes: host->device copy (`h2d`), compute, device->host copy
(`d2h`), in the window's trace, in `appliance_model_stage_seconds` and in `appliance trace
summarize` (issue 31, item 5; appliance/profiling/operators.py).

The CPU path runs for real: a window over the real runtime, ORT's real profile of
person_ssdlite on the CPU provider (no copies: compute only). This machine has no GPU, so
the device path is fed ORT's events in the shape ORT writes them on the CUDA provider
(`Memcpy_token_<n>` nodes of op `MemcpyFromHost` / `MemcpyToHost`, fences, GPU `Kernel`
events), with our spans from the real tracer hook.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.config import parse_config
from appliance.models.batcher import BatchRecord
from appliance.observe.metrics import Metrics
from appliance.profiling.hooks import trace_batch
from appliance.profiling.operators import place, with_stages
from appliance.profiling.tracer import Tracer
from appliance.profiling.windows import ProfilingWindows, observe_stages
from appliance.runtime.runtime import Runtime
from tests.support import tracecheck
from tests.support.appliance import DEMO_CLIP, person_model
from tests.tools import run_cli, span, write_trace

Event = dict[str, Any]
STAGE_SAMPLES = "appliance_model_stage_seconds_count"
CUDA = "CUDAExecutionProvider"
# One device run of model "det", µs from its start: (node, op type, offset, duration).
GPU_NODES = [
    ("Memcpy_token_0", "MemcpyFromHost", 10, 300),
    ("conv1", "Conv", 320, 50),
    ("relu1", "Relu", 380, 20),
    ("Memcpy_token_1", "MemcpyToHost", 410, 900),  # may wait for queued kernels
]


# -- the CPU provider, for real ---------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_window(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Runtime]]:
    """A 1 s window with operators over stream `a` (model person on the CPU provider,
    every batch profiled, at most 3), its stages observed into the runtime's metrics."""
    folder = tmp_path_factory.mktemp("cpu")
    doc = {
        "profiling": {"dir": "traces", "rotate_s": 600, "max_window_s": 5},
        "models": {"person": person_model()},
        "streams": [
            {
                "id": "a",
                "source": {"url": str(DEMO_CLIP), "pace": "realtime", "loop": True},
                "workflow": {
                    "name": "people",
                    "blocks": [{"id": "people", "type": "detect", "model": "person"}],
                    "outputs": {"people": "people"},
                },
            }
        ],
    }
    rt = Runtime(parse_config(doc, folder))
    rt.start()
    try:
        # The runtime's own windows do not observe stages until appliance/profiling/
        # profiler.py passes the histogram: these do, over the same tracer and models.
        windows = ProfilingWindows(
            rt.profiler.tracer,
            rt.profiler.writer,
            rt.pool,
            lambda: ["a"],
            folder,
            5.0,
            rt.metrics.window_active,
            ort_every_n=1,
            ort_max_runs=3,
            stages=rt.metrics.model_stage,
        )
        window = windows.start(1.0, None, ort_operators=True)
        done = threading.Event()
        for _ in range(400):  # 20 s at most on a loaded machine
            if windows.get(window.id).state != "running":
                break
            done.wait(0.05)
        assert windows.get(window.id).state == "done", windows.get(window.id).error
        yield windows.trace_path(window.id), rt
    finally:
        rt.stop()


def test_a_cpu_window_is_all_compute(cpu_window: tuple[Path, Runtime]) -> None:
    """ORT's real CPU profile: every node is compute, each profiled run holds its nodes'
    sum, the trace has a compute counter and no copy counters, the histogram has
    compute samples, one per profiled run, and no copy series."""
    path, rt = cpu_window
    doc = tracecheck.load(path)
    tracecheck.check(doc)  # the runs' copies still nest their operators
    events = doc["traceEvents"]
    ops = [e for e in events if e.get("cat") == "Node"]
    assert ops and {e["args"]["stage"] for e in ops} == {"compute"}
    assert all(e["name"].endswith("_kernel_time") for e in ops)  # ORT's node names kept
    profiled = [e for e in events if e["name"] == "session.run" and "stages_us" in e["args"]]
    assert profiled and all(e["args"]["ort_profiled"] for e in profiled)
    for run in profiled:
        mine = [o for o in _leaves(ops) if o["tid"] == run["tid"] and _within(o, run)]
        assert run["args"]["stages_us"] == {"h2d": 0, "compute": _us(mine), "d2h": 0}
        assert _us(mine) <= run["dur"]  # each node once: a Loop's nodes, not the Loop too
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert "compute_us:person" in counters
    assert not {c for c in counters if c.startswith("copy.")}
    compute = [e for e in events if e["name"] == "compute_us:person"]
    assert sorted(e["args"]["value"] for e in compute if e["args"]["value"]) == sorted(
        r["args"]["stages_us"]["compute"] for r in profiled
    )
    placement = doc["otherData"]["operators"]
    registry = rt.metrics.registry
    samples = registry.get_sample_value(STAGE_SAMPLES, {"model": "person", "stage": "compute"})
    assert samples == placement["runs"] + placement["runs_left_out"] == 3
    for stage in ("h2d", "d2h"):
        assert registry.get_sample_value(STAGE_SAMPLES, {"model": "person", "stage": stage}) is None


def test_summarize_shows_a_cpu_window_s_stages_and_where_the_time_goes(
    cpu_window: tuple[Path, Runtime], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = cpu_window
    report = json.loads(run_cli(["trace", "summarize", str(path), "--json"], capsys)[1])
    events = json.loads(path.read_text())["traceEvents"]
    profiled = [e for e in events if e["name"] == "session.run" and "stages_us" in e["args"]]
    ops = _leaves([e for e in events if e.get("cat") == "Node"])
    assert report["stages"] == {
        "person": {
            "runs": len(profiled),
            "h2d_ms": 0.0,
            "compute_ms": _us(ops) / 1000,
            "d2h_ms": 0.0,
            "copy_share": 0.0,
        }
    }
    where = report["where"]["a"]
    frames = [e for e in events if e["name"] == "workflow.run"]
    assert where["frames"] == len(frames) and where["decode"] > 0 and where["device"] > 0
    # The worker's frame is its Python, its queue waits and the runs that served it.
    mean_ms = _us(frames) / len(frames) / 1000
    assert where["python"] + where["queue"] + where["device"] == pytest.approx(mean_ms, abs=0.003)
    out = run_cli(["trace", "summarize", str(path)], capsys)[1]
    assert "\nmodel stages (profiled runs)" in out and "\nwhere is the time" in out


# -- a device provider: ORT's events in its CUDA shape ----------------------------------
def _gpu_run(ts: int, model: str = "det") -> list[Event]:
    """One of ORT's CUDA runs, as `read_operators` returns it (with the model the window
    sets): its `model_run` and its node events."""
    run = {"cat": "Session", "name": "model_run", "ts": ts, "dur": 1400, "args": {}, "model": model}
    return [run] + [
        {
            "cat": "Node",
            "name": f"{name}_kernel_time",
            "ts": ts + at,
            "dur": dur,
            "args": {"op_name": op, "provider": CUDA},
            "model": model,
        }
        for name, op, at, dur in GPU_NODES
    ]


def test_device_copies_are_their_own_stages() -> None:
    """Copies are classed h2d / d2h, the rest compute; each run's span holds the sums,
    three counter tracks step with the runs; the histogram gets all three stages."""
    tracer = Tracer()
    tracer.anchor_us = 0.0  # perf_counter seconds -> µs as they are
    for start in (1.0, 1.1):
        trace_batch(tracer, BatchRecord("det", 1, ("a",), (0.001,), start, 0.002, True))
    events = tracer.drain()
    spans = [e for e in events if e["name"] == "session.run"]
    ort = [*_gpu_run(spans[0]["ts"] + 100), *_gpu_run(spans[1]["ts"] + 100)]
    ort += _gpu_run(spans[1]["ts"] + 50_000)  # no span: left out of the trace, still timed
    placed = place(ort, events, tracer.pid)

    stages = {op["name"]: op["args"]["stage"] for op in placed.operators}
    assert stages == {
        "Memcpy_token_0_kernel_time": "h2d",
        "conv1_kernel_time": "compute",
        "relu1_kernel_time": "compute",
        "Memcpy_token_1_kernel_time": "d2h",
    }
    one_run = {"h2d": 300, "compute": 70, "d2h": 900}
    assert [(r.us, r.span is not None) for r in placed.runs] == [
        (one_run, True),
        (one_run, True),
        (one_run, False),
    ]
    out = with_stages(events, placed.runs, tracer.pid) + placed.operators
    tracecheck.check({"traceEvents": out})
    runs = [e for e in out if e["name"] == "session.run"]
    assert [r["args"]["stages_us"] for r in runs] == [one_run, one_run]
    assert all("stages_us" not in s["args"] for s in spans)  # the originals are untouched
    counters = [(e["name"], e["ts"], e["args"]["value"]) for e in out if e["ph"] == "C"]
    for name, stage in (
        ("copy.h2d_us:det", "h2d"),
        ("compute_us:det", "compute"),
        ("copy.d2h_us:det", "d2h"),
    ):
        assert [c[1:] for c in counters if c[0] == name] == [
            (run["ts"] + at, value)
            for run in spans
            for at, value in ((0, one_run[stage]), (run["dur"], 0))
        ]

    metrics = Metrics()
    observe_stages(metrics.model_stage, placed.runs)
    for stage, us in one_run.items():
        labels = {"model": "det", "stage": stage}
        value = metrics.registry.get_sample_value("appliance_model_stage_seconds_sum", labels)
        assert value == pytest.approx(3 * us / 1e6)
        assert metrics.registry.get_sample_value(STAGE_SAMPLES, labels) == 3


def test_summarize_shows_the_stages_of_an_ort_cuda_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ORT's own profile file of two CUDA runs: fences and GPU `Kernel` events (cat
    Kernel, pid -1) are not nodes; copies are 1200 of 1270 µs per run."""
    profile: list[Event] = [
        {
            "cat": "Session",
            "pid": 1,
            "tid": 1,
            "dur": 900,
            "ts": 1,
            "ph": "X",
            "name": "session_initialization",
            "args": {},
        },
    ]
    for ts in (10_000, 20_000):
        profile.append({**_ort(ts, 1400, "model_run"), "cat": "Session", "args": {}})
        for name, op, at, dur in GPU_NODES:
            node = _ort(ts + at, dur, f"{name}_kernel_time", op_name=op, provider=CUDA)
            profile += [_ort(ts + at - 1, 0, f"{name}_fence_before", op_name=op), node]
        kernel = _ort(ts + 330, 40, "implicit_convolve_sgemm", op_name="Conv", stream="13")
        profile.append({**kernel, "cat": "Kernel", "pid": -1, "tid": -1})
    path = tmp_path / "ort_profile.json"
    path.write_text(json.dumps(profile))

    report = json.loads(run_cli(["trace", "summarize", str(path), "--json"], capsys)[1])
    assert report["stages"] == {
        "-": {
            "runs": 2,
            "h2d_ms": 0.6,
            "compute_ms": 0.14,
            "d2h_ms": 1.8,
            "copy_share": round(100 * 1200 / 1270, 2),
        }
    }
    out = run_cli(["trace", "summarize", str(path)], capsys)[1]
    table = out.split("\nmodel stages (profiled runs)")[1].split("\n\n")[0].splitlines()
    assert table[0].split() == ["runs", "h2d", "ms", "compute", "ms", "d2h", "ms", "copy", "%"]
    assert table[1].split() == ["-", "2", "0.60", "0.14", "1.80", "94.49"]


def _ort(ts: int, dur: int, name: str, **args: Any) -> Event:
    """An event as ORT writes it into its profile."""
    return {
        "cat": "Node",
        "pid": 1,
        "tid": 1,
        "dur": dur,
        "ts": ts,
        "ph": "X",
        "name": name,
        "args": args,
    }


# -- where is the time ------------------------------------------------------------------
@pytest.mark.parametrize(
    "decode_us, python_us, run_us, bottleneck",
    [(9000, 2000, 3000, "decode"), (1000, 8000, 3000, "python"), (1000, 2000, 7000, "device")],
)
def test_where_is_the_time_names_the_thread_that_bounds_the_stream(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    decode_us: int,
    python_us: int,
    run_us: int,
    bottleneck: str,
) -> None:
    """Two frames of stream `s`: each decoded on the grab thread, then on the worker
    Python before and after a 500 µs queue wait and the run that served it (batcher
    track); per frame ms of each, and the largest of decode, python, device."""
    events: list[Event] = []
    for i in range(2):
        t0 = i * 100_000
        frame = python_us + 500 + run_us
        events += [
            {**span("grab", "decode", t0, decode_us, stream="s"), "tid": 1},
            {**span("workflow", "workflow.run", t0 + 20_000, frame, stream="s"), "tid": 2},
            {**span("block", "people", t0 + 20_000, frame, stream="s"), "tid": 2},
            {**span("queue", "queue.wait", t0 + 21_000, 500, model="m", stream="s"), "tid": 2},
            {
                **span("model", "session.run", t0 + 21_500, run_us, model="m", streams=["s"]),
                "tid": 3,
            },
        ]
    path = write_trace(tmp_path / "t.json", events)
    where = json.loads(run_cli(["trace", "summarize", str(path), "--json"], capsys)[1])["where"]
    assert where == {
        "s": {
            "frames": 2,
            "decode": decode_us / 1000,
            "python": python_us / 1000,
            "device": run_us / 1000,
            "queue": 0.5,
            "bottleneck": bottleneck,
        }
    }


def _within(inner: Event, outer: Event) -> bool:
    return bool(
        outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    )


def _leaves(ops: list[Event]) -> list[Event]:
    """The nodes that run no subgraph: person_ssdlite's Loop nodes hold nodes profiled on
    their own."""
    return [o for o in ops if o["args"]["op_name"] not in ("Loop", "Scan", "If")]


def _us(events: list[Event]) -> int:
    return sum(int(e["dur"]) for e in events)
