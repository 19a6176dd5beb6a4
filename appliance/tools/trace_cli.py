"""`appliance trace summarize|diff|fingerprint`: read traces, print fingerprints and
regressions, make the regression watch's baseline.

Exit codes: 0 ok; 1 a file is not a trace (`error: ...` on stderr); 2 usage (argparse),
and any error of `fingerprint` (no baseline written); 3 `diff --fail-over PCT` found a
block, model, frame or frame age slower, materially and significantly
(appliance/tools/regression.py says what that means).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from appliance.tools.baseline_file import (
    MIN_SPANS,
    FingerprintError,
    fingerprint_baselines,
    left_out_line,
    table,
    write_baselines,
)
from appliance.tools.fingerprint import Fingerprint, fingerprint
from appliance.tools.regression import SLOWER, Gate, Row, compare_traces, describe, samples
from appliance.tools.trace_file import TraceFormatError, load_events
from appliance.tools.where import stage_rows, where_rows
from appliance.watch.baseline import MAX_SAMPLES
from appliance.watch.ranktest import MIN_SAMPLES

EXIT_BAD_INPUT = 1
EXIT_REGRESSION = 3  # not 2: argparse's usage error, which a CI gate must tell apart
EXIT_NO_BASELINE = 1  # `fingerprint` wrote nothing: bad input (appliance/cli/main.py exit codes)

Command = Callable[[argparse.Namespace], int]
OpRow = tuple[str, float, float, float | None]  # op type, µs per call before, after, change %

# fingerprint key -> column heading, per table of `summarize`
BLOCK_COLUMNS = {
    "count": "count",
    "total_ms": "total ms",
    "mean_ms": "mean ms",
    "p50_ms": "p50 ms",
    "p99_ms": "p99 ms",
    "share": "share %",
    "frame_share": "frame %",
}
MODEL_COLUMNS = {
    "runs": "runs",
    "total_ms": "total ms",
    "mean_ms": "mean ms",
    "mean_batch": "batch",
}
# appliance/profiling/operators.py: a profiled run's node time per stage
STAGE_COLUMNS = {
    "runs": "runs",
    "h2d_ms": "h2d ms",
    "compute_ms": "compute ms",
    "d2h_ms": "d2h ms",
    "copy_share": "copy %",
}
# per stream, ms per traced frame: which thread limits it (`where_rows`)
WHERE_COLUMNS = {
    "frames": "frames",
    "decode": "decode",
    "python": "python",
    "queue": "queue",
    "device": "device",
    "bottleneck": "bottleneck",
}
OP_COLUMNS = {"total_us": "total µs", "count": "count", "share": "share %"}
NODE_COLUMNS = {"op": "op", **OP_COLUMNS}
DIFF_HEAD = (
    "p50 before",
    "p50 after",
    "effect ms",
    "CI low",
    "CI high",
    "change %",
    "frame %",
    "p",
)


def add_trace_commands(sub: Any) -> None:
    """Register `trace summarize`, `diff` and `fingerprint` on the `appliance` parser's
    subparsers."""
    trace = sub.add_parser("trace", help="summarize a trace or compare two")
    actions = trace.add_subparsers(required=True, metavar="ACTION")

    summ = actions.add_parser("summarize", help="the fingerprint of a trace, with hints")
    summ.add_argument("file", type=Path, help="a trace or ONNX Runtime profile (.json[.gz])")
    summ.add_argument("--top", type=int, default=10, metavar="N", help="rows per table")
    summ.add_argument("--json", action="store_true", help="print the fingerprint as JSON")
    summ.set_defaults(func=_guarded(cmd_summarize))

    diff = actions.add_parser("diff", help="compare two traces: blocks, models, frames, ops")
    diff.add_argument("before", type=Path)
    diff.add_argument("after", type=Path)
    _add_gate_options(diff)
    diff.add_argument("--json", action="store_true")
    diff.set_defaults(func=_guarded(cmd_diff))
    _add_fingerprint(actions)


def _add_fingerprint(actions: Any) -> None:
    fp = actions.add_parser(
        "fingerprint", help="a trace made into a baseline for profiling.watch.baseline"
    )
    fp.add_argument("file", type=Path, help="a rolling or window trace (.json[.gz])")
    fp.add_argument("-o", "--output", type=Path, required=True, metavar="BASELINE.json")
    fp.add_argument(
        "--reservoir",
        type=_reservoir,
        default=1000,
        metavar="N",
        help="samples a row keeps at most, a uniform sample (default %(default)s)",
    )
    fp.add_argument(
        "--stream",
        action="append",
        default=[],
        metavar="ID",
        help="keep only this stream's rows, as the trace names it (repeatable; every "
        "model's rows are kept)",
    )
    fp.add_argument(
        "--rename",
        action="append",
        default=[],
        type=_rename,
        metavar="OLD=NEW",
        help="the trace's stream OLD is NEW in the config that reads the baseline (repeatable)",
    )
    fp.set_defaults(func=cmd_fingerprint)


def _add_gate_options(diff: argparse.ArgumentParser) -> None:
    gate = Gate()
    diff.add_argument(
        "--fail-over",
        type=float,
        metavar="PCT",
        help=f"exit {EXIT_REGRESSION} if a block, model, frame or frame age is slower by more "
        "than PCT %% of its median, and the rest of the gate holds",
    )
    diff.add_argument(
        "--min-ms",
        type=float,
        default=gate.min_ms,
        help="smallest slowdown that counts, in ms (default %(default)s)",
    )
    diff.add_argument(
        "--min-frame-pct",
        type=float,
        default=gate.min_frame_pct,
        help="smallest slowdown that counts, in %% of the stream's frame time: the change "
        "weighted by the block's share of the frame (default %(default)s)",
    )
    diff.add_argument(
        "--confidence",
        type=_confidence,
        default=gate.confidence,
        help="confidence level of the rank test and intervals (default %(default)s)",
    )


def _confidence(text: str) -> float:
    value = float(text)
    if not 0.5 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0.5, 1), got {text}")
    return value


def _reservoir(text: str) -> int:
    value = int(text)
    if not MIN_SPANS <= value <= MAX_SAMPLES:
        raise argparse.ArgumentTypeError(f"must be {MIN_SPANS} to {MAX_SAMPLES}, got {text}")
    return value


def _rename(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not (old and sep and new) or "/" in new:
        raise argparse.ArgumentTypeError(f"expected OLD=NEW (stream ids, no '/'), got {text!r}")
    return old, new


def _guarded(func: Command) -> Command:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except TraceFormatError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT

    return run


# -- summarize ----------------------------------------------------------------------------
def cmd_summarize(args: argparse.Namespace) -> int:
    events, other = load_events(args.file)
    fp = fingerprint(events, other)
    stages = stage_rows(events)
    if args.json:
        print(json.dumps({**fp, "stages": stages, "where": where_rows(events)}, indent=2))
        return 0
    print(f"{args.file}: {summary_line(fp)}")
    _section("blocks (stream/block)", BLOCK_COLUMNS, fp["blocks"], args.top)
    _section("models", MODEL_COLUMNS, fp["models"], args.top)
    _section("op types", OP_COLUMNS, fp["ops"], args.top)
    _section("nodes (model/node)", NODE_COLUMNS, fp["nodes"], args.top)
    _section("model stages (profiled runs)", STAGE_COLUMNS, stages, args.top)
    where = where_rows(events)
    _section("where is the time (stream, ms per frame)", WHERE_COLUMNS, where, args.top)
    if fp["batch_sizes"]:
        print("\nbatch sizes: " + ", ".join(f"{k}×{v}" for k, v in fp["batch_sizes"].items()))
    if fp["frame_age_ms"]:
        print("frame age ms: " + ", ".join(f"{k} {v:.1f}" for k, v in fp["frame_age_ms"].items()))
    for op, providers in fp["providers"].items():
        if len(providers) > 1:
            print(f"op {op} ran on several providers: {', '.join(providers)}")
    print("\nhints:" if fp["hints"] else "\nhints: none")
    for hint in fp["hints"]:
        print(f"  - {hint}")
    return 0


def summary_line(fp: Fingerprint) -> str:
    """What the trace covers, each figure named: its wall length (a window's asked length,
    else from its first event to its last), then the time summed over streams and models,
    which can exceed the wall length (streams run side by side)."""
    if fp["window_s"] is not None:
        parts = [f"window {fp['window_s']:.1f} s"]
    else:
        parts = [f"events over {_wall(fp['total_ms'])}"]
    streams = {b["stream"] for b in fp["blocks"].values()}
    if streams:
        parts.append(f"{fp['block_ms']:.1f} ms of block time over {_count(len(streams), 'stream')}")
    if fp["models"]:
        model_ms = sum(m["total_ms"] for m in fp["models"].values())
        parts.append(f"{model_ms:.1f} ms of session.run over {_count(len(fp['models']), 'model')}")
    return "; ".join(parts)


def _wall(ms: float) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.1f} ms"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _section(
    title: str, columns: dict[str, str], rows: Mapping[str, Mapping[str, Any]], top: int
) -> None:
    """A table of the first `top` rows (all with 0), and how many were left out."""
    if not rows:
        return
    shown = list(rows.items())[: top if top > 0 else None]
    width = max(len(title), *(len(name) for name, _ in shown)) + 2
    print(f"\n{title:<{width}}" + "".join(f"{c:>12}" for c in columns.values()))
    for name, stats in shown:
        print(f"{name:<{width}}" + "".join(f"{_cell(stats[k]):>12}" for k in columns))
    if len(rows) > len(shown):
        print(f"  ... {len(rows) - len(shown)} more")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


# -- fingerprint --------------------------------------------------------------------------
def cmd_fingerprint(args: argparse.Namespace) -> int:
    renames = dict(args.rename)
    if len(renames) < len(args.rename):
        print("error: --rename: a stream renamed twice", file=sys.stderr)
        return EXIT_NO_BASELINE
    try:
        made = fingerprint_baselines(args.file, args.reservoir, args.stream, renames)
        write_baselines(args.output, made.baselines)
    except (TraceFormatError, FingerprintError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_NO_BASELINE
    except OSError as exc:
        print(f"error: {exc.filename or args.output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_NO_BASELINE
    print("\n".join(table(made)))
    print(f"wrote {len(made.baselines)} rows to {args.output}")
    if (line := left_out_line(made)) is not None:
        print(line, file=sys.stderr)
    return 0


# -- diff ---------------------------------------------------------------------------------
def cmd_diff(args: argparse.Namespace) -> int:
    gate = Gate(args.fail_over or 0.0, args.min_ms, args.min_frame_pct, args.confidence)
    (before, other_a), (after, other_b) = load_events(args.before), load_events(args.after)
    rows = compare_traces(samples(before), samples(after), gate)
    ops = op_rows(fingerprint(before, other_a), fingerprint(after, other_b))
    gated = args.fail_over is not None
    slower = [describe(r, gate) for r in rows if gated and r.verdict == SLOWER]
    spared = [_spared(r, gate) for r in rows if gated and _over(r, gate) and r.verdict != SLOWER]
    if args.json:
        report = {"gate": asdict(gate), "min_samples": MIN_SAMPLES}
        report |= {"rows": [asdict(r) for r in rows], "op_types_us_per_call": ops}
        print(json.dumps({**report, "regressions": slower, "not_flagged": spared}, indent=2))
    else:
        _print_rows(rows)
        _print_ops(ops)
        print("".join(f"regression: {line}\n" for line in slower), end="")
        print("".join(f"not flagged: {line}\n" for line in spared), end="")
    return EXIT_REGRESSION if slower else 0


def _over(row: Row, gate: Gate) -> bool:
    """Slower by more than the gate's % (whatever the rest of the gate says)."""
    return row.change_pct is not None and row.change_pct > gate.fail_over_pct


def _spared(row: Row, gate: Gate) -> str:
    return f"{describe(row, gate)}: {row.verdict}"


def op_rows(before: Fingerprint, after: Fingerprint) -> list[OpRow]:
    """ONNX Runtime op types in both: mean µs per call (informational, never gated)."""
    a, b = before["ops"], after["ops"]
    rows = []
    for op in sorted(a.keys() & b.keys()):
        x, y = a[op]["total_us"] / a[op]["count"], b[op]["total_us"] / b[op]["count"]
        change = round(100 * (y - x) / x, 2) if x > 0 else None
        rows.append((op, round(x, 3), round(y, 3), change))
    return rows


def _print_rows(rows: list[Row]) -> None:
    if not rows:
        return
    width = max(len(f"{r.kind} {r.name}") for r in rows) + 2
    print(f"{'':<{width}}" + "".join(f"{h:>11}" for h in DIFF_HEAD) + "  verdict")
    for r in rows:
        cells = (
            r.before_ms,
            r.after_ms,
            r.effect_ms,
            r.low_ms,
            r.high_ms,
            r.change_pct,
            r.frame_pct,
        )
        text = "".join(f"{_num(v):>11}" for v in cells)
        p = "-" if r.p_value is None else f"{r.p_value:.2g}"
        print(f"{r.kind + ' ' + r.name:<{width}}{text}{p:>11}  {r.verdict}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print_ops(ops: list[OpRow]) -> None:
    if not ops:
        return
    width = max(len("op types (µs per call)"), *(len(r[0]) for r in ops)) + 2
    print(f"\n{'op types (µs per call)':<{width}}{'before':>12}{'after':>12}{'change %':>12}")
    for name, x, y, change in ops:
        text = "-" if change is None else f"{change:+.1f}"
        print(f"{name:<{width}}{x:>12.3f}{y:>12.3f}{text:>12}")
