"""A stream's slowest frames (appliance/observe/slowest.py): the slowest of each minute
kept, the slowest of a period first with its blocks' times and the model runs it waited
for, bounded to the last hour."""

from __future__ import annotations

from appliance.models.batches import BatchRecord
from appliance.observe.slowest import PER_SLOT, SLOT_S, SLOTS, LastBatches, SlowestFrames
from pipelines.types import FrameResult

BLOCKS = [("people", "detect"), ("count", "zone_counter")]
WALL = 1_796_104_000.0  # the capture's wall clock of frame 0


def frame(seq: int, at: float, people_s: float, skipped: bool = False) -> FrameResult:
    """Frame `seq` run at `at` (perf_counter s): `people_s` in its detector."""
    spans = [(at, at + people_s), None if skipped else (at + people_s, at + people_s + 0.001)]
    done = at + people_s + 0.001
    return FrameResult("cam", seq, None, WALL + at, at - 0.01, at, done, None, {}, spans)


def test_the_slowest_come_first_with_the_slow_block_named_and_its_batch() -> None:
    batches = LastBatches()
    slowest = SlowestFrames("cam", BLOCKS, batches)
    for seq in range(100):
        at = 10.0 + seq * 0.1
        heavy = seq in (17, 58)
        batches(BatchRecord("person", 3, ("x", "cam", "y"), (0.0, 0.004, 0.0), at + 0.001, 0.01))
        slowest(frame(seq, at, 0.3 if heavy else 0.02 + seq * 1e-5))
    rows = slowest.report(WALL, 3)
    assert [r.seq for r in rows] == [58, 17, 99]
    top = rows[0]
    assert top.slowest_block == "people" and top.blocks[0].ms == 300.0
    assert top.total_ms == 301.0 and top.trace == "/v1/streams/cam/frames/58/trace"
    assert top.batch_size == 3 and top.queue_wait_ms == 4.0
    assert [(m.model, m.run_ms) for m in top.models] == [("person", 10.0)]
    assert top.at.startswith("2026-")


def test_only_the_slowest_of_each_minute_are_kept_for_the_last_hour() -> None:
    slowest = SlowestFrames("cam", BLOCKS, LastBatches())
    minutes = SLOTS + 5
    for m in range(minutes):
        for k in range(3 * PER_SLOT):  # each minute: 30 frames, the k-th k ms
            at = m * SLOT_S + k
            slowest(frame(m * 1000 + k, at, (k + 1) * 1e-3, skipped=True))
    rows = slowest.report(0.0, PER_SLOT)
    assert len(rows) == PER_SLOT
    assert len(slowest.report(0.0, 10**6)) == PER_SLOT * SLOTS  # all it holds: bounded
    # The oldest 5 minutes are gone; a minute kept its 10 slowest (k = 20..29).
    since_first_kept = WALL + 5 * SLOT_S
    assert all(r.seq >= 5000 for r in slowest.report(0.0, PER_SLOT))
    newest = slowest.report(WALL + (minutes - 1) * SLOT_S, PER_SLOT)
    assert sorted(r.seq % 1000 for r in newest) == list(range(20, 30))
    assert slowest.report(since_first_kept, 1)[0].blocks[1].ms is None  # skipped: None
