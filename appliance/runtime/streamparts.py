"""The small records of a stream (appliance/runtime/streams.py): its state changes, its
last error, the heartbeat the supervisor reads, and a switch of workflow."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from appliance.observe import status
from appliance.observe.metrics import StreamMetrics
from appliance.observe.status import StateName
from appliance.profiling.hooks import StreamTrace
from appliance.sources import StreamState
from pipelines.executor import CompiledWorkflow, WorkflowRun
from pipelines.types import iso_utc


@dataclass(frozen=True, slots=True)
class Transition:
    """One state change: wall-clock time (s), new state, why."""

    time: float
    state: StreamState
    reason: str

    def to_status(self) -> status.Transition:
        return status.Transition(self.time, state_name(self.state), self.reason, iso_utc(self.time))


@dataclass(frozen=True, slots=True)
class LastError:
    """The stream's latest error: why (credentials masked), when (wall clock, s), and how
    many frames the stream had processed then: a frame processed since clears it."""

    reason: str
    time: float
    frames: int


@dataclass(slots=True)
class Switch:
    """Another workflow for a running stream (a shadow promoted, or rolled back), applied
    by its worker between two frames: the frame it takes next runs the new workflow, so
    none is lost and sequence numbers go on (RunningStreams.switch)."""

    workflow: CompiledWorkflow
    run: WorkflowRun | None  # the instance to go on with (warm block state), or a new one
    metrics: StreamMetrics
    trace: StreamTrace | None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What the supervisor reads of a stream. Times are time.perf_counter() seconds,
    0.0 while idle (waiting for a frame, pacing, reconnecting)."""

    working_since: float  # the worker's current frame began
    reading_since: float  # the grabber's current read began
    worker: int | None  # the worker thread's ident, to name the block it is stuck in
    worker_died: bool  # it ended without finishing (an exception outside the workflow)
    started: float  # when the stream started


def state_name(state: StreamState) -> StateName:
    """The state's wire name (StateName lists StreamState's values; a test keeps them so)."""
    return state.value
