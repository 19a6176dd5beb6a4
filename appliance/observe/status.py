"""What the runtime reports about itself: frozen snapshots that `Runtime.status()` and
its siblings build, and that everything outside the runtime reads instead of its
internals.

They are also the API's wire shape, written once, here: the server answers with these
dataclasses as JSON (`as_json`), /openapi.json documents them from their fields
(pydantic reads dataclasses), and the client parses its answers back into them. Times
are wall clock (seconds since the epoch), latencies milliseconds.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Literal

from appliance.watch.report import StreamWatch
from pipelines.types import iso_utc
from sinks.base import SinkStatus

__all__ = [
    "Batching",
    "Latency",
    "ModelStatus",
    "Origin",
    "ProfilingStatus",
    "Readiness",
    "RuntimeStatus",
    "SinkStatus",
    "StateName",
    "StateStatus",
    "StreamStatus",
    "Tensor",
    "Transition",
    "WindowState",
    "WindowStatus",
    "as_json",
]

# appliance.sources.StreamState's values (a test keeps the two equal).
# `unavailable`: only in `appliance gateway`'s lists, for a stream whose replica does not
# answer (its `last_error` says which and why); a process never reports it of itself.
StateName = Literal[
    "starting", "running", "reconnecting", "stopped", "failed", "stalled", "unavailable"
]
Origin = Literal["config", "api"]
WindowState = Literal["running", "done", "failed"]


@dataclass(frozen=True, slots=True)
class Latency:
    """Frame age at the end of the workflow over the recent window; None before a frame."""

    p50: float | None
    p99: float | None


@dataclass(frozen=True, slots=True)
class Transition:
    """One state change of a stream: when, into which state, and why."""

    time: float
    """Seconds since the Unix epoch (for programs)."""
    state: StateName
    reason: str
    at: str = ""
    """The same instant in ISO 8601, UTC, to the millisecond (for people)."""


@dataclass(frozen=True, slots=True)
class StreamStatus:
    """A stream: its state, figures, the models' providers and its recent transitions."""

    id: str
    state: StateName
    url: str
    """Credentials masked."""
    workflow: str
    fps: float
    """Processed frames per second since the stream started."""
    source_fps: float | None
    """What the camera delivers, when known."""
    frames_processed: int
    frames_dropped: int
    """Overwritten in the one-slot buffer before a worker took them."""
    frames_failed: int
    latency_ms: Latency
    """Frame age at the end of the workflow (capture to result)."""
    detections: int
    reconnects: int
    last_error: str | None
    """The latest error (credentials masked); kept after the stream recovers
    (`last_error_cleared`)."""
    providers: dict[str, list[str]]
    """Model id -> ONNX Runtime providers it got."""
    outputs: list[str]
    """The sinks its results go to."""
    sinks: dict[str, str]
    """Each of those sinks' state (connected, reconnecting, ...)."""
    transitions: list[Transition]
    """Oldest first, the last few."""
    watch: StreamWatch | None = None
    """The regression watch: its state, each row's latest verdict, active regressions."""
    origin: Origin = "config"
    """`api`: added over the API (also when restored from server.state_dir at start);
    `config`: the config file's."""
    last_error_at: str | None = None
    """When `last_error` happened: ISO 8601, UTC, to the millisecond; null with it."""
    last_error_cleared: bool = False
    """True once the error is past: the stream has processed a frame since and is not
    failed, reconnecting or stalled; false while it holds (or with no error)."""
    decoder: str | None = None
    """What decodes the video, chosen when the source opened: the codec and `cuda` (NVDEC)
    or `software`, e.g. `h264 cuda`; null before the source first opened."""
    decoder_problem: str | None = None
    """Why the hardware decoder `source.decoder.hwaccel` asked for was refused (the stream
    decodes in software); null when none was asked for, or it was granted."""


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    shape: list[int | str | None]
    dtype: str


@dataclass(frozen=True, slots=True)
class Batching:
    max_batch_size: int
    max_queue_delay_ms: float


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """A loaded model: interface, providers actually obtained, batching and counters."""

    id: str
    path: str
    decoder: str | None
    labels: list[str]
    inputs: list[Tensor]
    outputs: list[Tensor]
    providers: list[str]
    batching: Batching
    batches: int
    samples: int
    users: int
    """Streams and requests using the model now."""
    pinned: bool
    """Declared in the config: never released when idle."""
    preprocess: str = "host"
    """Where frames become the model's input: `graph` (composed with the decoder's
    prologue: the model takes uint8 BGR frames) or `host` (numpy on the stream's thread)."""


@dataclass(frozen=True, slots=True)
class ProfilingStatus:
    enabled: bool
    trace_dir: str
    window_active: bool
    last_write_error: str | None
    """Why the last rolling trace could not be written."""


@dataclass(frozen=True, slots=True)
class WindowStatus:
    """An on-demand profiling window; `error` says why when it `failed`."""

    id: str
    state: WindowState
    trace: str
    """Where its trace is served once done: /v1/profiling/{id}/trace."""
    duration_s: float
    streams: list[str] | None
    """The stream ids traced; null: all."""
    ort_operators: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StateStatus:
    """Where this process keeps the changes made over the API (server.state_dir)."""

    dir: str
    """The state folder (relative to the config file's folder when it lies there)."""
    file: str
    """This process's streams document in it."""
    problem: str | None
    """Why the document found at start was refused (it was set aside, named here, and the
    process started from the config alone); null when none. Kept until a restart."""
    streams: int
    """Its entries: streams added, replaced or removed over the API."""
    tuning: str | None = None
    """This process's tuning document when it holds a tuning a tune applied live (`apply`),
    which runs over the config file's `tuning:` until that section changes; null when none."""
    tuning_problem: str | None = None
    """Why the tuning document found at start was refused (set aside, named here; the config
    file's `tuning:` runs); null when none. Kept until a restart."""


@dataclass(frozen=True, slots=True)
class RuntimeStatus:
    """Everything at once: what /ready, `appliance status` and the stats log read."""

    started_at: float
    problem: str | None
    """Why the runtime cannot work (GET /health); None while it can."""
    streams: list[StreamStatus]
    models: list[ModelStatus]
    sinks: list[SinkStatus]
    profiling: ProfilingStatus
    stalled: dict[str, str]
    """Stream id -> why, until its restarted stream processes."""
    shard: str | None = None
    """`INDEX/COUNT` when serving one shard of the config's streams (--shard)."""
    state: StateStatus | None = None
    """server.state_dir and what the start found there; None without one."""

    @property
    def waiting(self) -> list[str]:
        """Ids of the streams still starting."""
        return [s.id for s in self.streams if s.state == "starting"]

    @property
    def ready(self) -> bool:
        """Models loaded, every stream past `starting`, none stalled, the runtime alive."""
        return not self.waiting and not self.stalled and self.problem is None


@dataclass(frozen=True, slots=True)
class Readiness:
    """GET /ready's answer (503 when not `ready`)."""

    ready: bool
    models: list[str]
    waiting: list[str]
    """Ids of the streams still starting."""
    stalled: dict[str, str]
    """Stream id -> why it stalled (restarted; listed until it processes a frame again)."""
    insecure: bool
    """The API is open without a token on a non-loopback address (--insecure)."""
    tls: bool
    """The API is served over TLS (`server.tls`)."""
    sinks: dict[str, str]
    """Sink name -> state; informational: a sink that is down does not make it unready."""
    profiling: ProfilingStatus
    shard: str | None = None
    """`INDEX/COUNT` (appliance/runtime/sharding.py) when this process runs one shard of the
    config's streams; null when it runs them all."""
    started_at: str | None = None
    """When the streams started, ISO 8601 UTC (with --workers: the longest-running
    worker's start); null before."""
    uptime_s: float | None = None
    """Seconds since `started_at`."""
    state: StateStatus | None = None
    """server.state_dir: its folder, this process's document, a refusal at start and its
    entries; null without a state folder."""

    @classmethod
    def of(cls, status: RuntimeStatus, insecure: bool, tls: bool = False) -> Readiness:
        started = status.started_at or None
        return cls(
            ready=status.ready,
            models=sorted(m.id for m in status.models),
            waiting=status.waiting,
            stalled=status.stalled,
            insecure=insecure,
            tls=tls,
            sinks={s.name: s.state for s in status.sinks},
            profiling=status.profiling,
            shard=status.shard,
            started_at=None if started is None else iso_utc(started),
            uptime_s=None if started is None else round(time.time() - started, 1),
            state=status.state,
        )


# Attribute docstrings become the API's field descriptions in /openapi.json (pydantic reads
# this key of a dataclass; a plain dict keeps this module free of pydantic).
for _cls in (
    Latency,
    Transition,
    StreamStatus,
    Tensor,
    Batching,
    ModelStatus,
    ProfilingStatus,
    WindowStatus,
    StateStatus,
    RuntimeStatus,
    Readiness,
):
    setattr(_cls, "__pydantic_config__", {"use_attribute_docstrings": True})  # noqa: B010


def as_json(status: Any) -> Any:
    """A status dataclass (or a list of them) as JSON-ready dicts and lists."""
    if isinstance(status, list):
        return [as_json(s) for s in status]
    return dataclasses.asdict(status)
