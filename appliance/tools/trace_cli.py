"""`appliance trace summarize|diff`: read traces, print fingerprints and regressions.

Exit codes: 0 ok; 1 a file is not a trace (`error: ...` on stderr); 2 usage, or `diff
--fail-over PCT` found a block, model or the p99 frame age slower by more than PCT %.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from appliance.tools.fingerprint import Fingerprint, TraceFormatError, fingerprint_file

EXIT_BAD_INPUT = 1
EXIT_REGRESSION = 2
MIN_BASELINE_MS = 0.1  # below this a change in % is noise, not a regression

Command = Callable[[argparse.Namespace], int]
Row = tuple[str, float, float, float | None]  # name, before, after, change %

# fingerprint key -> column heading, per table of `summarize`
BLOCK_COLUMNS = {
    "count": "count",
    "total_ms": "total ms",
    "mean_ms": "mean ms",
    "p50_ms": "p50 ms",
    "p99_ms": "p99 ms",
    "share": "share %",
}
MODEL_COLUMNS = {
    "runs": "runs",
    "total_ms": "total ms",
    "mean_ms": "mean ms",
    "mean_batch": "batch",
}
OP_COLUMNS = {"total_us": "total µs", "count": "count", "share": "share %"}
NODE_COLUMNS = {"op": "op", **OP_COLUMNS}


def add_trace_commands(sub: Any) -> None:
    """Register `trace summarize` and `trace diff` on the `appliance` parser's subparsers."""
    trace = sub.add_parser("trace", help="summarize a trace or compare two")
    actions = trace.add_subparsers(required=True, metavar="ACTION")

    summ = actions.add_parser("summarize", help="the fingerprint of a trace, with hints")
    summ.add_argument("file", type=Path, help="a trace or ONNX Runtime profile (.json[.gz])")
    summ.add_argument("--top", type=int, default=10, metavar="N", help="rows per table")
    summ.add_argument("--json", action="store_true", help="print the fingerprint as JSON")
    summ.set_defaults(func=_guarded(cmd_summarize))

    diff = actions.add_parser("diff", help="compare two traces: blocks, models, op types")
    diff.add_argument("before", type=Path)
    diff.add_argument("after", type=Path)
    diff.add_argument(
        "--fail-over",
        type=float,
        metavar="PCT",
        help=f"exit {EXIT_REGRESSION} if a block, model or p99 frame age slowed by > PCT %%",
    )
    diff.add_argument("--json", action="store_true")
    diff.set_defaults(func=_guarded(cmd_diff))


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
    fp = fingerprint_file(args.file)
    if args.json:
        print(json.dumps(fp, indent=2))
        return 0
    print(f"{args.file}: {fp['total_ms']:.1f} ms traced")
    _section("blocks", BLOCK_COLUMNS, fp["blocks"])
    _section("models", MODEL_COLUMNS, fp["models"])
    _section("op types", OP_COLUMNS, fp["ops"], args.top)
    _section("nodes", NODE_COLUMNS, fp["nodes"], args.top)
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


def _section(
    title: str, columns: dict[str, str], rows: Mapping[str, Mapping[str, Any]], top: int = 0
) -> None:
    if not rows:
        return
    shown = list(rows.items())[: top or None]
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


# -- diff ---------------------------------------------------------------------------------
def cmd_diff(args: argparse.Namespace) -> int:
    before, after = fingerprint_file(args.before), fingerprint_file(args.after)
    tables = compare(before, after)
    slower = regressions(tables, args.fail_over) if args.fail_over is not None else []
    if args.json:
        print(json.dumps({"tables": tables, "regressions": slower}, indent=2))
    else:
        for title, rows in tables.items():
            _print_diff(title, rows)
        for line in slower:
            print(f"regression: {line}")
    return EXIT_REGRESSION if slower else 0


def compare(before: Fingerprint, after: Fingerprint) -> dict[str, list[Row]]:
    """Per block and model (mean ms per run), per op type (µs per call), frame-age p99."""
    age = [
        ("p99", a["p99"], b["p99"])
        for a, b in [(before["frame_age_ms"], after["frame_age_ms"])]
        if a and b
    ]
    return {
        "blocks (mean ms)": _rows(before["blocks"], after["blocks"], "mean_ms", "total_ms"),
        "models (mean ms)": _rows(before["models"], after["models"], "mean_ms", "total_ms"),
        "op types (µs per call)": _op_rows(before, after),
        "frame age (ms)": [(n, x, y, _change(x, y)) for n, x, y in age],
    }


def _rows(a: Mapping[str, Any], b: Mapping[str, Any], key: str, base: str) -> list[Row]:
    rows = []
    for name in sorted(a.keys() & b.keys()):
        meaningful = a[name][base] >= MIN_BASELINE_MS
        change = _change(a[name][key], b[name][key]) if meaningful else None
        rows.append((name, a[name][key], b[name][key], change))
    return rows


def _op_rows(before: Fingerprint, after: Fingerprint) -> list[Row]:
    a, b = before["ops"], after["ops"]
    rows = []
    for op in sorted(a.keys() & b.keys()):
        x, y = a[op]["total_us"] / a[op]["count"], b[op]["total_us"] / b[op]["count"]
        rows.append((op, round(x, 3), round(y, 3), _change(x, y)))
    return rows


def _change(before: float, after: float) -> float | None:
    return round(100 * (after - before) / before, 2) if before > 0 else None


def regressions(tables: Mapping[str, Iterable[Row]], pct: float) -> list[str]:
    """Lines naming each block, model or p99 frame age slower by more than `pct` %."""
    return [
        f"{title.split(' ')[0]} {name}: {x} -> {y} (+{change:.1f} %)"
        for title, rows in tables.items()
        if not title.startswith("op types")
        for name, x, y, change in rows
        if change is not None and change > pct
    ]


def _print_diff(title: str, rows: list[Row]) -> None:
    if not rows:
        return
    width = max(len(title), *(len(r[0]) for r in rows)) + 2
    print(f"\n{title:<{width}}{'before':>12}{'after':>12}{'change %':>12}")
    for name, x, y, change in rows:
        text = "-" if change is None else f"{change:+.1f}"
        print(f"{name:<{width}}{x:>12.3f}{y:>12.3f}{text:>12}")
