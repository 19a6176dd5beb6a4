"""The one comparison method every bench uses (docs/performance.md, "How we measure").

This machine's CPU swings between a fast and a slow state for minutes at a time (65-68
against 48-54 fps in the same run), so two arms measured one after the other compare
the machine's states, not the arms. Every comparison therefore:

1. runs its arms **alternating in one run**, round after round, with the order
   **rotating** each round (A B C, B C A, C A B, ...), so no arm always runs first (warm
   caches, a fresh broker) or always right after another;
2. takes a **ratio per round** against the round's own baseline, so a state that lasts a
   round cancels;
3. reports the **median** of the rounds' ratios with a **bootstrap 95 % interval**;
4. is **met only by the interval's bound** on the side of the target (the lower bound for
   "at least", the upper for "at most"), so a verdict can fail on noise but never pass on
   it.

Every results file carries `method` (what ran, how many rounds, the order) and
`verdicts` (per target: median, interval, rule, met) from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LEVEL = 0.95
RESAMPLES = 10_000


def rotations(arms: Sequence[str], rounds: int) -> list[list[str]]:
    """The arms' order in each round: rotated by one every round."""
    n = len(arms)
    return [[arms[(r + i) % n] for i in range(n)] for r in range(rounds)]


def alternate(
    arms: Mapping[str, Callable[[], float]],
    rounds: int,
    progress: Callable[[int, dict[str, list[float]]], None] | None = None,
) -> dict[str, list[float]]:
    """Each arm's value per round, the arms run in rotating order; `progress(round,
    values so far)` after each round (to print)."""
    values: dict[str, list[float]] = {name: [] for name in arms}
    for r, order in enumerate(rotations(list(arms), rounds)):
        for name in order:
            values[name].append(float(arms[name]()))
        if progress is not None:
            progress(r, values)
    return values


def ratios(variant: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Per round: variant ÷ the same round's baseline."""
    return [v / b for v, b in zip(variant, baseline, strict=True) if b]


def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """A bootstrap interval of the median (10 000 resamples, fixed seed: reruns of the
    same data give the same interval)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(data, (RESAMPLES, data.size)), axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


@dataclass(frozen=True)
class Verdict:
    """A target judged by the interval's bound on its side."""

    median: float
    low: float
    high: float
    rounds: int
    at_least: float | None = None
    at_most: float | None = None

    @property
    def met(self) -> bool:
        if self.rounds == 0:
            return False
        if self.at_least is not None and not self.low >= self.at_least:
            return False
        return self.at_most is None or self.high <= self.at_most

    @property
    def rule(self) -> str:
        parts = []
        if self.at_least is not None:
            parts.append(f"the interval's lower bound >= {self.at_least:g}")
        if self.at_most is not None:
            parts.append(f"the interval's upper bound <= {self.at_most:g}")
        return " and ".join(parts) or "reported, no target"

    @property
    def target(self) -> str:
        parts = []
        if self.at_least is not None:
            parts.append(f">= {self.at_least:g}")
        if self.at_most is not None:
            parts.append(f"<= {self.at_most:g}")
        return " and ".join(parts)

    def as_json(self) -> dict[str, Any]:
        """The verdict for a results file (no rounds: null figures, RFC 8259 has no NaN)."""
        return {
            "median": _finite(self.median),
            "interval": [_finite(self.low), _finite(self.high)],
            "level": LEVEL,
            "rounds": self.rounds,
            "target": self.target,
            "rule": f"met when {self.rule}" if self.target else self.rule,
            "met": self.met if self.target else None,  # nothing to meet: reported only
        }


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


def judge(
    values: Sequence[float], at_least: float | None = None, at_most: float | None = None
) -> Verdict:
    """The median of per-round `values` with its interval, against a target."""
    clean = [v for v in values if np.isfinite(v)]
    low, high = median_interval(clean)
    mid = float(np.median(clean)) if clean else float("nan")
    return Verdict(mid, low, high, len(clean), at_least, at_most)


def method(what: str, arms: Sequence[str], rounds: int, unit: str, **extra: Any) -> dict[str, Any]:
    """The `method` entry of a results file: how the figures were taken."""
    return {
        "what": what,
        "arms": list(arms),
        "rounds": rounds,
        "round": unit,
        "order": "alternating in one run, the order rotated by one each round",
        "figure": "median of the per-round ratios against the same round's baseline",
        "interval": f"bootstrap {LEVEL:.0%} of the median ({RESAMPLES} resamples, seed 0)",
        "verdict": "met only when the interval's bound on the target's side clears it",
        **extra,
    }
