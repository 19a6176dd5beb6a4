"""Tests of the trace tools, with traces built here in the documented format."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from appliance.tools.trace_cli import add_trace_commands

Event = dict[str, Any]


def span(cat: str, name: str, ts: float, dur: float, **args: Any) -> Event:
    """A complete ("X") event, times in µs."""
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": ts,
        "dur": dur,
        "pid": 1,
        "tid": 1,
        "args": args,
    }


def node(
    name: str, op: str, dur: float, provider: str = "CPUExecutionProvider", **args: Any
) -> Event:
    """An ONNX Runtime operator event, as ORT writes it."""
    return span("Node", f"{name}_kernel_time", 0, dur, op_name=op, provider=provider, **args)


def write_trace(
    path: Path, events: list[Event], other: dict[str, Any] | None = None, gz: bool = False
) -> Path:
    """Write `events` as our trace object (gzip-compressed with `gz`)."""
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other or {}}
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def sample_events(detect_us: tuple[float, ...] = (1000, 2000, 3000, 4000)) -> list[Event]:
    """Blocks detect (durations `detect_us`) and draw (4 × 1 ms), two model runs, ten frame
    ages 10..100 ms, and operators Conv 600 µs (on CPU), Relu 200, MemcpyToHost 200."""
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 1, "args": {"name": "x"}}]
    for i, dur in enumerate(detect_us):
        events.append(span("block", "detect", i * 10_000, dur, stream="s", type="ObjectDetection"))
        events.append(span("block", "draw", i * 10_000 + 5000, 1000, stream="s", type="Draw"))
    events.append(span("model", "session.run", 100, 3000, model="ssd", batch_size=1))
    events.append(span("model", "session.run", 200, 5000, model="ssd", batch_size=3))
    events += [span("workflow", "workflow.run", 0, 10, age_ms=10.0 * k) for k in range(1, 11)]
    events.append(node("conv1", "Conv", 400, model="ssd"))
    events.append(node("conv2", "Conv", 200, model="ssd"))
    events.append(node("relu", "Relu", 200, "CUDAExecutionProvider", model="ssd"))
    events.append(node("copy", "MemcpyToHost", 200, "CUDAExecutionProvider", model="ssd"))
    return events


def frame_events(
    stream: str, workflow: str, blocks: dict[str, list[float]], tid: int = 1, age_ms: float = 50
) -> list[Event]:
    """One `workflow.run` per frame with its blocks inside, back to back on track `tid`:
    frame i runs block b for blocks[b][i] µs (every list as long)."""
    events: list[Event] = []
    ts = 0.0
    for i in range(len(next(iter(blocks.values())))):
        durs = [d[i] for d in blocks.values()]
        run = span(
            "workflow",
            "workflow.run",
            ts,
            sum(durs) + 10,
            stream=stream,
            workflow=workflow,
            seq=i,
            age_ms=age_ms,
        )
        events.append({**run, "tid": tid})
        at = ts + 5
        for name, dur in zip(blocks, durs, strict=True):
            events.append({**span("block", name, at, dur, stream=stream, type=name), "tid": tid})
            at += dur
        ts += sum(durs) + 100
    return events


def two_workflow_events() -> list[Event]:
    """Streams cam and lobby run workflow people (detect 8 / 6 ms, drawn 1 ms), door runs
    privacy (faces 3 ms, drawn 2 ms); three frames each."""
    return [
        *frame_events("cam", "people", {"detect": [8000] * 3, "drawn": [1000] * 3}, tid=1),
        *frame_events("lobby", "people", {"detect": [6000] * 3, "drawn": [1000] * 3}, tid=2),
        *frame_events("door", "privacy", {"faces": [3000] * 3, "drawn": [2000] * 3}, tid=3),
    ]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Parse `argv` as `appliance` would and run the command: (exit code, stdout, stderr)."""
    parser = argparse.ArgumentParser(prog="appliance")
    add_trace_commands(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err
