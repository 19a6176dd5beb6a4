"""What a fault test measured, for the table bench/faults.py prints (docs/faults.md).

Tests assert behaviour and documented bounds only; the figures themselves (how long a
stream took to recover, what the other streams' fps did, how many results were lost)
are timings, so they are recorded, not asserted: `record()` appends one JSON line to
the file named by $FAULT_FIGURES when bench/faults.py runs the suite, and does nothing
in `make test`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

ENV = "FAULT_FIGURES"


@dataclass(frozen=True, slots=True)
class FaultFigures:
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


def record(figures: FaultFigures) -> None:
    path = os.environ.get(ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(dataclasses.asdict(figures)) + "\n")
