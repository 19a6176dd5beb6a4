"""Read a trace and compute its performance fingerprint, with tuning hints.

Reads our traces (`{"traceEvents": [...]}`, see `appliance.profiling`) and ONNX Runtime's
own profile files (a JSON array), either one optionally gzip-compressed. Durations in the
files are microseconds; the fingerprint reports blocks and models in ms, operators in µs.
Percentiles use the nearest-rank method, so every value is one that was measured.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypedDict

Event = dict[str, Any]

GZIP_MAGIC = b"\x1f\x8b"
KERNEL_SUFFIX = "_kernel_time"  # ORT names an operator event "<node>_kernel_time"
MEMCPY_OPS = frozenset({"MemcpyToHost", "MemcpyFromHost"})
GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")
CPU_PROVIDER = "CPUExecutionProvider"
HOT_OP_SHARE = 30.0  # % of operator time: one op type dominates
MEMCPY_SHARE = 10.0  # % of operator time spent copying between providers
TINY_OP_US = 10.0  # median operator below this, with more than TINY_OPS_PER_RUN per run
TINY_OPS_PER_RUN = 200
HOT_BLOCK_SHARE = 50.0  # % of block time in a single block


class TraceFormatError(ValueError):
    """A file that is not a trace; the message names the file and what is wrong."""


class BlockStats(TypedDict):
    count: int
    total_ms: float
    mean_ms: float
    p50_ms: float
    p99_ms: float
    share: float  # % of all block time


class ModelStats(TypedDict):
    runs: int
    total_ms: float
    mean_ms: float
    mean_batch: float | None


class OpStats(TypedDict):
    total_us: float
    count: int
    share: float  # % of all operator time


class NodeStats(TypedDict):
    model: str
    op: str
    total_us: float
    count: int
    share: float  # % of its model's operator time


class Fingerprint(TypedDict):
    total_ms: float
    blocks: dict[str, BlockStats]
    models: dict[str, ModelStats]
    ops: dict[str, OpStats]
    nodes: dict[str, NodeStats]
    batch_sizes: dict[str, int]
    frame_age_ms: dict[str, float] | None
    providers: dict[str, list[str]]
    hints: list[str]


def load_events(path: Path) -> tuple[list[Event], dict[str, Any]]:
    """The events and `otherData` of a trace file; `TraceFormatError` if it is not one."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"{path}: not a valid gzip file: {exc}") from exc
    elif path.suffix == ".gz":
        raise TraceFormatError(f"{path}: named .gz but not gzip-compressed")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceFormatError(f"{path}: not JSON: {exc}") from exc
    events, other = _split(path, data)
    _check_events(path, events)
    return events, other


def _split(path: Path, data: Any) -> tuple[list[Any], dict[str, Any]]:
    if isinstance(data, list):  # ONNX Runtime's profile: a bare array of events
        return data, {}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceFormatError(f"{path}: no traceEvents list (not a Chrome trace)")
    other = data.get("otherData")
    return data["traceEvents"], other if isinstance(other, dict) else {}


def _check_events(path: Path, events: list[Any]) -> None:
    for i, event in enumerate(events):
        if not isinstance(event, dict) or "ph" not in event:
            raise TraceFormatError(f"{path}: event #{i} has no ph (not a trace event)")
        needs = ("name", "ts", "dur") if event["ph"] == "X" else ("name", "ts")
        for field in needs if event["ph"] != "M" else ():
            if not isinstance(event.get(field), str if field == "name" else int | float):
                raise TraceFormatError(f"{path}: event #{i} ({event.get('name')!r}) has no {field}")


def fingerprint_file(path: Path) -> Fingerprint:
    """Load `path` and compute its fingerprint."""
    events, other = load_events(path)
    return fingerprint(events, other)


def fingerprint(events: Sequence[Event], other: dict[str, Any] | None = None) -> Fingerprint:
    """The fingerprint of a list of trace events (and the trace's `otherData`)."""
    spans = [e for e in events if e["ph"] == "X"]
    nodes = [e for e in spans if e.get("cat") == "Node" and e["name"].endswith(KERNEL_SUFFIX)]
    runs = [e for e in spans if e.get("cat") == "model" and e["name"] == "session.run"]
    ages = [
        _args(e)["age_ms"] for e in spans if e["name"] == "workflow.run" and "age_ms" in _args(e)
    ]
    fp = Fingerprint(
        total_ms=_total_ms(events),
        blocks=_blocks([e for e in spans if e.get("cat") == "block"]),
        models=_models(runs),
        ops=_ops(nodes),
        nodes=_nodes(nodes),
        batch_sizes=_batch_sizes(runs),
        frame_age_ms=_age(ages),
        providers=_providers(nodes),
        hints=[],
    )
    ort_runs = sum(1 for e in spans if e.get("cat") == "Session" and e["name"] == "model_run")
    fp["hints"] = hints(fp, nodes, max(ort_runs, len(runs), 1), (other or {}))
    return fp


def percentile(values: Iterable[float], q: float) -> float:
    """The nearest-rank `q`-th percentile (0 < q ≤ 100) of a non-empty collection."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


def _args(event: Event) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _total_ms(events: Sequence[Event]) -> float:
    timed = [e for e in events if e["ph"] != "M"]
    if not timed:
        return 0.0
    end = max(e["ts"] + e.get("dur", 0) for e in timed)
    return round(float(end - min(e["ts"] for e in timed)) / 1000, 3)


def _group(events: Iterable[Event], key: str | None = None) -> dict[str, list[Event]]:
    groups: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        groups[str(_args(e).get(key, "-")) if key else e["name"]].append(e)
    return dict(groups)


def _blocks(events: list[Event]) -> dict[str, BlockStats]:
    all_us = sum(e["dur"] for e in events) or 1
    out: dict[str, BlockStats] = {}
    for name, group in _group(events).items():
        ms = [e["dur"] / 1000 for e in group]
        out[name] = BlockStats(
            count=len(ms),
            total_ms=round(sum(ms), 3),
            mean_ms=round(sum(ms) / len(ms), 3),
            p50_ms=percentile(ms, 50),
            p99_ms=percentile(ms, 99),
            share=round(100 * sum(e["dur"] for e in group) / all_us, 2),
        )
    return out


def _models(runs: list[Event]) -> dict[str, ModelStats]:
    out: dict[str, ModelStats] = {}
    for name, group in _group(runs, "model").items():
        total = sum(e["dur"] for e in group) / 1000
        batches = [_args(e)["batch_size"] for e in group if "batch_size" in _args(e)]
        out[name] = ModelStats(
            runs=len(group),
            total_ms=round(total, 3),
            mean_ms=round(total / len(group), 3),
            mean_batch=round(sum(batches) / len(batches), 3) if batches else None,
        )
    return out


def _op_name(event: Event) -> str:
    return str(_args(event).get("op_name", "?"))


def _ops(nodes: list[Event]) -> dict[str, OpStats]:
    all_us = sum(e["dur"] for e in nodes) or 1
    groups: dict[str, list[float]] = defaultdict(list)
    for e in nodes:
        groups[_op_name(e)].append(e["dur"])
    ranked = sorted(groups.items(), key=lambda item: -sum(item[1]))
    return {
        op: OpStats(total_us=sum(d), count=len(d), share=round(100 * sum(d) / all_us, 2))
        for op, d in ranked
    }


def _nodes(nodes: list[Event]) -> dict[str, NodeStats]:
    per_model = Counter[str]()
    out: dict[str, NodeStats] = {}
    for e in nodes:
        model = str(_args(e).get("model", "-"))
        name = e["name"].removesuffix(KERNEL_SUFFIX)
        key = name if model == "-" else f"{model}/{name}"
        stats = out.setdefault(
            key, NodeStats(model=model, op=_op_name(e), total_us=0, count=0, share=0)
        )
        stats["total_us"] += e["dur"]
        stats["count"] += 1
        per_model[model] += e["dur"]
    for stats in out.values():
        stats["share"] = round(100 * stats["total_us"] / (per_model[stats["model"]] or 1), 2)
    return dict(sorted(out.items(), key=lambda item: -item[1]["total_us"]))


def _batch_sizes(runs: list[Event]) -> dict[str, int]:
    sizes = Counter(str(_args(e)["batch_size"]) for e in runs if "batch_size" in _args(e))
    return dict(sorted(sizes.items(), key=lambda item: int(item[0])))


def _age(ages: list[float]) -> dict[str, float] | None:
    if not ages:
        return None
    return {f"p{q}": percentile(ages, q) for q in (50, 90, 99)}


def _providers(nodes: list[Event]) -> dict[str, list[str]]:
    seen: dict[str, set[str]] = defaultdict(set)
    for e in nodes:
        if "provider" in _args(e):
            seen[_op_name(e)].add(str(_args(e)["provider"]))
    return {op: sorted(p) for op, p in sorted(seen.items())}


def hints(fp: Fingerprint, nodes: list[Event], runs: int, other: dict[str, Any]) -> list[str]:
    """Tuning hints in the spirit of ONNX Runtime's performance guidance, each naming a spot."""
    out = [
        f"op type {op} takes {s['share']:.1f} % of operator time: the hot spot to optimise"
        for op, s in fp["ops"].items()
        if s["share"] > HOT_OP_SHARE
    ]
    memcpy = sum(s["share"] for op, s in fp["ops"].items() if op in MEMCPY_OPS)
    if memcpy > MEMCPY_SHARE:
        out.append(
            f"Memcpy nodes take {memcpy:.1f} % of operator time: the graph is partitioned "
            "between providers; keep it on one provider"
        )
    if nodes and len(nodes) / runs > TINY_OPS_PER_RUN:
        median = percentile((e["dur"] for e in nodes), 50)
        if median < TINY_OP_US:
            out.append(
                f"many tiny operators: {len(nodes) / runs:.0f} ops per run, median {median} µs: "
                "enable graph optimisations (ORT_ENABLE_ALL) or fuse the model"
            )
    out += _fallback_hints(nodes, other)
    out += [
        f"block {name} takes {s['share']:.1f} % of block time: the hot spot of the workflow"
        for name, s in fp["blocks"].items()
        if s["share"] > HOT_BLOCK_SHARE
    ]
    return out


def _fallback_hints(nodes: list[Event], other: dict[str, Any]) -> list[str]:
    requested = other.get("requested_providers")
    if not requested:
        return []
    out = []
    for model, group in sorted(_group(nodes, "model").items()):
        wanted = requested.get(model, []) if isinstance(requested, dict) else requested
        gpu = [p for p in wanted if p in GPU_PROVIDERS]
        on_cpu = sorted({_op_name(e) for e in group if _args(e).get("provider") == CPU_PROVIDER})
        if gpu and on_cpu:
            out.append(
                f"model {model}: {', '.join(gpu)} requested but ops ran on {CPU_PROVIDER}: "
                f"{', '.join(on_cpu[:8])}"
            )
    return out
