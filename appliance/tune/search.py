"""The search: coordinate descent over the knobs, each candidate measured against the
best-so-far in alternation, and the exhaustive grid it is judged against (bench/tune.py).

The machines this runs on drift (a 2-core VM here switches between a fast and a slow
state for minutes: 65-68 or 48-54 fps, the same run), so no candidate is judged by a
window of its own. For each knob the best-so-far (A) and its candidates (B, C, ...)
alternate as A B A C A ...: every candidate gets two ratios, its score over each
neighbouring A window, and an interval (their min-max). A candidate is better only when
its whole interval is above 1 and its median at least `min_gain` above (bench/
profiling_overhead.py's rule: never a winner inside the noise); worse when its whole
interval is below 1 and its median at least `min_gain` below; otherwise a tie. A near
tie, whose median says better but whose interval reaches 1, is measured again (B A), up
to `max_repeats` times; so is a winner, once (`confirm_pairs`): it is adopted only when
all four of its ratios say so. `min_gain` (2 %) is about a window's own resolution: a stream's
count of results over 5 s at 15 fps gains or loses a frame at each edge. The best of
the knob's better candidates is adopted, and the next knob starts from it. A knob of n
values costs 2n - 1 windows (2n - 2 when the previous knob ended on the same settings:
its last A window serves as this one's first), the descent the sum of them; the grid
the product.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from appliance.tune.meter import Window
from appliance.tune.objective import Objective
from appliance.tune.space import Knob, Settings, start_settings

log = logging.getLogger("appliance.tune")

Verdict = Literal["pending", "adopted", "better", "worse", "tie", "failed"]
Outcome = Literal["done", "budget", "interrupted", "failed"]


class Target(Protocol):
    """What is tuned: a running workload whose settings can change (target.py)."""

    def apply(self, settings: Settings) -> None:
        """Run with `settings` from now on (and settle); raises when they cannot apply."""

    def measure(self, seconds: float, stop: threading.Event) -> Window | None:
        """One window of `seconds`; None when `stop` was set meanwhile."""

    def problem(self) -> str | None:
        """Why the workload is not whole (a stream gone, or failing), else None."""


@dataclass
class Candidate:
    """One knob's value tried against the best-so-far."""

    knob: str
    value: Any
    settings: Settings
    windows: list[Window] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # over the neighbouring A windows
    verdict: Verdict = "pending"

    @property
    def median(self) -> float:
        return statistics.median(self.ratios) if self.ratios else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return (min(self.ratios), max(self.ratios)) if self.ratios else (0.0, 0.0)


@dataclass
class Progress:
    """Where a tune is: shown as it goes (CLI) or answered by GET /v1/tune."""

    current: str  # what is being measured now
    windows: int  # measured so far
    windows_left: int  # estimated, to the end of the descent
    elapsed_s: float
    remaining_s: float  # estimated; the budget caps it
    best: Settings


@dataclass
class TuneResult:
    objective: Objective
    knobs: list[Knob]
    start: Settings
    best: Settings
    candidates: list[Candidate]
    reference: list[tuple[Settings, Window, float]]  # every A window: settings, figures, score
    reasons: dict[str, str]  # knob key -> why it has its value
    outcome: Outcome
    problem: str | None
    elapsed_s: float
    windows: int

    @property
    def changed(self) -> Settings:
        """The knobs whose value the tune changed, with the new value."""
        return {k: v for k, v in self.best.items() if self.start.get(k) != v}


class _EndedError(Exception):
    def __init__(self, outcome: Outcome, problem: str | None = None) -> None:
        super().__init__(problem or outcome)
        self.outcome, self.problem = outcome, problem


@dataclass
class Tuner:
    target: Target
    knobs: Sequence[Knob]
    objective: Objective
    window_s: float = 5.0
    settle_s: float = 2.0  # after a change: ORT's first runs on a new session are slow
    budget_s: float = 600.0
    min_gain: float = 0.02  # a winner's median ratio clears 1 by this much
    max_repeats: int = 2  # extra B A pairs for a near tie, or to confirm a winner
    # Pairs a winner needs: on 2 cores at saturation a window's p99 is its 2nd-highest
    # age of 150, and a lone pair crowned values the alternating check then found no
    # better than the start (bench/tune.py, centerface4).
    confirm_pairs: int = 2
    stop: threading.Event = field(default_factory=threading.Event)
    on_progress: Callable[[Progress], None] | None = None

    def __post_init__(self) -> None:
        self._t0 = 0.0
        self._applied: Settings | None = None
        self._windows = 0
        self._left = 0
        self._reference: list[tuple[Settings, Window, float]] = []
        self._last: tuple[Settings, float] | None = None  # the latest window's settings, score

    def run(self) -> TuneResult:
        """The descent; the target is left on the last settings measured (tune() puts it
        back). Ends early on `stop`, the budget, or a failure, with the best so far."""
        self._t0 = time.monotonic()
        start = start_settings(self.knobs)
        best, reasons = dict(start), {}
        candidates: list[Candidate] = []
        self._left = sum(2 * len(k.values) - 1 for k in self.knobs)
        outcome: Outcome = "done"
        problem = None
        try:
            for knob in self.knobs:
                first = len(candidates)  # _descend appends: an early end keeps them
                self._descend(knob, best, candidates)
                best, reasons[knob.key] = _choose(knob, best, candidates[first:])
        except _EndedError as stop:
            outcome, problem = stop.outcome, stop.problem
            if candidates and candidates[-1].verdict == "pending":
                candidates[-1].verdict = "failed" if outcome == "failed" else "pending"
        return TuneResult(
            self.objective,
            list(self.knobs),
            start,
            best,
            candidates,
            self._reference,
            reasons,
            outcome,
            problem,
            time.monotonic() - self._t0,
            self._windows,
        )

    def _descend(self, knob: Knob, best: Settings, tried: list[Candidate]) -> None:
        """Each other value of the knob against `best`, alternating: A B A C A ...; each
        candidate appended to `tried` before it is measured."""
        others = knob.others(best[knob.key])
        self._left -= (2 * len(knob.values) - 1) - (2 * len(others) + 1 if others else 0)
        if not others:
            return
        if self._last is not None and self._last[0] == best:
            before = self._last[1]  # the previous knob ended on `best`: its A window serves
            self._left -= 1
        else:
            before = self._measure(best, "best so far")
        for value in others:
            c = Candidate(knob.key, value, {**best, knob.key: value})
            tried.append(c)
            label = f"{knob.key}={value}"
            for pair in range(1 + self.max_repeats):
                if pair:
                    self._left += 2
                score = self._measure(c.settings, label, c)
                after = self._measure(best, "best so far")
                c.ratios += [_ratio(score, before), _ratio(score, after)]
                before = after
                c.verdict = self._judge(c)
                if c.verdict == "better" and pair + 1 < self.confirm_pairs:
                    continue  # one pair is two ratios: a winner is confirmed by another
                if c.verdict != "tie" or c.median < 1.0 + self.min_gain:
                    break  # settled, or a tie that is no winner even by its median

    def _judge(self, c: Candidate) -> Verdict:
        low, high = c.interval
        if low > 1.0 and c.median >= 1.0 + self.min_gain:
            return "better"
        if high < 1.0 and c.median <= 1.0 - self.min_gain:
            return "worse"
        return "tie"

    def _measure(self, settings: Settings, label: str, into: Candidate | None = None) -> float:
        if self.stop.is_set():
            raise _EndedError("interrupted")
        elapsed = time.monotonic() - self._t0
        changing = settings != self._applied
        if elapsed + self.window_s + self.settle_s * changing > self.budget_s:
            raise _EndedError("budget")
        self._report(label)
        if changing:
            try:
                self.target.apply(settings)
            except Exception as exc:  # any failure to apply ends the tune; tune() restores
                raise _EndedError("failed", f"{label}: {exc}") from exc
            self._applied = dict(settings)
            if self.stop.wait(self.settle_s):
                raise _EndedError("interrupted")
        window = self.target.measure(self.window_s, self.stop)
        if window is None:
            raise _EndedError("interrupted")
        if problem := self.target.problem():
            raise _EndedError("failed", f"{label}: {problem}")
        self._windows += 1
        self._left = max(0, self._left - 1)
        score = self.objective.score(window)
        self._last = (dict(settings), score)
        if into is None:
            self._reference.append((dict(settings), window, score))
        else:
            into.windows.append(window)
            into.scores.append(score)
        return score

    def _report(self, label: str) -> None:
        if self.on_progress is None:
            return
        elapsed = time.monotonic() - self._t0
        per_window = self.window_s + self.settle_s
        remaining = min(self._left * per_window, max(0.0, self.budget_s - elapsed))
        best = self._reference[-1][0] if self._reference else start_settings(self.knobs)
        self.on_progress(Progress(label, self._windows, self._left, elapsed, remaining, best))


def _ratio(score: float, reference: float) -> float:
    return score / reference if reference > 0 else (1.0 if score <= 0 else float("inf"))


def _choose(knob: Knob, best: Settings, tried: list[Candidate]) -> tuple[Settings, str]:
    """The knob's value after its candidates: the best better one, else the current."""
    current = best[knob.key]
    better = [c for c in tried if c.verdict == "better"]
    if better:
        winner = max(better, key=lambda c: c.median)
        winner.verdict = "adopted"
        low, high = winner.interval
        return winner.settings, (
            f"{winner.value} over {current}: score ×{winner.median:.3f} [{low:.3f}–{high:.3f}]"
        )
    if not tried:
        return best, f"{current}: the only value searched"
    closest = max(tried, key=lambda c: c.median)
    low, high = closest.interval
    return best, (
        f"kept {current}: no value beat it beyond the noise (nearest: {closest.value} at "
        f"×{closest.median:.3f} [{low:.3f}–{high:.3f}])"
    )


def grid(
    target: Target,
    knobs: Sequence[Knob],
    objective: Objective,
    window_s: float,
    settle_s: float,
    stop: threading.Event | None = None,
    on_window: Callable[[int, int, Settings], None] | None = None,
) -> list[tuple[Settings, Window, float]]:
    """Every combination of the knobs' values, one window each (the reference the
    descent is judged against); source knobs outermost, so streams restart least."""
    stop = stop or threading.Event()
    ordered = sorted(knobs, key=lambda k: not k.restarts)
    combos = list(itertools.product(*(k.values for k in ordered)))
    out: list[tuple[Settings, Window, float]] = []
    for i, values in enumerate(combos):
        settings = {k.key: v for k, v in zip(ordered, values, strict=True)}
        if on_window is not None:
            on_window(i, len(combos), settings)
        target.apply(settings)
        if stop.wait(settle_s):
            break
        window = target.measure(window_s, stop)
        if window is None:
            break
        out.append((settings, window, objective.score(window)))
    return out
