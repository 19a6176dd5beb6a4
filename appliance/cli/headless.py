"""`appliance run`: the streams without a server. It processes until every stream has
ended or failed, `--duration` has passed, or Ctrl+C; then prints a summary with each
stream's last outputs (counts, crossings), and can save every result as JSON lines and
each stream's `video` output as an MP4 (appliance/observe/recording.py).

A live camera that cannot be reached is retried by `serve` for as long as it runs; a run
gives up on a stream that has never produced a frame once its first connection failed,
so a wrong URL ends the run with exit 3 instead of waiting forever.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from appliance.cli.validate import load_whole_config
from appliance.observe.recording import JsonLines, VideoRecorder, video_path
from appliance.observe.status import StreamStatus, as_json
from appliance.runtime.runtime import Runtime

EXIT_STREAM_FAILED = 3
POLL_S = 0.5  # how often the run checks its streams and redraws the progress line


def add_run_command(sub: Any) -> None:
    run = sub.add_parser("run", help="headless: process the streams, print a summary")
    run.add_argument("--config", required=True, type=Path)
    run.add_argument("--max-frames", type=int, help="stop each stream after N frames")
    run.add_argument("--duration", type=float, help="stop after S seconds")
    run.add_argument(
        "--save-json", type=Path, metavar="FILE.jsonl", help="write every result as one JSON line"
    )
    run.add_argument(
        "--save-video",
        type=Path,
        metavar="FILE.mp4",
        help="write each stream's video output (FILE-<stream>.mp4 each when there are several)",
    )
    run.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    config = load_whole_config(args.config)
    runtime = Runtime(config, max_frames=args.max_frames, config_path=args.config)
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    recordings = _recordings(runtime, args)
    given_up: dict[str, str] = {}
    try:
        runtime.start()
        deadline = None if args.duration is None else time.monotonic() + args.duration
        show = sys.stderr.isatty() and not args.json
        _wait(runtime, stop, deadline, given_up, show)
    finally:
        runtime.stop()
        for close in recordings:
            close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = _summary(runtime, given_up)
    if args.json:
        print(json.dumps(summary))
    else:
        _print_table(summary["streams"])
    failed = any(s["state"] == "failed" for s in summary["streams"].values())
    return EXIT_STREAM_FAILED if failed else 0


def _recordings(runtime: Runtime, args: argparse.Namespace) -> list[Any]:
    """Subscribe the writers asked for; their close functions."""
    closers: list[Any] = []
    if args.save_json is not None:
        lines = JsonLines(args.save_json)
        runtime.subscribe(lines)
        closers.append(lines.close)
    if args.save_video is not None:
        streams = runtime.config.streams
        for cfg in streams:
            path = video_path(args.save_video, cfg.id, len(streams) > 1)
            recorder = VideoRecorder(path, cfg.id)
            runtime.subscribe(recorder, cfg.id)
            closers.append(recorder.close)
    return closers


def _wait(
    runtime: Runtime,
    stop: threading.Event,
    deadline: float | None,
    given_up: dict[str, str],
    show: bool,
) -> None:
    while not stop.wait(POLL_S):
        if deadline is not None and time.monotonic() >= deadline:
            break
        statuses = runtime.streams_status()
        for status in statuses:
            reason = _never_connected(status)
            if reason is not None and status.id not in given_up:
                given_up[status.id] = reason  # the run no longer waits for it
        if all(sid in given_up for sid in runtime.unfinished()):
            break
        if show:
            parts = [f"{s.id} {s.frames_processed} ({s.fps:.1f} fps)" for s in statuses]
            print("\r" + "  ".join(parts), end="", file=sys.stderr, flush=True)
    if show:
        print(file=sys.stderr)


def _never_connected(status: StreamStatus) -> str | None:
    """Why a stream that never ran is given up: its first connection failed."""
    if status.state != "reconnecting" or status.frames_processed:
        return None
    if any(t.state == "running" for t in status.transitions):
        return None
    return f"never connected: {status.last_error}"


def _summary(runtime: Runtime, given_up: dict[str, str]) -> dict[str, Any]:
    streams: dict[str, Any] = {}
    for status in runtime.streams_status():
        s = as_json(status)
        del s["transitions"], s["outputs"]  # the API's; a run prints its results instead
        if status.id in given_up:
            s["state"], s["last_error"] = "failed", given_up[status.id]
        latest = runtime.latest.get(status.id)
        s["outputs"] = {} if latest is None else _scalars(latest.result.predictions_json())
        streams[status.id] = s
    return {"streams": streams}


def _scalars(outputs: dict[str, Any]) -> dict[str, Any]:
    """The outputs worth printing at the end: counts and values, not detection rows."""
    return {k: v for k, v in outputs.items() if not isinstance(v, list)}


def _print_table(streams: dict[str, dict[str, Any]]) -> None:
    head = (
        f"{'stream':<16}{'state':<10}{'processed':>10}{'dropped':>9}{'fps':>8}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'detections':>12}"
    )
    print(head)
    for sid, s in streams.items():
        lat = s["latency_ms"]
        print(
            f"{sid:<16}{s['state']:<10}{s['frames_processed']:>10}{s['frames_dropped']:>9}"
            f"{s['fps']:>8.1f}{_ms(lat['p50']):>9}{_ms(lat['p99']):>9}{s['detections']:>12}"
        )
        for name, value in s["outputs"].items():
            print(f"  {name}: {json.dumps(value)}")
        if s["state"] == "failed":
            print(f"  failed: {s['last_error']}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
