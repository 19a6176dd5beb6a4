"""`appliance run`: the streams without a server. It processes until every stream has
ended or failed, `--duration` has passed, or Ctrl+C; then prints a summary with each
stream's last outputs (counts, crossings), and can save every result as JSON lines and
each stream's `video` output as an MP4 (appliance/observe/recording.py).

`--config FILE` runs a config's streams; `--source URL --workflow FILE` tries a workflow on
one source without writing a config: a config made in memory with one stream, SOURCE_STREAM,
goes through the same validation, file policy and errors, each problem located by the flag
that gave the value (`--workflow: file not found: ...`). Relative paths are the shell's:
from the current directory.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.cli.validate import load_whole_config
from appliance.config import AppConfig, ConfigError, parse_config
from appliance.observe.recording import JsonLines, VideoRecorder, video_path
from appliance.observe.status import StreamStatus, as_json
from appliance.runtime.checking import BAD_INPUT, problem_lines
from appliance.runtime.runtime import Runtime

EXIT_STREAM_FAILED = 3
POLL_S = 0.5  # how often the run checks its streams and redraws the progress line
SOURCE_STREAM = "source"  # the one stream of `run --source URL --workflow FILE`
SOURCE_CONFIG = "run --source/--workflow"  # what its errors name as their source
# The in-memory config's locations, as the flags that gave their values.
FLAG_OF = {
    "streams[0].source": "--source",
    "streams[0].workflow": "--workflow",
    "streams[0]": "--source/--workflow",
}


def add_run_command(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="headless: process the streams, print a summary",
        description="Run a config's streams (--config), or one source through a workflow "
        "(--source with --workflow), without a server.",
    )
    what = run.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", type=Path, help="a config file: its streams")
    what.add_argument(
        "--source",
        metavar="URL",
        help="one source (a file, rtsp://, http(s)://, ...) to run --workflow on, no config",
    )
    run.add_argument(
        "--workflow", type=Path, metavar="FILE", help="the workflow file --source runs"
    )
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
    run.set_defaults(func=_usage_checked(run))


def _usage_checked(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """cmd_run once --source and --workflow come together (argparse's mutually exclusive
    group already keeps --config and --source apart): a usage error (exit 2) if not."""

    def run(args: argparse.Namespace) -> int:
        if args.source is not None and args.workflow is None:
            parser.error("--source needs --workflow FILE: the workflow to run on it")
        if args.workflow is not None and args.source is None:
            parser.error(
                "--workflow goes with --source URL; with --config, the config names each "
                "stream's workflow"
            )
        return cmd_run(args)

    return run


def source_config(url: str, workflow: Path) -> AppConfig:
    """The config of `--source URL --workflow FILE`: one stream, SOURCE_STREAM, with the
    workflow's own models. ConfigError as a config file's, each problem named by its flag."""
    doc = {"streams": [{"id": SOURCE_STREAM, "source": url, "workflow": str(workflow)}]}
    try:
        return parse_config(doc, Path.cwd(), SOURCE_CONFIG)
    except ConfigError as exc:
        raise ConfigError([_by_flag(p) for p in exc.problems], SOURCE_CONFIG) from None


def _by_flag(problem: str) -> str:
    """`streams[0].source.url: ...` -> `--source: ...`, `streams[0].workflow (path): ...`
    -> `--workflow (path): ...`."""
    where, sep, message = problem.partition(": ")
    for prefix, flag in FLAG_OF.items():
        if where == prefix or where.startswith((f"{prefix}.", f"{prefix}[", f"{prefix} ")):
            return f"{flag}{where[len(prefix) :].removeprefix('.url')}{sep}{message}"
    return problem


def _start(runtime: Runtime, from_source: bool) -> None:
    """Start the runtime; with --source, its workflow's and models' problems are named
    by flag as the config's are (source_config)."""
    try:
        runtime.start()
    except BAD_INPUT as exc:
        if not from_source:
            raise
        lines = [_by_flag(line) for line in problem_lines(exc, SOURCE_CONFIG)]
        raise ConfigError(lines, SOURCE_CONFIG) from None


def cmd_run(args: argparse.Namespace) -> int:
    if args.source is not None:
        config, config_path = source_config(args.source, args.workflow), None
    else:
        config, config_path = load_whole_config(args.config), args.config
    runtime = Runtime(config, max_frames=args.max_frames, config_path=config_path)
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    recordings = _recordings(runtime, args)
    given_up: dict[str, str] = {}
    try:
        _start(runtime, args.source is not None)
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
            # Held before the streams start: every frame of the recording is drawn.
            closers.append(runtime.hold_video(cfg.id))
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
