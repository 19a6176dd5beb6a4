"""The config's `limits:` section: what any request, workflow or config may make the
appliance do (docs/security.md). The file policy, the one-shot runs, the models and the
HTTP server all read it, so it sits in policy/, below every one of them."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from appliance.strict import Strict

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
    # A state document (server.state_dir): about 1 KB of JSON per stream added over the API.
    max_state_bytes: Annotated[int, Field(ge=1)] = 16 * MiB
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
