"""Compute a trace's performance fingerprint, with tuning hints.

Reads what `trace_file` reads (our traces and ONNX Runtime's profiles); the fingerprint
reports blocks and models in ms, operators in µs. Percentiles use the nearest-rank method,
so every value is one that was measured.

Blocks are keyed `<stream>/<block>`: one block id in two streams (or two workflows) is two
rows, each with its share of all block time and of its own stream's frame time (its
`workflow.run` spans). Every table is sorted by time spent, the hottest first; the hot
block hint is given per workflow.

An operator (node) belongs to the model its `args.model` names (a profiling window writes
it); without one, to the model of the `session.run` span that holds it on its track (a
window trace written before operators carried it), else to NO_MODEL.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypedDict

from appliance.tools.trace_file import Event, event_args, load_events

KERNEL_SUFFIX = "_kernel_time"  # ORT names an operator event "<node>_kernel_time"
MEMCPY_OPS = frozenset({"MemcpyToHost", "MemcpyFromHost"})
GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")
CPU_PROVIDER = "CPUExecutionProvider"
HOT_OP_SHARE = 30.0  # % of operator time: one op type dominates
MEMCPY_SHARE = 10.0  # % of operator time spent copying between providers
TINY_OP_US = 10.0  # median operator below this, with more than TINY_OPS_PER_RUN per run
TINY_OPS_PER_RUN = 200
HOT_BLOCK_SHARE = 50.0  # % of a workflow's block time in a single block
NO_STREAM = "-"  # a block span without a stream (built by hand, or another tool's)
NO_MODEL = "-"  # an operator of no known model (ORT's own profile: one model, unnamed)


class BlockStats(TypedDict):
    stream: str
    workflow: str | None  # from the stream's workflow.run spans
    block: str
    count: int
    total_ms: float
    mean_ms: float
    p50_ms: float
    p99_ms: float
    share: float  # % of all block time in the trace
    frame_share: float | None  # % of its stream's workflow.run time (None: no such spans)


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
    total_ms: float  # wall time from the trace's first event to its last
    window_s: float | None  # a profiling window's asked length (otherData.duration_s)
    block_ms: float  # all block spans summed: over streams, so it can exceed the wall time
    blocks: dict[str, BlockStats]
    models: dict[str, ModelStats]
    ops: dict[str, OpStats]
    nodes: dict[str, NodeStats]
    batch_sizes: dict[str, int]
    frame_age_ms: dict[str, float] | None
    providers: dict[str, list[str]]
    hints: list[str]


def fingerprint_file(path: Path) -> Fingerprint:
    """Load `path` and compute its fingerprint."""
    events, other = load_events(path)
    return fingerprint(events, other)


def fingerprint(events: Sequence[Event], other: dict[str, Any] | None = None) -> Fingerprint:
    """The fingerprint of a list of trace events (and the trace's `otherData`)."""
    spans = [e for e in events if e["ph"] == "X"]
    nodes = [e for e in spans if e.get("cat") == "Node" and e["name"].endswith(KERNEL_SUFFIX)]
    runs = [e for e in spans if e.get("cat") == "model" and e["name"] == "session.run"]
    frames = [e for e in spans if e["name"] == "workflow.run"]
    ages = [event_args(e)["age_ms"] for e in frames if "age_ms" in event_args(e)]
    blocks = [e for e in spans if e.get("cat") == "block"]
    fp = Fingerprint(
        total_ms=_total_ms(events),
        window_s=_window_s(other or {}),
        block_ms=round(sum(e["dur"] for e in blocks) / 1000, 3),
        blocks=_blocks(blocks, frames),
        models=_models(runs),
        ops=_ops(nodes),
        nodes=_nodes(nodes, runs),
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


def stream_of(event: Event) -> str:
    """The stream a span belongs to (its `stream` arg), NO_STREAM without one."""
    return str(event_args(event).get("stream", NO_STREAM))


def _total_ms(events: Sequence[Event]) -> float:
    timed = [e for e in events if e["ph"] != "M"]
    if not timed:
        return 0.0
    end = max(e["ts"] + e.get("dur", 0) for e in timed)
    return round(float(end - min(e["ts"] for e in timed)) / 1000, 3)


def _window_s(other: dict[str, Any]) -> float | None:
    duration = other.get("duration_s")
    return float(duration) if isinstance(duration, int | float) and duration > 0 else None


def _group(events: Iterable[Event], key: str | None = None) -> dict[str, list[Event]]:
    groups: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        groups[str(event_args(e).get(key, "-")) if key else e["name"]].append(e)
    return dict(groups)


def _blocks(events: list[Event], frames: list[Event]) -> dict[str, BlockStats]:
    """Per (stream, block), hottest first."""
    all_us = sum(e["dur"] for e in events) or 1
    frame_us: Counter[str] = Counter()
    workflows: dict[str, str] = {}
    for f in frames:
        frame_us[stream_of(f)] += f["dur"]
        workflows.setdefault(stream_of(f), str(event_args(f).get("workflow", "-")))
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in events:
        groups[(stream_of(e), e["name"])].append(e["dur"])
    out: dict[str, BlockStats] = {}
    for (stream, block), durs in sorted(groups.items(), key=lambda item: -sum(item[1])):
        ms = [d / 1000 for d in durs]
        total = sum(durs)
        out[f"{stream}/{block}"] = BlockStats(
            stream=stream,
            workflow=workflows.get(stream),
            block=block,
            count=len(ms),
            total_ms=round(sum(ms), 3),
            mean_ms=round(sum(ms) / len(ms), 3),
            p50_ms=percentile(ms, 50),
            p99_ms=percentile(ms, 99),
            share=round(100 * total / all_us, 2),
            frame_share=round(100 * total / frame_us[stream], 2) if frame_us[stream] else None,
        )
    return out


def _models(runs: list[Event]) -> dict[str, ModelStats]:
    """Per model, hottest first."""
    out: dict[str, ModelStats] = {}
    groups = sorted(_group(runs, "model").items(), key=lambda g: -sum(e["dur"] for e in g[1]))
    for name, group in groups:
        total = sum(e["dur"] for e in group) / 1000
        batches = [event_args(e)["batch_size"] for e in group if "batch_size" in event_args(e)]
        out[name] = ModelStats(
            runs=len(group),
            total_ms=round(total, 3),
            mean_ms=round(total / len(group), 3),
            mean_batch=round(sum(batches) / len(batches), 3) if batches else None,
        )
    return out


def _op_name(event: Event) -> str:
    return str(event_args(event).get("op_name", "?"))


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


def _nodes(nodes: list[Event], runs: list[Event]) -> dict[str, NodeStats]:
    """Per model and node, hottest first; keyed `<model>/<node>` (the node alone for
    NO_MODEL)."""
    model_of = _enclosing_model(runs)
    per_model = Counter[str]()
    out: dict[str, NodeStats] = {}
    for e in nodes:
        model = str(event_args(e).get("model") or model_of(e))
        name = e["name"].removesuffix(KERNEL_SUFFIX)
        key = name if model == NO_MODEL else f"{model}/{name}"
        stats = out.setdefault(
            key, NodeStats(model=model, op=_op_name(e), total_us=0, count=0, share=0)
        )
        stats["total_us"] += e["dur"]
        stats["count"] += 1
        per_model[model] += e["dur"]
    for stats in out.values():
        stats["share"] = round(100 * stats["total_us"] / (per_model[stats["model"]] or 1), 2)
    return dict(sorted(out.items(), key=lambda item: -item[1]["total_us"]))


def _enclosing_model(runs: list[Event]) -> Callable[[Event], str]:
    """A node's model from the `session.run` span that holds it on its own track (one
    batcher runs one batch at a time, so the last span to start before it is the one)."""
    tracks: dict[tuple[Any, Any], list[Event]] = defaultdict(list)
    for run in runs:
        tracks[(run.get("pid"), run.get("tid"))].append(run)
    starts = {}
    for key, spans in tracks.items():
        spans.sort(key=lambda e: e["ts"])
        starts[key] = [e["ts"] for e in spans]

    def model_of(node: Event) -> str:
        key = (node.get("pid"), node.get("tid"))
        i = bisect_right(starts.get(key, []), node["ts"]) - 1
        if i < 0:
            return NO_MODEL
        run = tracks[key][i]
        inside = node["ts"] + node["dur"] <= run["ts"] + run["dur"]
        return str(event_args(run).get("model", NO_MODEL)) if inside else NO_MODEL

    return model_of


def _batch_sizes(runs: list[Event]) -> dict[str, int]:
    sizes = Counter(str(event_args(e)["batch_size"]) for e in runs if "batch_size" in event_args(e))
    return dict(sorted(sizes.items(), key=lambda item: int(item[0])))


def _age(ages: list[float]) -> dict[str, float] | None:
    if not ages:
        return None
    return {f"p{q}": percentile(ages, q) for q in (50, 90, 99)}


def _providers(nodes: list[Event]) -> dict[str, list[str]]:
    seen: dict[str, set[str]] = defaultdict(set)
    for e in nodes:
        if "provider" in event_args(e):
            seen[_op_name(e)].add(str(event_args(e)["provider"]))
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
            # Advise the optimisations only where the trace does not say they were on
            # (`appliance model bench` records its session's level in otherData).
            optimised = other.get("graph_optimization") == "all"
            advice = (
                "fuse the model"
                if optimised
                else ("enable graph optimisations (ORT_ENABLE_ALL) or fuse the model")
            )
            out.append(
                f"many tiny operators: {len(nodes) / runs:.0f} ops per run, median {median} µs: "
                f"{advice}"
            )
    return out + _fallback_hints(nodes, other) + _hot_blocks(fp["blocks"])


def _hot_blocks(blocks: dict[str, BlockStats]) -> list[str]:
    """At most one hot spot per workflow: the block with most of the block time of the
    workflow's streams together (per stream for a stream whose workflow is not known)."""
    groups: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    streams: dict[str, set[str]] = defaultdict(set)
    for s in blocks.values():
        label = f"workflow {s['workflow']}" if s["workflow"] else f"stream {s['stream']}"
        groups[label][s["block"]] += s["total_ms"]
        streams[label].add(s["stream"])
    out = []
    for label, per_block in groups.items():
        block, ms = max(per_block.items(), key=lambda item: item[1])
        share = 100 * ms / (sum(per_block.values()) or 1)
        if share > HOT_BLOCK_SHARE:
            where = (
                f" (streams {', '.join(sorted(streams[label]))})"
                if label.startswith("workflow ")
                else ""
            )
            out.append(
                f"block {block} takes {share:.1f} % of the block time of {label}{where}: "
                "its hot spot"
            )
    return out


def _fallback_hints(nodes: list[Event], other: dict[str, Any]) -> list[str]:
    requested = other.get("requested_providers")
    if not requested:
        return []
    out = []
    for model, group in sorted(_group(nodes, "model").items()):
        wanted = requested.get(model, []) if isinstance(requested, dict) else requested
        gpu = [p for p in wanted if p in GPU_PROVIDERS]
        on_cpu = sorted(
            {_op_name(e) for e in group if event_args(e).get("provider") == CPU_PROVIDER}
        )
        if gpu and on_cpu:
            out.append(
                f"model {model}: {', '.join(gpu)} requested but ops ran on {CPU_PROVIDER}: "
                f"{', '.join(on_cpu[:8])}"
            )
    return out
