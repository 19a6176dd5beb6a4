"""`appliance tune`: search the batching and threading settings on the config's own live
workload (an in-process runtime, no API server), or on a running appliance (`--url`,
POST /v1/tune), and report every candidate, the winner and why (docs/performance.md,
"Tuning").

Exit codes: 0 the tune ended (done, or stopped at its budget with the best found by
then); 1 it failed (a candidate would not apply, a stream failed, a stream had no
result after the warm-up), or an output could not be written; 2 usage, or the config
is invalid; 4 `--url`: the appliance cannot be reached; 130 interrupted (Ctrl+C,
SIGTERM): the starting settings are back, and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from appliance.cli.signals import stopped_by_signals
from appliance.policy.masking import mask_url
from appliance.runtime.checking import BAD_INPUT
from appliance.tune import report
from appliance.tune.space import parse_knob

if TYPE_CHECKING:
    from appliance.runtime.runtime import Runtime

log = logging.getLogger("appliance.tune")

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
DEFAULT_BUDGET = "10m"
UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
INTERRUPTED = "interrupted: the starting settings are back; nothing written"


def add_tune_command(sub: Any) -> None:
    """Register `tune` on the `appliance` parser's subparsers."""
    p = sub.add_parser(
        "tune",
        help="find the best batching and threading for this machine's cameras and models",
        description="Search the batching and threading settings on the config's own live "
        "workload (an in-process runtime, no API server), or on a running appliance "
        "(--url), and report every candidate, the winner and why each knob has its value.",
    )
    p.add_argument(
        "--config", type=Path, metavar="FILE", help="the config to tune (required without --url)"
    )
    p.add_argument(
        "--objective",
        choices=("fps", "latency"),
        default="fps",
        help="fps: the most processed fps with frame-age p99 under the SLO "
        "(default); latency: the lowest p99 at the cameras' own fps",
    )
    p.add_argument(
        "--slo-ms",
        type=_positive,
        metavar="MS",
        help="the fps objective's frame-age p99 bound (default: two frame "
        "intervals of the slowest camera)",
    )
    p.add_argument(
        "--budget",
        type=parse_duration,
        default=DEFAULT_BUDGET,
        metavar="TIME",
        help=f"the most the search may take: 90s, 10m, 1h or seconds (default {DEFAULT_BUDGET})",
    )
    p.add_argument(
        "--window",
        type=_positive,
        default=5.0,
        metavar="S",
        help="seconds measured per window (default 5)",
    )
    p.add_argument(
        "--settle",
        type=_not_negative,
        default=2.0,
        metavar="S",
        help="seconds waited after a change before measuring (default 2)",
    )
    p.add_argument(
        "--warmup",
        type=_not_negative,
        default=10.0,
        metavar="S",
        help="seconds the streams run before the search; each must have "
        "results by then (default 10)",
    )
    p.add_argument(
        "--knob",
        type=_knob,
        action="append",
        metavar="NAME[=V1,V2]",
        help="search only this knob (a setting, e.g. max_batch_size, or one "
        "model's, faces.max_batch_size), with these values if given; "
        "repeatable (default: every knob)",
    )
    p.add_argument(
        "--write",
        type=Path,
        metavar="PATH",
        help="write the winner as a YAML patch (the config's tuning: section)",
    )
    p.add_argument(
        "--apply",
        action="store_true",
        help="put the winner in the config file's tuning: section (--url: the "
        "running appliance keeps it)",
    )
    p.add_argument("--plot", type=Path, metavar="PATH", help="a PNG of fps against p99")
    p.add_argument("--json", type=Path, metavar="PATH", help="the whole result as JSON")
    p.add_argument("--url", help="tune a running appliance instead (POST /v1/tune)")
    p.add_argument("--token", help="--url: the API bearer token (default $APPLIANCE_API_TOKEN)")
    p.set_defaults(func=cmd_tune)


def parse_duration(text: str) -> float:
    """`90s`, `10m`, `1h` or plain seconds (`45`, `2.5`) as seconds."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([smh]?)\s*", text)
    if match is None or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration such as 90s, 10m, 1h or 600")
    return float(match[1]) * UNITS[match[2]]


def _positive(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
    return value


def _not_negative(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None


def _knob(text: str) -> tuple[str, tuple[Any, ...] | None]:
    try:
        return parse_knob(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--knob: ")) from None


def cmd_tune(args: argparse.Namespace) -> int:
    if args.slo_ms is not None and args.objective != "fps":
        print("error: --slo-ms is the fps objective's bound", file=sys.stderr)
        return EXIT_USAGE
    if args.url is not None:
        from appliance.cli.calls import guarded

        return guarded(_run_remote)(args)
    if args.config is None:
        print(
            "error: --config FILE is required (or --url to tune a running appliance)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return _run_local(args)


# -- local: an in-process runtime -------------------------------------------------------
def _run_local(args: argparse.Namespace) -> int:
    from appliance.cli.validate import load_whole_config
    from appliance.runtime.runtime import Runtime
    from appliance.tune.results import progress_json, result_json
    from appliance.tune.target import tune

    try:
        config = load_whole_config(args.config)
    except BAD_INPUT as exc:
        print(f"error: {mask_url(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    stop, show = threading.Event(), ProgressLine(sys.stderr)
    with stopped_by_signals(stop):
        rt = Runtime(config, config_path=args.config)
        try:
            if (problem := _start(rt) or _warm_up(rt, args.warmup, stop)) is not None:
                return problem
            result = tune(
                rt,
                objective=args.objective,
                slo_ms=args.slo_ms,
                budget_s=args.budget,
                window_s=args.window,
                settle_s=args.settle,
                only=_only(args),
                stop=stop,
                on_progress=lambda p: show(progress_json(p)),
            )
        except Exception as exc:  # a restore that failed: said, not a traceback
            log.debug("tune failed", exc_info=True)
            print(f"error: the tune failed: {mask_url(str(exc))}", file=sys.stderr)
            return EXIT_FAILED
        finally:
            show.end()
            rt.stop()
    keep = config.tuning.model_dump(mode="json", exclude_none=True)
    return _report(args, result_json(result), keep, args.config if args.apply else None)


def _start(rt: Runtime) -> int | None:
    """Start the runtime; exit 2 when a model or workflow of the config does not load."""
    try:
        rt.start()
    except BAD_INPUT as exc:
        print(f"error: {mask_url(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    return None


def _warm_up(rt: Runtime, seconds: float, stop: threading.Event) -> int | None:
    """Let the streams run `seconds` (models warm, first batches done); an exit code
    when interrupted or when a stream has had no result by then."""
    seen: set[str] = set()
    unsubscribe = rt.outputs.subscribe(lambda result: seen.add(result.stream_id))
    print(f"warming up {seconds:g} s ({len(rt.streams)} streams)", file=sys.stderr)
    try:
        interrupted = stop.wait(seconds)
    finally:
        unsubscribe()
    if interrupted:
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    silent = [sid for sid in rt.streams if sid not in seen]
    for sid in silent:
        stream = rt.streams[sid]
        why = f"{stream.state.value}" + (f": {stream.last_error}" if stream.last_error else "")
        print(
            f"error: stream {sid!r} had no result in the {seconds:g} s warm-up ({why})",
            file=sys.stderr,
        )
    if silent:
        print("nothing was tuned; a longer --warmup may help", file=sys.stderr)
        return EXIT_FAILED
    return None


def _only(args: argparse.Namespace) -> dict[str, tuple[Any, ...] | None] | None:
    return dict(args.knob) if args.knob else None


def _knobs_json(args: argparse.Namespace) -> dict[str, list[Any] | None] | None:
    only = _only(args)
    return None if only is None else {k: None if v is None else list(v) for k, v in only.items()}


# -- remote: a running appliance --------------------------------------------------------
def _run_remote(args: argparse.Namespace) -> int:
    from appliance.cli.tune_remote import run_remote
    from appliance.client import TOKEN_ENV

    request = {
        "objective": args.objective,
        "slo_ms": args.slo_ms,
        "budget_s": args.budget,
        "window_s": args.window,
        "settle_s": args.settle,
        "knobs": _knobs_json(args),
        "apply": args.apply,
    }
    keep = None
    if args.config is not None:  # its other tuning: settings go into --write's patch
        from appliance.config import load_config

        try:
            keep = load_config(args.config).tuning.model_dump(mode="json", exclude_none=True)
        except BAD_INPUT as exc:
            print(f"error: {mask_url(str(exc))}", file=sys.stderr)
            return EXIT_USAGE
    stop, show = threading.Event(), ProgressLine(sys.stderr)
    token = args.token or os.environ.get(TOKEN_ENV)
    with stopped_by_signals(stop):
        try:
            final = run_remote(args.url, token, request, show, stop)
        finally:
            show.end()
    result = final.get("result")
    if result is None:
        if stop.is_set():
            print(INTERRUPTED, file=sys.stderr)
            return EXIT_INTERRUPTED
        why = mask_url(str(final.get("error") or "no result"))
        print(f"error: the tune ended {final.get('state')!r}: {why}", file=sys.stderr)
        return EXIT_FAILED
    return _report(args, result, keep, None)


# -- the report, and what is written ----------------------------------------------------
def _report(
    args: argparse.Namespace,
    result: Mapping[str, Any],
    keep: Mapping[str, Any] | None,
    apply_to: Path | None,
) -> int:
    """The table on stdout; the files asked for, only after a tune that ended (done or
    at its budget); the exit code."""
    print(report.table(result))
    outcome = result["outcome"]
    if outcome == "interrupted":
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    if outcome == "failed":
        problem = mask_url(str(result.get("problem") or "?"))
        print(
            f"error: the tune failed: {problem}; the starting settings are back; nothing written",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if outcome == "budget":
        print("budget reached: the winner is the best found within it", file=sys.stderr)
    try:
        _write(args, result, keep, apply_to)
    except (OSError, *BAD_INPUT) as exc:
        print(f"error: {mask_url(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _write(
    args: argparse.Namespace,
    result: Mapping[str, Any],
    keep: Mapping[str, Any] | None,
    apply_to: Path | None,
) -> None:
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    if args.plot is not None:
        if report.plot(result, args.plot) is None:
            print("no plot: install appliance[plot] for the plot (matplotlib)", file=sys.stderr)
        else:
            print(f"wrote {args.plot}")
    patch = report.patch_yaml(result, keep)
    if args.write is not None:
        args.write.write_text(patch, encoding="utf-8")
        print(f"wrote {args.write}")
    if apply_to is not None:
        report.apply_to_file(apply_to, patch)
        print(f"applied to {apply_to}: its tuning: section holds the winner")
    elif args.apply:
        print("applied: the appliance runs the winner (its config file is unchanged)")


class ProgressLine:
    """The current candidate, windows done of the estimated total, elapsed and remaining
    time: one line rewritten on a terminal, a line a window otherwise (a log)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.width = 0

    def __call__(self, progress: Mapping[str, Any]) -> None:
        total = progress["windows"] + progress["windows_left"]
        line = (
            f"tune: {progress['current']}  {progress['windows']}/{total} windows  "
            f"{_clock(progress['elapsed_s'])} elapsed, ~{_clock(progress['remaining_s'])} left"
        )
        if self.tty:
            self.out.write("\r" + line.ljust(self.width))
            self.width = max(self.width, len(line))
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def end(self) -> None:
        """Leave the rewritten line (the next output starts on its own line)."""
        if self.tty and self.width:
            self.out.write("\n")
            self.out.flush()
            self.width = 0


def _clock(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}:{whole % 60:02d}"
