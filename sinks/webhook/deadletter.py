"""A bounded, rotated JSON-lines file of messages a sink gave up on.

`<data_dir>/dead-letters/<sink>.jsonl` takes appends until the next would pass
`max_bytes`; then it becomes `.1` (`.1` becomes `.2`, ...) and the oldest past
`keep_files` is deleted, as logrotate's `rotate N` does. The disk used stays under about
`(keep_files + 1) * max_bytes` (a single record larger than `max_bytes` gets a file of
its own rather than being cut: a half record is no use for a replay).

Appends block on the disk, so sinks call `append` off the event loop (run_in_executor);
the lock makes appends from several executor threads whole and ordered.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

MiB = 1024 * 1024


class DeadLetterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_bytes: Annotated[int, Field(ge=1024)] = 10 * MiB  # per file
    keep_files: Annotated[int, Field(ge=0, le=100)] = 3  # rotated files kept besides the live one


class DeadLetterFile:
    """Appends records as JSON lines to `path`, rotating past `config.max_bytes`."""

    def __init__(self, path: Path, config: DeadLetterConfig) -> None:
        self.path = path
        self._config = config
        self._lock = threading.Lock()

    def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Write `records`, one line each; raises OSError when the disk refuses."""
        lines = [
            (json.dumps(r, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
            for r in records
        ]
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for line in lines:
                if self._size() > 0 and self._size() + len(line) > self._config.max_bytes:
                    self._rotate()
                with self.path.open("ab") as f:
                    f.write(line)

    def files(self) -> list[Path]:
        """The live file and its rotated ones that exist, newest first."""
        names = [self.path] + [self._rotated(i) for i in range(1, self._config.keep_files + 1)]
        return [p for p in names if p.exists()]

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def _rotate(self) -> None:
        keep = self._config.keep_files
        if keep == 0:
            self.path.unlink(missing_ok=True)
            return
        self._rotated(keep).unlink(missing_ok=True)
        for i in range(keep - 1, 0, -1):
            if self._rotated(i).exists():
                self._rotated(i).replace(self._rotated(i + 1))
        self.path.replace(self._rotated(1))

    def _rotated(self, i: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{i}")
