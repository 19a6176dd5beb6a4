"""Documents under `server.state_dir`: what a user changed on purpose at runtime, kept
across restarts (docs/deploy.md, "Durable runtime changes").

- **Written whole and atomically**: a temporary file beside the document, flushed to the
  disk (fsync), renamed over it, and the folder flushed too, so a crash or a power cut
  leaves the old document or the new one, never half of one (POSIX rename(2) is atomic
  within a file system; the folder's fsync makes the rename itself durable, as
  SQLite's and etcd's writers do). Files and folder are the owner's only (0600, 0700):
  a document holds what users added, their cameras' credentials sealed
  (appliance/runtime/sealing.py), and a document of an older version may hold them in
  clear.
- **Read through the file policy** (appliance/policy/files.py): a regular file, at most
  `limits.max_state_bytes`, never a FIFO or a device swapped in.
- **Refused as a whole** when it is not one of ours (another program's file, a newer
  version, a different kind, JSON that does not parse, an entry that does not validate):
  `StateFileError` names the file and the problem, and the file is set aside beside it
  (`<name>.refused-<UTC time>`), never deleted, so nothing a user did is lost silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from appliance.atomic import write_atomic
from appliance.config import AppConfig
from appliance.errors import FileAccessError, LimitError
from appliance.policy.files import FileKind, FilePolicy, shown_path
from pipelines.errors import format_location, pydantic_message

__all__ = [
    "FORMAT",
    "VERSION",
    "StateFileError",
    "digest",
    "read_document",
    "read_model",
    "set_aside",
    "state_folder",
    "write_document",
]

FORMAT = "appliance-state"  # every document's "format": tells ours from any other JSON
VERSION = 1  # the layout of the documents this code writes and reads


M = TypeVar("M", bound=BaseModel)


def state_folder(config: AppConfig) -> tuple[Path, str] | None:
    """`server.state_dir` resolved, and as answers name it; None without one."""
    named = config.server.state_dir
    if named is None:
        return None
    folder = config.resolve(named)
    return folder, shown_path(config, folder)


def digest(entry: BaseModel) -> str:
    """A part of the config file (a stream's entry, the `tuning:` section) as a change
    made over the API records it (`over`): the sha256 of its JSON."""
    return hashlib.sha256(entry.model_dump_json().encode()).hexdigest()


class StateFileError(ValueError):
    """A state document that cannot be used: what is wrong, and where the file went."""

    def __init__(self, path: Path, problem: str, kept: Path | None) -> None:
        self.path, self.problem, self.kept = path, problem, kept
        where = f"kept as {kept}" if kept is not None else "left where it is"
        super().__init__(f"state file {path}: {problem}; {where}")


def write_document(path: Path, kind: str, body: Mapping[str, Any]) -> None:
    """`body` as the `kind` document at `path`, atomically (see the module docstring).
    OSError when the folder or the disk refuses: the old document is left as it was."""
    doc = {"format": FORMAT, "kind": kind, "version": VERSION, "saved_at": time.time(), **body}
    write_atomic(path, json.dumps(doc, indent=1, sort_keys=True).encode(), durable=True)


def read_document(path: Path, kind: str, files: FilePolicy) -> dict[str, Any] | None:
    """The `kind` document at `path` (its body, with "format", "kind" and "version"), or
    None when there is none yet. StateFileError when it cannot be used: set aside first
    when it is a file of the wrong content (a folder, a device or an unreadable file is
    left where it is: the message says what to do)."""
    if not path.exists() and not path.is_symlink():
        return None
    where = f"state file {path}"
    try:
        data = files.read_bytes(path, FileKind.STATE, where)
    except LimitError as exc:
        raise StateFileError(path, str(exc), set_aside(path)) from None
    except FileAccessError as exc:
        raise StateFileError(path, exc.rule, None) from None
    problem = _problem(data, kind)
    if problem is not None:
        raise StateFileError(path, problem, set_aside(path))
    doc: dict[str, Any] = json.loads(data)
    return doc


def read_model(path: Path, kind: str, files: FilePolicy, model: type[M]) -> M | None:
    """`read_document`, its body validated as `model`: None when there is no document;
    StateFileError (the file set aside) naming the first field that does not validate."""
    doc = read_document(path, kind, files)
    if doc is None:
        return None
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        problem = f"{format_location(first['loc'])}: {pydantic_message(first)}"
        raise StateFileError(path, problem, set_aside(path)) from None


def _problem(data: bytes, kind: str) -> str | None:
    """Why `data` is not a `kind` document this code can read, or None."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return f'not an appliance state document (no "format": "{FORMAT}")'
    if doc.get("kind") != kind:
        return f"a {doc.get('kind')!r} document where a {kind!r} one belongs"
    if doc.get("version") != VERSION:
        return f"version {doc.get('version')!r}; this appliance reads version {VERSION}"
    return None


def set_aside(path: Path, why: str = "refused") -> Path:
    """Rename `path` to `<name>.<why>-<UTC time>` beside it (a second one in the same
    second gets a counter); the new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = path.with_name(f"{path.name}.{why}-{stamp}")
    n = 1
    while kept.exists():
        n += 1
        kept = path.with_name(f"{path.name}.{why}-{stamp}-{n}")
    os.replace(path, kept)
    return kept
