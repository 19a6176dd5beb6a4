"""The appliance config file: pydantic models, loading, and errors with locations.

Top-level names (`server`, `models`, `streams`, `profiling`, `limits`, `sinks`) are fixed: tools and
docs depend on them. Relative paths (models, workflow files, video files) are resolved
against the directory of the config file, so a config works from any working directory.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
)

from appliance.policy.hosts import SourceHosts, url_host
from appliance.policy.masking import mask_one_url
from appliance.sections import (
    IceServerConfig,
    LimitsConfig,
    ProfilingConfig,
    ServerConfig,
    Strict,
    TuningConfig,
    WebRtcConfig,
)
from pipelines.errors import format_location, pydantic_message
from pipelines.spec import BatchingSpec as BatchingConfig
from pipelines.spec import ModelSpec as ModelConfig
from pipelines.spec import SessionSpec as SessionConfig
from pipelines.spec import load_yaml
from sinks.registry import SINKS, SinkTypeError, config_model

__all__ = [
    "AppConfig",
    "BatchingConfig",
    "ConfigError",
    "IceServerConfig",
    "LimitsConfig",
    "ModelConfig",
    "ProfilingConfig",
    "ServerConfig",
    "SessionConfig",
    "TuningConfig",
    "WebRtcConfig",
]


class ConfigError(Exception):
    """The config cannot be used. `problems` lists every `location: message` found.
    `partial`: the config as if each invalid value were not there, when that is valid,
    so that its models and workflows can be checked in the same run."""

    def __init__(
        self, problems: Sequence[str], source: str = "config", partial: AppConfig | None = None
    ) -> None:
        self.problems = list(problems)
        self.source = source
        self.partial = partial
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s)\n{lines}")


class BackoffConfig(Strict):
    """Capped exponential backoff with jitter between reconnect attempts."""

    initial_s: Annotated[float, Field(gt=0)] = 0.5
    max_s: Annotated[float, Field(gt=0)] = 10.0
    multiplier: Annotated[float, Field(ge=1)] = 2.0
    jitter: Annotated[float, Field(ge=0, le=1)] = 0.2  # +- fraction of the delay


# The URL schemes a reader takes, by the kind of source they name (sources.source_kind);
# other text is a file's path or a /dev/videoN.
URL_KINDS: dict[str, Literal["rtsp", "http"]] = {
    "rtsp": "rtsp", "rtsps": "rtsp", "http": "http", "https": "http",
}  # fmt: skip


class SourceConfig(Strict):
    url: str
    transport: Literal["tcp", "udp"] = "tcp"  # RTSP only
    # RTSP only. auto: H.264/H.265 cameras are read by our RTP reader, which decodes a
    # frame as soon as its last packet arrives (FFmpeg's waits for the next frame's
    # first packet: one frame interval later); other codecs, or any FFmpeg `options`,
    # go to FFmpeg's reader. ffmpeg: always FFmpeg's reader.
    reader: Literal["auto", "ffmpeg"] = "auto"
    loop: bool = True  # files only
    pace: Literal["realtime", "fast"] = "realtime"  # files only
    stall_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    open_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    backoff: BackoffConfig = BackoffConfig()
    options: dict[str, str] = Field(default_factory=dict)  # extra FFmpeg/PyAV options
    # The H.264/H.265 decoder's slice threads; 0: FFmpeg's choice (one per core).
    decoder_threads: Annotated[int, Field(ge=0, le=64)] = 0

    @field_validator("url")
    @classmethod
    def _a_source(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        problem = _url_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v


# A URL's scheme: what FFmpeg splits a URL on is the first ":", with "//" or without.
_URL_SCHEME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.-]*):")
_URL_FORM = "scheme://[user:password@]host[:port]/path"


def _url_problem(url: str) -> str | None:
    """Why a source URL would be read otherwise than it looks, or None (a file's path
    too). The message shows the URL masked: it is refused before anything masks it.
    FFmpeg reads `rtsp:/u:pw@cam` and `rtsp:// u:pw@cam` as `rtsp://u:pw@cam`."""
    scheme = _URL_SCHEME.match(url)
    has_slashes = scheme is not None and url[scheme.end() :].startswith("//")
    if scheme is None or not (has_slashes or scheme[1].lower() in URL_KINDS):
        return None  # a file's path, or a /dev/videoN
    if scheme[1].lower() not in URL_KINDS:
        # Else read as a file name, and "file not found" would hide the real fault.
        return (
            f"unsupported URL scheme {scheme[1]!r} (supported: {', '.join(URL_KINDS)}; "
            "or a video file's path, or /dev/videoN)"
        )
    shown = repr(mask_one_url(url))
    odd = next((c for c in url if c.isspace() or not c.isprintable()), None)
    if odd is not None:
        return (
            f"{shown}: whitespace and control characters are not allowed in a URL "
            f"(found {odd!r} at position {url.index(odd)}); percent-encode them (%20)"
        )
    if not has_slashes:
        return f'malformed URL {shown}: "//" must follow the scheme ({_URL_FORM})'
    if not url_host(url):
        return f"malformed URL {shown}: no host ({_URL_FORM})"
    try:
        _ = urlsplit(url).port  # parsed when read
    except ValueError:
        return (
            f"malformed URL {shown}: the port is not a number from 0 to 65535 (a password's"
            ' "/", "?" or "#" must be percent-encoded)'
        )
    return None


_STREAM_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class OutputConfig(Strict):
    """One of a stream's outputs: a declared sink and the filters in front of it. A
    result passes when every filter given lets it through."""

    sink: Annotated[str, Field(min_length=1, max_length=64)]
    every_s: Annotated[float, Field(gt=0)] | None = None  # at most one result per N s
    # Only when one of these outputs' value changed since the last result sent.
    on_change: list[str] | None = Field(default=None, min_length=1)
    # Only when a detections output holds one of these class names.
    classes: list[str] | None = Field(default=None, min_length=1)


class StreamConfig(Strict):
    id: Annotated[str, Field(pattern=_STREAM_ID)]
    source: SourceConfig
    workflow: Path | dict[str, Any]
    outputs: list[OutputConfig] = Field(default_factory=list, max_length=16)

    @field_validator("outputs", mode="before")
    @classmethod
    def _outputs_from_names(cls, v: Any) -> Any:
        """`[bus, {sink: hook, every_s: 1}]`: a name is an output without filters."""
        if isinstance(v, list):
            return [{"sink": o} if isinstance(o, str) else o for o in v]
        return v

    @field_validator("source", mode="before")
    @classmethod
    def _source_from_string(cls, v: Any) -> Any:
        return {"url": v} if isinstance(v, str) else v


class AppConfig(Strict):
    server: ServerConfig = ServerConfig()
    webrtc: WebRtcConfig = WebRtcConfig()
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    streams: list[StreamConfig] = Field(default_factory=list)
    profiling: ProfilingConfig = ProfilingConfig()
    limits: LimitsConfig = LimitsConfig()
    sinks: dict[str, Any] = Field(default_factory=dict)
    tuning: TuningConfig = TuningConfig()  # `appliance tune`'s settings, over the declared ones
    base_dir: Path = Path(".")  # set by load_config: the config file's directory

    def resolve(self, path: Path | str) -> Path:
        """A path from the config, made absolute against the config file's directory."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    @field_validator("streams")
    @classmethod
    def _unique_ids(cls, streams: list[StreamConfig]) -> list[StreamConfig]:
        seen: set[str] = set()
        for s in streams:
            if s.id in seen:
                raise ValueError(f"duplicate stream id {s.id!r}")
            seen.add(s.id)
        return streams


def parse_config(data: Any, base_dir: Path, source: str = "config") -> AppConfig:
    """Validate a parsed YAML/JSON document; every problem is reported with its location."""
    if not isinstance(data, dict):
        raise ConfigError([f"(top): expected a mapping, got {type(data).__name__}"], source)
    try:
        config = AppConfig.model_validate({**data, "base_dir": base_dir})
    except ValidationError as exc:
        problems = [f"{format_location(e['loc'])}: {pydantic_message(e)}" for e in exc.errors()]
        partial = _without_invalid(data, exc, base_dir)
        if partial is not None:  # the files it names, in the same pass
            problems += _check_references(partial)
        raise ConfigError(problems, source, partial) from None
    problems = _check_references(config)
    if problems:
        raise ConfigError(problems, source)
    return config


def _without_invalid(
    data: dict[str, Any], exc: ValidationError, base_dir: Path
) -> AppConfig | None:
    """The config with each invalid value left out (its default taken), so what else is
    wrong is found in the same pass; None when a value cannot be left out (a required
    one, a list item) or what is left is still invalid."""
    doc = copy.deepcopy(data)
    for error in exc.errors():
        *parents, last = error["loc"] or ("",)
        parent: Any = doc
        for key in parents:
            parent = _child(parent, key)
        if not isinstance(parent, dict) or last not in parent:
            return None
        del parent[last]
    try:
        return AppConfig.model_validate({**doc, "base_dir": base_dir})
    except ValidationError:
        return None


def _child(node: Any, key: int | str) -> Any:
    if isinstance(node, dict):
        return node.get(key)
    if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
        return node[key]
    return None


def _check_references(config: AppConfig) -> list[str]:
    problems = []
    problems += _sink_problems(config)
    if len(config.streams) > config.limits.max_streams:
        problems.append(
            f"streams: {len(config.streams)} streams, over "
            f"limits.max_streams = {config.limits.max_streams}"
        )
    for name, model in config.models.items():
        problems += _missing(config, model.path, f"models.{name}.path")
        if model.labels_file is not None:
            problems += _missing(config, model.labels_file, f"models.{name}.labels_file")
    for i, stream in enumerate(config.streams):
        if isinstance(stream.workflow, Path):
            problems += _missing(config, stream.workflow, f"streams[{i}].workflow")
    problems += _host_problems(config)
    return problems


def _host_problems(config: AppConfig) -> list[str]:
    """Streams whose source names a host server.allowed_source_hosts does not allow."""
    hosts = SourceHosts.of(config.server.allowed_source_hosts)
    refused = ((i, hosts.refusal(s.source.url)) for i, s in enumerate(config.streams))
    return [f"streams[{i}].source.url: {problem}" for i, problem in refused if problem]


def sink_configs(config: AppConfig) -> dict[str, BaseModel]:
    """Each declared sink's config, validated by its type's own model (sinks.registry).
    ConfigError naming every problem (`sinks.bus.port: ...`)."""
    out: dict[str, BaseModel] = {}
    problems: list[str] = []
    for name, raw in config.sinks.items():
        where = f"sinks.{name}"
        if not re.match(_STREAM_ID, name):
            problems.append(f"{where}: a sink name is letters, digits, '_', '.', '-'")
            continue
        kind = raw.get("type") if isinstance(raw, dict) else None
        if not isinstance(kind, str):
            problems.append(f"{where}.type: required (known: {', '.join(sorted(SINKS))})")
            continue
        try:
            out[name] = config_model(kind).model_validate(raw)
        except SinkTypeError as exc:
            problems.append(f"{where}.type: {exc}")
        except ValidationError as exc:
            # Without the value it got: a sink's fields hold passwords and secrets.
            problems += [f"{where}.{format_location(e['loc'])}: {pydantic_message(_no_input(e))}"
                         for e in exc.errors()]  # fmt: skip
    if problems:
        raise ConfigError(problems)
    return out


def _no_input(error: Any) -> dict[str, Any]:
    return {k: v for k, v in error.items() if k != "input"}


def _sink_problems(config: AppConfig) -> list[str]:
    try:
        sink_configs(config)
    except ConfigError as exc:
        problems = exc.problems
    else:
        problems = []
    for i, stream in enumerate(config.streams):
        for j, output in enumerate(stream.outputs):
            if output.sink not in config.sinks:
                problems.append(
                    f"streams[{i}].outputs[{j}].sink: {unknown_sink(output.sink, config.sinks)}"
                )
    return problems


def unknown_sink(name: str, declared: Iterable[str]) -> str:
    """The message for an output naming no declared sink, with what to do instead."""
    names = ", ".join(sorted(declared)) or "none"
    hint = ""
    if "://" in name:  # a URL where a name belongs: the common first try
        hint = (
            "; declare the destination under `sinks:` (e.g. bus: {type: mqtt, host: ...})"
            " and name it here"
        )
    return f"unknown sink {name!r} (declared: {names}){hint}"


def _missing(config: AppConfig, path: Path, where: str) -> list[str]:
    """A problem when `path` is not a regular file (the access policy checks it again,
    with the size caps, when the file is read)."""
    resolved = config.resolve(path)
    if resolved.is_file():
        return []
    what = "not a regular file" if resolved.exists() else "file not found"
    return [f"{where}: {what}: {path}"]


def load_config(path: Path | str) -> AppConfig:
    """Read and validate a YAML config file; raises ConfigError naming every problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"cannot read: {exc.strerror or exc}"], str(p)) from None
    try:
        data = load_yaml(text)
    except ValueError as exc:
        raise ConfigError([str(exc)], str(p)) from None
    return parse_config(data, p.resolve().parent, str(p))
