"""The config's `server:` section: the HTTP control plane (docs/api.md), read once at start."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from appliance.policy.hosts import HostEntry
from appliance.strict import Strict

# One entry of `allowed_source_hosts`: a host name, an IP address or a CIDR network.
SourceHost = Annotated[HostEntry, Field(min_length=1, max_length=253)]


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
    # Where what a user changes at runtime is kept across restarts (streams added or
    # removed over the API, the watch's baselines; docs/deploy.md, "Durable runtime
    # changes"): a folder of this process's own, relative to the config file; the chart
    # mounts a volume per replica there. None: runtime changes last until the process
    # ends. `serve --state-dir` overrides it.
    state_dir: Path | None = None
    # On SIGTERM/SIGINT, in-flight requests get this long before they are cancelled.
    drain_timeout_s: Annotated[float, Field(gt=0, le=300)] = 5.0
    # The hosts a stream's source may name (host names, IP addresses or CIDR networks such
    # as 10.1.0.0/16), for streams added over the API and from the config alike. None: any
    # host. Set it so a token holder cannot use sources to probe the internal network.
    # Names match names exactly; a name not listed must resolve into the networks, checked
    # again before each connection (appliance/policy/hosts.py).
    allowed_source_hosts: Annotated[list[SourceHost], Field(max_length=256)] | None = None
