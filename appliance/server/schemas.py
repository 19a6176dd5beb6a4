"""The API's bodies as pydantic models: requests are validated with them, and every
answer's JSON Schema in /openapi.json is generated from them (docs/api.md has the prose)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from appliance.observe.status import ModelStatus, SinkStatus, StreamStatus

# POST /v1/profiling's body is the MQTT `profiling` command's arguments: one model, defined
# in the command catalogue (one validation rule for both), re-exported for the routes.
from appliance.runtime.commands import ProfilingRequest as ProfilingRequest  # noqa: PLC0414
from appliance.server.tls import TlsReloaded

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


class WebRtcOffer(_Request):
    """A viewer's SDP offer (non-trickle: gather ICE candidates first). Open a data
    channel labelled `predictions` before making the offer to get each result's
    predictions beside the video."""

    sdp: str = Field(min_length=1, max_length=64 * 1024, description="the offer's SDP")
    type: Literal["offer"]
    max_fps: float | None = Field(
        None, gt=0, le=120, allow_inf_nan=False, description="at most webrtc.max_fps"
    )
    max_width: int | None = Field(
        None, ge=16, le=7680, description="frames wider than this are scaled down"
    )
    video: Literal["annotated", "raw"] = Field(
        "annotated",
        description="the workflow's `video` output (annotated), or the frame as captured "
        "(raw: for a viewer that draws the predictions itself)",
    )


class SceneRegion(BaseModel):
    block: str = Field(description="the block that counts against it")
    kind: Literal["line", "zone"]
    points: list[list[float]] = Field(description="[x, y] pairs, in `units`")
    units: Literal["norm", "px"] = Field(description="norm: 0-1 of the frame's sides")


class Scene(BaseModel):
    stream: str
    regions: list[SceneRegion]


class WebRtcAnswer(BaseModel):
    sdp: str
    type: Literal["answer"]
    session_id: str = Field(description="DELETE /v1/webrtc/{session_id} ends the session")


class ErrorDetail(BaseModel):
    # server/errors.py's CODES values (a test keeps the two equal).
    code: Literal[
        "bad_request",
        "unauthorized",
        "forbidden",
        "not_found",
        "method_not_allowed",
        "request_timeout",
        "conflict",
        "payload_too_large",
        "unsupported_media_type",
        "invalid",
        "too_many_requests",
        "internal",
        "not_implemented",
        "unavailable",
    ]
    message: str
    details: list[str] = Field(description="every problem as `location: message`")


class Error(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "down"]
    reason: str | None = Field(
        None, description="why the process cannot work (`down`: its runtime or supervisor)"
    )


class StreamList(BaseModel):
    streams: list[StreamStatus]


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


class ModelList(BaseModel):
    models: list[ModelStatus]


class Reloaded(BaseModel):
    added: list[str]
    removed: list[str]
    restarted: list[str]
    unchanged: list[str]
    tls: TlsReloaded | None = Field(
        None, description="served over TLS: the certificate files read again; absent over HTTP"
    )


# A Chrome trace (appliance.profiling's conventions), as a literal JSON Schema: its events
# are ORT's and the tracer's, not one model.
CHROME_TRACE: dict[str, Any] = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {"traceEvents": {"type": "array", "items": {"type": "object"}}},
    "description": "Chrome Trace Event Format (chrome://tracing, Perfetto)",
}


class SinkList(BaseModel):
    sinks: list[SinkStatus]


class LatestResult(BaseModel):
    v: int = Field(description="message schema version (docs/outputs.md)")
    stream: str
    seq: int = Field(description="the frame's sequence number in its stream")
    capture_time: float = Field(description="Unix time the frame was captured, seconds")
    captured_at: str = Field(description="the same instant, ISO 8601 UTC to the millisecond")
    latency_ms: float = Field(description="capture to result")
    outputs: dict[str, Any] = Field(description="the workflow's outputs (no images)")


# A knob's name (`max_batch_size`, `faces.allow_spinning`, `sources.decoder_threads`) and
# the values to try: numbers, true/false or names (appliance/tune/space.py).
KnobName = Annotated[str, Field(min_length=1, max_length=128)]
KnobValue = (
    bool
    | int
    | Annotated[float, Field(allow_inf_nan=False)]
    | Annotated[str, Field(min_length=1, max_length=64)]
)
KnobValues = Annotated[list[KnobValue], Field(min_length=1, max_length=16)]


class TuneRequest(_Request):
    """A tune of the running workload (docs/performance.md, "Tuning"): the knobs of the
    models the streams run and of their sources, each value measured live against the
    best so far."""

    objective: Literal["fps", "latency"] = Field(
        "fps", description="`fps`: most processed fps under the SLO; `latency`: lowest p99"
    )
    slo_ms: float | None = Field(
        None,
        gt=0,
        le=60000,
        allow_inf_nan=False,
        description="frame-age p99 limit of `fps`; default two frame intervals of the cameras",
    )
    budget_s: float = Field(
        600, ge=10, le=3600, allow_inf_nan=False, description="the whole tune's time limit, seconds"
    )
    window_s: float = Field(
        5, ge=1, le=60, allow_inf_nan=False, description="seconds of each measuring window"
    )
    settle_s: float = Field(
        2, ge=0, le=30, allow_inf_nan=False, description="seconds waited after each change"
    )
    knobs: Annotated[dict[KnobName, KnobValues | None], Field(max_length=32)] | None = Field(
        None,
        description="knob name (`max_batch_size`) or key (`faces.max_batch_size`) -> the "
        "values to try, or null for its own; every knob by default",
    )
    apply: bool = Field(False, description="stay on the winner (else the starting settings)")


class TuneStatus(BaseModel):
    state: Literal["idle", "running", "done", "interrupted", "failed", "cancelled"] = Field(
        description="`interrupted`: by a shutdown; `cancelled`: by DELETE /v1/tune"
    )
    request: dict[str, Any] | None = Field(description="the tune's request, defaults filled in")
    started_at: str | None
    ended_at: str | None
    progress: dict[str, Any] | None = Field(
        description="the latest: `current`, `windows`, `windows_left`, `elapsed_s`, "
        "`remaining_s`, `best`"
    )
    result: dict[str, Any] | None = Field(
        description="once ended: `outcome`, `best`, `changed`, `reasons`, `candidates`, ..."
    )
    error: str | None = Field(description="why a `failed` tune failed")
    note: str | None = Field(None, description="what a cancel does (DELETE's answer)")


class ShadowReport(BaseModel):
    """A stream's shadow (appliance/runtime/shadow.py) and its comparison with the live
    workflow (appliance/runtime/comparison.py; docs/shadow.md says what each figure is)."""

    stream: str
    workflow: str = Field(description="the candidate workflow's name")
    source: str = Field(description="its file, or `inline`")
    every: int
    max_fps: float | None
    publish: bool = Field(description="its results on the stream's MQTT `shadow` topic")
    started: float = Field(description="Unix time")
    stopped: float | None
    running: bool
    offered: int = Field(description="frames sampled for the candidate")
    ran: int = Field(description="frames the candidate ran")
    skipped: int = Field(description="sampled frames replaced before the candidate took them")
    failed: int
    last_error: str | None
    budget: dict[str, Any] = Field(
        description="what it may cost the live streams, and what it does to hold that"
    )
    comparison: dict[str, Any]


class ComparedResult(LatestResult):
    """One side of a shadow's compared frame, as sinks send a result (docs/outputs.md)."""

    workflow: str = Field(description="the workflow version that made it")


class ShadowFrame(BaseModel):
    """The newest frame a stream's shadow compared: both results, what one found and the
    other did not (appliance/runtime/shadowframe.py), and the frame they were made from."""

    stream: str
    seq: int = Field(description="the frame's sequence number in its stream")
    width: int = Field(description="the frame's width, pixels (boxes are in its pixels)")
    height: int
    iou: float = Field(description="the IoU at which two detections match")
    live: ComparedResult
    candidate: ComparedResult
    missed: dict[str, list[int]] = Field(
        description="output -> rows of the live output's detections the candidate did not find"
    )
    extra: dict[str, list[int]] = Field(
        description="output -> rows of the candidate's detections the live output did not have"
    )
    image: str = Field(description="the frame as captured: a `data:image/jpeg;base64,` URL")


class RolledBack(BaseModel):
    """A stream switched from one workflow version to another."""

    stream: str
    workflow: str = Field(description="the version it runs now")
    previous: str = Field(description="the version it ran before")
    applied: bool = Field(description="false: the switch waits for the stream's next frame")


class Promoted(RolledBack):
    """A shadow promoted: the stream runs the candidate's workflow."""

    rollback_s: float = Field(description="how long `previous` stays ready for a rollback")
    auto_rollback: bool = Field(
        description="whether a regression the watch raises on the stream within rollback_s "
        "rolls it back by itself"
    )
    comparison: dict[str, Any] = Field(description="the shadow's comparison at the switch")
