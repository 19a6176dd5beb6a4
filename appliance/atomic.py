"""Files written whole or not at all: a reader (or a restart after a crash) sees the old
file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

FOLDER_MODE = 0o700  # what the appliance keeps (state, caches) may be private


def write_atomic(path: Path, data: bytes, *, durable: bool = False) -> None:
    """`data` as the file at `path`: written to a temporary file beside it (mode 0600,
    a dot name), then renamed over it; the folder is created (0700) when missing.
    `durable`: the data and the rename are on disk before this returns (state that must
    survive a power cut). OSError when the folder or the disk refuses: the old file is
    left as it was, and no temporary file."""
    folder = path.parent
    folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_folder(folder)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
