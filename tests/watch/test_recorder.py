"""A stream's recorder: one row per frame, its own-cost columns only from frames whose run
read the CPU clocks (appliance/watch/recorder.py)."""

from __future__ import annotations

import numpy as np

from appliance.watch.recorder import StreamRecorder
from pipelines.types import FrameResult


def result(cpu_ns: tuple[int, ...]) -> FrameResult:
    return FrameResult(
        stream_id="cam", seq=0, pts=None, capture_time=0.0, capture_mono=0.9, start_mono=1.0,
        done_mono=1.01, image=np.zeros((2, 2, 3), np.uint8), outputs={},
        block_spans=[(1.0, 1.004), None], block_cpu_ns=cpu_ns,
    )  # fmt: skip


def test_a_frame_not_measured_gives_no_own_cost_sample() -> None:
    recorder = StreamRecorder("cam", ("det", "blur"), 16)
    recorder(result((3_000_000, 0)))  # det ran 3 ms of CPU, blur was skipped
    recorder(result(()))  # a frame whose run did not read the clocks
    recorder(result((2_000_000, 0)))
    frame, age, det, blur, det_cpu, blur_cpu = recorder.ring.take()
    assert frame.tolist() == [10_000] * 3 and age.tolist() == [110_000] * 3
    assert det.tolist() == [4000] * 3 and blur.size == 0
    # The unmeasured frame's row holds no CPU time, not the frame before's.
    assert det_cpu.tolist() == [3000, 2000] and blur_cpu.size == 0
