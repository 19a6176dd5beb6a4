"""Crossover phases: what a switchable cost (the tracer, a profiling window) does to one
saturated stream, measured inside one process so that both arms see the same machine.

The stream plays the bundled clip (240 frames) with `pace: fast`, every frame processed,
so frame k of every loop shows the same content. Each loop is cut into segments of
SEGMENT frames; in loop A the segments alternate variant, off, variant, off, ...; in
loop B, right after, off, variant, ... For a pair of segments (j, j+1) the variant's
throughput against off is

    sqrt( t_off(A, j+1) / t_var(A, j)  *  t_off(B, j) / t_var(B, j+1) )

in which each segment's content appears once on each side and cancels, and the two
durations compared within one loop are a second apart, so the machine's state (which
swings by tens of per cent over minutes here) cancels too. The first SETTLE frames of a
segment, still in flight when the switch happens, are not timed.

Alongside, each segment's CPU time per frame is read for every thread (/proc schedstat,
ns), by kind of thread: the direct measure of what the switched cost does on the threads
that do it. The same pairing gives its difference per frame.

A bench's verdict on the pairs is bench/_compare.py's: the median of the pair ratios
with its bootstrap interval, met only by the interval's bound (`judge`); the arms of a
round take their turns in `rotations` order.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

import _compare
import numpy as np

LOOP = 240  # frames in configs/media/demo.mp4
SEGMENT = 30  # frames; 8 segments per loop, 4 pairs
SETTLE = 3  # frames of a segment not timed: in flight when the state switched


def thread_cpu_ns() -> dict[str, int]:
    """CPU ns of every live thread of this process (/proc schedstat), summed by Python
    thread name with its `:stream` or `:model` suffix dropped ("work", "batch",
    "trace-writer"); threads Python did not start (ONNX Runtime's pools, FFmpeg's) are
    "native"."""
    out: dict[str, int] = {}
    for name, ns in threads_cpu_ns().values():
        out[name] = out.get(name, 0) + ns
    return out


def threads_cpu_ns() -> dict[int, tuple[str, int]]:
    """Each live thread's kind (as `thread_cpu_ns` names it) and CPU ns, by thread id."""
    names = {t.native_id: t.name.split(":")[0] for t in threading.enumerate()}
    out: dict[int, tuple[str, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            first = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        out[int(tid)] = (names.get(int(tid), "native"), int(first))
    return out


def cpu_between(
    before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]
) -> dict[str, int]:
    """CPU ns spent between two `threads_cpu_ns` readings, by kind: per thread, so that a
    thread that ended meanwhile (FFmpeg's decoder threads, when a looping clip is opened
    again) takes only its own last stretch away, not its whole life's CPU from its kind."""
    out: dict[str, int] = {}
    for tid, (name, ns) in after.items():
        out[name] = out.get(name, 0) + ns - before.get(tid, (name, 0))[1]
    return out


@dataclass
class Segment:
    variant: bool  # the variant's state, else off
    seconds: float
    cpu_ns: dict[str, int]  # by kind of thread, over the timed frames


@dataclass
class Arm:
    """One variant's pairs: throughput ratios and CPU differences (ms per frame)."""

    ratios: list[float] = field(default_factory=list)
    cpu_delta_ms: dict[str, list[float]] = field(default_factory=dict)
    off_frame_s: list[float] = field(default_factory=list)  # wall time per frame, off


class FrameClock:
    """The time each processed frame's result was published (a subscriber's list)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, _result: object) -> None:
        self.stamps.append(time.perf_counter())

    def wait_for(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.stamps) < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"the stream stalled at frame {len(self.stamps)}")
            time.sleep(0.001)


def run_loops(
    clock: FrameClock, switch: Callable[[bool], None], first_variant: bool
) -> list[Segment]:
    """One loop of the clip from the next loop boundary, its segments alternating,
    starting with the variant when `first_variant`. Leaves the stream off."""
    start = -(-len(clock.stamps) // LOOP) * LOOP  # the next boundary (content-aligned)
    clock.wait_for(start - 1)
    segments = []
    state = first_variant
    for s in range(start, start + LOOP, SEGMENT):
        switch(state)
        clock.wait_for(s + SETTLE)
        cpu0 = threads_cpu_ns()
        clock.wait_for(s + SEGMENT)
        cpu1 = threads_cpu_ns()
        seconds = clock.stamps[s + SEGMENT - 1] - clock.stamps[s + SETTLE - 1]
        delta = cpu_between(cpu0, cpu1)
        segments.append(Segment(state, seconds, delta))
        state = not state
    switch(False)
    return segments


def pair_up(a: Sequence[Segment], b: Sequence[Segment], arm: Arm) -> None:
    """Loop A (variant first) and loop B (off first) into the arm's pairs."""
    frames = SEGMENT - SETTLE
    for j in range(0, len(a) - 1, 2):
        va, oa, ob, vb = a[j], a[j + 1], b[j], b[j + 1]
        assert va.variant and vb.variant and not oa.variant and not ob.variant
        arm.ratios.append(math.sqrt(oa.seconds / va.seconds * ob.seconds / vb.seconds))
        arm.off_frame_s.append((oa.seconds + ob.seconds) / 2 / frames)
        for kind in {*va.cpu_ns, *vb.cpu_ns, *oa.cpu_ns, *ob.cpu_ns}:
            var = va.cpu_ns.get(kind, 0) + vb.cpu_ns.get(kind, 0)
            off = oa.cpu_ns.get(kind, 0) + ob.cpu_ns.get(kind, 0)
            arm.cpu_delta_ms.setdefault(kind, []).append((var - off) / 2 / frames / 1e6)


Switch = Callable[[bool], None]
ArmFactory = Callable[[], AbstractContextManager[Switch]]


def crossover(
    clock: FrameClock, arms: dict[str, ArmFactory], schedule: Sequence[Sequence[str]]
) -> dict[str, Arm]:
    """Round by round (`schedule`: the arms of each round, in order), each arm gets its
    loop A and loop B. An arm's factory is entered around its two loops (to make and
    free what its variant needs, such as a profiled session) and gives its switch."""
    result = {name: Arm() for name in arms}
    for c, names in enumerate(schedule):
        for name in names:
            with arms[name]() as switch:
                a = run_loops(clock, switch, first_variant=True)
                b = run_loops(clock, switch, first_variant=False)
            pair_up(a, b, result[name])
        shown = (f"{n} {median(result[n].ratios):.3f}" for n in dict.fromkeys(names))
        print(f"round {c + 1}/{len(schedule)}, medians so far: {', '.join(shown)}", flush=True)
    return result


def median(values: Sequence[float]) -> float:
    return float(np.median(values)) if values else float("nan")


def median_interval(values: Sequence[float], level: float = _compare.LEVEL) -> tuple[float, float]:
    """bench/_compare.py's bootstrap interval of the median (one for every bench)."""
    return _compare.median_interval(values, level)
