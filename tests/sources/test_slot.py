"""LatestFrame: newest-only by default, lossless in blocking mode, close wakes everyone.

A test of a wake-up first waits until the other thread is really asleep in the call
(`asleep_in`), so that the wake-up, not luck in the order the threads ran, is what it
checks: a `get` that had not started waiting yet when the frame came would return it
whether or not `put` wakes anyone.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import CodeType

import numpy as np

from appliance.sources import LatestFrame
from pipelines.types import Frame

WAIT_S = 5.0


def frame(seq: int) -> Frame:
    now = time.perf_counter()
    return Frame("cam", seq, None, time.time(), now, np.zeros((2, 2, 3), np.uint8))


def in_thread(fn: Callable[[], Frame | None]) -> tuple[threading.Thread, list[Frame | None]]:
    """Run fn() in a thread; its result lands in the returned list."""
    out: list[Frame | None] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def asleep_in(thread: threading.Thread, method: Callable[..., object]) -> bool:
    """Wait until `thread` sleeps on a Condition inside `method` (True), or has ended
    (False): read from its stack, polled. A thread that never blocks ends instead."""
    code: CodeType = method.__code__
    assert thread.ident is not None, "not started"
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident)
        if frame is None:
            return False  # it ended
        if frame.f_code is threading.Condition.wait.__code__:
            while frame is not None and frame.f_code is not code:
                frame = frame.f_back
            if frame is not None:
                return True
        time.sleep(0.001)
    raise AssertionError(f"{thread.name} neither slept in {method.__qualname__} nor ended")


def test_put_replaces_an_unconsumed_frame_and_counts_it_dropped() -> None:
    slot = LatestFrame()
    for seq in range(3):
        slot.put(frame(seq))
    got = slot.get(timeout=0)
    assert got is not None and got.seq == 2
    assert (slot.produced, slot.dropped) == (3, 2)
    assert slot.get(timeout=0) is None  # each frame is returned once


def test_taken_frames_are_not_dropped() -> None:
    slot = LatestFrame()
    for seq in range(3):
        slot.put(frame(seq))
        got = slot.get(timeout=0)
        assert got is not None and got.seq == seq
    assert (slot.produced, slot.dropped) == (3, 0)


def test_last_put_mono_is_the_newest_put() -> None:
    slot = LatestFrame()
    assert slot.last_put_mono == 0.0
    before = time.perf_counter()
    slot.put(frame(0))
    assert before <= slot.last_put_mono <= time.perf_counter()


def test_get_times_out_with_none() -> None:
    assert LatestFrame().get(timeout=0.01) is None


def test_get_wakes_on_put_from_another_thread() -> None:
    slot = LatestFrame()
    thread, out = in_thread(lambda: slot.get(timeout=60))  # woken, not timed out
    assert asleep_in(thread, LatestFrame.get)
    slot.put(frame(7))
    thread.join(WAIT_S)
    assert not thread.is_alive() and [f.seq if f else None for f in out] == [7]


def test_close_wakes_a_waiting_get() -> None:
    slot = LatestFrame()
    thread, out = in_thread(lambda: slot.get(timeout=60))
    assert asleep_in(thread, LatestFrame.get)
    slot.close()
    thread.join(WAIT_S)
    assert not thread.is_alive() and out == [None]
    assert slot.closed


def test_a_closed_slot_still_hands_out_its_last_frame_then_none() -> None:
    slot = LatestFrame()
    slot.put(frame(1))
    slot.close()
    got = slot.get(timeout=0)
    assert got is not None and got.seq == 1
    assert slot.get(timeout=0) is None


def test_put_after_close_is_discarded() -> None:
    slot = LatestFrame()
    slot.close()
    slot.put(frame(0))
    assert slot.get(timeout=0) is None and slot.produced == 0


def test_blocking_mode_hands_over_every_frame_in_order() -> None:
    slot = LatestFrame(blocking=True)
    count = 200

    def produce() -> None:
        for seq in range(count):
            slot.put(frame(seq))

    producer, _ = in_thread(produce)
    got = []
    for _ in range(count):
        f = slot.get(timeout=WAIT_S)
        assert f is not None
        got.append(f.seq)
    producer.join(WAIT_S)
    assert got == list(range(count))
    assert (slot.produced, slot.dropped) == (count, 0)


def test_blocking_put_waits_until_the_previous_frame_is_taken() -> None:
    slot = LatestFrame(blocking=True)
    slot.put(frame(0))
    second_put = threading.Event()

    def produce() -> None:
        slot.put(frame(1))
        second_put.set()

    producer, _ = in_thread(produce)
    assert asleep_in(producer, LatestFrame.put)  # the slot is full: put waits for room
    assert not second_put.is_set() and (slot.produced, slot.dropped) == (1, 0)
    first = slot.get(timeout=0)
    assert first is not None and first.seq == 0
    assert second_put.wait(WAIT_S)
    second = slot.get(timeout=0)
    assert second is not None and second.seq == 1
    producer.join(WAIT_S)


def test_close_wakes_a_blocked_put() -> None:
    slot = LatestFrame(blocking=True)
    slot.put(frame(0))
    producer, _ = in_thread(lambda: slot.put(frame(1)))
    assert asleep_in(producer, LatestFrame.put)
    slot.close()
    producer.join(WAIT_S)
    assert not producer.is_alive()
    assert (slot.produced, slot.dropped) == (1, 0)  # frame 1 discarded: the slot is closed
