"""The config's service sections, read once at start: the API server, WebRTC, limits and
profiling (README, "Configuration"). appliance/config.py puts them together with the
models, streams and sinks, and re-exports them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, IPvAnyAddress

from appliance.policy.hosts import HostEntry
from pipelines.spec import GraphOptimization


class Strict(BaseModel):
    """Unknown keys are errors (a misspelt option must not be ignored); values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(Strict):
    """The HTTP control plane (docs/api.md). Read once at start: a reload does not change it."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    # The API's bearer token; APPLIANCE_API_TOKEN wins. repr=False keeps it out of logs.
    token: Annotated[str | None, Field(min_length=1, repr=False)] = None
    # /health, /ready, /metrics without the token: None = open on a loopback bind only.
    open_probes: bool | None = None
    # 16 MiB: a large photo as base64 for /v1/workflows/run, with room to spare.
    max_body_bytes: Annotated[int, Field(gt=0)] = 16 * 1024 * 1024
    # Where files named over the API (workflows, models, labels, videos) may live, after
    # symlinks are followed; relative to the config file. None: the folders of the files
    # the config names itself (appliance/policy/request_files.py), not the config's folder.
    file_roots: list[Path] | None = None
    # On SIGTERM/SIGINT, in-flight requests get this long before they are cancelled.
    drain_timeout_s: Annotated[float, Field(gt=0, le=300)] = 5.0
    # The hosts a stream's source may name (host names, IP addresses or CIDR networks such
    # as 10.1.0.0/16), for streams added over the API and from the config alike. None: any
    # host. Set it so a token holder cannot use sources to probe the internal network.
    # Names match names exactly; a name not listed must resolve into the networks, checked
    # again before each connection (appliance/policy/hosts.py).
    allowed_source_hosts: Annotated[list[Annotated[HostEntry, Field(min_length=1, max_length=253)]],
                                    Field(max_length=256)] | None = None  # fmt: skip


MiB = 1024 * 1024


class LimitsConfig(Strict):
    """What any request, workflow or config may make the appliance do (docs/security.md).
    A limit that is hit is refused with its name and value, and counted in
    `appliance_limit_hits_total{limit}`."""

    max_streams: Annotated[int, Field(ge=1)] = 64
    max_models: Annotated[int, Field(ge=1)] = 16  # loaded at once, config's included
    # Models no stream or request uses (e.g. declared by an API workflow) stay loaded for
    # reuse up to this many, least recently used released first.
    idle_models: Annotated[int, Field(ge=0)] = 2
    max_concurrent_runs: Annotated[int, Field(ge=1)] = 4  # /v1/workflows/run at once
    # Server-sent events and MJPEG readers at once (each holds a connection and a task).
    max_watchers: Annotated[int, Field(ge=1)] = 32
    request_timeout_s: Annotated[float, Field(gt=0)] = 30.0  # any one API request
    # Decoded image size, checked from the header before decoding: 40 MP is 8K plus room
    # (7680x4320 = 33 MP); each megapixel costs 3 MB as BGR.
    max_image_pixels: Annotated[int, Field(ge=1)] = 40_000_000
    max_workflow_bytes: Annotated[int, Field(ge=1)] = 1 * MiB
    max_labels_bytes: Annotated[int, Field(ge=1)] = 1 * MiB
    # A watch baseline: about 8 bytes of JSON per sample, 1000 samples per row.
    max_baseline_bytes: Annotated[int, Field(ge=1)] = 16 * MiB
    max_model_bytes: Annotated[int, Field(ge=1)] = 2048 * MiB  # protobuf's own cap is 2 GiB
    # A labels file has one class name a line: COCO has 80, ImageNet 1000, Open Images
    # about 20 000 boxes' classes at most; a name is a few words.
    max_labels: Annotated[int, Field(ge=1)] = 20_000
    max_label_chars: Annotated[int, Field(ge=1)] = 256
    # Blocks in one workflow: the shipped ones have 2 to 8; a graph of hundreds is a mistake
    # or an attack on the compiler.
    max_blocks: Annotated[int, Field(ge=1, le=10_000)] = 256
    # HTTP connections (docs/security.md, "Connections"): a client must send its first
    # request's headers within header_timeout_s of connecting, and a kept-alive
    # connection its next request's within keepalive_timeout_s of the previous answer
    # (else it is closed); at most max_connections are open at once,
    # max_connections_per_client from one address (server/connections.py).
    header_timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    keepalive_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 15.0
    max_connections: Annotated[int, Field(ge=1)] = 1024
    max_connections_per_client: Annotated[int, Field(ge=1)] = 256
    # A worker busy on one frame for longer is reported `stalled` and its stream restarted.
    worker_stall_s: Annotated[float, Field(gt=0)] = 30.0


class WatchConfig(Strict):
    """The regression watch (docs/profiling.md, "Regression watch"): each stream's block,
    model and frame-age latencies against a baseline, with `trace diff`'s rule."""

    enabled: bool = True
    interval_s: Annotated[float, Field(ge=1, le=3600)] = 30.0  # one comparison per interval
    # After a stream (re)starts or a model loads: skipped (ONNX Runtime's first runs,
    # caches filling), neither learned nor compared.
    warmup_s: Annotated[float, Field(ge=0, le=3600)] = 20.0
    learn_s: Annotated[float, Field(gt=0, le=86400)] = 180.0  # a new row's baseline
    reservoir: Annotated[int, Field(ge=100, le=20000)] = 1000  # samples a baseline keeps
    # Recent samples compared per row and interval (a uniform sample when more came).
    window_samples: Annotated[int, Field(ge=50, le=20000)] = 1000
    # trace diff's gate (appliance/watch/rule.py), with its CLI's names. 25 %: on cores
    # the streams saturate, their models' run times drift over minutes with nothing
    # changed (their runs overlap more or less); 10 % raised false regressions within
    # minutes on the demo here (docs/profiling.md, "Regression watch").
    fail_over_pct: Annotated[float, Field(ge=0, le=1000)] = 25.0
    min_ms: Annotated[float, Field(ge=0)] = 0.2
    min_frame_pct: Annotated[float, Field(ge=0, le=100)] = 1.0
    confidence: Annotated[float, Field(gt=0.5, lt=1)] = 0.999
    # The host is slower when its speed probe and the shift every row shares agree on
    # more than this (%); blocks are then judged on what that shift does not explain.
    host_pct: Annotated[float, Field(gt=0, le=1000)] = 10.0
    confirm_intervals: Annotated[int, Field(ge=1, le=100)] = 1  # slower in a row to raise
    recover_intervals: Annotated[int, Field(ge=1, le=100)] = 2  # not slower in a row to end
    # The evidence: a profiling window the watch opens itself on a regression, at most
    # once per stream per cooldown_s.
    evidence_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    cooldown_s: Annotated[float, Field(ge=0)] = 600.0
    # A baseline made by `appliance trace fingerprint` (CI's, shared by a fleet); through
    # the file-access policy, relative to the config file. None: learned here.
    baseline: Path | None = None
    # Rows never raised, as the API names them: "cam1/blur", "model:faces".
    mute: Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=1024)] = Field(
        default_factory=list
    )


class ProfilingConfig(Strict):
    """Continuous profiling: rolling Chrome traces and latency histograms."""

    enabled: bool = True
    dir: Path = Path("traces")  # relative to the config file; rolling/ goes inside
    rotate_s: Annotated[float, Field(gt=0)] = 60.0
    keep_files: Annotated[int, Field(ge=1)] = 60
    keep_bytes: Annotated[int, Field(ge=1)] = 500 * 1024 * 1024
    gzip: bool = False
    sample_every_n_frames: Annotated[int, Field(ge=1)] = 1
    max_window_s: Annotated[float, Field(gt=0)] = 300.0  # longest on-demand window
    # A window's ONNX Runtime operator profile records one model batch in N, and at most
    # M per model: ORT keeps a recorded run's events in memory (about 0.5 MB of JSON for
    # the person detector's 524 operators) until the window ends, and stops recording at
    # a million events.
    ort_sample_every_n_batches: Annotated[int, Field(ge=1)] = 16
    ort_max_runs_per_window: Annotated[int, Field(ge=1, le=1000)] = 100
    buckets: list[Annotated[float, Field(gt=0)]] | None = None  # histogram bounds, seconds
    watch: WatchConfig = WatchConfig()


class ModelTuning(Strict):
    """One model's settings as `appliance tune` chose them; each one set wins over the
    model's own declaration (the config's `models:` or a workflow's), None leaves it."""

    max_batch_size: Annotated[int, Field(ge=1, le=256)] | None = None
    max_queue_delay_ms: Annotated[float, Field(ge=0, le=1000)] | None = None
    intra_op_threads: Annotated[int, Field(ge=0, le=256)] | None = None
    inter_op_threads: Annotated[int, Field(ge=0, le=256)] | None = None
    allow_spinning: bool | None = None
    graph_optimization: GraphOptimization | None = None


class SourceTuning(Strict):
    """Every stream's source settings as `appliance tune` chose them (wins over each
    stream's own; None leaves it)."""

    reader: Literal["auto", "ffmpeg"] | None = None
    decoder_threads: Annotated[int, Field(ge=0, le=64)] | None = None


class TuningConfig(Strict):
    """What `appliance tune --write/--apply` writes (docs/performance.md, "Tuning"). A
    reload applies a change live: batching at once, session options on a session loaded
    beside the running one and swapped in; only a source change restarts streams."""

    models: Annotated[dict[str, ModelTuning], Field(max_length=256)] = Field(default_factory=dict)
    sources: SourceTuning = SourceTuning()


class IceServerConfig(Strict):
    """A STUN or TURN server offered to WebRTC peers (RTCIceServer)."""

    urls: Annotated[list[Annotated[str, Field(min_length=1, max_length=512)]],
                    Field(min_length=1, max_length=8)]  # fmt: skip
    username: Annotated[str | None, Field(max_length=256)] = None
    # A TURN secret: repr=False keeps it out of logs and error messages.
    credential: Annotated[str | None, Field(max_length=256, repr=False)] = None


class WebRtcConfig(Strict):
    """WebRTC viewers (docs/api.md, "WebRTC"). Read once at start."""

    # STUN/TURN for peers behind NAT. None by default: a public server nobody configured
    # would learn who watches which appliance (aiortc's own default is Google's STUN).
    ice_servers: Annotated[list[IceServerConfig], Field(max_length=8)] = Field(default_factory=list)
    # The addresses offered as host candidates; empty: the server's bind address when it
    # is a single one (127.0.0.1 offers only loopback), else every interface's but
    # loopback (aioice's rule, for 0.0.0.0, :: or a host name). An appliance with several
    # NICs bound to 0.0.0.0 names the viewers' network here.
    host_addresses: Annotated[list[IPvAnyAddress], Field(max_length=16)] = Field(
        default_factory=list
    )
    max_sessions: Annotated[int, Field(ge=1, le=256)] = 16
    max_sessions_per_stream: Annotated[int, Field(ge=1, le=256)] = 4
    # A peer that has not connected by then is closed and its resources freed.
    connect_timeout_s: Annotated[float, Field(gt=0, le=120)] = 15.0
    max_fps: Annotated[float, Field(gt=0, le=120)] = 30.0  # per session, unless it asks less
    # Predictions wait in the data channel's buffer up to this much; past it a message is
    # skipped (and counted), never queued without bound.
    max_buffered_bytes: Annotated[int, Field(ge=1024, le=16 * MiB)] = 256 * 1024
