"""Where a profiling window puts ONNX Runtime's operators: on the track of the
`session.run` span that ran them, moved rigidly by the least shift that puts ORT's run
inside the span (appliance/profiling/operators.py, `place`).

ORT's clock and ours disagree by a little; in a live window the shift is usually a few
µs, too small for a test of the whole runtime to tell a right shift from none. Here the
spans come from the real tracer hook (`trace_batch`) and ORT's events, in the shape
`read_operators` gives them, are put off their spans by known amounts, before the span
and after it, so that every placed `ts` is known to the microsecond.
"""

from __future__ import annotations

from typing import Any

import pytest

from appliance.models.batcher import BatchRecord
from appliance.profiling.hooks import trace_batch
from appliance.profiling.operators import SLACK_US, place
from appliance.profiling.tracer import Tracer

MODEL = "person"
SPAN_US = 5000  # each session.run of ours
# (offset from ORT's run start, duration) of each operator, µs: ORT's order and gaps.
EARLY_OPS = [(100, 1000), (1200, 2500)]
LATE_OPS = [(50, 3000), (3100, 900)]
INSIDE_OPS = [(0, 2000)]


def _spans() -> list[dict[str, Any]]:
    """Three session.run spans of MODEL, 100 ms apart, as the tracer writes them."""
    tracer = Tracer()
    tracer.anchor_us = 0.0  # perf_counter seconds -> µs as they are: readable numbers
    for start in (1.0, 1.1, 1.2):
        record = BatchRecord(MODEL, 1, ("a",), (0.001,), start, SPAN_US / 1e6, ort_profiled=True)
        trace_batch(tracer, record)
    events = tracer.drain()
    spans = [e for e in events if e["name"] == "session.run"]
    assert len(spans) == 3 and all(s["dur"] in (SPAN_US - 1, SPAN_US) for s in spans)
    return events


def _ort_run(ts: int, dur: int, ops: list[tuple[int, int]], node: str) -> list[dict[str, Any]]:
    """One ORT run and its operators, as `read_operators` returns them (ORT's clock),
    with the model set as the window's `_restore` sets it."""
    run = {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur, "args": {},
           "model": MODEL}  # fmt: skip
    return [run] + [
        {"cat": "Node", "name": f"{node}{i}_kernel_time", "ts": ts + at, "dur": d,
         "args": {"op_name": "Conv", "provider": "CPUExecutionProvider",
                  "input_type_shape": [{"float": [1, 3, 320, 320]}]},
         "model": MODEL}
        for i, (at, d) in enumerate(ops)
    ]  # fmt: skip


@pytest.mark.parametrize("early_us, late_us", [(1500, 1300), (1, 1), (SLACK_US, SLACK_US)])
def test_operators_move_by_the_least_shift_that_puts_their_run_inside_its_span(
    early_us: int, late_us: int
) -> None:
    """ORT's first run starts `early_us` before its span (moved later by that much), the
    second ends `late_us` after its span (moved earlier by that much), the third lies
    inside its span (not moved); one more run has no span (left out) and one operator
    is in no run (an orphan)."""
    events = _spans()
    first, second, third = (e for e in events if e["name"] == "session.run")
    early = first["ts"] - early_us
    late = second["ts"] + second["dur"] + late_us - 4100  # a 4.1 ms run ending late_us late
    ort = [
        *_ort_run(early - 600, 100, [(100, 10)], "stray")[1:],  # an operator in no run
        *_ort_run(early, 4000, EARLY_OPS, "early"),
        *_ort_run(late, 4100, LATE_OPS, "late"),
        *_ort_run(third["ts"] + 500, 3000, INSIDE_OPS, "inside"),
        *_ort_run(third["ts"] + 50_000, 3000, INSIDE_OPS, "nospan"),
    ]
    result = place(ort, events, pid=4242)
    placed, stats = result.operators, result.placement

    expected = [
        *((f"early{i}_kernel_time", first, early + at + early_us, d)
          for i, (at, d) in enumerate(EARLY_OPS)),
        *((f"late{i}_kernel_time", second, late + at - late_us, d)
          for i, (at, d) in enumerate(LATE_OPS)),
        *((f"inside{i}_kernel_time", third, third["ts"] + 500 + at, d)
          for i, (at, d) in enumerate(INSIDE_OPS)),
    ]  # fmt: skip
    got = sorted(placed, key=lambda op: int(op["ts"]))
    assert [(op["name"], op["tid"], op["ts"], op["dur"]) for op in got] == [
        (name, span["tid"], ts, dur) for name, span, ts, dur in expected
    ]
    assert stats == {"runs": 3, "runs_left_out": 1, "operators": 5, "orphans": 1,
                     "max_shift_us": max(early_us, late_us)}  # fmt: skip
    # Moved, each run sits inside its span: the early one at its start, the late one
    # flush with its end.
    assert got[0]["ts"] == first["ts"] + EARLY_OPS[0][0]
    assert got[3]["ts"] + got[3]["dur"] == second["ts"] + second["dur"] - (4100 - 3100 - 900)
    for op in got:
        assert op["pid"] == 4242 and op["cat"] == "Node" and op["ph"] == "X"
        assert op["args"]["op_name"] == "Conv"
