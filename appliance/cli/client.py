"""CLI subcommands that talk to a running appliance through `ApplianceClient`.

`appliance streams list|add|remove|restart|watch|baseline`, `appliance status` and
`appliance profile`.
Exit codes: 0 ok; 1 the API refused (`error: <status> <code>: <message>` and the details
on stderr), or a profiling window failed or did not end in time; 2 usage; 4 the appliance
cannot be reached (the URL is printed). Whatever may hold a URL (`--url`, errors, the
streams' URLs and last errors) is printed with its credentials masked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from appliance.cli.calls import (
    EXIT_API_ERROR,
    EXIT_USAGE,
    client_of,
    common_options,
    guarded,
    print_json,
    width,
)
from appliance.cli.frames import add_frame_commands
from appliance.cli.regressions import regression_lines, regressions_of
from appliance.client import (
    ApplianceClient,
)
from appliance.observe.status import ModelStatus, SinkStatus, StreamStatus, WindowStatus, as_json
from appliance.policy.masking import mask_url

POLL_S = 0.5  # between looks at a profiling window's state
WINDOW_SLACK_S = 60.0  # past its duration, how long a window may take to end


def add_client_commands(sub: Any) -> None:
    """Register `streams ...` and `status` on the `appliance` parser's subparsers."""
    common = common_options()
    streams = sub.add_parser("streams", help="list, add, remove, restart streams over the API")
    actions = streams.add_subparsers(required=True, metavar="ACTION")

    ls = actions.add_parser("list", parents=[common], help="a table of every stream")
    ls.add_argument("--json", action="store_true", help="print the API's JSON instead")
    ls.set_defaults(func=guarded(cmd_list))

    add = actions.add_parser("add", parents=[common], help="start a new stream")
    add.add_argument("--id", required=True)
    add.add_argument("--source", required=True, help="a URL or file, or a JSON source mapping")
    add.add_argument(
        "--workflow",
        required=True,
        help="a workflow file (a local one is sent as an absolute path; others are resolved "
        "by the appliance against its config file) or an inline workflow as JSON",
    )
    add.add_argument("--outputs", nargs="*", default=[], metavar="SINK")
    add.add_argument("--json", action="store_true", help="print the new stream as JSON")
    add.set_defaults(func=guarded(cmd_add))

    for name, func, text in (
        ("remove", cmd_remove, "stop a stream and forget it"),
        ("restart", cmd_restart, "stop a stream and start it again"),
        ("baseline", cmd_baseline, "learn its latency baselines again (after an intended change)"),
    ):
        action = actions.add_parser(name, parents=[common], help=text)
        action.add_argument("id")
        action.set_defaults(func=guarded(func))

    watch = actions.add_parser(
        "watch", parents=[common], help="print a stream's results as they come (Ctrl+C ends)"
    )
    watch.add_argument("id")
    watch.add_argument("--count", type=int, help="stop after N results")
    watch.add_argument("--json", action="store_true", help="one JSON document a line")
    watch.set_defaults(func=guarded(cmd_watch))
    add_frame_commands(actions, common)  # slowest, frame: appliance/cli/frames.py

    status = sub.add_parser("status", parents=[common], help="health, readiness, streams, models")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=guarded(cmd_status))

    profile = sub.add_parser(
        "profile", parents=[common], help="record an on-demand profiling window, save its trace"
    )
    profile.add_argument("--duration", type=float, required=True, help="seconds")
    profile.add_argument("--streams", help="comma-separated stream ids (default: all)")
    profile.add_argument(
        "--ort-operators", action="store_true", help="add ONNX Runtime's per-operator events"
    )
    profile.add_argument(
        "-o", "--output", type=Path, required=True, help="where to write the Chrome trace"
    )
    profile.set_defaults(func=guarded(cmd_profile))


# -- streams ----------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    streams = client_of(args).streams()
    if args.json:
        print_json({"streams": as_json(streams)})
    else:
        _print_streams(streams)
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    try:
        source = _source_arg(args.source)
        workflow = workflow_arg(args.workflow)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    body = {"id": args.id, "source": source, "workflow": workflow, "outputs": args.outputs}
    stream = client_of(args).add_stream(body)
    if args.json:
        print_json(as_json(stream))
    else:
        print(f"added {stream.id}: {stream.state}, workflow {stream.workflow}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    removed = client_of(args).remove_stream(args.id)
    joined = "" if removed.threads_joined else " (its threads did not end in time)"
    print(f"removed {removed.id}{joined}")
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    stream = client_of(args).restart_stream(args.id)
    print(f"restarted {stream.id}: {stream.state}")
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    """`appliance streams baseline ID`: the regression watch forgets the stream's baselines
    and learns them again from now; its regressions end."""
    done = client_of(args).rebaseline(args.id)
    print(
        f"{done.stream}: {len(done.rows)} rows learn their baseline again, "
        f"for {done.learn_s:g} s from now"
    )
    for row in done.rows:
        print(f"  {row}")
    return 0


def _source_arg(text: str) -> str | dict[str, Any]:
    if text.lstrip().startswith("{"):
        return _json_object(text, "--source")
    return _local_path(text)


def workflow_arg(text: str) -> str | dict[str, Any]:
    if text.lstrip().startswith("{"):
        return _json_object(text, "--workflow")
    return _local_path(text)


def _json_object(text: str, option: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{option}: invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{option}: expected a JSON object, got {type(value).__name__}")
    return value


def _local_path(text: str) -> str:
    """A file that exists here is sent absolute (client and appliance share the disk);
    anything else (a URL, a path on the appliance) is sent as given."""
    path = Path(text).expanduser()
    return str(path.resolve()) if path.is_file() else text


def _print_streams(streams: Sequence[StreamStatus]) -> None:
    """id, state, fps, dropped, p50 ms, workflow, last error: one row per stream."""
    idw = width("id", (s.id for s in streams))
    wfw = width("workflow", (s.workflow for s in streams))
    print(
        f"{'id':<{idw}}{'state':<14}{'fps':>6}{'dropped':>9}{'p50 ms':>9}  "
        f"{'workflow':<{wfw}}last error"
    )
    for s in streams:
        print(
            f"{s.id:<{idw}}{s.state:<14}{s.fps:>6.1f}{s.frames_dropped:>9}"
            f"{_ms(s.latency_ms.p50):>9}  {s.workflow:<{wfw}}{_last_error(s)}"
        )


def _last_error(s: StreamStatus) -> str:
    """`-`, or the error with its time and whether it is past: `(12:03:04Z, cleared) why`
    (an older appliance gives no time: the error alone)."""
    if not s.last_error:
        return "-"
    when = [_clock(s.last_error_at)] if s.last_error_at else []
    when += ["cleared"] if s.last_error_cleared else []
    prefix = f"({', '.join(when)}) " if when else ""
    return prefix + mask_url(s.last_error)


def _clock(iso: str) -> str:
    """An ISO 8601 UTC time as the time of day when it is today (UTC), else whole."""
    day, _, clock = iso.partition("T")
    today = time.strftime("%Y-%m-%d", time.gmtime())
    return f"{clock.split('.')[0]}Z" if day == today else iso


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


# -- status -----------------------------------------------------------------------------
def cmd_watch(args: argparse.Namespace) -> int:
    """`appliance streams watch ID`: one line per result, until --count or Ctrl+C."""
    results = client_of(args).watch(args.id)
    try:
        for n, result in enumerate(results, 1):
            print(json.dumps(result) if args.json else result_line(result), flush=True)
            if args.count is not None and n >= args.count:
                break
    except KeyboardInterrupt:  # Ctrl+C is how a watch ends
        pass
    finally:
        results.close()
    return 0


def result_line(result: dict[str, Any]) -> str:
    """`cam #1042 +38 ms people: 2 detections, line: {"in": 3, "out": 1}`."""
    parts = []
    for name, value in result["outputs"].items():
        if isinstance(value, list):
            parts.append(f"{name}: {len(value)} detections")
        else:
            parts.append(f"{name}: {json.dumps(value)}")
    skipped = f" ({result['skipped']} skipped)" if result.get("skipped") else ""
    return (
        f"{result['stream']} #{result['seq']} +{result['latency_ms']:.0f} ms "
        f"{', '.join(parts)}{skipped}"
    )


def cmd_status(args: argparse.Namespace) -> int:
    client = client_of(args)
    health, ready = client.health(), client.ready()
    streams, models, sinks = client.streams(), client.models(), client.sinks()
    watch = regressions_of(client)
    if args.json:
        report = {
            "health": health,
            "ready": as_json(ready),
            "streams": as_json(streams),
            "models": as_json(models),
            "sinks": as_json(sinks),
            "regressions": None if watch is None else as_json(watch),
        }
        print_json({"url": client.url, **report})
        return 0
    waiting = f" (waiting for {', '.join(ready.waiting)})" if ready.waiting else ""
    readiness = "ready" if ready.ready else "not ready"
    shard = f" (shard {ready.shard})" if ready.shard else ""
    print(f"appliance {client.url}: {health.get('status', '?')}, {readiness}{waiting}{shard}")
    if ready.started_at is not None and ready.uptime_s is not None:
        print(f"up {_duration(ready.uptime_s)}, since {ready.started_at}")
    _print_workers(health.get("workers", []))
    _print_models(models)
    _print_sinks(sinks)
    states = Counter(s.state for s in streams)
    print(f"streams: {len(streams)}" + "".join(f", {n} {st}" for st, n in states.items()))
    _print_streams(streams)
    if watch is not None:
        print("\n".join(regression_lines(watch)))
    return 0


def _duration(seconds: float) -> str:
    """`3d 4h`, `2h 5m`, `4m 10s`, `12s`: the two largest units."""
    parts: list[str] = []
    left = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
    return " ".join(parts[:2])


def _print_workers(workers: Sequence[dict[str, Any]]) -> None:
    """`serve --workers N`'s processes (its /health lists them); nothing for one process."""
    if not workers:
        return
    print(f"workers: {len(workers)}")
    for w in workers:
        print(f"  {w['index']}: {w['state']}, pid {w['pid']}, {w['restarts']} restart(s)")


def _print_models(models: Sequence[ModelStatus]) -> None:
    print(f"models: {len(models)}")
    for m in models:
        providers = ", ".join(m.providers) or "-"
        print(f"  {m.id}: {m.decoder}, {providers}, {m.batches} batch(es)")


def _print_sinks(sinks: Sequence[SinkStatus]) -> None:
    if not sinks:
        return
    print(f"sinks: {len(sinks)}")
    for s in sinks:
        error = f", last error: {mask_url(s.last_error)}" if s.last_error else ""
        print(
            f"  {s.name} ({s.type}): {s.state}, {s.sent} sent, "
            f"{s.queue_depth} queued, {s.dropped} dropped{error}"
        )


# -- profile ----------------------------------------------------------------------------
def cmd_profile(args: argparse.Namespace) -> int:
    streams = [s.strip() for s in args.streams.split(",") if s.strip()] if args.streams else None
    client = client_of(args)
    window = client.start_profiling(args.duration, streams, args.ort_operators)
    print(f"profiling window {window.id}: {args.duration:g} s", file=sys.stderr)
    window = _wait_window(client, window, args.duration + WINDOW_SLACK_S)
    if window.state == "failed":
        error = mask_url(window.error or "?")
        print(f"error: window {window.id} failed: {error}", file=sys.stderr)
        return EXIT_API_ERROR
    if window.state != "done":
        print(
            f"error: window {window.id} still {window.state} after "
            f"{args.duration + WINDOW_SLACK_S:g} s",
            file=sys.stderr,
        )
        return EXIT_API_ERROR
    trace = client.profiling_trace(window.id)
    args.output.write_text(json.dumps(trace), encoding="utf-8")
    events = len(trace.get("traceEvents", ()))
    print(f"wrote {args.output} ({events} events)")
    return 0


def _wait_window(client: ApplianceClient, window: WindowStatus, timeout_s: float) -> WindowStatus:
    """Poll the window every POLL_S until it is done or failed, or `timeout_s` passed."""
    deadline = time.monotonic() + timeout_s
    while window.state == "running" and time.monotonic() < deadline:
        time.sleep(POLL_S)
        window = client.profiling_window(window.id)
    return window
