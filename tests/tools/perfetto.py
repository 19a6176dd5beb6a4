"""How Perfetto's JSON importer reads a trace's counters and flows, for tests that check a
written trace the way the UI will show it (google/perfetto,
src/trace_processor/importers/json/json_trace_parser_impl.cc, the sorter's JSON order and
the slice and flow trackers):

- a counter ("C") goes on the process's counter track named `name` (plus " id: <id>" when
  the event has an id) plus " " and the arg's key: one track per pid and that name;
- events are read in (ts, order, file position) order, where the order puts, at one ts,
  complete slices longest first and every other event (flows, counters) after them;
- a slice opening first closes the slices of its thread that ended before it (or at its
  start); a slice that has ended stays open until then;
- an "s", or an "f" with "bp": "e", binds to the innermost open slice of its thread at
  that moment; an "f" without it binds to the next slice that opens on its thread;
  "s"/"f" ids are matched within (id, cat, name);
- a slice with "bind_id" and "flow_out" / "flow_in" is itself the flow's end.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]


def counter_tracks(events: list[Event]) -> dict[tuple[int, str], list[tuple[int, float]]]:
    """Every counter track: (pid, track name) -> [(ts, value)] in file order."""
    tracks: dict[tuple[int, str], list[tuple[int, float]]] = defaultdict(list)
    for e in events:
        if e["ph"] != "C":
            continue
        prefix = e["name"] + (f" id: {e['id']}" if "id" in e else "")
        for key, value in e["args"].items():
            tracks[(e["pid"], f"{prefix} {key}")].append((e["ts"], float(value)))
    return dict(tracks)


@dataclass(frozen=True)
class Slice:
    name: str
    pid: int
    tid: int
    ts: int
    dur: int
    args: dict[str, Any] = field(hash=False, compare=False)
    index: int = 0  # position in the file: tells equal slices apart

    @property
    def end(self) -> int:
        return self.ts + self.dur


@dataclass(frozen=True)
class Flow:
    """An arrow from `source` to `target`; `source_ts`, `target_ts`: its events' ts."""

    source: Slice
    target: Slice
    source_ts: int
    target_ts: int


@dataclass
class _Reader:
    stacks: dict[tuple[int, int], list[Slice]] = field(default_factory=lambda: defaultdict(list))
    pending: dict[tuple[int, int], list[tuple[Any, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    starts: dict[Any, tuple[Slice, int]] = field(default_factory=dict)
    flows: list[Flow] = field(default_factory=list)
    unbound: list[Event] = field(default_factory=list)

    def open(self, e: Event, index: int) -> None:
        track = (e["pid"], e["tid"])
        new = Slice(e["name"], e["pid"], e["tid"], e["ts"], e["dur"], e.get("args", {}), index)
        stack = self.stacks[track]
        while stack and (
            stack[-1].end < new.ts or (stack[-1].end == new.ts and (stack[-1].dur or new.dur))
        ):
            stack.pop()
        stack.append(new)
        for key, ts in self.pending.pop(track, []):
            self.end(key, new, ts)
        if "bind_id" in e and e.get("flow_out"):
            self.starts[("v2", e["bind_id"])] = (new, new.ts)
        if "bind_id" in e and e.get("flow_in"):
            self.end(("v2", e["bind_id"]), new, new.ts)

    def flow_event(self, e: Event) -> None:
        track = (e["pid"], e["tid"])
        key = ("v1", e["id"], e.get("cat"), e["name"])
        stack = self.stacks[track]
        if e["ph"] == "f" and e.get("bp") != "e":
            self.pending[track].append((key, e["ts"]))
        elif not stack:
            self.unbound.append(e)
        elif e["ph"] == "s":
            self.starts[key] = (stack[-1], e["ts"])
        else:
            self.end(key, stack[-1], e["ts"])

    def end(self, key: Any, target: Slice, ts: int) -> None:
        if key in self.starts:
            source, source_ts = self.starts[key]
            self.flows.append(Flow(source, target, source_ts, ts))


def _order(item: tuple[int, Event]) -> tuple[int, float, int]:
    index, e = item
    rank = -e["dur"] if e["ph"] == "X" else 0  # longest slice first, then the rest
    return (e["ts"], rank, index)


def read_flows(events: list[Event]) -> tuple[list[Flow], list[Event]]:
    """The flows Perfetto draws, and the flow events it could bind to no slice."""
    reader = _Reader()
    timed = [(i, e) for i, e in enumerate(events) if e["ph"] in ("X", "s", "f")]
    for index, e in sorted(timed, key=_order):
        if e["ph"] == "X":
            reader.open(e, index)
        else:
            reader.flow_event(e)
    return reader.flows, reader.unbound
