"""The host speed probe: how fast this host runs a fixed piece of work now, and how much
of it other processes take.

Two things slow every block at once, and each has its own measure:

- a slower CPU (a frequency state, thermal throttling): the thread CPU time of a fixed
  pure-Python loop (`LOOPS`), about 1 ms on a 2020s x86 core;
- fewer cores for us (another tenant, a noisy neighbour, a hypervisor's steal): the share
  of all cores' time that went to other processes over the last tick, from /proc/stat
  (every CPU's busy and idle ticks, steal counted as busy) less this process's own ticks
  (/proc/self/stat utime + stime; proc(5)). Our own threads never count: a block that got
  heavier raises our CPU time, not the others'. A short probe's wall time would miss it:
  the scheduler favours a thread that just woke, so a 1 ms loop runs at once while the
  ONNX Runtime threads of the streams wait.

A probe sample is the loop's CPU µs divided by the share of the machine left to us,
1 − others' share (at least `MIN_LEFT`): the time the loop would take here now.

Beside it, each tick reads how long this process's threads waited for a core for each
second they ran, (run + wait) / run, from the kernel's per-thread
`/proc/self/task/*/schedstat` (Documentation/scheduler/sched-stats.rst): the contention
the streams' own threads meet. On a machine the streams saturate it swings by tens of %
over minutes with nothing changed, as the streams' frames drift in and out of phase and
their models' runs overlap more or less (two ONNX Runtime sessions of two threads each
on two cores); it rises with a noisy neighbour too. A row slowed only by it has not
regressed (judge.py).

Each run is also a `host.probe` span in the trace (its args carry `host_us` and
`wait_ratio`), so `appliance trace fingerprint` carries both into a shared baseline.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

import numpy as np

from appliance.profiling.tracer import Tracer
from appliance.watch.recorder import Samples

LOOPS = 20_000  # iterations of the probe's loop
SPAN, CATEGORY = "host.probe", "watch"  # the trace span (appliance/tools/baseline_file.py)
KEEP = 4096  # runs kept: at one every 3 s, more than 3 hours
MIN_LEFT = 0.05  # the least share of the machine counted as left to us (a bound, not 0)


def run_probe() -> tuple[int, int]:
    """One run: (wall µs, thread CPU µs)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    x = 0
    for i in range(LOOPS):
        x += i * i
    return round((time.perf_counter() - wall) * 1e6), round((time.thread_time() - cpu) * 1e6)


def cpu_ticks() -> tuple[int, int, int]:
    """(all CPUs' busy ticks, all ticks, this process's ticks) so far; zeros where the
    kernel does not tell (no /proc)."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        with open("/proc/self/stat", "rb") as f:
            mine = f.read().rsplit(b")", 1)[1].split()  # after the command's name
    except (OSError, ValueError, IndexError):
        return 0, 0, 0
    # user nice system idle iowait irq softirq steal (guest time is inside user, nice)
    idle = fields[3] + fields[4]
    total = sum(fields[:8])
    return total - idle, total, int(mine[11]) + int(mine[12])  # utime, stime: fields 14, 15


def thread_schedstats() -> dict[str, tuple[int, int]]:
    """Each thread of this process: (ns run on a CPU, ns waited on a run queue); empty
    where the kernel does not tell."""
    out: dict[str, tuple[int, int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                run, wait, _ = f.read().split()
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        out[tid] = (int(run), int(wait))
    return out


class Probe:
    """The probe's runs with their time (perf_counter), for any span of time since."""

    def __init__(self, tracer: Tracer | None = None) -> None:
        self._tracer = tracer
        self._runs: deque[tuple[float, int, float]] = deque(maxlen=KEEP)
        self._ticks = cpu_ticks()
        self._stats = thread_schedstats()
        self._lock = threading.Lock()

    def run(self) -> None:
        """Once per tick, on the watch's thread."""
        others = self._others_share()
        waits = self._wait_ratio()
        start = time.perf_counter()
        wall, cpu = run_probe()
        host_us = round(max(cpu, 1) / max(MIN_LEFT, 1.0 - others))
        with self._lock:
            self._runs.append((start, host_us, waits))
        if self._tracer is not None and self._tracer.enabled:
            args = {
                "cpu_us": cpu,
                "host_us": host_us,
                "others_share": round(others, 3),
                "wait_ratio": round(waits, 3),
            }
            self._tracer.span(SPAN, CATEGORY, start, start + wall / 1e6, args)

    def _wait_ratio(self) -> float:
        """(run + wait) / run of this process's threads alive at this tick and the last."""
        now = thread_schedstats()
        ran = waited = 0
        for tid, (run, wait) in now.items():
            if (before := self._stats.get(tid)) is not None:
                ran, waited = ran + run - before[0], waited + wait - before[1]
        self._stats = now
        return (ran + waited) / ran if ran > 0 and waited >= 0 else 1.0

    def _others_share(self) -> float:
        """Other processes' share of all cores' time since the last tick, 0..1."""
        now = cpu_ticks()
        busy, total, mine = (a - b for a, b in zip(now, self._ticks, strict=True))
        self._ticks = now
        return min(1.0, max(0.0, (busy - mine) / total)) if total > 0 else 0.0

    def since(self, t: float) -> tuple[Samples, Samples]:
        """(host µs, wait ratio × 1000) of the runs that started at or after `t`."""
        with self._lock:
            runs = [(h, round(w * 1000)) for s, h, w in self._runs if s >= t]
        if not runs:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        values = np.asarray(runs, dtype=np.int64)
        return values[:, 0], values[:, 1]
