"""Rolling traces: every `rotate_s` the events since the last file become one complete,
closed Chrome trace file in `<dir>/rolling/`, oldest files removed past the retention.

A write failure (read-only or full disk) is logged and counted, never raised: profiling
must not stop the streams (Roboflow Inference #1110 is the counter-example).
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from appliance.profiling.tracer import Tracer

log = logging.getLogger("appliance.profiling")


class RollingWriter:
    def __init__(
        self,
        tracer: Tracer,
        directory: Path,
        *,
        rotate_s: float = 60.0,
        keep_files: int = 60,
        keep_bytes: int = 500 * 1024 * 1024,
        compress: bool = False,
        written: Counter | None = None,
        errors: Counter | None = None,
    ) -> None:
        self._tracer = tracer
        self.directory = directory
        self._rotate_s = rotate_s
        self._keep_files = keep_files
        self._keep_bytes = keep_bytes
        self._compress = compress
        self._written = written
        self._errors = errors
        self.last_error: str | None = None
        # Called with each window's events before they are written (profiling windows).
        self.listeners: list[Callable[[list[dict[str, Any]]], None]] = []
        self._rotate_lock = threading.Lock()  # one drain at a time: no event taken twice
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trace-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Write what is left, then end the thread; True when it ended in time."""
        self._stop.set()
        if self._thread.ident is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self._rotate_s):
            self.rotate()
        self.rotate()  # the last window, so a clean shutdown loses nothing

    def rotate(self) -> Path | None:
        """Write the current window as one trace file; None when nothing was written."""
        with self._rotate_lock:
            events = self._tracer.drain()
            for listener in list(self.listeners):
                listener(events)
            return self._write_window(events)

    def _write_window(self, events: list[dict[str, Any]]) -> Path | None:
        if not any(e["ph"] != "M" for e in events):
            return None
        name = datetime.now(UTC).strftime("trace-%Y%m%dT%H%M%S.%fZ.json")
        path = self.directory / "rolling" / (name + (".gz" if self._compress else ""))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._write(path, events)
            self._retain(path.parent)
        except OSError as exc:
            self.last_error = f"cannot write {path}: {exc.strerror or exc}"
            log.error("trace not written: %s", self.last_error)
            if self._errors is not None:
                self._errors.inc()
            return None
        self.last_error = None  # written again: the condition has cleared
        if self._written is not None:
            self._written.inc()
        return path

    def _write(self, path: Path, events: list[dict[str, Any]]) -> None:
        other = {"source": "appliance rolling trace", "pid": self._tracer.pid}
        doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}
        data = json.dumps(doc, separators=(",", ":")).encode()
        tmp = path.with_name(path.name + ".tmp")  # never a half-written trace under its name
        tmp.write_bytes(gzip.compress(data, 6) if self._compress else data)
        tmp.replace(path)

    def _retain(self, folder: Path) -> None:
        files = sorted(folder.glob("trace-*.json*"), key=lambda p: p.name, reverse=True)
        total = 0
        for i, f in enumerate(files):
            total += f.stat().st_size
            if i >= self._keep_files or (i > 0 and total > self._keep_bytes):  # keep the newest
                f.unlink(missing_ok=True)
