"""`trace diff`'s verdicts: which blocks, models and frames got slower, both materially and
significantly.

Two traces of the same streams (rolling traces of two runs, two windows) are compared row
by row, on the distributions of their span durations: each (stream, block), each model's
`session.run`, each stream's frame (`workflow.run`) and frame age. A row is `slower` when:

- it is material: its Hodges–Lehmann shift is at least `min_ms`, more than `fail_over_pct`
  % of its median before, and at least `min_frame_pct` % of its stream's mean frame time,
  i.e. the relative change weighted by the row's share of the frame (a block that takes
  2 % of the frame and gets 10 % slower costs the frame 0.2 %). A model's frame is the
  shortest of the streams it served; a frame age is weighed by its own change;
- and significant: the Mann–Whitney U test rejects "no shift" at `confidence`.

Both traces must be of the same streams and workflows: rows are matched by name. What
this cannot see: a machine that was slower for all of one run (another job, a thermal
state) shifts every span of that run for real; record the two traces on one machine, at
a time when it is equally loaded (docs/profiling.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from appliance.tools.fingerprint import stream_of
from appliance.tools.trace_file import Event, event_args
from appliance.watch.rule import (
    KINDS,
    PARTS,
    SLOWER,
    Gate,
    Row,
    Samples,
    compare_row,
    describe,
    verdict,
)

__all__ = [
    "KINDS",
    "PARTS",
    "SLOWER",
    "Gate",
    "Row",
    "Samples",
    "compare_row",
    "compare_traces",
    "describe",
    "samples",
    "verdict",
]


def samples(events: Sequence[Event]) -> Samples:
    """The rows of one trace's events."""
    out = Samples()
    for e in events:
        if e["ph"] != "X":
            continue
        args = event_args(e)
        if e.get("cat") == "block":
            out.rows[("block", f"{stream_of(e)}/{e['name']}")].append(round(e["dur"]))
        elif e["name"] == "session.run" and "model" in args:
            out.rows[("model", str(args["model"]))].append(round(e["dur"]))
            out.model_streams[str(args["model"])].update(map(str, args.get("streams", ())))
        elif e["name"] == "workflow.run":
            out.rows[("frame", stream_of(e))].append(round(e["dur"]))
            if "age_ms" in args:
                out.rows[("frame age", stream_of(e))].append(round(args["age_ms"] * 1000))
    return out


def compare_traces(before: Samples, after: Samples, gate: Gate) -> list[Row]:
    """Every row both traces have, by kind, the most time before first."""
    keys = sorted(
        before.rows.keys() & after.rows.keys(),
        key=lambda k: (KINDS.index(k[0]), -sum(before.rows[k]), k[1]),
    )
    return [compare_row(kind, name, before, after, gate) for kind, name in keys]
