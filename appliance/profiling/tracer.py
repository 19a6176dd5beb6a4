"""The tracer: spans recorded into per-thread buffers, drained into Chrome trace events.

Hot path: one tuple appended to the calling thread's own list (no lock: list.append is
atomic under the GIL, and each thread has its own list). A virtual track (`track`) is a
timeline of its own that any thread may append to: a model's `session.run` spans stay on
the model's track whichever thread ran them. Timestamps are time.perf_counter() seconds,
mapped once to wall-clock microseconds when the trace is written (`anchor_us`), and
floored to whole microseconds: flooring is monotonic, so a span inside another stays
inside after rounding (Perfetto and chrome://tracing need proper nesting per thread).

Flows (the arrows a viewer draws between threads) come in the two forms of the format:
- bound to a span itself (`bind_id` with `flow_out` / `flow_in` on the "X" event): exact,
  for one-to-one hops (a frame's decode -> its workflow run);
- "s" / "f" events (one pair per id), for many-to-one hops (each sample's wait -> the one
  batch that served it), since a span carries a single `bind_id`. Perfetto binds an "s"
  or an "f" with `"bp": "e"` to the innermost slice open on that thread when it reads the
  event, and it reads a timestamp's slices before its flow events (longest slice first),
  so each is placed at the start of its slice and written after it.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# (ph, name, cat, start s, end s or counter value, tid, args, flow id or 0).
# ph is the trace's own, except "X>" / "X<": a span that a flow leaves / enters.
Event = tuple[str, str, str, float, float, int, Mapping[str, Any] | None, int]

FLOW_NAME = "sample"  # the "s" / "f" pairs: one sample's hop from its wait to its batch
_FLOW_PHASES = ("s", "f")


@dataclass
class Track:
    """One timeline of the trace, named like a thread: a thread's own (only that thread
    appends), or a virtual one (`Tracer.track`: any thread appends, atomically)."""

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
        self._buffers: list[Track] = []  # every thread's and every virtual track
        self._lock = threading.Lock()  # taken once per thread (registration) and per drain
        self._tids = itertools.count(1)
        self._stream_tids: dict[str, int] = {}
        self._tracks: dict[tuple[str, int], Track] = {}

    def _buffer(self) -> Track:
        buf: Track | None = getattr(self._local, "buf", None)
        if buf is None:
            with self._lock:
                buf = Track(next(self._tids), threading.current_thread().name, [])
                self._buffers.append(buf)
            self._local.buf = buf
        return buf

    def track(self, name: str, instance: int = 0) -> Track:
        """The virtual track `name` (`instance` tells apart two of one name that may
        overlap in time), made on first use: its tid is stable, any thread may write to
        it (pass it as `track`). A dict lookup once made; the lock only to make it."""
        key = (name, instance)
        found = self._tracks.get(key)
        if found is None:
            with self._lock:
                found = self._tracks.get(key)
                if found is None:
                    found = self._tracks[key] = Track(next(self._tids), name, [])
                    self._buffers.append(found)
        return found

    def bind_stream(self, stream_id: str) -> None:
        """Called on a stream's worker thread: its waits on models go on this track."""
        self._stream_tids[stream_id] = self._buffer().tid

    def span(
        self,
        name: str,
        cat: str,
        start: float,
        end: float,
        args: Mapping[str, Any] | None = None,
        track: Track | None = None,
    ) -> None:
        """A complete event on `track`, or the calling thread's (perf_counter seconds)."""
        if self.enabled:
            buf = self._buffer() if track is None else track
            buf.events.append(("X", name, cat, start, end, buf.tid, args, 0))

    def span_flow_out(
        self, name: str, cat: str, start: float, end: float, args: Mapping[str, Any], flow_id: int
    ) -> None:
        """A span that flow `flow_id` leaves (bound to the span itself)."""
        if self.enabled:
            buf = self._buffer()
            buf.events.append(("X>", name, cat, start, end, buf.tid, args, flow_id))

    def span_flow_in(
        self, name: str, cat: str, start: float, end: float, args: Mapping[str, Any], flow_id: int
    ) -> None:
        """A span that flow `flow_id` enters (bound to the span itself); 0: no flow."""
        if self.enabled:
            buf = self._buffer()
            buf.events.append(("X<", name, cat, start, end, buf.tid, args, flow_id))

    def span_for_stream(
        self,
        stream_id: str,
        name: str,
        cat: str,
        start: float,
        end: float,
        args: Mapping[str, Any],
        flow_id: int = 0,
        track: Track | None = None,
    ) -> None:
        """A complete event on a stream worker's track, recorded from any thread
        (nothing when the stream has no track). With `flow_id`, a flow from this span to
        the span that starts at `end` on `track`, or on the calling thread's own track
        (record that span first)."""
        tid = self._stream_tids.get(stream_id)
        if not self.enabled or tid is None:
            return
        buf = self._buffer() if track is None else track
        buf.events.append(("X", name, cat, start, end, tid, args, 0))
        if flow_id:  # with the span's args: a window kept for some streams keeps its flows
            buf.events.append(("s", FLOW_NAME, "flow", start, start, tid, args, flow_id))
            buf.events.append(("f", FLOW_NAME, "flow", end, end, buf.tid, args, flow_id))

    def counter(self, name: str, at: float, value: float, track: Track | None = None) -> None:
        """A counter sample (kept with `track`'s events, or the calling thread's). Viewers
        draw one track per process and name: give each series (stream, model) its own."""
        if self.enabled:
            buf = self._buffer() if track is None else track
            buf.events.append(("C", name, "counter", at, value, buf.tid, None, 0))

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
        # By time; at one time, slices before the flows bound to them (see the top).
        taken.sort(key=lambda e: (e[3], e[0] in _FLOW_PHASES))
        out.extend(self._to_json(e) for e in taken)
        return out

    def _metadata(self, buffers: list[Track]) -> list[dict[str, Any]]:
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
        ph, name, cat, start, end, tid, args, flow_id = e
        ts = int(start * 1e6 + self.anchor_us)
        event: dict[str, Any] = {"name": name, "cat": cat, "ph": ph[0], "pid": self.pid}
        event["tid"], event["ts"] = tid, ts
        if ph == "C":
            event["args"] = {"value": end}
            return event
        if ph in _FLOW_PHASES:
            event["id"] = flow_id
            if ph == "f":
                event["bp"] = "e"  # bound to the enclosing slice, not the next one
        else:
            event["dur"] = max(int(end * 1e6 + self.anchor_us) - ts, 0)
            if flow_id:
                event["bind_id"] = flow_id
                event["flow_out" if ph == "X>" else "flow_in"] = True
        if args:
            event["args"] = dict(args)
        return event
