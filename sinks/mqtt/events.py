"""Discrete events derived from one stream's results, in order (`<prefix>/<stream>/events`).

Two kinds of outputs make events; everything else in a result is ignored here:

* Counts: a dict of ints. The shapes of the counting blocks are known (pipelines/blocks):
  `line_counter` `{"in", "out", "total"}` → `line_crossed` when "in" or "out" grows;
  `zone_counter` `{"inside", "entered", "exited"}` → `zone_entered` / `zone_left` when
  "entered" / "exited" grows ("total" and "inside" are derived, so they make no events).
  Any other dict of ints → `count_changed` for each key whose value changed, either way.
  The first result of a stream sets the baseline: a sink (re)started mid-stream does not
  replay a day of crossings. A cumulative count that goes down means the stream's
  workflow restarted (its counters start at 0 again): the baseline follows, no event.
* Detections: the set of class names present. A class `class_appeared` on the first
  result it is in; `class_disappeared` once it has been absent for `absent_results`
  results in a row, so a detector missing one frame does not make a pair of events.

An event is `{"type", "output", ...}`; `event_message` adds the stream, seq and time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipelines.types import Detections, FrameResult
from sinks.messages import header

Event = dict[str, Any]

# Cumulative keys of the counting blocks' outputs, and the event each one's growth makes.
KNOWN_COUNTS: Mapping[frozenset[str], Mapping[str, str]] = {
    frozenset({"in", "out", "total"}): {"in": "line_crossed", "out": "line_crossed"},
    frozenset({"inside", "entered", "exited"}): {
        "entered": "zone_entered",
        "exited": "zone_left",
    },
}
ABSENT_RESULTS = 5  # results without a class before it "disappears": 0.2 s at 25 fps


def is_count(value: Any) -> bool:
    """A dict of plain ints (bool is an int in Python, but not a count)."""
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value.values())
    )


def class_names(dets: Detections) -> frozenset[str]:
    """The classes present: names when the model has labels, else ids as strings."""
    if dets.class_name:
        return frozenset(dets.class_name)
    return frozenset(str(i) for i in dets.class_id.tolist())


class EventDetector:
    """One stream's events; feed it every result of that stream, in order, on one thread."""

    def __init__(self, absent_results: int = ABSENT_RESULTS) -> None:
        if absent_results < 1:
            raise ValueError("absent_results must be >= 1")
        self.absent_results = absent_results
        self._counts: dict[str, Mapping[str, int]] = {}
        self._present: dict[str, dict[str, int]] = {}  # output → class → results absent

    def feed(self, result: FrameResult) -> list[Event]:
        events: list[Event] = []
        for name, value in result.outputs.items():
            if isinstance(value, Detections):
                events += self._classes(name, class_names(value))
            elif is_count(value):
                events += self._count(name, value)
        return events

    def _count(self, name: str, now: Mapping[str, int]) -> list[Event]:
        before = self._counts.get(name)
        self._counts[name] = dict(now)
        if before is None:
            return []  # the baseline
        known = KNOWN_COUNTS.get(frozenset(now))
        events: list[Event] = []
        for key, value in now.items():
            delta = value - before.get(key, value)
            if known is None and delta != 0:
                events.append(_count_event("count_changed", name, key, value, delta))
            elif known is not None and key in known and delta > 0:
                events.append(_count_event(known[key], name, key, value, delta))
        return events

    def _classes(self, name: str, now: frozenset[str]) -> list[Event]:
        absent = self._present.setdefault(name, {})
        events: list[Event] = []
        for cls in sorted(now - absent.keys()):
            events.append({"type": "class_appeared", "output": name, "class": cls})
        for cls in sorted(absent):
            absent[cls] = 0 if cls in now else absent[cls] + 1
            if absent[cls] >= self.absent_results:
                del absent[cls]
                events.append({"type": "class_disappeared", "output": name, "class": cls})
        for cls in now:
            absent.setdefault(cls, 0)
        return events


def _count_event(kind: str, output: str, key: str, value: int, delta: int) -> Event:
    return {"type": kind, "output": output, "key": key, "value": value, "delta": delta}


def event_message(result: FrameResult, event: Event) -> dict[str, Any]:
    """The document sent for one event: where and when, then the event itself."""
    return {**header(result), **event}
