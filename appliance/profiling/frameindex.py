"""Which frames a trace holds: per stream, the ranges of sequence numbers whose workflow
runs (`workflow.run` spans, appliance/profiling/hooks.py) it has.

A rolling file's ranges are kept beside it while the writer runs (`RollingWriter.index`)
and written into its `otherData.frames`, so a file from before a restart says what it
holds too. A stream restarted numbers its frames from 0 again: a new range then, and a
seq may be in two ranges of one stream (the newer is the one asked for, by default).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

RUN_SPAN = "workflow.run"  # the span that makes a frame (one per frame processed)


def frame_of(event: Mapping[str, Any]) -> tuple[str, int] | None:
    """(stream, seq) of a workflow run's span; None for any other event."""
    if event.get("name") != RUN_SPAN or event.get("ph") != "X":
        return None
    args = event.get("args") or {}
    stream, seq = args.get("stream"), args.get("seq")
    if not isinstance(stream, str) or not isinstance(seq, int):
        return None
    return stream, seq


class FrameRanges:
    """Per stream, [first, last] seq ranges in the order they were written."""

    def __init__(self, ranges: Mapping[str, list[list[int]]] | None = None) -> None:
        self.ranges: dict[str, list[list[int]]] = {
            k: [list(r) for r in v] for k, v in (ranges or {}).items()
        }

    def add(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Take in the workflow runs among `events` (a flush's, in time order)."""
        for event in events:
            frame = frame_of(event)
            if frame is None:
                continue
            stream, seq = frame
            spans = self.ranges.setdefault(stream, [])
            if spans and spans[-1][0] <= seq:  # the stream goes on (or a sampled gap)
                spans[-1][1] = max(spans[-1][1], seq)
            else:  # the first, or a restart numbering from 0 again
                spans.append([seq, seq])

    def holds(self, stream: str, seq: int) -> bool:
        return any(lo <= seq <= hi for lo, hi in self.ranges.get(stream, ()))

    def oldest(self, stream: str) -> int | None:
        """The stream's first seq here (of its first range), None if it has none."""
        spans = self.ranges.get(stream)
        return spans[0][0] if spans else None
