"""What the regression watch reports: a regression (or a host slowdown) with its numbers and
evidence, each stream's watch state, and the whole watch (`GET /v1/regressions`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

WatchState = Literal["off", "warming", "learning", "watching"]
# A row's, and `idle`: a block that has not run yet, a drawing nobody has watched.
RowState = Literal["off", "warming", "learning", "watching", "idle"]


@dataclass(frozen=True, slots=True)
class Change:
    """What changed before a regression: a reload, a stream restart, the appliance's start."""

    what: str
    at: str  # ISO 8601 UTC
    summary: str


@dataclass(frozen=True, slots=True)
class Victim:
    """A row slower only by waiting: its latency and own cost now over its baseline's."""

    name: str
    ratio: float
    own_ratio: float | None


@dataclass(frozen=True, slots=True)
class ContentionEvent:
    """Rows that became victims at one comparison, and what they waited for."""

    type: str  # "contention", or "load_changed" when a change of load explains them
    at: str  # ISO 8601 UTC
    rows: list[Victim]
    culprits: list[str]  # rows in regression (their own cost grew) meanwhile
    change: Change | None  # the change of load that explains them, if any
    wait_ratio: float | None  # the streams' threads' waits for a core, now / learned
    probe_ratio: float | None


@dataclass(frozen=True, slots=True)
class Evidence:
    """The profiling window the watch opened itself on the regression."""

    window: str
    trace: str  # /v1/profiling/{id}/trace: ready once the window is done
    ort_operators: bool


@dataclass(slots=True)
class Regression:
    """A row (a block, a model's session.run or queue wait, a frame age) or the host that
    got slower, from `started_at` until it recovered (`ended_at`). Times in ms; the shift
    is trace diff's Hodges–Lehmann estimate with its interval, on the samples with the
    host's share (`host_ratio`) taken out."""

    id: str
    kind: str  # block, model, queue, frame age, or host
    name: str  # the row as the API names it: cam1/blur, model:faces, host
    stream: str | None
    block: str | None
    model: str | None
    started_at: str
    baseline_p50_ms: float
    baseline_p99_ms: float
    current_p50_ms: float
    current_p99_ms: float
    ratio: float  # current / baseline median (host-normalised for rows)
    shift_ms: float | None = None
    shift_low_ms: float | None = None
    shift_high_ms: float | None = None
    p_value: float | None = None
    host_ratio: float = 1.0
    probe_ratio: float | None = None
    common_ratio: float | None = None
    wait_ratio: float | None = None  # the streams' threads' waits for a core, now / learned
    change: Change | None = None
    evidence: Evidence | None = None
    ended_at: str | None = None
    end_reason: str | None = None  # recovered, re-baselined, stream removed, ...
    active: bool = True
    # Its own cost per run (CPU) now over its baseline's, probe-normalised: what makes it
    # a cause, not a victim of contention (None: not measured).
    own_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class RowWatch:
    """One row of a stream: its baseline and, once watched, its latest verdict."""

    name: str
    kind: str
    state: RowState
    verdict: str | None = None  # trace diff's: slower, ok, immaterial, not significant, ...
    ratio: float | None = None
    learn_progress: float | None = None  # 0..1 while learning
    own_ratio: float | None = None  # its own cost per run (CPU) now / in its baseline


@dataclass(frozen=True, slots=True)
class StreamWatch:
    """A stream's regression watch, in GET /v1/streams/{id}."""

    state: WatchState
    regressions: list[Regression]
    """Active ones."""
    rows: list[RowWatch] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class WatchReport:
    """GET /v1/regressions: the host, every active regression and the recent history."""

    enabled: bool
    interval_s: float
    comparisons: int
    """Rows judged against a baseline since the start."""
    host: Regression | None
    """The host slowdown going on, if any."""
    host_ratio: float | None
    """The latest host factor (1: nothing put on the host)."""
    active: list[Regression]
    history: list[Regression]
    """Ended ones, newest first, at most 200."""
    baseline_error: str | None = None
    contention: list[ContentionEvent] = field(default_factory=list)
    """Rows slower only by waiting, and the changes of load that explained them: the
    latest 50 events, newest first."""
