"""Baselines of the regression watch: per row (a stream's block, a model's `session.run` or
queue wait, a stream's frame and frame age), a fixed sample of its latency, in µs, with the
host speed probe's samples taken while it was learned.

Rows are named as the API names them (`row_key`): `cam1/blur` a block, `model:faces` a
model's session.run, `queue:faces` its queue wait, `age:cam1` a frame age, `frame:cam1` a
whole workflow run (its stream's frame: the weight of a block's shift, never raised).

One JSON document holds them all (`BASELINE_VERSION`): the watch keeps its own beside the
traces (`<profiling.dir>/watch/baselines.json`, written whole to a temporary file and
renamed, so a crash leaves the old or the new), and `appliance trace fingerprint` writes
the same document from a trace, for `profiling.watch.baseline`. A baseline survives
restarts, reloads and model changes: a change is judged against what it replaced.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Samples = npt.NDArray[np.int64]
BASELINE_VERSION = 1
KINDS = ("block", "model", "queue", "frame age", "frame")
_PREFIX = {"model": "model:", "queue": "queue:", "frame age": "age:", "frame": "frame:"}
MAX_ROWS = 4096  # rows a document may hold (streams × blocks, with room)
MAX_SAMPLES = 20000  # per row, the most a config's `reservoir` may ask


class BaselineError(ValueError):
    """A baseline document that cannot be used, with where the problem is."""


def row_key(kind: str, name: str) -> str:
    """The row's name in the API and the files: a block's `<stream>/<block>` as is."""
    return name if kind == "block" else f"{_PREFIX[kind]}{name}"


def kind_of(key: str) -> str:
    """The kind of a row, from its key."""
    prefix, colon, _ = key.partition(":")
    if colon:
        for kind, known in _PREFIX.items():
            if known == prefix + ":":
                return kind
    return "block"


def stream_of_row(kind: str, name: str) -> str | None:
    """The stream a row belongs to; None for a model's rows."""
    if kind == "block":
        return name.partition("/")[0]
    return name if kind in ("frame age", "frame") else None


@dataclass(frozen=True, slots=True)
class Baseline:
    """One row's baseline: what `trace diff` would rank a recent window against."""

    kind: str
    name: str
    samples: Samples  # µs, at most the reservoir's size
    probe: Samples  # the host probe's µs while it was learned (empty: none known)
    learned_at: float  # epoch seconds: the end of its learning
    source: str  # "learned", or the file it came from
    contention: Samples = field(default_factory=lambda: np.empty(0, np.int64))  # ‰ waits
    # The row's own cost per run, µs of CPU (a block's thread CPU; a model's per sample,
    # on every thread of its run): what a wait for a core does not move. Empty: unknown
    # (a baseline from a trace file, a row without one: frame age, queue wait).
    cpu: Samples = field(default_factory=lambda: np.empty(0, np.int64))
    # How far apart the medians of the intervals it was learned over were (the slowest
    # over the fastest, ≥ 1): the drift a machine showed with nothing changed, which a
    # comparison allows on top of its gate (a minute's learning sees one state only).
    spread: float = 1.0
    cpu_spread: float = 1.0
    # What `probe` timed (appliance/watch/probe.py): "onnx", or "loop" (the probe before
    # it ran a model, and where none can be built). Probes of two measures are not
    # compared: their µs differ by 1.1-1.9 times on the same host.
    probe_measure: str = "loop"
    # The probe's CPU µs alone while it was learned (`probe` is them over the share of the
    # machine left to us): what a row's own cost is judged against. Empty: unknown (a
    # baseline from before they were kept), when the whole probe ratio stands in.
    probe_cpu: Samples = field(default_factory=lambda: np.empty(0, np.int64))
    # The model a block's row ran while it was learned (None: none, or unknown): a block
    # that runs another model now (a shadow promoted) is not the row it learned, and its
    # slowdown is its own, never a victim's (contention.py).
    model: str | None = None

    def document(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "samples_us": self.samples.tolist(),
            "probe_us": self.probe.tolist(),
            "contention_permille": self.contention.tolist(),
            "cpu_us": self.cpu.tolist(),
            "spread": round(self.spread, 4),
            "cpu_spread": round(self.cpu_spread, 4),
            "probe_measure": self.probe_measure,
            "probe_cpu_us": self.probe_cpu.tolist(),
            "learned_at": round(self.learned_at, 3),
            "source": self.source,
            **({} if self.model is None else {"model": self.model}),
        }


def subsample(values: Samples, size: int, seed: int = 0) -> Samples:
    """At most `size` of `values`, uniformly at random without replacement (seeded, so
    the same input keeps the same sample), sorted."""
    if len(values) > size:
        values = np.random.default_rng(seed).choice(values, size, replace=False)
    return np.sort(values.astype(np.int64))


def document(baselines: Iterable[Baseline]) -> dict[str, Any]:
    """The JSON document of these baselines."""
    rows = {row_key(b.kind, b.name): b.document() for b in baselines}
    return {"version": BASELINE_VERSION, "rows": rows}


def parse(doc: Any, where: str) -> dict[str, Baseline]:
    """A document's baselines by row key; BaselineError naming the first problem."""
    if not isinstance(doc, Mapping) or doc.get("version") != BASELINE_VERSION:
        raise BaselineError(f"{where}: not a baseline document (version {BASELINE_VERSION})")
    rows = doc.get("rows")
    if not isinstance(rows, Mapping) or len(rows) > MAX_ROWS:
        raise BaselineError(f"{where}: rows: expected an object of at most {MAX_ROWS} rows")
    return {str(key): _parse_row(row, f"{where}: rows.{key}") for key, row in rows.items()}


def _parse_row(row: Any, where: str) -> Baseline:
    if not isinstance(row, Mapping):
        raise BaselineError(f"{where}: expected an object")
    kind, name = row.get("kind"), row.get("name")
    if kind not in KINDS or not isinstance(name, str) or not name:
        raise BaselineError(f"{where}: kind must be one of {list(KINDS)}, name a string")
    learned_at = row.get("learned_at", 0.0)
    if not isinstance(learned_at, int | float):
        raise BaselineError(f"{where}.learned_at: expected epoch seconds")
    return Baseline(
        kind,
        name,
        _samples(row.get("samples_us"), f"{where}.samples_us", minimum=1),
        _samples(row.get("probe_us", []), f"{where}.probe_us", minimum=0),
        float(learned_at),
        str(row.get("source", "learned"))[:256],
        _samples(row.get("contention_permille", []), f"{where}.contention_permille", minimum=0),
        _samples(row.get("cpu_us", []), f"{where}.cpu_us", minimum=0),
        _spread(row.get("spread", 1.0), f"{where}.spread"),
        _spread(row.get("cpu_spread", 1.0), f"{where}.cpu_spread"),
        _measure(row.get("probe_measure", "loop"), f"{where}.probe_measure"),
        _samples(row.get("probe_cpu_us", []), f"{where}.probe_cpu_us", minimum=0),
        _model(row.get("model"), f"{where}.model"),
    )


def _model(value: Any, where: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not 0 < len(value) <= 256):
        raise BaselineError(f"{where}: expected a model id (a string of 1 to 256 characters)")
    return value


PROBE_MEASURES = ("onnx", "loop")


def _measure(value: Any, where: str) -> str:
    if value not in PROBE_MEASURES:
        raise BaselineError(f"{where}: expected one of {list(PROBE_MEASURES)}")
    return str(value)


MAX_SPREAD = 4.0  # a baseline whose intervals differed more than this learned nothing


def _spread(value: Any, where: str) -> float:
    if not isinstance(value, int | float) or not 1.0 <= value <= MAX_SPREAD:
        raise BaselineError(f"{where}: expected a number from 1 to {MAX_SPREAD:g}")
    return float(value)


def _samples(values: Any, where: str, minimum: int) -> Samples:
    ok = isinstance(values, list) and minimum <= len(values) <= MAX_SAMPLES
    if not ok or not all(type(v) is int and 0 <= v < 2**40 for v in values):
        raise BaselineError(f"{where}: expected {minimum} to {MAX_SAMPLES} whole µs values (>= 0)")
    return np.sort(np.asarray(values, dtype=np.int64))


@dataclass
class BaselineStore:
    """The watch's baselines, saved whole at `path` after each change (None: kept in
    memory only). Readers and the watch thread share it under a lock."""

    path: Path | None
    rows: dict[str, Baseline] = field(default_factory=dict)
    last_error: str | None = None  # the last save that failed (the watch goes on)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def open(cls, path: Path | None, shared: Mapping[str, Baseline] | None = None) -> BaselineStore:
        """The store at `path` as saved; `shared` (a fleet's file) wins row by row. A
        file that cannot be read is set aside (renamed `.bad`) and learned again."""
        store = cls(path)
        if path is not None and path.exists():
            try:
                store.rows = parse(json.loads(path.read_bytes()), str(path))
            except (OSError, ValueError) as exc:
                store.last_error = f"{exc}: set aside as {path.name}.bad, learning again"
                path.replace(path.with_name(path.name + ".bad"))
        store.rows.update(shared or {})
        return store

    def get(self, key: str) -> Baseline | None:
        return self.rows.get(key)

    def put(self, baselines: Iterable[Baseline]) -> None:
        with self._lock:
            for b in baselines:
                self.rows[row_key(b.kind, b.name)] = b
        self.save()

    def drop(self, keys: Iterable[str]) -> int:
        """Forget these rows (re-learned from now); how many there were."""
        with self._lock:
            gone = [k for k in keys if self.rows.pop(k, None) is not None]
        self.save()
        return len(gone)

    def save(self) -> None:
        if self.path is None:
            return
        with self._lock:
            data = json.dumps(document(self.rows.values()), separators=(",", ":"))
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(data)
            os.replace(tmp, self.path)
            self.last_error = None
        except OSError as exc:
            self.last_error = f"{self.path}: {exc.strerror or exc}"
            tmp.unlink(missing_ok=True)


MIN_INTERVAL_SAMPLES = 10  # an interval's median counts towards the spread from this many


@dataclass
class Reservoir:
    """At most `cap` of all the samples added, each with the same chance."""

    kept: Samples = field(default_factory=lambda: np.empty(0, np.int64))
    count: int = 0

    def add(self, samples: Samples, cap: int) -> None:
        seen, self.count = self.count, self.count + samples.size
        self.kept = _reservoir(self.kept, seen, samples, self.count, cap)


@dataclass
class Learning:
    """A row being learned: what it gathered since `started` (perf_counter), bounded, its
    own cost per run beside it, and each interval's median (the spread it saw)."""

    started: float
    started_at: float = field(default_factory=time.time)
    parts: list[Samples] = field(default_factory=list)
    count: int = 0
    cpu: Reservoir = field(default_factory=Reservoir)
    medians: list[float] = field(default_factory=list)  # per interval, µs
    cpu_medians: list[float] = field(default_factory=list)

    def add(self, samples: Samples, cap: int, cpu: Samples | None = None) -> None:
        """Keep at most `cap` samples, each of all those seen with the same chance (a
        reservoir: the old ones in proportion to how many they stand for)."""
        if samples.size >= MIN_INTERVAL_SAMPLES:
            self.medians.append(float(np.median(samples)))
        if cpu is not None and cpu.size:
            if cpu.size >= MIN_INTERVAL_SAMPLES:
                self.cpu_medians.append(float(np.median(cpu)))
            self.cpu.add(cpu, cap)
        if samples.size == 0:
            return
        seen, self.count = self.count, self.count + samples.size
        self.parts = [_reservoir(self.samples(), seen, samples, self.count, cap)]

    def samples(self) -> Samples:
        return np.concatenate(self.parts) if self.parts else np.empty(0, np.int64)

    def spreads(self) -> tuple[float, float]:
        """(wall, own cost): the slowest interval's median over the fastest's, at most
        MAX_SPREAD; 1 with fewer than two intervals."""
        return _ratio(self.medians), _ratio(self.cpu_medians)


def _reservoir(kept: Samples, seen: int, new: Samples, count: int, cap: int) -> Samples:
    """`kept` (standing for `seen` samples) and `new`, at most `cap` of them."""
    if kept.size + new.size <= cap:
        return np.concatenate([kept, new])
    rng = np.random.default_rng(count)
    old = rng.choice(kept, min(kept.size, round(cap * seen / count)), replace=False)
    young = rng.choice(new, min(new.size, cap - old.size), replace=False)
    return np.concatenate([old, young])


def _ratio(medians: list[float]) -> float:
    if len(medians) < 2 or min(medians) <= 0:
        return 1.0
    return min(MAX_SPREAD, max(medians) / min(medians))
