"""What `appliance trace summarize` adds for a trace with model runs: each model's node
time per stage (host->device copy, compute, device->host copy) and, per stream, which
thread bounds its frame rate (decode, Python, or the device)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import Any

from appliance.observe.metrics import MODEL_STAGES
from appliance.profiling.operators import stage_totals
from appliance.tools.trace_file import Event, event_args


def stage_rows(events: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Per model with operators in the trace, hottest first: its profiled runs, its node
    time per stage (host->device copy, compute, device->host copy) in ms, and the copies'
    share of it in %."""
    rows: dict[str, dict[str, float | int]] = {}
    totals = stage_totals(events)
    for model, stages in sorted(totals.items(), key=lambda m: -sum(m[1].us.values())):
        us = stages.us
        rows[model] = {"runs": stages.runs}
        rows[model] |= {f"{stage}_ms": round(us[stage] / 1000, 3) for stage in MODEL_STAGES}
        copies = us["h2d"] + us["d2h"]
        rows[model]["copy_share"] = round(100 * copies / (sum(us.values()) or 1), 2)
    return rows


def where_rows(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per stream with traced frames, ms per frame: decode (its grab thread's `decode`
    spans), python (its worker's `workflow.run` outside its model waits), queue (waiting
    for a batch: `queue.wait`) and device (the `session.run` that served it: the worker
    waits the whole run), and the largest of decode, python and device: the thread that
    bounds the stream's frame rate (grab, worker or the model's batcher)."""
    spans = [e for e in events if e["ph"] == "X"]
    runs = {(event_args(e).get("model"), e["ts"]): e["dur"] for e in spans if _is(e, "session.run")}
    frames: dict[str, list[Event]] = defaultdict(list)
    decode: dict[str, list[float]] = defaultdict(list)
    waits: dict[tuple[Any, Any], list[Event]] = defaultdict(list)  # per track, by start
    for e in sorted(spans, key=lambda e: e["ts"]):
        stream = event_args(e).get("stream")
        if _is(e, "workflow.run") and stream is not None:
            frames[str(stream)].append(e)
        elif _is(e, "decode") and stream is not None:
            decode[str(stream)].append(e["dur"])
        elif _is(e, "queue.wait"):
            waits[(e.get("pid"), e.get("tid"))].append(e)
    starts = {track: [w["ts"] for w in ws] for track, ws in waits.items()}
    rows = {}
    for stream, frame_spans in sorted(frames.items()):
        n, queue_us, device_us = len(frame_spans), 0.0, 0.0
        for f in frame_spans:
            track = (f.get("pid"), f.get("tid"))
            inside = _inside(f, waits.get(track, []), starts.get(track, []))
            queue_us += sum(w["dur"] for w in inside)
            served = {(event_args(w).get("model"), w["ts"] + w["dur"]) for w in inside}
            device_us += sum(runs.get(key, 0) for key in served)
        python_us = sum(f["dur"] for f in frame_spans) - queue_us - device_us
        ms = {"decode": _mean_ms(decode[stream]), "python": python_us / n / 1000}
        ms |= {"device": device_us / n / 1000}
        row: dict[str, Any] = {"frames": n, **{k: round(v, 3) for k, v in ms.items()}}
        row["queue"] = round(queue_us / n / 1000, 3)
        row["bottleneck"] = max(ms, key=lambda k: ms[k])
        rows[stream] = row
    return rows


def _inside(outer: Event, spans: list[Event], starts: list[float]) -> list[Event]:
    """The `spans` (by start: `starts`) within `outer`."""
    lo = bisect_left(starts, outer["ts"])
    hi = bisect_right(starts, outer["ts"] + outer["dur"])
    return [e for e in spans[lo:hi] if _within(e, outer)]


def _is(event: Event, name: str) -> bool:
    return bool(event["name"] == name)


def _within(inner: Event, outer: Event) -> bool:
    return bool(
        outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]
    )


def _mean_ms(durs: list[float]) -> float:
    return sum(durs) / len(durs) / 1000 if durs else 0.0
