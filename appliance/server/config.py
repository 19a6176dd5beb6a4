"""The config's `server:` section: the HTTP control plane (docs/api.md), read once at start."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, Self
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from appliance.policy.hosts import HostEntry
from appliance.strict import Strict

# One entry of `allowed_source_hosts`: a host name, an IP address or a CIDR network.
SourceHost = Annotated[HostEntry, Field(min_length=1, max_length=253)]
# A token's name: what the audit and the logs say instead of the token itself.
TOKEN_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# An environment variable's name (POSIX: letters, digits, underscores, not a digit first).
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class TokenConfig(Strict):
    """One API token of `server.tokens`: its name (never the token) is what the audit
    records; the token itself comes from an environment variable or a file, never the
    config."""

    name: Annotated[str, Field(pattern=TOKEN_NAME)]
    role: Literal["viewer", "operator", "admin"]
    token_env: Annotated[str, Field(pattern=ENV_NAME)] | None = None
    # Read through the owner's file policy at start (4 KiB at most, surrounding
    # whitespace stripped, never empty): a Kubernetes or Docker secret's file.
    token_file: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.token_env is None) == (self.token_file is None):
            raise ValueError("give exactly one of token_env and token_file")
        return self


class TlsConfig(Strict):
    """The API served over TLS on its one listener: PEM files, read through the owner's
    file policy at start and again on each reload (SIGHUP, POST /v1/config/reload), so a
    renewed certificate takes effect without a restart."""

    cert_file: Path  # the certificate chain, leaf first
    key_file: Path  # its private key (unencrypted PEM)


def _origin(value: str) -> str:
    """`scheme://host[:port]`, as a browser's Origin header says it: nothing else."""
    parts = urlsplit(value)
    plain = not (parts.path or parts.query or parts.fragment or parts.username)
    if parts.scheme not in ("http", "https") or not parts.hostname or not plain:
        raise ValueError(
            f"{value!r} is not an origin (scheme://host[:port], such as https://ops.example.com)"
        )
    return value.rstrip("/").lower()


Origin = Annotated[str, Field(min_length=1, max_length=512), AfterValidator(_origin)]
_HOST = re.compile(r"\.?[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})?|\[[0-9A-Fa-f:.]+\]")


def _host(value: str) -> str:
    """A host name, an IP address, or `.example.com` (that name and every name below it,
    Django's ALLOWED_HOSTS convention); no port, no other wildcard."""
    if value != "*" and not _HOST.fullmatch(value):
        raise ValueError(f"{value!r} is not a host name, an IP address or .domain")
    return value if value == "*" else value.lower().rstrip(".")


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
    # API tokens with roles (docs/security.md, "Roles"); `token` / APPLIANCE_API_TOKEN
    # stays the admin token (named `admin`). Read at start.
    tokens: Annotated[list[TokenConfig], Field(max_length=64)] = []
    # The API over TLS (cert-manager's files, say): None serves plain HTTP.
    tls: TlsConfig | None = None
    # Origins besides the appliance's own whose pages may change things (POST, DELETE):
    # a console served elsewhere. Browsers' cross-site requests are refused otherwise.
    allowed_origins: Annotated[list[Origin], Field(max_length=64)] = []
    # Host header values the API answers besides its bind address and localhost (the
    # names it is reached by): anything else is refused, which ends DNS rebinding.
    allowed_hosts: Annotated[
        list[Annotated[str, AfterValidator(_host)]], Field(max_length=256)
    ] = []
