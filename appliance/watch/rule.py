"""The rule `trace diff` and the regression watch judge a row by: which of a row's two
samples of span durations (before, after) got slower, both materially and significantly
(appliance/tools/regression.py's docstring says what each part means).

Here so that the serving process's watch and the offline `trace diff` share one rule, and
their verdicts never disagree: the tools import it, the runtime never imports the tools.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace

from appliance.watch.ranktest import MIN_SAMPLES, compare

KINDS = ("block", "model", "frame", "frame age")  # the order rows are listed in
PARTS = ("block", "model")  # the kinds that are a share of a frame
SLOWER = "slower"


@dataclass(frozen=True, slots=True)
class Gate:
    """What counts as slower (see the top)."""

    fail_over_pct: float = 0.0
    min_ms: float = 0.2
    min_frame_pct: float = 1.0
    confidence: float = 0.99


@dataclass
class Samples:
    """A trace's durations per row, in whole µs (frame ages too), and what the frame
    weighting needs."""

    rows: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(list))
    model_streams: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def frame_us(self, stream: str) -> float | None:
        """The stream's mean frame (workflow.run) time, None without any."""
        frames = self.rows.get(("frame", stream))
        return statistics.fmean(frames) if frames else None


@dataclass(frozen=True, slots=True)
class Row:
    """One row compared; times in ms, medians for before and after."""

    kind: str
    name: str
    count_before: int
    count_after: int
    before_ms: float
    after_ms: float
    effect_ms: float | None = None  # Hodges–Lehmann shift, after − before
    low_ms: float | None = None  # its interval at the gate's confidence
    high_ms: float | None = None
    change_pct: float | None = None  # the shift, in % of the median before
    share_pct: float | None = None  # the row's mean, in % of its stream's mean frame
    frame_pct: float | None = None  # the shift, in % of that frame
    p_value: float | None = None  # Mann–Whitney U, two-sided
    verdict: str = "too few spans"


def compare_row(kind: str, name: str, before: Samples, after: Samples, gate: Gate) -> Row:
    """One row of both traces, judged (the regression watch judges its rows one by one)."""
    a, b = before.rows[(kind, name)], after.rows[(kind, name)]
    median = statistics.median(a)
    base = Row(kind, name, len(a), len(b), median / 1000, statistics.median(b) / 1000)
    if min(len(a), len(b)) < MIN_SAMPLES:  # the medians' change, to say what was not judged
        change = 100 * (statistics.median(b) - median) / median if median > 0 else None
        return replace(base, change_pct=change)
    shift = compare(a, b, gate.confidence)
    frame = _frame_us(kind, name, before)
    row = replace(
        base,
        effect_ms=shift.estimate / 1000,
        low_ms=shift.low / 1000,
        high_ms=shift.high / 1000,
        change_pct=100 * shift.estimate / median if median > 0 else None,
        share_pct=100 * statistics.fmean(a) / frame if frame and kind in PARTS else None,
        frame_pct=100 * shift.estimate / frame if frame else None,
        p_value=shift.p_value,
    )
    return replace(row, verdict=verdict(row, gate))


def _frame_us(kind: str, name: str, trace: Samples) -> float | None:
    """The frame a row's shift is weighed against; None for a frame age (its change is
    its weight)."""
    if kind == "block":
        return trace.frame_us(name.partition("/")[0])
    if kind == "model":
        frames = [f for s in trace.model_streams[name] if (f := trace.frame_us(s))]
        return min(frames, default=None)
    if kind == "frame":
        return trace.frame_us(name)
    return None


def verdict(row: Row, gate: Gate) -> str:
    """`slower`, or why not: `ok` (not slower by more than the gate's %), `immaterial`,
    `not significant` or `too few spans`."""
    if row.effect_ms is None or row.p_value is None:
        return "too few spans"
    if row.effect_ms <= 0 or row.change_pct is None or row.change_pct <= gate.fail_over_pct:
        return "ok"
    frame_pct = row.frame_pct if row.frame_pct is not None else row.change_pct
    if row.effect_ms < gate.min_ms or frame_pct < gate.min_frame_pct:
        return "immaterial"
    if row.p_value >= 1 - gate.confidence:
        return "not significant"
    return SLOWER


def describe(row: Row, gate: Gate) -> str:
    """One line: the row's effect with its interval, p-value and share of the frame."""
    head = f"{row.kind} {row.name}: median {row.before_ms:.3f} -> {row.after_ms:.3f} ms"
    if row.effect_ms is None or row.low_ms is None or row.high_ms is None:
        return f"{head}, {row.count_before} / {row.count_after} spans (< {MIN_SAMPLES} a side)"
    effect = (
        f"{row.effect_ms:+.3f} ms ({gate.confidence * 100:g} % CI {row.low_ms:+.3f} .. "
        f"{row.high_ms:+.3f})"
    )
    change = "" if row.change_pct is None else f", {row.change_pct:+.1f} %"
    frame = ""
    if row.share_pct is not None and row.frame_pct is not None:
        frame = f", {row.share_pct:.1f} % of the frame: {row.frame_pct:+.2f} % on it"
    return f"{head}, {effect}{change}{frame}, p {row.p_value:.2g} (Mann-Whitney U)"
