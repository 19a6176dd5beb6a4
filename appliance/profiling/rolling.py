"""Rolling traces: the events of every `rotate_s` become one complete, closed Chrome trace
file in `<dir>/rolling/`, oldest files removed past the retention.

The writer drains the tracer every `flush_s` (1 s) and appends what it took to the
file being written (`trace-<start>.json.tmp`), which gets its final name when its period
ends. Writing a minute's events at once held the GIL for one long stretch: at 50 fps,
0.1 s of `json.dumps` and 0.1 s of draining per minute, in which no stream's Python
thread could run (bench/profiling_overhead.py); flushing every second, in chunks of
CHUNK events, holds it for about a millisecond at a time and keeps a second's events in
memory instead of a minute's.

A write failure (read-only or full disk) is logged and counted once per file, never
raised: profiling must not stop the streams (Roboflow Inference #1110 is the
counter-example). That period's events are dropped and the next period tries again.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import orjson
from prometheus_client import Counter

from appliance.profiling.frameindex import FrameRanges
from appliance.profiling.tracer import Tracer

log = logging.getLogger("appliance.profiling")

FLUSH_S = 1.0  # the writer's period: events in memory, and the GIL held once per period
CHUNK = 500  # events per json.dumps call: about 1 ms with the GIL held (50 fps x 15 ev/s)
TMP_SUFFIX = ".tmp"  # the file being written; renamed when its period ends


class TraceFile:
    """One rolling trace being written: events appended in chunks, the JSON document
    closed and the file renamed to `path` by `close()`."""

    def __init__(self, path: Path, compress: bool, other: dict[str, Any]) -> None:
        self.path = path
        self._tmp = path.with_name(path.name + TMP_SUFFIX)
        self._other = other
        self._raw: IO[bytes] = self._tmp.open("wb")
        self._out: IO[bytes] = (
            gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6)  # type: ignore[assignment]
            if compress
            else self._raw
        )
        self._out.write(b'{"traceEvents":[')
        self._empty = True
        self._named: set[tuple[str, int]] = set()  # metadata events written (name, tid)
        self.frames = FrameRanges()  # which frames' workflow runs it holds

    def write(self, events: list[dict[str, Any]]) -> None:
        """Append events; each thread's and the process's name only once per file."""
        self.frames.add(events)
        fresh = [e for e in events if e["ph"] != "M" or self._first_name(e)]
        for i in range(0, len(fresh), CHUNK):
            # orjson: the encoding in C, about 10x the standard library's, on the thread
            # that holds the GIL the streams' workers want (bench/gil_profile.py).
            text = orjson.dumps(fresh[i : i + CHUNK])[1:-1]
            self._out.write(text if self._empty else b"," + text)
            self._empty = False

    def _first_name(self, event: dict[str, Any]) -> bool:
        key = (event["name"], event["tid"])
        if key in self._named:
            return False
        self._named.add(key)
        return True

    def close(self) -> Path:
        other = json.dumps({**self._other, "frames": self.frames.ranges}, separators=(",", ":"))
        self._out.write(f'],"displayTimeUnit":"ms","otherData":{other}}}'.encode())
        self._out.close()
        self._raw.close()
        self._tmp.replace(self.path)  # never a half-written trace under its name
        return self.path

    def discard(self) -> None:
        for f in (self._out, self._raw):
            with contextlib.suppress(OSError):  # a full disk fails the close too
                f.close()
        # A folder replaced by a file meanwhile fails the unlink too (NotADirectoryError):
        # nothing is left to remove then, and the writer thread must go on.
        with contextlib.suppress(OSError):
            self._tmp.unlink(missing_ok=True)


class RollingWriter:
    def __init__(
        self,
        tracer: Tracer,
        directory: Path,
        *,
        rotate_s: float = 60.0,
        flush_s: float = FLUSH_S,
        keep_files: int = 60,
        keep_bytes: int = 500 * 1024 * 1024,
        compress: bool = False,
        written: Counter | None = None,
        errors: Counter | None = None,
    ) -> None:
        self._tracer = tracer
        self.directory = directory
        self._rotate_s = rotate_s
        self._flush_s = min(flush_s, rotate_s)
        self._keep_files = keep_files
        self._keep_bytes = keep_bytes
        self._compress = compress
        self._written = written
        self._errors = errors
        self.last_error: str | None = None
        # Called with every flush's events before they are written (profiling windows).
        self.listeners: list[Callable[[list[dict[str, Any]]], None]] = []
        self._lock = threading.Lock()  # one drain at a time: no event taken twice
        self._file: TraceFile | None = None
        self._next: Path | None = None  # the name the period's file will get
        # The closed files this writer wrote, oldest first, and the frames each holds.
        self.index: dict[Path, FrameRanges] = {}
        self._period_start: float | None = None  # monotonic s; None: no period open
        self._failed = False  # this period's file could not be written: drop its events
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trace-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Write what is left and close the file, then end the thread; True when it
        ended in time."""
        self._stop.set()
        if self._thread.ident is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self._flush_s):
            self.flush()
        self.rotate()  # the last period, so a clean shutdown loses nothing

    def flush(self) -> None:
        """Hand the events since the last flush to the listeners and append them to the
        current file; close that file once its period has lasted `rotate_s`."""
        with self._lock:
            self._take()
            start = self._period_start
            if start is not None and time.monotonic() - start >= self._rotate_s:
                self._close()

    def rotate(self) -> Path | None:
        """Flush and close the current file now: its path, or None when nothing was
        written (no events since the last file, or the write failed)."""
        with self._lock:
            self._take()
            return self._close()

    def _take(self) -> None:
        events = self._tracer.drain()
        for listener in list(self.listeners):
            listener(events)
        if not any(e["ph"] != "M" for e in events):
            return  # thread names alone make no file
        if self._period_start is None:
            self._period_start, self._failed = time.monotonic(), False
        if self._failed:
            return
        trace = self._file
        try:
            if trace is None:  # the period's first events: its file, named by its start
                trace = self._file = self._open()
            trace.write(events)
        except OSError as exc:
            self._fail(exc, trace, self.directory / "rolling")

    def current_name(self) -> str:
        """The name of the file the events recorded now will be written to (the file
        being written, or the next one): an exemplar's `trace` label."""
        trace = self._file
        if trace is not None:
            return trace.path.name
        upcoming = self._next
        if upcoming is None:
            upcoming = self._next = self._next_path()
        return upcoming.name

    def writing(self, stream: str, seq: int) -> bool:
        """Whether the file being written holds that frame's workflow run."""
        trace = self._file
        return trace is not None and trace.frames.holds(stream, seq)

    def _open(self) -> TraceFile:
        path, self._next = self._next or self._next_path(), None
        path.parent.mkdir(parents=True, exist_ok=True)
        other = {"source": "appliance rolling trace", "pid": self._tracer.pid}
        return TraceFile(path, self._compress, other)

    def _next_path(self) -> Path:
        name = datetime.now(UTC).strftime("trace-%Y%m%dT%H%M%S.%fZ.json")
        return self.directory / "rolling" / (name + (".gz" if self._compress else ""))

    def _close(self) -> Path | None:
        trace, self._file, self._period_start = self._file, None, None
        if trace is None:
            return None
        try:
            path = trace.close()
            self.index[path] = trace.frames
            self._retain(path.parent)
        except OSError as exc:
            self._fail(exc, trace)
            return None
        self.last_error = None  # written again: the condition has cleared
        if self._written is not None:
            self._written.inc()
        return path

    def _fail(self, exc: OSError, trace: TraceFile | None, folder: Path | None = None) -> None:
        """This period's file (`trace`, or one not opened in `folder`) is lost: counted
        once, its events dropped until the next period."""
        self._file, self._failed = None, True
        if trace is not None:
            trace.discard()
        where = trace.path if trace is not None else folder
        self.last_error = f"cannot write {where}: {exc.strerror or exc}"
        log.error("trace not written: %s", self.last_error)
        if self._errors is not None:
            self._errors.inc()

    def _retain(self, folder: Path) -> None:
        """Keep the newest files within the limits. Called between files, so a `.tmp`
        here was left half-written by a process that died: it goes too."""
        for stale in folder.glob(f"trace-*{TMP_SUFFIX}"):
            stale.unlink(missing_ok=True)
        files = sorted(folder.glob("trace-*.json*"), key=lambda p: p.name, reverse=True)
        total = 0
        for i, f in enumerate(files):
            total += f.stat().st_size
            if i >= self._keep_files or (i > 0 and total > self._keep_bytes):  # keep the newest
                f.unlink(missing_ok=True)
                self.index.pop(f, None)
