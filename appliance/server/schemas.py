"""The API's bodies as pydantic models: requests are validated with them, and every
answer's JSON Schema in /openapi.json is generated from them (docs/api.md has the prose)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from appliance.config import BatchingConfig

# appliance.sources.StreamState's values (a test keeps the two equal).
StateName = Literal["starting", "running", "reconnecting", "stopped", "failed", "stalled"]

WorkflowRef = str | dict[str, Any]  # a path (relative to the config file) or an inline workflow


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunRequest(_Request):
    """One image through a workflow."""

    image: str = Field(description="the image file (JPEG, PNG, ...) as base64")
    workflow: WorkflowRef
    profile: bool = Field(False, description="add a Chrome trace of the run")
    video: bool = Field(False, description="add the `video` output as a base64 JPEG")


class ValidateRequest(_Request):
    workflow: WorkflowRef


class ProfilingRequest(_Request):
    """One on-demand profiling window."""

    duration_s: float = Field(
        gt=0, allow_inf_nan=False, description="seconds, at most profiling.max_window_s"
    )
    streams: list[str] | None = Field(None, description="stream ids to trace; all by default")
    ort_operators: bool = Field(False, description="add ONNX Runtime's per-operator events")


class ErrorDetail(BaseModel):
    # server/errors.py's CODES values (a test keeps the two equal).
    code: Literal[
        "bad_request", "unauthorized", "forbidden", "not_found", "method_not_allowed",
        "request_timeout", "conflict", "payload_too_large", "unsupported_media_type",
        "invalid", "too_many_requests", "internal",
    ]  # fmt: skip
    message: str
    details: list[str] = Field(description="every problem as `location: message`")


class Error(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "down"]
    reason: str | None = Field(
        None, description="why the process cannot work (`down`: its runtime or supervisor)"
    )


class ProfilingState(BaseModel):
    enabled: bool
    trace_dir: str
    window_active: bool
    last_write_error: str | None = Field(
        description="why the last rolling trace could not be written (streams go on)"
    )


class Ready(BaseModel):
    ready: bool
    models: list[str]
    waiting: list[str] = Field(description="ids of streams still starting")
    stalled: dict[str, str] = Field(
        description="stream id -> why it stalled (restarted; listed until it processes a "
        "frame again)"
    )
    insecure: bool = Field(
        description="the API is open without a token on a non-loopback address (--insecure)"
    )
    sinks: dict[str, str] = Field(
        description="sink name -> state (connected, reconnecting, ...); informational: a "
        "sink that is down does not make the appliance unready"
    )
    profiling: ProfilingState


class Latency(BaseModel):
    p50: float | None
    p99: float | None


class Stream(BaseModel):
    id: str
    url: str = Field(description="the source URL, credentials masked")
    state: StateName
    workflow: str
    fps: float
    source_fps: float | None
    frames_processed: int
    frames_dropped: int
    frames_failed: int
    latency_ms: Latency = Field(description="frame age at the end of the workflow")
    detections: int
    reconnects: int
    last_error: str | None
    providers: dict[str, list[str]] = Field(description="model id -> ONNX Runtime providers")
    outputs: list[str] = Field(description="the sinks its results go to")


class Transition(BaseModel):
    time: float = Field(description="Unix time, seconds")
    state: StateName
    reason: str


class StreamDetail(Stream):
    transitions: list[Transition]


class StreamList(BaseModel):
    streams: list[Stream]


class Removed(BaseModel):
    id: str
    removed: Literal[True]
    threads_joined: bool


class Timings(BaseModel):
    total: float
    blocks: dict[str, float]


class RunResult(BaseModel):
    workflow: str
    outputs: dict[str, Any]
    image_size: list[int] = Field(min_length=2, max_length=2, description="[width, height]")
    timings_ms: Timings
    trace: dict[str, Any] = Field(
        default_factory=dict, description="Chrome trace of the run, with `profile: true`"
    )
    video: str = Field("", description="the `video` output as a base64 JPEG, with `video: true`")


class Validated(BaseModel):
    valid: Literal[True]
    summary: str


class Tensor(BaseModel):
    name: str
    shape: list[int | str | None]
    dtype: str


class Model(BaseModel):
    id: str
    path: str
    decoder: str | None
    labels: list[str]
    inputs: list[Tensor]
    outputs: list[Tensor]
    providers: list[str]
    batching: BatchingConfig
    batches: int
    samples: int
    users: int = Field(description="streams and requests using the model now")
    pinned: bool = Field(description="declared in the config: never released when idle")


class ModelList(BaseModel):
    models: list[Model]


class Reloaded(BaseModel):
    added: list[str]
    removed: list[str]
    restarted: list[str]
    unchanged: list[str]


WindowState = Literal["running", "done", "failed"]


class ProfilingWindow(BaseModel):
    """A profiling window's status."""

    id: str
    state: WindowState
    trace: str = Field(description="where its trace is, once done: /v1/profiling/{id}/trace")
    duration_s: float | None = None
    streams: list[str] | None = Field(None, description="the stream ids traced; null: all")
    ort_operators: bool | None = None
    error: str | None = Field(None, description="why it failed (state `failed`)")


# A Chrome trace (appliance.profiling's conventions), as a literal JSON Schema: its events
# are ORT's and the tracer's, not one model.
CHROME_TRACE: dict[str, Any] = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {"traceEvents": {"type": "array", "items": {"type": "object"}}},
    "description": "Chrome Trace Event Format (chrome://tracing, Perfetto)",
}


class Sink(BaseModel):
    name: str
    type: str
    up: bool = Field(description="connected (MQTT), or the last delivery succeeded (webhook)")
    state: str
    queue_depth: int
    sent: int
    retried: int
    dropped: int = Field(description="queue overflow (oldest first) or left at shutdown")
    dead_lettered: int
    last_error: str | None


class SinkList(BaseModel):
    sinks: list[Sink]


class LatestResult(BaseModel):
    v: int = Field(description="message schema version (docs/outputs.md)")
    stream: str
    seq: int = Field(description="the frame's sequence number in its stream")
    capture_time: float = Field(description="Unix time the frame was captured, seconds")
    latency_ms: float = Field(description="capture to result")
    outputs: dict[str, Any] = Field(description="the workflow's outputs (no images)")
