"""Tests of appliance.sources; the helpers below drive a real Grabber and watch its states."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from appliance.sources import Grabber, LatestFrame, StreamState, slot_for
from appliance.sources.config import SourceConfig
from pipelines.types import Frame

# FFmpeg probes an RTSP stream for ~2 s by default; 0.2 s is plenty for one H.264 track.
FAST_PROBE = {"analyzeduration": "200000"}
WAIT_S = 30.0  # upper bound of any wait in these tests; normal runs take a fraction


class StateLog:
    """The StateCallback of a grabber: records (state, reason, perf_counter) and wakes waiters."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.events: list[tuple[StreamState, str, float]] = []

    def __call__(self, state: StreamState, reason: str) -> None:
        with self._cond:
            self.events.append((state, reason, time.perf_counter()))
            self._cond.notify_all()

    @property
    def states(self) -> list[StreamState]:
        with self._cond:
            return [state for state, _, _ in self.events]

    def wait_for(
        self, state: StreamState, *, after: int = 0, timeout: float = WAIT_S
    ) -> tuple[int, str, float]:
        """Wait for `state` at position >= `after`; (position, reason, time) of the first."""
        found: list[tuple[int, str, float]] = []

        def seen() -> bool:
            found[:] = [(i, r, t) for i, (s, r, t) in enumerate(self.events) if s is state]
            found[:] = [hit for hit in found if hit[0] >= after]
            return bool(found)

        with self._cond:
            if not self._cond.wait_for(seen, timeout):
                raise AssertionError(f"no {state.value} within {timeout} s: {self.events}")
        return found[0]


@dataclass
class Run:
    """A started grabber with its slot and state log."""

    grabber: Grabber
    slot: LatestFrame
    states: StateLog

    def take(self, count: int, timeout: float = WAIT_S) -> list[Frame]:
        """The next `count` frames the consumer gets."""
        frames: list[Frame] = []
        deadline = time.perf_counter() + timeout
        while len(frames) < count:
            frame = self.slot.get(max(0.0, deadline - time.perf_counter()))
            assert frame is not None, f"got {len(frames)} of {count} frames: {self.states.events}"
            frames.append(frame)
        return frames

    def drain(self, work_s: float = 0.0, timeout: float = WAIT_S) -> list[Frame]:
        """Every frame until the grabber closes the slot; `work_s` simulates a slow consumer."""
        frames: list[Frame] = []
        deadline = time.perf_counter() + timeout
        busy = threading.Event()  # never set: waiting on it is the consumer's "work"
        while time.perf_counter() < deadline:
            frame = self.slot.get(timeout=1.0)
            if frame is None:
                if self.slot.closed:
                    return frames
                continue
            frames.append(frame)
            if work_s:
                busy.wait(work_s)
        raise AssertionError(f"slot still open after {timeout} s: {self.states.events}")


@dataclass
class Harness:
    """Starts grabbers for a test and stops every one of them at the end."""

    resolve_path: Callable[[str], Path]
    runs: list[Run] = field(default_factory=list)

    def start(self, url: str, *, stream_id: str = "cam", **cfg: Any) -> Run:
        config = SourceConfig(url=url, **cfg)
        slot, states = slot_for(config), StateLog()
        run = Run(Grabber(stream_id, config, slot, states, self.resolve_path), slot, states)
        run.grabber.start()
        self.runs.append(run)
        return run

    def stop_all(self) -> None:
        for run in self.runs:
            assert_stops(run.grabber)


def assert_stops(grabber: Grabber, within_s: float = 3.0) -> None:
    """stop() returns True within `within_s` and the thread is gone."""
    started = time.perf_counter()
    assert grabber.stop(timeout=within_s), f"grab:{grabber.stream_id} did not stop"
    assert time.perf_counter() - started < within_s
    names = {t.name for t in threading.enumerate()}
    assert f"grab:{grabber.stream_id}" not in names
