"""The appliance config file: AppConfig put together from each subsystem's own section
model, loading, and errors with locations.

Each section is defined where it is used: `server:` in appliance/server/config.py,
`webrtc:` in appliance/server/webrtc/config.py, `limits:` in appliance/policy/limits.py,
`profiling:` in appliance/profiling/config.py (its `watch:` in appliance/watch/config.py),
a stream's `source:` in appliance/sources/config.py, `models:` in pipelines/spec.py
(ModelSpec), each of `sinks:` by its sink kind (sinks/registry.py). Here: a stream and its
outputs, and `tuning:`, which put other rooms' models together.

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

from pydantic import BaseModel, Field, ValidationError, field_validator

from appliance.models.tuned import ModelTuning
from appliance.policy.hosts import SourceHosts
from appliance.policy.limits import LimitsConfig
from appliance.profiling.config import ProfilingConfig
from appliance.runtime.shadow import ShadowSpec
from appliance.server.config import ServerConfig
from appliance.server.webrtc.config import WebRtcConfig
from appliance.sources.config import SourceConfig, SourceTuning
from appliance.strict import Strict
from pipelines.errors import format_location, pydantic_message
from pipelines.spec import ModelSpec, load_yaml
from sinks.registry import SINKS, SinkTypeError, config_model


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


# A stream's or a sink's id, matched whole: pydantic's `pattern` runs Rust's regex (its
# `$` is the end of the text), Python's through fullmatch (its `$` also passes "id\n").
_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
_STREAM_ID = rf"^{_ID}$"


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
    # on_demand: annotation and blur run only while someone reads the video (a viewer,
    # the JPEG/MJPEG routes, a recording, MQTT snapshots); always: on every frame.
    draw: Literal["on_demand", "always"] = "on_demand"
    # A candidate workflow run on this stream's frames from its start (docs/shadow.md).
    shadow: ShadowSpec | None = None

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


class TuningConfig(Strict):
    """What `appliance tune --write/--apply` writes (docs/performance.md, "Tuning"): each
    model's settings (appliance/models/tuned.py) and every stream's source settings
    (appliance/sources/config.py). A reload applies a change live: batching at once,
    session options on a session loaded beside the running one and swapped in; only a
    source change restarts streams. Here, not in tune/: the runtime applies it."""

    models: Annotated[dict[str, ModelTuning], Field(max_length=256)] = Field(default_factory=dict)
    sources: SourceTuning = SourceTuning()


class AppConfig(Strict):
    server: ServerConfig = ServerConfig()
    webrtc: WebRtcConfig = WebRtcConfig()
    models: dict[str, ModelSpec] = Field(default_factory=dict)
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
        if not re.fullmatch(_ID, name):
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
            problems += [
                f"{where}.{format_location(e['loc'])}: {pydantic_message(_no_input(e))}"
                for e in exc.errors()
            ]
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
