"""What a fault test measured, for the table bench/faults.py prints (docs/faults.md).

Tests assert behaviour and documented bounds only; the figures themselves (how long a
stream took to recover, what the other streams' fps did, how many results were lost)
are timings, so they are recorded, not asserted. A test takes its figures inside
`recording(...)`, filling in the row as it measures and asserting only after:

    with recording("webhook_down", "webhook receiver down 2 s", HOOK_BOUND) as row:
        ...                      # the fault
        row.lost = len(want - got)
        assert row.lost == 0

The row is written however the block ends, so a fault that loses results shows its
loss in the table and still fails its test (`passed` false). `record()` appends one
JSON line to the file named by $FAULT_FIGURES when bench/faults.py runs the suite, and
does nothing in `make test`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

ENV = "FAULT_FIGURES"


@dataclass(frozen=True, slots=True)
class FaultFigures:
    key: str
    """The row's name in bench/results/faults.json (`rows.<key>`): word characters only,
    so that docs/faults.md can link to its fields."""
    fault: str
    """What was done, in a few words (`RTSP server killed 3 s, then back`)."""
    recovery_s: float | None
    """The fault's end (or start, for faults with no end) → the affected stream(s) or sink
    working again; None where nothing needed to recover."""
    others_fps_ratio: float | None
    """The unaffected streams' fps during the fault ÷ before it; None with no others."""
    lost: int | None
    """Results (or messages) lost to the fault; None where it cannot be counted."""
    bound: str = ""
    """The documented bound the test asserts (`backoff cap + 2 s`, `queue bound`)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Other counts the row states (`frames_skipped`: damaged frames a stream skipped)."""
    passed: bool | None = None
    """Whether the test's checks held; None when recorded outside `recording`."""


@dataclass(slots=True)
class Row:
    """A row being measured: a test sets each figure as soon as it has it."""

    key: str
    fault: str
    bound: str
    recovery_s: float | None = None
    others_fps_ratio: float | None = None
    lost: int | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def figures(self, passed: bool) -> FaultFigures:
        return FaultFigures(
            self.key, self.fault, self.recovery_s, self.others_fps_ratio, self.lost,
            self.bound, dict(self.counts), passed,
        )  # fmt: skip


@contextmanager
def recording(key: str, fault: str, bound: str) -> Iterator[Row]:
    """The row of one fault, recorded when the block ends, however it ends: an assert or
    a wait that fails leaves the figures taken so far in the table, marked not passed. A
    skip (pytest's, a BaseException) records nothing: the fault did not run."""
    row = Row(key, fault, bound)
    try:
        yield row
    except Exception:
        record(row.figures(passed=False))
        raise
    record(row.figures(passed=True))


def record(figures: FaultFigures) -> None:
    path = os.environ.get(ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(dataclasses.asdict(figures)) + "\n")
