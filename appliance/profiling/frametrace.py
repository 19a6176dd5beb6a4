"""One frame's trace: `GET /v1/streams/{id}/frames/{seq}/trace`, what an exemplar and a
row of the slowest frames lead to.

The answer is a Chrome/Perfetto trace of the frame and its neighbours (AROUND processed
frames of its stream either side): every event of every thread that overlaps them, so
the batcher's run each waited for, the other streams that shared the cores and the
grabber's decode are there beside the frame's own spans. It is cut from where the
frame is still held, newest first:
1. the ring of the last flushes the rolling writer handed over (`RecentEvents`): the
   frames of about the last `rotate_s`, the file being written included;
2. the rolling files, through their frame index (appliance/profiling/frameindex.py);
   the file being written is closed early when the frame is in it and not in the ring.
When a profiling window covered the frame, the cut comes from the window's trace
instead: the same events, with ONNX Runtime's operators. A frame in none of these has
rotated away: FrameNotHeldError (appliance/errors.py) says which is the stream's oldest
frame still held.

The cut keeps the trace strict: flows whose other end is outside it are left out (a
flow drawn to nowhere is an error in Perfetto), and every thread keeps its name.
"""

from __future__ import annotations

import gzip
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from appliance.errors import FrameNotHeldError
from appliance.profiling.frameindex import RUN_SPAN, FrameRanges
from appliance.profiling.rolling import RollingWriter

AROUND = 2  # processed frames of the stream either side of the one asked for
MAX_AROUND = 10
RING_EVENTS = 60_000  # about 25 MB of event dicts; a minute of 4 streams at 15 fps
Event = dict[str, Any]
# A done profiling window's trace covering [t0, t1] (wall-clock µs): (id, path) or None.
WindowLookup = Callable[[int, int], tuple[str, Path] | None]


class RecentEvents:
    """The rolling writer's listener: the events of its flushes of the last `keep_s`
    (the file being written, which is not readable yet: `rotate_s` and a flush or two),
    at most `limit` (the oldest flush goes first), and the name of every thread seen."""

    def __init__(self, limit: int = RING_EVENTS, keep_s: float = math.inf) -> None:
        self._limit = limit
        self._keep_s = keep_s
        self._flushes: deque[tuple[float, list[Event]]] = deque()  # (monotonic s, events)
        self._count = 0
        self._names: dict[tuple[int, int, str], Event] = {}  # (pid, tid, name) -> "M"
        self._lock = threading.Lock()

    def __call__(self, events: list[Event]) -> None:
        """On the writer's thread (or a flushing request's), with a flush's events."""
        kept = [e for e in events if e["ph"] != "M"]
        now = time.monotonic()
        with self._lock:
            for e in events:
                if e["ph"] == "M":
                    self._names[(e["pid"], e["tid"], e["name"])] = e
            if kept:
                self._flushes.append((now, kept))
                self._count += len(kept)
            flushes = self._flushes
            while len(flushes) > 1 and (
                self._count > self._limit or now - flushes[0][0] > self._keep_s
            ):
                self._count -= len(flushes.popleft()[1])

    def snapshot(self) -> tuple[list[Event], list[Event]]:
        """(events oldest first, thread and process names)."""
        with self._lock:
            flushes, names = list(self._flushes), list(self._names.values())
        return [e for _, flush in flushes for e in flush], names


@dataclass(frozen=True, slots=True)
class FrameTrace:
    """A cut: the trace document, and where it came from (`ring`, a file, a window)."""

    doc: dict[str, Any]
    source: str


class FrameTraces:
    """Finds a frame's trace in the ring, the rolling files or a window's trace."""

    def __init__(
        self, writer: RollingWriter, recent: RecentEvents, windows: WindowLookup | None = None
    ) -> None:
        self._writer = writer
        self._recent = recent
        self.windows = windows
        self._read: dict[Path, FrameRanges] = {}  # files from before this process

    def trace(self, stream: str, seq: int, around: int = AROUND) -> FrameTrace:
        """The frame's trace; FrameNotHeldError when no trace held has it."""
        self._writer.flush()  # the last second's events: a frame just done is there
        events, names = self._recent.snapshot()
        found = cut(events, names, stream, seq, around)
        source = "ring"
        if found is None:
            found, source = self._from_files(stream, seq, around)
        if found is None:
            raise FrameNotHeldError(stream, seq, self.oldest(stream, events))
        window = self._window(found, stream, seq, around)
        return window or FrameTrace(found, source)

    def _from_files(self, stream: str, seq: int, around: int) -> tuple[Event | None, str]:
        path = self._file_holding(stream, seq)
        # In the file being written (a busy minute pushed it out of the ring): closed now,
        # a period early. Only then: a request must not rotate files away by asking.
        if path is None and self._writer.writing(stream, seq) and self._writer.rotate():
            path = self._file_holding(stream, seq)
        if path is None:
            return None, ""
        doc = read_trace(path)
        events = doc.get("traceEvents", [])
        names = [e for e in events if e.get("ph") == "M"]
        return cut(events, names, stream, seq, around), f"file:{path.name}"

    def _window(self, doc: Event, stream: str, seq: int, around: int) -> FrameTrace | None:
        # The frame's own run inside the window: its model runs were the window's.
        run = doc["otherData"]["run_us"]
        hit = None if self.windows is None else self.windows(run[0], run[1])
        if hit is None:
            return None
        window_id, path = hit
        events = read_trace(path).get("traceEvents", [])
        names = [e for e in events if e.get("ph") == "M"]
        found = cut(events, names, stream, seq, around)
        return None if found is None else FrameTrace(found, f"window:{window_id}")

    def _files(self) -> list[tuple[Path, FrameRanges]]:
        """Every rolling file on disk with its frames, newest first."""
        index = dict(self._writer.index)
        folder = self._writer.directory / "rolling"
        paths = sorted(folder.glob("trace-*.json*"), key=lambda p: p.name, reverse=True)
        out = []
        for path in paths:
            if path.name.endswith(".tmp"):
                continue
            ranges = index.get(path) or self._read.get(path)
            if ranges is None:  # written before this process: its otherData says
                ranges = self._read[path] = _ranges_of(path)
            out.append((path, ranges))
        return out

    def _file_holding(self, stream: str, seq: int) -> Path | None:
        return next((p for p, r in self._files() if r.holds(stream, seq)), None)

    def oldest(self, stream: str, recent: Iterable[Event] = ()) -> int | None:
        """The stream's oldest frame still held: in the oldest file that has it, else
        in the ring."""
        for _path, ranges in reversed(self._files()):
            first = ranges.oldest(stream)
            if first is not None:
                return first
        ring = FrameRanges()
        ring.add(recent)
        return ring.oldest(stream)


def read_trace(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    doc: dict[str, Any] = orjson.loads(data)
    return doc


def _ranges_of(path: Path) -> FrameRanges:
    try:
        other = read_trace(path).get("otherData") or {}
    except (OSError, ValueError, EOFError):  # half written, or not ours: holds nothing
        return FrameRanges()
    return FrameRanges(other.get("frames") or {})


def cut(
    events: list[Event], names: Iterable[Event], stream: str, seq: int, around: int = AROUND
) -> dict[str, Any] | None:
    """The trace of frame `seq` of `stream` and `around` frames either side, from
    `events`; None when they hold no workflow run of that frame."""
    runs, grabs = _frame_spans(events, stream)
    if seq not in runs:
        return None
    ordered = sorted(runs)
    at = ordered.index(seq)
    seqs = ordered[max(0, at - around) : at + around + 1]
    chosen = set(seqs)
    spans = [runs[s] for s in seqs] + [grabs[s] for s in seqs if s in grabs]
    spans += _later_spans(events, stream, chosen)  # their sinks' deliveries
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    picked = _closed([e for e in events if e["ph"] != "M" and _overlaps(e, t0, t1)])
    picked.sort(key=lambda e: e["ts"])
    threads = {(e["pid"], e["tid"]) for e in picked}
    meta = [m for m in names if m["name"] == "process_name" or (m["pid"], m["tid"]) in threads]
    other = {
        "source": "appliance frame trace",
        "stream": stream,
        "seq": seq,
        "frames": seqs,
        "span_us": [t0, t1],
        "run_us": [runs[seq]["ts"], runs[seq]["ts"] + runs[seq]["dur"]],
    }
    return {"traceEvents": meta + picked, "displayTimeUnit": "ms", "otherData": other}


def _frame_spans(events: list[Event], stream: str) -> tuple[dict[int, Event], dict[int, Event]]:
    """The stream's workflow runs and grabs by seq (a later one of a seq wins: the
    stream's newest life)."""
    runs: dict[int, Event] = {}
    grabs: dict[int, Event] = {}
    for e in events:
        if e["ph"] != "X":
            continue
        args = e.get("args")
        if not args or args.get("stream") != stream or "seq" not in args:
            continue
        if e["name"] == RUN_SPAN:
            runs[args["seq"]] = e
        elif e["name"] == "grab":
            grabs[args["seq"]] = e
    return runs, grabs


def _later_spans(events: list[Event], stream: str, seqs: set[int]) -> list[Event]:
    """The spans of these frames after their run: the sinks' deliveries."""
    return [
        e
        for e in events
        if e["ph"] == "X"
        and e.get("cat") == "sink"
        and (e.get("args") or {}).get("stream") == stream
        and e["args"].get("seq") in seqs
    ]


def _overlaps(e: Mapping[str, Any], t0: int, t1: int) -> bool:
    ts = e["ts"]
    if e["ph"] == "X":
        return bool(ts <= t1 and ts + e["dur"] >= t0)
    return bool(t0 <= ts <= t1)


def _closed(events: list[Event]) -> list[Event]:
    """`events` without the flows whose other end is not among them."""
    starts = {e["id"] for e in events if e["ph"] == "s"}
    ends = {e["id"] for e in events if e["ph"] == "f"}
    paired = starts & ends
    outs = {e["bind_id"] for e in events if e.get("flow_out")}
    ins = {e["bind_id"] for e in events if e.get("flow_in")}
    bound = outs & ins
    kept: list[Event] = []
    for e in events:
        if e["ph"] in ("s", "f"):
            if e["id"] in paired:
                kept.append(e)
        elif "bind_id" in e and e["bind_id"] not in bound:
            kept.append({k: v for k, v in e.items() if k not in ("bind_id", "flow_in", "flow_out")})
        else:
            kept.append(e)
    return kept
