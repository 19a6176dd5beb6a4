"""The request policy built from the config: what a path that arrives over the API may
reach (appliance/policy/files.py applies it; docs/security.md, "Files: one access policy").

- Its roots: `server.file_roots`, else the folders that hold the config's own files: its
  models and labels files, its workflow files and the models and labels files those
  declare, its video files. Not the config's folder as such: what lies beside the config
  (secrets, keys, notes) is no business of a request. A config that names none of these
  has no roots: every path a request names is refused, and the message says to set
  `server.file_roots`.
- Its denied files, refused even inside the roots: the config file itself (it holds the
  API token) and every file the config names for a secret. Those are found by walking
  each sink's validated config for paths at any depth: every path in a sink's config is
  a credential (a password file, a TLS CA, certificate or key, a signing secret), so a
  new secret field is denied without a change here; and so are `server.tokens`' token
  files and `server.tls`' certificate and key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from appliance.config import AppConfig, sink_configs
from appliance.errors import FileAccessError, LimitError
from appliance.policy.files import FileKind, FilePolicy, shown_path
from appliance.sources.base import source_kind
from pipelines.errors import WorkflowError
from pipelines.spec import parse_workflow_text

CONFIG_FILE = "the appliance's config file"


def request_policy(config: AppConfig, config_path: Path | None) -> FilePolicy:
    """The policy for paths named over the API, under `config` loaded from `config_path`
    (the whole config, not a shard's: every worker must answer a request alike)."""
    given = config.server.file_roots
    named = default_roots(config) if given is None else given  # []: no file at all
    # Each folder once, named as the config first names it (a folder named relative to
    # the config and found again by its real path is one root, not two).
    by_folder = {config.resolve(r).resolve(): r for r in reversed(named)}
    roots = tuple(dict.fromkeys(config.resolve(r).resolve() for r in named))
    shown = tuple(dict.fromkeys(shown_path(config, by_folder[root]) for root in roots))
    denied = denied_files(config, config_path)
    return FilePolicy(config.base_dir, config.limits, roots, shown, denied)


def default_roots(config: AppConfig) -> list[Path]:
    """The folders of the files the config names, as it names them (relative to its
    folder, or absolute), and the folder each file really lies in, if a symlink leads
    elsewhere."""
    folders: dict[Path, None] = {}
    for path in _named_files(config):
        folders[path.parent] = None
        folders[config.resolve(path).resolve().parent] = None
    return list(folders)


def denied_files(config: AppConfig, config_path: Path | None) -> dict[Path, str]:
    """Absolute path -> what it is, for the refusal's message: the config file, and each
    path in a sink's config (ConfigError if a sink's config is invalid)."""
    denied = {} if config_path is None else {config_path.absolute(): CONFIG_FILE}
    for name, cfg in sink_configs(config).items():
        for where, path in _paths(cfg, f"sinks.{name}"):
            denied[config.resolve(path)] = f"a secret file the config names ({where})"
    server = config.server  # the API's own secrets: its tokens' files, its TLS key
    for where, path in [*_paths(server.tokens, "server.tokens"), *_paths(server.tls, "server.tls")]:
        denied[config.resolve(path)] = f"a secret file the config names ({where})"
    return denied


def _paths(value: Any, where: str) -> Iterator[tuple[str, Path]]:
    """Every Path in a validated config, at any depth, with its location."""
    if isinstance(value, Path):
        yield where, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _paths(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _paths(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _paths(item, f"{where}[{i}]")


def _named_files(config: AppConfig) -> Iterator[Path]:
    """The config's models and labels files, workflow files (and the models those
    declare) and video files, relative to the config's folder or absolute."""
    for model in config.models.values():
        yield from _model_files({"path": model.path, "labels_file": model.labels_file}, Path())
    owner = FilePolicy.owner(config)
    for stream in config.streams:
        if source_kind(stream.source.url) == "file":
            yield Path(stream.source.url).expanduser()
        if isinstance(stream.workflow, Path):
            yield stream.workflow
            document = _read_workflow(owner, stream.workflow)
            base = stream.workflow.expanduser().parent
        else:
            document, base = stream.workflow, Path()
        models = document.get("models")
        for spec in models.values() if isinstance(models, Mapping) else ():
            if isinstance(spec, Mapping):
                yield from _model_files(spec, base)


def _model_files(spec: Mapping[str, Any], base: Path) -> Iterator[Path]:
    for key in ("path", "labels_file"):
        value = spec.get(key)
        if isinstance(value, str | Path) and str(value).strip():
            yield base / Path(value).expanduser()


def _read_workflow(owner: FilePolicy, path: Path) -> Mapping[str, Any]:
    """A workflow file of the config, or an empty one if it does not read or parse: the
    runtime's compile reports why, with the config's other problems."""
    try:
        return parse_workflow_text(owner.read_text(path, FileKind.WORKFLOW), str(path))
    except (FileAccessError, LimitError, WorkflowError):
        return {}
