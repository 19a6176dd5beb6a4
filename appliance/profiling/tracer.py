"""The tracer: spans recorded into per-thread buffers, drained into Chrome trace events.

Hot path: one tuple appended to the calling thread's own list (no lock: list.append is
atomic under the GIL, and each thread has its own list). Timestamps are
time.perf_counter() seconds, mapped once to wall-clock microseconds when the trace is
written (`anchor_us`), and floored to whole microseconds: flooring is monotonic, so a span
inside another stays inside after rounding (Perfetto and chrome://tracing need proper
nesting per thread).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# (ph, name, cat, start s, end s or counter value, tid, args)
Event = tuple[str, str, str, float, float, int, Mapping[str, Any] | None]


@dataclass
class _Buffer:
    tid: int
    name: str
    events: list[Event]


class Tracer:
    """Collects spans from every thread; `drain()` hands them over as trace events."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.pid = os.getpid()
        # perf_counter -> wall clock, measured once: both clocks read back to back.
        self.anchor_us = (time.time() - time.perf_counter()) * 1e6
        self._local = threading.local()
        self._buffers: list[_Buffer] = []
        self._lock = threading.Lock()  # taken once per thread (registration) and per drain
        self._tids = itertools.count(1)
        self._stream_tids: dict[str, int] = {}

    def _buffer(self) -> _Buffer:
        buf: _Buffer | None = getattr(self._local, "buf", None)
        if buf is None:
            with self._lock:
                buf = _Buffer(next(self._tids), threading.current_thread().name, [])
                self._buffers.append(buf)
            self._local.buf = buf
        return buf

    def bind_stream(self, stream_id: str) -> None:
        """Called on a stream's worker thread: its waits on models go on this track."""
        self._stream_tids[stream_id] = self._buffer().tid

    def span(
        self, name: str, cat: str, start: float, end: float, args: Mapping[str, Any] | None = None
    ) -> None:
        """A complete event on the calling thread's track (perf_counter seconds)."""
        if self.enabled:
            buf = self._buffer()
            buf.events.append(("X", name, cat, start, end, buf.tid, args))

    def span_for_stream(
        self, stream_id: str, name: str, cat: str, start: float, end: float, args: Mapping[str, Any]
    ) -> None:
        """A complete event on a stream worker's track, recorded from another thread."""
        tid = self._stream_tids.get(stream_id)
        if self.enabled and tid is not None:
            self._buffer().events.append(("X", name, cat, start, end, tid, args))

    def flow(self, phase: str, flow_id: int, at: float) -> None:
        """A flow event linking one frame's journey across threads: "s" starts it inside
        the current slice, "f" ends it bound to the enclosing slice."""
        if self.enabled:
            buf = self._buffer()
            buf.events.append((phase, "frame", "flow", at, float(flow_id), buf.tid, None))

    def counter(self, name: str, at: float, value: float) -> None:
        if self.enabled:
            buf = self._buffer()
            buf.events.append(("C", name, "counter", at, value, buf.tid, None))

    def drain(self) -> list[dict[str, Any]]:
        """Every event recorded since the last drain, as Trace Event Format dicts, with
        the process and thread names as metadata events."""
        with self._lock:
            buffers = list(self._buffers)
        taken: list[Event] = []
        for buf in buffers:
            events, buf.events = buf.events, []  # swap: the owner appends to the new list
            taken.extend(events)
        out = self._metadata(buffers)
        out.extend(self._to_json(e) for e in sorted(taken, key=lambda e: e[3]))
        return out

    def _metadata(self, buffers: list[_Buffer]) -> list[dict[str, Any]]:
        pid = self.pid
        meta: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "appliance"}}
        ]
        meta.extend(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": b.tid, "args": {"name": b.name}}
            for b in buffers
        )
        return meta

    def _to_json(self, e: Event) -> dict[str, Any]:
        ph, name, cat, start, end, tid, args = e
        ts = int(start * 1e6 + self.anchor_us)
        if ph == "C":
            return {"name": name, "cat": cat, "ph": "C", "pid": self.pid, "tid": tid, "ts": ts,
                    "args": {"value": end}}  # fmt: skip
        if ph in ("s", "f"):
            flow = {"name": name, "cat": cat, "ph": ph, "pid": self.pid, "tid": tid, "ts": ts,
                    "id": int(end)}  # fmt: skip
            if ph == "f":
                flow["bp"] = "e"  # bind to the enclosing slice (the workflow run)
            return flow
        dur = int(end * 1e6 + self.anchor_us) - ts
        event = {"name": name, "cat": cat, "ph": "X", "pid": self.pid, "tid": tid, "ts": ts,
                 "dur": max(dur, 0)}  # fmt: skip
        if args:
            event["args"] = dict(args)
        return event
