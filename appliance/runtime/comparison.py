"""A shadow's comparison: the live and the candidate result of the same frame, side by side.

Detections are matched per output and per class the way detection benchmarks match a
prediction to the ground truth (PASCAL VOC, COCO): the candidate's detections, most
confident first, each take the unmatched live detection of the same class that overlaps
it most, when the IoU reaches the threshold. The live output stands as the reference:
a live detection left unmatched is a miss of the candidate, a candidate detection left
unmatched is an extra. Agreement is the F1 score over every compared frame,
2·matched / (2·matched + missed + extra): 1.0 when both found the same, and when neither
found anything.

Counters (a line or zone counter's mapping of names to counts) are compared by how much
each grew over the shadow's run. Latency is each frame's workflow run, start to end,
candidate against live.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np

from pipelines.tracking.boxes import iou_matrix
from pipelines.types import Detections, FrameResult

DEFAULT_IOU = 0.5  # PASCAL VOC's match threshold
EXAMPLES = 20  # the newest misses and extras kept, with their frames
FRAMES_KEPT = 2000  # per-frame figures kept for the intervals (a few minutes at 15 fps)
RESAMPLES = 400  # bootstrap resamples of the agreement's interval
LEVEL = 0.95


@dataclass(frozen=True, slots=True)
class Match:
    """One frame's detections of one output, matched."""

    matched: int
    missed: list[int]  # rows of the live detections the candidate did not find
    extra: list[int]  # rows of the candidate's detections the live output did not have


def match(live: Detections, candidate: Detections, iou: float = DEFAULT_IOU) -> Match:
    """Greedy matching by confidence, per class (class names when both have them)."""
    if len(live) == 0 or len(candidate) == 0:
        return Match(0, list(range(len(live))), list(range(len(candidate))))
    overlap = iou_matrix(candidate.xyxy, live.xyxy)
    overlap[_classes(candidate)[:, None] != _classes(live)[None, :]] = -1.0
    taken = np.zeros(len(live), bool)
    extra: list[int] = []
    for row in np.argsort(-candidate.confidence, kind="stable"):
        scores = np.where(taken, -1.0, overlap[row])
        best = int(np.argmax(scores))
        if scores[best] >= iou:
            taken[best] = True
        else:
            extra.append(int(row))
    return Match(int(taken.sum()), [int(i) for i in np.flatnonzero(~taken)], sorted(extra))


def _classes(d: Detections) -> np.ndarray[Any, np.dtype[Any]]:
    if d.class_name:
        return np.array(d.class_name, dtype=object)
    return d.class_id.astype(object)


@dataclass(frozen=True, slots=True)
class Example:
    """A detection one side had and the other did not, on frame `seq`."""

    seq: int
    output: str
    kind: str  # "missed" (live only) or "extra" (candidate only)
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in frame pixels
    label: str
    confidence: float

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "output": self.output,
            "kind": self.kind,
            "box": [round(v, 1) for v in self.box],
            "label": self.label,
            "confidence": round(self.confidence, 3),
        }


@dataclass
class Comparison:
    """Every compared frame pair's figures; fed by one thread at a time (the pairing's)."""

    iou: float = DEFAULT_IOU
    frames: int = 0
    matched: int = 0
    missed: int = 0
    extra: int = 0
    per_frame: deque[tuple[int, int, int]] = field(
        default_factory=lambda: deque(maxlen=FRAMES_KEPT)
    )
    latency_ms: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=FRAMES_KEPT)
    )
    # Each pair's CPU of its blocks' own work (ms; a model's runs are the model's, not
    # its block's: appliance/models/threads.py), where both runs measured it.
    cpu_ms: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=FRAMES_KEPT))
    examples: deque[Example] = field(default_factory=lambda: deque(maxlen=EXAMPLES))
    counts: dict[str, dict[str, tuple[float, float, float, float]]] = field(default_factory=dict)
    # Per detections output, per class: how many each side found over the run.
    classes: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    def add(self, live: FrameResult, candidate: FrameResult) -> None:
        """One frame's pair: the outputs both name, compared by kind."""
        totals = [0, 0, 0]
        for name, value in live.outputs.items():
            other = candidate.outputs.get(name)
            if isinstance(value, Detections) and isinstance(other, Detections):
                self._detections(live.seq, name, value, other, totals)
            elif _is_counts(value) and _is_counts(other):
                self._counts(name, value, other)
        self.frames += 1
        self.matched, self.missed, self.extra = (
            self.matched + totals[0],
            self.missed + totals[1],
            self.extra + totals[2],
        )
        self.per_frame.append((totals[0], totals[1], totals[2]))
        self.latency_ms.append((_run_ms(live), _run_ms(candidate)))
        if live.block_cpu_ns and candidate.block_cpu_ns:
            self.cpu_ms.append((sum(live.block_cpu_ns) / 1e6, sum(candidate.block_cpu_ns) / 1e6))

    def _detections(
        self, seq: int, name: str, live: Detections, candidate: Detections, totals: list[int]
    ) -> None:
        found = match(live, candidate, self.iou)
        tally = self.classes.setdefault(name, {})
        for side, detections in enumerate((live, candidate)):
            for label in _labels(detections):
                tally.setdefault(label, [0, 0])[side] += 1
        totals[0] += found.matched
        totals[1] += len(found.missed)
        totals[2] += len(found.extra)
        for kind, rows, source in (
            ("missed", found.missed, live),
            ("extra", found.extra, candidate),
        ):
            for row in rows:
                self.examples.append(_example(seq, name, kind, source, row))

    def _counts(self, name: str, live: Mapping[str, Any], candidate: Mapping[str, Any]) -> None:
        """Per key: the first and the newest value of each side."""
        kept = self.counts.setdefault(name, {})
        for key, value in live.items():
            if key not in candidate:
                continue
            first = kept.get(key)
            now = (float(value), float(candidate[key]))
            kept[key] = (*(first[:2] if first else now), *now)

    def report(self, interval: bool = True) -> dict[str, Any]:
        """The figures so far, as the API answers them (`interval` False: without the
        agreement's bootstrap, a few ms over a full window, as the metrics read it)."""
        low, high = self.agreement_interval() if interval else (None, None)
        return {
            "frames": self.frames,
            "iou": self.iou,
            "agreement": _round(f1(self.matched, self.missed, self.extra)),
            "agreement_interval": [_round(low), _round(high)],
            "matched": self.matched,
            "missed": self.missed,
            "extra": self.extra,
            "latency_ms": _paired(self.latency_ms, interval),
            "cpu_ms": _paired(self.cpu_ms, interval),
            "classes": {
                name: {
                    label: {"live": lv, "candidate": cv, "difference": cv - lv}
                    for label, (lv, cv) in sorted(labels.items())
                }
                for name, labels in self.classes.items()
            },
            "counts": {
                name: {
                    key: {
                        "live": lv - lf,
                        "candidate": cv - cf,
                        "difference": (cv - cf) - (lv - lf),
                    }
                    for key, (lf, cf, lv, cv) in keys.items()
                }
                for name, keys in self.counts.items()
            },
            "examples": [e.to_json() for e in reversed(self.examples)],
        }

    def agreement_interval(self) -> tuple[float | None, float | None]:
        """A bootstrap 95 % interval of the agreement, frames resampled (seeded: the same
        figures give the same interval)."""
        if not self.per_frame:
            return None, None
        counts = np.array(self.per_frame, dtype=np.float64)  # (frames, 3)
        rng = np.random.default_rng(0)
        picks = rng.integers(0, len(counts), size=(RESAMPLES, len(counts)))
        sums = counts[picks].sum(axis=1)  # (RESAMPLES, 3)
        denominators = 2 * sums[:, 0] + sums[:, 1] + sums[:, 2]
        scores = np.where(denominators > 0, 2 * sums[:, 0] / np.maximum(denominators, 1), 1.0)
        tail = (1 - LEVEL) / 2 * 100
        low, high = np.percentile(scores, [tail, 100 - tail])
        return float(low), float(high)


def f1(matched: int, missed: int, extra: int) -> float:
    """2·matched / (2·matched + missed + extra); 1.0 when there was nothing to find."""
    denominator = 2 * matched + missed + extra
    return 1.0 if denominator == 0 else 2 * matched / denominator


def _example(seq: int, output: str, kind: str, d: Detections, row: int) -> Example:
    box = tuple(float(v) for v in d.xyxy[row])
    return Example(
        seq,
        output,
        kind,
        (box[0], box[1], box[2], box[3]),
        _label(d, row),
        float(d.confidence[row]),
    )


def _is_counts(value: Any) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(value, Mapping) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()
    )


def _paired(pairs: deque[tuple[float, float]], interval: bool) -> dict[str, Any]:
    """Per-frame (live, candidate) figures: each side's p50 and p99, and the median of
    the per-frame ratios with a bootstrap 95 % interval over frames (`interval`)."""
    live = [pair[0] for pair in pairs]
    candidate = [pair[1] for pair in pairs]
    ratios = [c / l_ for l_, c in pairs if l_ > 0]
    low, high = _median_interval(ratios) if interval and ratios else (None, None)
    return {
        "live_p50": _round(_percentile(live, 50)),
        "candidate_p50": _round(_percentile(candidate, 50)),
        "live_p99": _round(_percentile(live, 99)),
        "candidate_p99": _round(_percentile(candidate, 99)),
        "ratio_p50": _round(_percentile(ratios, 50)),
        "ratio_interval": [_round(low), _round(high)],
    }


def _median_interval(values: list[float]) -> tuple[float, float]:
    """A bootstrap 95 % interval of the median (seeded: the same figures, the same one)."""
    data = np.asarray(values)
    picks = np.random.default_rng(0).integers(0, len(data), size=(RESAMPLES, len(data)))
    medians = np.median(data[picks], axis=1)
    tail = (1 - LEVEL) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float(low), float(high)


def _labels(d: Detections) -> list[str]:
    """Each detection's class, named as the examples name it."""
    return [_label(d, row) for row in range(len(d))]


def _label(d: Detections, row: int) -> str:
    """A detection's class name, or its id where the model names none."""
    return str(d.class_name[row]) if d.class_name else str(int(d.class_id[row]))


def _run_ms(result: FrameResult) -> float:
    return (result.done_mono - result.start_mono) * 1e3


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
