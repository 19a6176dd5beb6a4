"""`appliance streams slowest ID` and `appliance streams frame ID SEQ`: from a latency
figure to the frames behind it, over the HTTP API (docs/exemplars.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from appliance.cli.calls import client_of, guarded, print_json, width
from appliance.observe.slowest import SlowestReport, SlowFrame
from appliance.observe.status import as_json


def add_frame_commands(actions: Any, common: argparse.ArgumentParser) -> None:
    """Register `slowest` and `frame` on the `streams` subparsers."""
    slowest = actions.add_parser(
        "slowest", parents=[common], help="a stream's slowest frames, with each block's time"
    )
    slowest.add_argument("id")
    slowest.add_argument("--since", help="a time (2026-12-07T15:00:00Z) or a span (15m, 1h)")
    slowest.add_argument("--limit", type=int, help="how many frames (at most 10)")
    slowest.add_argument("--json", action="store_true", help="print the API's JSON instead")
    slowest.set_defaults(func=guarded(cmd_slowest))
    frame = actions.add_parser(
        "frame", parents=[common], help="save one frame's trace (Perfetto, chrome://tracing)"
    )
    frame.add_argument("id")
    frame.add_argument("seq", type=int)
    frame.add_argument("--around", type=int, help="frames either side (default 2)")
    frame.add_argument("-o", "--output", type=Path, required=True, help="where to write it")
    frame.set_defaults(func=guarded(cmd_frame))


def cmd_slowest(args: argparse.Namespace) -> int:
    report = client_of(args).slowest(args.id, args.since, args.limit)
    if args.json:
        print_json(as_json(report))
    else:
        print("\n".join(slowest_lines(report)))
    return 0


def cmd_frame(args: argparse.Namespace) -> int:
    trace = client_of(args).frame_trace(args.id, args.seq, args.around)
    args.output.write_text(json.dumps(trace), encoding="utf-8")
    spans = sum(1 for e in trace.get("traceEvents", []) if e.get("ph") == "X")
    print(f"wrote {args.output}: frame {args.seq} of {args.id}, {spans} spans")
    return 0


def slowest_lines(report: SlowestReport) -> list[str]:
    """seq, when, total, age, slowest block and its time, batch, queue wait, trace."""
    frames = report.frames
    if not frames:
        return [f"{report.stream}: no frame since {report.since}"]
    blockw = width("slowest block", (_slowest(f) for f in frames))
    lines = [
        f"{report.stream}: the {len(frames)} slowest frames since {report.since}",
        f"{'seq':>8}  {'captured':<24}{'total ms':>9}{'age ms':>9}  "
        f"{'slowest block':<{blockw}}{'batch':>6}{'queue ms':>9}  trace",
    ]
    for f in frames:
        batch = "-" if f.batch_size is None else str(f.batch_size)
        lines.append(
            f"{f.seq:>8}  {f.at:<24}{f.total_ms:>9.1f}{f.age_ms:>9.1f}  "
            f"{_slowest(f):<{blockw}}{batch:>6}{f.queue_wait_ms:>9.1f}  {f.trace}"
        )
    return lines


def _slowest(frame: SlowFrame) -> str:
    """`faces 412.0`: the frame's slowest block and its ms."""
    ms = {b.id: b.ms for b in frame.blocks}
    name = frame.slowest_block
    return "-" if name is None else f"{name} {ms.get(name) or 0.0:.1f}"
