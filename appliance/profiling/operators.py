"""ONNX Runtime's operators put on our trace timeline, inside the `session.run` that ran them.

A profiling window (appliance/profiling/windows.py) reads the operators of its profiled
sessions (`ort_profile.read_operators`: ORT's `model_run` events and operators, on ORT's
clock, each tagged with its `model`) and the spans our tracer wrote meanwhile. ORT's clock
and ours disagree by a little, so each ORT run is matched to the `session.run` span of its
model that holds it, within SLACK_US at each end, and its operators move with it, rigidly,
by the least shift that puts the run inside the span: their order and gaps stay as ORT
measured them. Each placed operator names its model in `args.model` (the span's), so a
trace with several models ties every node to its own. Pure functions over trace events;
nothing here touches ORT.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import asdict, dataclass
from typing import Any

from appliance.profiling.ort_profile import is_model_run, is_operator

Event = dict[str, Any]
# ORT's clock vs ours, µs: an ORT run that reaches at most this far outside one of our
# session.run spans of its model is that span's run.
SLACK_US = 2000


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


def place_operators(
    ort: list[Event], events: list[Event], pid: int
) -> tuple[list[Event], dict[str, int]]:
    """ORT's operators (`ort`: its runs and operators) moved onto the track of the
    `session.run` span in `events` that ran them, as trace events of process `pid`. Runs
    with no span are left out. Returns the placed operators and how well the clocks met
    (Placement's fields)."""
    spans = _spans_by_model(events)
    starts = {model: [_ts(e) for e in model_spans] for model, model_spans in spans.items()}
    placed: list[Event] = []
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
            if span is None:
                stats.runs_left_out += 1
                continue
            placed += _moved(mine, run, span, pid, stats)
        stats.orphans += len(ops) - i
    stats.operators = len(placed)
    return placed, stats.as_dict()


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
    """One ORT operator of `model` as our trace's complete event on track `tid`."""
    args = {**(op.get("args") or {}), "model": model}
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
