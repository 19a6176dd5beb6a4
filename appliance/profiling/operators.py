"""ONNX Runtime's operators put on our trace timeline, inside the `session.run` that ran them.

A profiling window (appliance/profiling/windows.py) reads the operators of its profiled
sessions (`ort_profile.read_operators`: ORT's `model_run` events and operators, on ORT's
clock, each tagged with its `model`) and the spans our tracer wrote meanwhile. ORT's clock
and ours disagree by a little, so each ORT run is matched to the `session.run` span of its
model that holds it, within SLACK_US at each end, and its operators move with it, rigidly,
by the least shift that puts the run inside the span: their order and gaps stay as ORT
measured them. Each placed operator names its model in `args.model` (the span's), so a
trace with several models ties every node to its own.

Each operator also names its stage in `args.stage`: `h2d` (ORT's `MemcpyFromHost` node, a
copy from host to device memory), `d2h` (`MemcpyToHost`) or `compute` (every other node).
ORT inserts the two copy ops where a graph crosses between the CPU and a device provider
(CUDA, TensorRT); on the CPU provider alone every node is compute. Per matched run the
stages' node times are summed (`RunStages`): `with_stages` writes them into the run's
`session.run` span (`args.stages_us`) and as one counter track per model and stage
(STAGE_COUNTERS), stepping up to the run's µs at its start and back to 0 at its end. Not
child spans: the operators already are the run's children, at their real times, and a
span summing a stage's nodes has no true place among them (on a device the copies sit
between compute nodes), so it would overlap them and break the nesting Perfetto needs.
The sums are of ORT's node (`_kernel_time`) durations: host time of each node, which for
an asynchronous device kernel is mostly its launch; a `MemcpyToHost` that has to wait for
the kernels queued before it carries their device time (not measured here: no GPU). ORT's
GPU kernel events (`cat` "Kernel", with the CUDA provider's `enable_cuda_profiling`) would
give device time itself; `read_operators` does not keep them.

Pure functions over trace events; nothing here touches ORT.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from appliance.observe.metrics import MODEL_STAGES, ModelStage
from appliance.profiling.ort_profile import is_model_run, is_operator

Event = dict[str, Any]
NO_MODEL = "-"  # the model of an operator that names none (ORT's own profile: one model)
# ORT's clock vs ours, µs: an ORT run that reaches at most this far outside one of our
# session.run spans of its model is that span's run.
SLACK_US = 2000

# ORT's op types of the copies it inserts between host and device memory (its memcpy
# transformer); every other op is compute.
COPY_STAGES: dict[str, ModelStage] = {"MemcpyFromHost": "h2d", "MemcpyToHost": "d2h"}
# Ops that run a subgraph: ORT profiles the subgraph's nodes as events of their own, inside
# the container's, so a sum counts only those (as ORT's own profile_result_processor.py
# skips NODES_TYPE_CONTAINING_SUBGRAPH): measured on person_ssdlite, counting its Loop
# nodes too made a run's compute up to 12 % longer than the run itself.
SUBGRAPH_OPS = frozenset({"Loop", "Scan", "If"})
# Stage -> counter name prefix, `<prefix>:<model>`: one track per model and stage, in µs.
STAGE_COUNTERS: dict[ModelStage, str] = {
    "h2d": "copy.h2d_us",
    "compute": "compute_us",
    "d2h": "copy.d2h_us",
}


@dataclass
class Placement:
    """How ORT's runs met our spans: the trace's `otherData.operators`."""

    runs: int = 0  # ORT runs matched to a span
    runs_left_out: int = 0  # with no span: batches of streams outside the window
    operators: int = 0  # placed
    orphans: int = 0  # in no ORT run
    max_shift_us: int = 0  # the largest shift that put a run inside its span

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class RunStages:
    """One of ORT's runs: its model, its nodes' µs per stage (every stage present, 0 where
    it had none), and our `session.run` span that ran it (None: left out of the trace)."""

    model: str
    us: dict[ModelStage, int]
    span: Event | None


@dataclass(frozen=True)
class Placed:
    """ORT's operators placed on our trace (`place`)."""

    operators: list[Event]  # on their spans' tracks, each with its `args.stage`
    placement: dict[str, int]  # how well the clocks met: Placement's fields
    runs: list[RunStages]  # every ORT run, placed or left out, in ORT's order per model


def stage_of(op_name: str) -> ModelStage:
    """The stage of an operator of ORT op type `op_name`."""
    return COPY_STAGES.get(op_name, "compute")


def place(ort: list[Event], events: list[Event], pid: int) -> Placed:
    """ORT's operators (`ort`: its runs and operators) moved onto the track of the
    `session.run` span in `events` that ran them, as trace events of process `pid`, and
    each run's time per stage. Operators of runs with no span are left out."""
    spans = _spans_by_model(events)
    starts = {model: [_ts(e) for e in model_spans] for model, model_spans in spans.items()}
    placed: list[Event] = []
    runs_stages: list[RunStages] = []
    stats = Placement()
    for model in {e["model"] for e in ort}:
        runs = sorted((e for e in ort if e["model"] == model and is_model_run(e)), key=_ts)
        ops = sorted((e for e in ort if e["model"] == model and is_operator(e)), key=_ts)
        i = 0
        for run in runs:
            start, end = run["ts"], run["ts"] + run["dur"]
            while i < len(ops) and ops[i]["ts"] < start:
                stats.orphans += 1
                i += 1
            j = i
            while j < len(ops) and ops[j]["ts"] < end:
                j += 1
            mine, i = ops[i:j], j
            span = _containing(spans.get(model, []), starts.get(model, []), start, end)
            runs_stages.append(RunStages(model, _stage_us(mine), span))
            if span is None:
                stats.runs_left_out += 1
                continue
            placed += _moved(mine, run, span, pid, stats)
        stats.orphans += len(ops) - i
    stats.operators = len(placed)
    return Placed(placed, stats.as_dict(), runs_stages)


@dataclass
class ModelStages:
    """One model's profiled runs in a trace, and its operators' µs per stage."""

    runs: int = 0
    us: dict[ModelStage, int] = field(default_factory=lambda: dict.fromkeys(MODEL_STAGES, 0))


def stage_totals(events: Iterable[Event]) -> dict[str, ModelStages]:
    """Per model, its operators' µs per stage and its profiled runs, from a trace: ours
    (operators name their model; the `session.run` spans with `args.stages_us` were
    profiled) or ORT's own profile (one unnamed model, NO_MODEL; its `model_run` events
    are the runs). Models with no operators are not in it."""
    out: dict[str, ModelStages] = {}
    runs: Counter[str] = Counter()
    for e in events:
        args = e.get("args")
        args = args if isinstance(args, dict) else {}
        if is_operator(e):
            _add_stage(out.setdefault(str(args.get("model", NO_MODEL)), ModelStages()).us, e)
        elif e.get("name") == "session.run" and "stages_us" in args:
            runs[str(args.get("model", NO_MODEL))] += 1
        elif is_model_run(e):
            runs[NO_MODEL] += 1
    for name, model in out.items():
        model.runs = runs[name]
    return out


def _stage_us(ops: list[Event]) -> dict[ModelStage, int]:
    """The operators' µs per stage, every stage present (subgraph containers left out:
    their nodes are counted)."""
    us: dict[ModelStage, int] = dict.fromkeys(MODEL_STAGES, 0)
    for op in ops:
        _add_stage(us, op)
    return us


def _add_stage(us: dict[ModelStage, int], op: Event) -> None:
    """The operator's µs to its stage (a subgraph container's nodes count, not it)."""
    args = op.get("args")
    op_name = str(args.get("op_name", "")) if isinstance(args, dict) else ""
    if op_name not in SUBGRAPH_OPS:
        us[stage_of(op_name)] += int(op["dur"])


def with_stages(events: list[Event], runs: list[RunStages], pid: int) -> list[Event]:
    """`events` with each placed run's `session.run` span replaced by a copy that holds
    its stages (`args.stages_us`), and each model's stage counters (STAGE_COUNTERS): only
    the stages that model's runs had, so a model on the CPU provider gets `compute_us`
    alone. The spans are copied, never changed: other readers hold the same dicts."""
    placed = {id(r.span): (r.span, r.us) for r in runs if r.span is not None}
    out = [_with_stages(e, placed[id(e)][1]) if id(e) in placed else e for e in events]
    seen: dict[str, set[ModelStage]] = {}
    for span, us in placed.values():
        seen.setdefault(span["args"]["model"], set()).update(s for s in MODEL_STAGES if us[s])
    for span, us in placed.values():
        for stage in sorted(seen[span["args"]["model"]], key=MODEL_STAGES.index):
            name = f"{STAGE_COUNTERS[stage]}:{span['args']['model']}"
            out.append(_counter(name, pid, span["tid"], span["ts"], us[stage]))
            out.append(_counter(name, pid, span["tid"], span["ts"] + span["dur"], 0))
    return out


def _with_stages(span: Event, us: dict[ModelStage, int]) -> Event:
    return {**span, "args": {**span["args"], "stages_us": dict(us)}}


def _counter(name: str, pid: int, tid: int, ts: int, value: int) -> Event:
    """A counter sample, as the tracer writes them."""
    return {
        "name": name,
        "cat": "counter",
        "ph": "C",
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "args": {"value": value},
    }


def _spans_by_model(events: list[Event]) -> dict[str, list[Event]]:
    """Our `session.run` spans, per model, by start."""
    spans: dict[str, list[Event]] = {}
    for e in events:
        if e.get("name") == "session.run":
            spans.setdefault(e["args"]["model"], []).append(e)
    for model_spans in spans.values():
        model_spans.sort(key=_ts)
    return spans


def _moved(ops: list[Event], run: Event, span: Event, pid: int, stats: Placement) -> list[Event]:
    """A run's operators on its span's track, shifted by the least amount that puts the
    run inside the span."""
    start, end = run["ts"], run["ts"] + run["dur"]
    lo, hi = span["ts"], span["ts"] + span["dur"]
    shift = lo - start if start < lo else min(0, hi - end)
    stats.runs += 1
    stats.max_shift_us = max(stats.max_shift_us, abs(shift))
    model = span["args"]["model"]
    return [_operator(op, pid, span["tid"], op["ts"] + shift, model) for op in ops]


def _operator(op: Event, pid: int, tid: int, ts: int, model: str) -> Event:
    """One ORT operator of `model` as our trace's complete event on track `tid`, ORT's
    node name kept, its stage in `args.stage`."""
    args = {**(op.get("args") or {}), "model": model}
    args["stage"] = stage_of(str(args.get("op_name", "")))
    return {
        "name": op["name"],
        "cat": "Node",
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": op["dur"],
        "args": args,
    }


def _ts(event: Event) -> int:
    return int(event["ts"])


def _containing(spans: list[Event], starts: list[int], start: int, end: int) -> Event | None:
    """The span that holds the run [start, end] (each end within SLACK_US), if any.
    `spans` are one model's, by start (`starts`): one batcher runs one batch at a time,
    so only the last two that start early enough can hold it (two: a reload's batchers
    overlap)."""
    i = bisect_right(starts, start + SLACK_US)
    held = [s for s in spans[max(0, i - 2) : i] if end <= s["ts"] + s["dur"] + SLACK_US]
    return held[-1] if held else None
