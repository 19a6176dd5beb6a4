"""One comparison of the regression watch: each row's recent samples against its baseline,
with `trace diff`'s rule (appliance/watch/rule.py: material in ms and in share of the
frame, significant by the Mann–Whitney U test, the Hodges–Lehmann shift with its
interval), after what the machine explains is taken out.

Three things slow many rows at once, none of them a row's own regression, each with its
measure (probe.py), now against while the row was learned:

- a slower CPU (frequency, throttling) and a busier machine (another tenant, a noisy
  neighbour, a VM's steal): the probe, a small fixed ONNX model's CPU time over the share
  of the machine other processes leave us. Our own work barely moves it. This is the
  host;
- contention among the streams' own threads: how long they waited for a core per second
  run. On a saturated machine it swings by tens of % with nothing changed (the streams'
  models overlap more or less as their frames drift in and out of phase), and a noisy
  neighbour raises it too.

The factor is the larger of the two ratios when it passes a margin (half of `host_pct`),
else 1: a machine faster than at learning excuses nothing. Each row is judged on its
samples divided by the factor, with the gate's `fail_over_pct` widened by as much again:
rows do not all slow alike (ONNX Runtime's threads wait for each other when one of them
waits for a core; a Python block barely notices), so a machine 40 % slower must leave a
row 40 % beyond what it explains. With a factor of 1 this is exactly `trace diff
--fail-over`.

A row's own cost per run (CPU time) is divided by the probe's CPU time alone, now over
learned (`Host.cpu_factor`): a slower core moves both, while a wait for a core or a
neighbour that leaves us fewer cores moves neither.

The host is reported slower when the probe passes `host_pct` and the median CPU row (the
common shift: blocks and models of at least `min_ms`, each its median now over its
baseline's) moved too: a busier machine that costs the streams nothing is not an alert.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from appliance.watch.baseline import Baseline
from appliance.watch.baseline import Samples as Values
from appliance.watch.ranktest import MIN_SAMPLES
from appliance.watch.rule import SLOWER, Gate, Row, Samples, compare_row

CPU_KINDS = ("block", "model")  # rows whose time is CPU work (the common shift's rows)
# An own cost judged one of these did not grow: its row's latency alone did. "too few
# spans" is not among them: an own cost not judged tells nothing.
OWN_VERDICTS_NOT_SLOWER = ("ok", "immaterial", "not significant")


@dataclass(frozen=True, slots=True)
class Host:
    """The host's speed now against the baselines', and whether it is slower."""

    probe_ratio: float | None  # the probe's median now / while learned (None: no probe)
    common_ratio: float | None  # the median of the CPU rows' median ratios
    rows: int  # CPU rows in the common shift
    factor: float  # what the rows are divided by (1: nothing put on the host)
    widen_pct: float  # added to the gate's fail_over_pct
    slower: bool  # the host: the probe past host_pct, and the rows moved
    wait_ratio: float | None = None  # the threads' waits per second run, now / learned
    # What a row's own cost (CPU time) is divided by: the probe's CPU time alone, now /
    # learned (`probe_cpu_ratio`), since a wait for a core, or fewer cores left to us,
    # does not move CPU time while a slower core does.
    cpu_factor: float = 1.0
    probe_cpu_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class Judged:
    """One row's verdict; `row` in trace diff's terms, on the host-normalised samples."""

    key: str
    kind: str
    name: str
    row: Row
    ratio: float  # median now (normalised) / median in the baseline
    baseline_p99_ms: float
    current_p50_ms: float  # not normalised: what was measured
    current_p99_ms: float
    own: Row | None = None  # its own cost per run (CPU) judged alike; None: not measured
    own_ratio: float | None = None  # own cost now (normalised) / in the baseline
    # Its latency as measured, judged before the host's factor was taken out (None: the
    # factor was 1, or `row` is slower already), and its median now over its baseline's.
    raw: Row | None = None
    raw_ratio: float = 1.0

    @property
    def slower(self) -> bool:
        """Slower, and by its own doing where its own cost tells (see `contended`)."""
        return self.row.verdict == SLOWER and not self.contended

    @property
    def grew(self) -> bool:
        """Its own cost per run passed the gate: whatever its latency did, it did more."""
        return self.own is not None and self.own.verdict == SLOWER

    @property
    def excused(self) -> bool:
        """Slower as measured, but not once the machine's factor was taken out: what a
        change of the appliance's own load makes of the rows it slows (contention.py)."""
        return self.raw is not None and self.raw.verdict == SLOWER and not self.grew

    @property
    def contended(self) -> bool:
        """Slower only because it waited longer: its latency passed the gate while its
        own cost per run did not move beyond it (a victim of contention, not a cause)."""
        own = self.own
        return (
            self.row.verdict == SLOWER
            and own is not None
            and own.verdict in OWN_VERDICTS_NOT_SLOWER
        )


def host_speed(
    recent: Mapping[str, Values],
    baselines: Mapping[str, Baseline],
    probe_now: tuple[Values, Values],
    waits_now: Values,
    gate: Gate,
    host_pct: float,
) -> Host:
    """The factor of this comparison, and the host's verdict (see the top). `probe_now`:
    the probe's samples since the last comparison (host µs, its model's CPU µs alone)."""
    host_now, cpu_now = probe_now
    ratios, probes, cpus, waits = [], [], [], []
    for key, now in recent.items():
        base = baselines.get(key)
        if base is None or now.size < MIN_SAMPLES:
            continue
        if base.probe.size and host_now.size:
            probes.append(_ratio(host_now, base.probe))
            # A baseline from before the CPU µs were kept: the whole probe stands in.
            has_cpu = base.probe_cpu.size and cpu_now.size
            cpus.append(_ratio(cpu_now, base.probe_cpu) if has_cpu else probes[-1])
        if base.contention.size and waits_now.size:
            waits.append(_ratio(waits_now, base.contention))
        if base.kind in CPU_KINDS and _median(base.samples) >= gate.min_ms * 1000:
            ratios.append(_ratio(now, base.samples))
    probe = statistics.median(probes) if probes else None
    probe_cpu = statistics.median(cpus) if cpus else None
    wait = statistics.median(waits) if waits else None
    common = statistics.median(ratios) if ratios else None
    margin = host_pct / 200
    factor = max(probe or 1.0, wait or 1.0)
    factor = factor if factor > 1 + margin else 1.0
    moved = common is not None and common > 1 + margin
    slower = probe is not None and probe >= 1 + host_pct / 100 and moved
    cpu_factor = probe_cpu if probe_cpu is not None and probe_cpu > 1 + margin else 1.0
    widen = (factor - 1) * 100
    return Host(
        probe, common, len(ratios), factor, widen, slower, wait, cpu_factor, probe_cpu
    )  # fmt: skip


def judge(
    recent: Mapping[str, Values],
    baselines: Mapping[str, Baseline],
    model_streams: Mapping[str, set[str]],
    host: Host,
    gate: Gate,
    cpu: Mapping[str, Values] | None = None,
) -> list[Judged]:
    """Every row with a baseline and enough recent samples, judged; its own cost too
    (`cpu`: µs of CPU per run) where both the baseline and this interval have it.

    Every row's latency is divided by the host's whole factor, its own cost grown or
    not. Judging a row whose own cost grew without the waits (the contention a heavier
    row adds excuses the others, not it) raised the faces model and its block in a
    20-minute run with short learning and nothing changed: a slow state of the machine
    moved the models' latency and own cost far more than the probe, which reads a small
    model on one thread. Until the probe reads what slows the models, a grown own cost
    may be the host's."""
    before = Samples()
    rows = []
    for key, now in recent.items():
        base = baselines.get(key)
        if base is None or now.size < MIN_SAMPLES:
            continue
        before.rows[(base.kind, base.name)] = base.samples.tolist()
        rows.append((key, now, base))
    for model, streams in model_streams.items():
        before.model_streams[model] = set(streams)
    own = {}
    for key, _, base in rows:
        own_now = None if cpu is None else cpu.get(key)
        if own_now is not None and own_now.size >= MIN_SAMPLES and base.cpu.size >= MIN_SAMPLES:
            own[key] = _own(base, own_now, before, host, gate)
    out = []
    for key, now, base in rows:
        judged = _latency(key, now, base, before, host, gate)
        if key in own:
            judged = replace(judged, own=own[key][0], own_ratio=own[key][1])
        out.append(judged)
    return out


def _latency(
    key: str, now: Values, base: Baseline, before: Samples, host: Host, gate: Gate
) -> Judged:
    """A row's latency judged: divided by the host's factor, and as measured too where
    that factor excused it (`Judged.excused`)."""
    factor = host.factor
    after = Samples()
    after.rows[(base.kind, base.name)] = np.rint(now / factor).astype(np.int64).tolist()
    # A baseline learned over intervals that differed by its spread allows as much.
    widened = _widened(gate, (factor - 1) * 100, base.spread)
    row = compare_row(base.kind, base.name, before, after, widened)
    ratio = row.after_ms / row.before_ms if row.before_ms > 0 else 1.0
    p99 = _percentile_ms(base.samples, 99)
    p50_now, p99_now = _percentile_ms(now, 50), _percentile_ms(now, 99)
    raw_ratio = round(_ratio(now, base.samples), 3)
    judged = Judged(
        key, base.kind, base.name, row, ratio, p99, p50_now, p99_now, raw_ratio=raw_ratio
    )  # fmt: skip
    if factor != 1.0 and row.verdict != SLOWER:  # as measured, with its spread allowed
        after.rows[(base.kind, base.name)] = now.tolist()
        raw = compare_row(base.kind, base.name, before, after, _widened(gate, 0, base.spread))
        judged = replace(judged, raw=raw)
    return judged


def _own(base: Baseline, now: Values, frames: Samples, host: Host, gate: Gate) -> tuple[Row, float]:
    """A row's own cost per run judged, with its ratio: the same rule on CPU µs, divided
    by the slower core only, weighed against the same frame as its latency."""
    scaled = np.rint(now / host.cpu_factor).astype(np.int64).tolist()
    pair_before, pair_after = Samples(), Samples()
    pair_before.rows = {**frames.rows, (base.kind, base.name): base.cpu.tolist()}
    pair_before.model_streams = frames.model_streams
    pair_after.rows = {(base.kind, base.name): scaled}
    widen = (host.cpu_factor - 1) * 100
    own = compare_row(
        base.kind, base.name, pair_before, pair_after, _widened(gate, widen, base.cpu_spread)
    )
    ratio = own.after_ms / own.before_ms if own.before_ms > 0 else 1.0
    return own, round(ratio, 3)


def _widened(gate: Gate, widen_pct: float, spread: float) -> Gate:
    return replace(gate, fail_over_pct=gate.fail_over_pct + widen_pct + (spread - 1) * 100)


def _ratio(now: Values, then: Values) -> float:
    return _median(now) / max(_median(then), 1.0)


def _median(values: Values) -> float:
    return float(np.median(values))


def _percentile_ms(values: Values, q: float) -> float:
    return round(float(np.percentile(values, q)) / 1000, 3)
