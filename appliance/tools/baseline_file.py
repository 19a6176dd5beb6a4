"""`appliance trace fingerprint`: a trace made into the regression watch's baseline document
(appliance/watch/baseline.py), for a fleet's `profiling.watch.baseline`.

Rows are those `trace diff` compares (appliance/tools/regression.py `samples`), with its
names, and each model's queue wait:

- block `<stream>/<block>`: complete spans of cat `block`;
- model `<model>`: `session.run` spans with a `model` arg, but failed ones (`ok` false)
  and those ORT's profiler slowed (`ort_profiled`), which the watch leaves out too;
- queue `<model>`: `queue.wait` spans;
- frame `<stream>`: `workflow.run` spans; frame age `<stream>`: their `age_ms` arg.

Durations are whole µs. Every row carries the same host probe samples: the `host_us` of
the trace's `host.probe` spans (cat `watch`), none if it has none, and their
`wait_ratio` as its contention samples (‰). A row keeps a uniform
sample of at most `reservoir` values; a row of fewer than `MIN_SPANS` spans is left out
(the rank test needs as many). Streams are named as in the trace, or as `renames` maps
them (the fleet's config may call CI's `ci-cam` `cam1`).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from appliance.tools.fingerprint import stream_of
from appliance.tools.trace_file import Event, event_args, load_events
from appliance.watch.baseline import (
    KINDS,
    MAX_SAMPLES,
    Baseline,
    BaselineError,
    Samples,
    document,
    parse,
    stream_of_row,
    subsample,
)
from appliance.watch.ranktest import MIN_SAMPLES

MIN_SPANS = MIN_SAMPLES  # fewer, and the watch could never judge the row
PROBE_SPAN, PROBE_CAT = "host.probe", "watch"
MAX_US = 2**40  # what a baseline document accepts (about 12 days)
RowKey = tuple[str, str]  # (kind, name)


class FingerprintError(ValueError):
    """A trace that makes no baseline, or options that do not fit it; names the file."""


@dataclass
class TraceRows:
    """A trace's samples per row (µs, as the trace names its streams) and its probe."""

    rows: dict[RowKey, list[int]] = field(default_factory=lambda: defaultdict(list))
    probe: list[int] = field(default_factory=list)
    waits: list[int] = field(default_factory=list)  # the probe's wait_ratio, ‰
    measures: list[str] = field(default_factory=list)  # what each probe run timed
    # Each probe run's CPU µs alone (its `onnx_cpu_us`, else `loop_cpu_us`; 0: neither)
    cpus: list[int] = field(default_factory=list)

    def streams(self) -> set[str]:
        """The streams that have a row."""
        return {s for kind, name in self.rows if (s := stream_of_row(kind, name)) is not None}


@dataclass(frozen=True, slots=True)
class Fingerprinted:
    """What `fingerprint_baselines` made: the rows kept (sorted by kind, then name), their
    span counts in the trace, and the rows left out with theirs."""

    baselines: list[Baseline]
    spans: dict[RowKey, int]
    left_out: dict[RowKey, int]


def trace_rows(events: Sequence[Event]) -> TraceRows:
    """The rows of one trace's events (see the top)."""
    out = TraceRows()
    for e in events:
        if e["ph"] != "X":
            continue
        args, dur = event_args(e), round(e["dur"])
        name = e["name"]
        if e.get("cat") == "block":
            out.rows[("block", f"{stream_of(e)}/{name}")].append(dur)
        elif name == "session.run" and "model" in args:
            if args.get("ok") is not False and args.get("ort_profiled") is not True:
                out.rows[("model", str(args["model"]))].append(dur)
        elif name == "queue.wait" and "model" in args:
            out.rows[("queue", str(args["model"]))].append(dur)
        elif name == "workflow.run":
            out.rows[("frame", stream_of(e))].append(dur)
            if "age_ms" in args:
                out.rows[("frame age", stream_of(e))].append(round(args["age_ms"] * 1000))
        elif name == PROBE_SPAN and e.get("cat") == PROBE_CAT:
            # The probe's sample is its `host_us` (its CPU time over the share of the
            # machine left to us, appliance/watch/probe.py); a span without it, its
            # duration. Its `wait_ratio`: the contention the streams' threads met.
            host_us = args.get("host_us")
            out.probe.append(round(host_us) if isinstance(host_us, int | float) else dur)
            # A probe span without it is the loop's (before the probe ran a model).
            out.measures.append("onnx" if args.get("measure") == "onnx" else "loop")
            cpu = args.get("onnx_cpu_us" if out.measures[-1] == "onnx" else "loop_cpu_us")
            out.cpus.append(round(cpu) if isinstance(cpu, int | float) and 0 < cpu < MAX_US else 0)
            waits = args.get("wait_ratio")
            if isinstance(waits, int | float) and 0 < waits < 1e6:
                out.waits.append(round(waits * 1000))
    return out


def fingerprint_baselines(
    path: Path,
    reservoir: int = 1000,
    streams: Collection[str] = (),
    renames: Mapping[str, str] | None = None,
) -> Fingerprinted:
    """The baselines of the trace at `path`: only `streams`' rows (and every model's) when
    given, streams named as in the trace; `renames` maps a trace's stream to its name in
    the target config. FingerprintError (TraceFormatError for a file that is not a trace)
    when nothing is left, or an option names a stream the trace does not have."""
    if not MIN_SPANS <= reservoir <= MAX_SAMPLES:
        raise FingerprintError(f"reservoir must be {MIN_SPANS} to {MAX_SAMPLES}, got {reservoir}")
    events, _ = load_events(path)
    found = trace_rows(events)
    rows = _select(path, found, set(streams), dict(renames or {}))
    _check_values(path, rows, found.probe)
    spans = {key: len(values) for key, values in rows.items()}
    left_out = {key: n for key, n in spans.items() if n < MIN_SPANS}
    if len(left_out) == len(rows):
        found_rows = (
            f": {_listed(left_out)}" if left_out else ": no block, model, queue or frame spans"
        )
        raise FingerprintError(f"{path}: no row of {MIN_SPANS} spans or more{found_rows}")
    probe, probe_cpu, measure = _probe_of(found)
    probe, probe_cpu = subsample(probe, reservoir), subsample(probe_cpu, reservoir)
    waits = subsample(np.asarray(found.waits, dtype=np.int64), reservoir)
    learned_at, source = path.stat().st_mtime, f"fingerprint:{path.name}"[:256]
    kept = sorted(rows.keys() - left_out.keys(), key=lambda k: (KINDS.index(k[0]), k[1]))
    baselines = [
        Baseline(
            kind, name, _sample(rows[(kind, name)], reservoir), probe, learned_at, source, waits,
            probe_measure=measure, probe_cpu=probe_cpu,
        )
        for kind, name in kept
    ]  # fmt: skip
    return Fingerprinted(baselines, {k: spans[k] for k in kept}, left_out)


def write_baselines(path: Path, baselines: Sequence[Baseline]) -> None:
    """Write the document whole (a temporary file renamed): what `parse` reads back, or
    FingerprintError (OSError for a file that cannot be written)."""
    data = json.dumps(document(baselines), separators=(",", ":"))
    try:
        parse(json.loads(data), str(path))  # what the watch will read, checked before
    except BaselineError as exc:
        raise FingerprintError(f"not written: {exc}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(data + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def median_ms(samples: Samples) -> float:
    """The median of µs samples, in ms."""
    return float(np.median(samples)) / 1000


def _select(
    path: Path, found: TraceRows, streams: set[str], renames: dict[str, str]
) -> dict[RowKey, list[int]]:
    """The rows of `streams` (all without), their streams renamed."""
    present = found.streams()
    unknown = sorted((streams | renames.keys()) - present)
    if unknown:
        raise FingerprintError(
            f"{path}: no stream {', '.join(unknown)} in the trace (it has "
            f"{', '.join(sorted(present)) or 'none'}; --stream and --rename take its names)"
        )
    bad = sorted(new for new in renames.values() if not new or "/" in new)
    if bad:
        raise FingerprintError(f"--rename: a stream id has no '/' and is not empty: {bad}")
    kept = {s for s in present if not streams or s in streams}
    targets: dict[str, str] = {}
    for stream in sorted(kept):
        target = renames.get(stream, stream)
        if target in targets:
            raise FingerprintError(
                f"{path}: streams {targets[target]} and {stream} would both be {target}"
            )
        targets[target] = stream
    named = {old: new for new, old in targets.items()}
    out: dict[RowKey, list[int]] = {}
    for (kind, name), values in found.rows.items():
        of = stream_of_row(kind, name)
        if of is None:  # a model's row: kept whatever the streams
            out[(kind, name)] = values
        elif of in named:
            out[(kind, _renamed(kind, name, named[of]))] = values
    return out


def _renamed(kind: str, name: str, stream: str) -> str:
    return f"{stream}/{name.partition('/')[2]}" if kind == "block" else stream


def _probe_of(found: TraceRows) -> tuple[Samples, Samples, str]:
    """The probe samples of the trace's latest measure (a trace across an upgrade holds
    both: their µs are not comparable), their CPU µs alone (empty unless every run has
    them: a trace from before they were written), and that measure."""
    if not found.measures:
        return np.empty(0, np.int64), np.empty(0, np.int64), "loop"
    measure = found.measures[-1]
    runs = [(v, c) for v, c, m in zip(found.probe, found.cpus, found.measures, strict=True)
            if m == measure]  # fmt: skip
    kept = np.asarray([v for v, _ in runs], dtype=np.int64)
    cpus = np.asarray([c for _, c in runs], dtype=np.int64)
    return kept, cpus if cpus.all() else cpus[:0], measure


def _check_values(path: Path, rows: Mapping[RowKey, list[int]], probe: list[int]) -> None:
    """Every value one a baseline holds: a trace with a negative span is broken."""
    for (kind, name), values in [*rows.items(), (("host probe", PROBE_SPAN), probe)]:
        if values and not 0 <= min(values) <= max(values) < MAX_US:
            raise FingerprintError(
                f"{path}: {kind} {name}: a duration outside 0 to {MAX_US} µs "
                f"({min(values)} .. {max(values)})"
            )


def _sample(values: list[int], reservoir: int) -> Samples:
    return subsample(np.asarray(values, dtype=np.int64), reservoir)


def _listed(rows: Mapping[RowKey, int]) -> str:
    """`block cam/x (3 spans), frame cam (3 spans)`."""
    return ", ".join(f"{kind} {name} ({n} spans)" for (kind, name), n in sorted(rows.items()))


def table(made: Fingerprinted) -> list[str]:
    """The rows kept, one a line: kind, name, spans in the trace, samples kept, median ms;
    then the host probe's."""
    rows = [(b.kind, b.name, made.spans[(b.kind, b.name)], b.samples) for b in made.baselines]
    width = max(len("name"), *(len(name) for _, name, _, _ in rows)) + 2
    lines = [f"{'kind':<11}{'name':<{width}}{'spans':>8}{'samples':>9}{'median ms':>11}"]
    for kind, name, spans, samples in rows:
        lines.append(
            f"{kind:<11}{name:<{width}}{spans:>8}{samples.size:>9}{median_ms(samples):>11.3f}"
        )
    probe = made.baselines[0].probe
    if probe.size:
        lines.append(f"host probe: {probe.size} samples, median {median_ms(probe):.3f} ms")
    else:
        lines.append(f"host probe: none in the trace (no {PROBE_SPAN} spans)")
    return lines


def left_out_line(made: Fingerprinted) -> str | None:
    """The rows left out, with their span counts; None if none was."""
    if not made.left_out:
        return None
    return f"left out (fewer than {MIN_SPANS} spans): {_listed(made.left_out)}"
