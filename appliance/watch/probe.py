"""The host speed probe: how fast this host runs a fixed piece of work now, and how much
of it other processes take.

Two things slow every block at once, and each has its own measure:

- a slower CPU or memory system (a frequency state, thermal throttling, a busier memory
  bus): the thread CPU time of one run of a small fixed ONNX model (probe_model.py: 8
  Conv 3×3 + Relu layers on 1×16×64×64, about 1.4 ms of one core here), run by ONNX
  Runtime on the appliance's execution provider, on this thread alone. It is work of the
  streams' kind: this machine flips between a fast and a slow CPU state for minutes, about
  25 % apart, and ONNX Runtime's kernels feel it more than a pure-Python loop does (issue
  41: every model ×1.4 with the loop unmoved). The loop (`LOOPS`, about 1 ms) still runs
  beside it, as a second measure in the trace, and is the sample where the model cannot
  be built (logged once);
- fewer cores for us (another tenant, a noisy neighbour, a hypervisor's steal): the share
  of all cores' time that went to other processes over the last tick, from /proc/stat
  (every CPU's busy and idle ticks, steal counted as busy) less this process's own ticks
  (/proc/self/stat utime + stime; proc(5)). Our own threads never count: a block that got
  heavier raises our CPU time, not the others'. A short probe's wall time would miss it:
  the scheduler favours a thread that just woke, so a 1 ms run goes at once while the
  ONNX Runtime threads of the streams wait.

A probe sample is the model's CPU µs divided by the share of the machine left to us,
1 − others' share (at least `MIN_LEFT`): the time the model would take here now. The CPU
µs alone are kept too: a row's own cost (CPU time) moves with a slower core, not with
fewer cores, so it is judged against them only (judge.py's `cpu_factor`).

Beside it, each tick reads how long this process's threads waited for a core for each
second they ran, (run + wait) / run, from the kernel's per-thread
`/proc/self/task/*/schedstat` (Documentation/scheduler/sched-stats.rst): the contention
the streams' own threads meet. On a machine the streams saturate it swings by tens of %
over minutes with nothing changed, as the streams' frames drift in and out of phase and
their models' runs overlap more or less (two ONNX Runtime sessions of two threads each
on two cores); it rises with a noisy neighbour too. A row slowed only by it has not
regressed (judge.py).

Each run is also a `host.probe` span in the trace (its args carry `host_us` and
`wait_ratio`, with `onnx_cpu_us` and `loop_cpu_us`), so `appliance trace fingerprint`
carries both into a shared baseline. `Probe.cost()` is the probe's own CPU time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from appliance.profiling.tracer import Tracer
from appliance.watch.recorder import Samples

if TYPE_CHECKING:  # imported by the first run: onnx or ORT failing to load leaves the loop
    from appliance.watch.probe_model import ProbeModel

log = logging.getLogger("appliance.watch")

LOOPS = 20_000  # iterations of the probe's loop
LAYERS = 8  # Conv + Relu layers of the probe's model: about 1.4 ms of one core here
CPU_PROVIDERS = ("CPUExecutionProvider",)  # the appliance's models' on a CPU-only build
SPAN, CATEGORY = "host.probe", "watch"  # the trace span (appliance/tools/baseline_file.py)
KEEP = 4096  # runs kept: at one every 3 s, more than 3 hours
MIN_LEFT = 0.05  # the least share of the machine counted as left to us (a bound, not 0)


@dataclass(frozen=True, slots=True)
class ProbeCost:
    """The probe's own cost so far, for the watch to export."""

    cpu_s: float  # thread CPU s of every run: /proc reads, loop, model (built in the first)
    runs: int
    measure: str  # what its `host_us` times now: "onnx" (the model) or "loop"


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
    """The probe's runs with their time (perf_counter), for any span of time since.

    `providers`: the appliance's models' (ORT names), so the model runs where theirs do.
    On CUDA a run's thread CPU time is its launches and copies, not the GPU's kernels.
    `layers`: the model's size (tests build a larger one)."""

    def __init__(
        self,
        tracer: Tracer | None = None,
        providers: Sequence[str] = CPU_PROVIDERS,
        layers: int = LAYERS,
    ) -> None:
        self._tracer = tracer
        self._providers = tuple(providers)
        self._layers = layers
        self._model: ProbeModel | None = None  # opened by the first run
        self._failed = False  # the model could not be built or run: the loop alone
        self._runs: deque[tuple[float, int, float, int]] = deque(maxlen=KEEP)
        self._ticks = cpu_ticks()
        self._stats = thread_schedstats()
        self._cpu_s, self._count = 0.0, 0
        self.build_cpu_s = 0.0  # the model's build, when `open` made it (once)
        self._lock = threading.Lock()

    def run(self) -> None:
        """Once per tick, on the watch's thread."""
        began = time.thread_time()
        others = self._others_share()
        waits = self._wait_ratio()
        model = self._open()
        start = time.perf_counter()
        _, loop_cpu = run_probe()
        onnx_wall, onnx_cpu = self._run_model(model) if model is not None else (None, None)
        cpu = loop_cpu if onnx_cpu is None else onnx_cpu
        end = time.perf_counter()
        host_us = round(max(cpu, 1) / max(MIN_LEFT, 1.0 - others))
        if self._tracer is not None and self._tracer.enabled:
            args: dict[str, Any] = {
                "host_us": host_us,
                "measure": "loop" if onnx_cpu is None else "onnx",
                "loop_cpu_us": loop_cpu,
                "others_share": round(others, 3),
                "wait_ratio": round(waits, 3),
            }
            if onnx_cpu is not None:  # its wall time less its CPU time: a wait for a core
                args["onnx_cpu_us"], args["onnx_wall_us"] = onnx_cpu, onnx_wall
            self._tracer.span(SPAN, CATEGORY, start, end, args)
        with self._lock:
            self._runs.append((start, host_us, waits, max(cpu, 1)))
            self._cpu_s += time.thread_time() - began
            self._count += 1

    def open(self) -> None:
        """Build the model now, on this thread (the watch's start): once per process,
        0.7 s of CPU here, nearly all of it `import onnx` (0.6 s), which the first tick
        would otherwise pay on the watch's thread. Its CPU is `build_cpu_s`, not a tick's."""
        began = time.thread_time()
        self._open()
        self.build_cpu_s = time.thread_time() - began

    def cost(self) -> ProbeCost:
        """The CPU time of every run so far (this thread's: the work, not its waits)."""
        with self._lock:
            measure = "loop" if self._failed else "onnx"
            return ProbeCost(self._cpu_s, self._count, measure)

    def _open(self) -> ProbeModel | None:
        """The model, built on the first call; None from then on if it cannot be."""
        if self._model is None and not self._failed:
            try:
                from appliance.watch.probe_model import ProbeModel

                self._model = ProbeModel(self._layers, self._providers)
            except Exception as exc:  # ORT's exception types share no base class but it
                self._give_up("built", exc)
        return self._model

    def _run_model(self, model: ProbeModel) -> tuple[int | None, int | None]:
        """The model's (wall µs, thread CPU µs), or Nones if ORT fails (then the loop
        from now on)."""
        try:
            return model.run()
        except Exception as exc:  # as in _open: ORT raises Exception's direct subclasses
            self._give_up("run", exc)
            return None, None

    def _give_up(self, step: str, exc: Exception) -> None:
        log.warning(
            "regression watch: the host probe's ONNX model could not be %s (%s: %s); "
            "the probe times a Python loop instead, which misses what slows ONNX Runtime's "
            "kernels more",
            step,
            type(exc).__name__,
            exc,
        )
        self._model, self._failed = None, True

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

    def since(self, t: float) -> tuple[Samples, Samples, Samples]:
        """(host µs, wait ratio × 1000, CPU µs) of the runs that started at or after `t`.
        The CPU µs are the model's alone, before the share left to us: how fast a core
        runs this work, which is all that moves a row's own cost (judge.py)."""
        with self._lock:
            runs = [(h, round(w * 1000), c) for s, h, w, c in self._runs if s >= t]
        if not runs:
            empty = np.empty(0, np.int64)
            return empty, empty, empty
        values = np.asarray(runs, dtype=np.int64)
        return values[:, 0], values[:, 1], values[:, 2]
