"""The host probe times work of the streams' kind: its samples are a real ONNX Runtime
run's thread CPU time (a model four times as large reports about four times as much), a
wait for a core is not in it, it counts its own cost, and a model that cannot be built
leaves the Python loop, said once (appliance/watch/probe.py, probe_model.py).

Medians over interleaved runs: this 2-core machine is shared, so a test's two probes
see the same load, and a run that another process preempted counts once."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from appliance.profiling.tracer import Tracer
from appliance.watch.probe import CATEGORY, LAYERS, SPAN, Probe
from tests.support.processes import end_process, read_line

RUNS = 60  # per probe: a few tenths of a second each


def probe_spans(tracer: Tracer) -> list[dict[str, Any]]:
    """The `host.probe` spans recorded since the last call."""
    return [e for e in tracer.drain() if e.get("name") == SPAN and e.get("cat") == CATEGORY]


SPIN = "print('spinning', flush=True)\nwhile True: pass"
START_S = 10.0  # a Python's start, on a loaded machine


@contextmanager
def busy(count: int) -> Iterator[None]:
    """`count` CPU-bound processes sharing one core with this thread meanwhile, each
    spinning by the time it starts: the thread then waits for the core whatever else the
    machine runs (unpinned, a second pytest worker beside them once left its runs almost
    unpreempted: wall 1.2 times the CPU)."""
    core = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)  # pid 0: this thread (Linux's sched_setaffinity)
    procs = [
        subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
        for _ in range(count)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and read_line(p.stdout, START_S) == "spinning"
            os.sched_setaffinity(p.pid, {core})
        os.sched_setaffinity(0, {core})
        yield
    finally:
        os.sched_setaffinity(0, mine)
        for p in procs:
            end_process(p, signal.SIGKILL)


def test_the_host_samples_are_the_onnx_runs_cpu_time() -> None:
    small, large = Probe(), Probe(layers=4 * LAYERS)
    for _ in range(RUNS):
        small.run()
        large.run()
    (small_us, _, small_cpu), (large_us, _, large_cpu) = small.since(0.0), large.since(0.0)
    assert small_us.size == large_us.size == small_cpu.size == RUNS
    # 4x the model's work (the loop beside it is the same in both): about 4x the sample.
    ratio = float(np.median(large_us)) / float(np.median(small_us))
    assert ratio > 1.5, ratio
    # The CPU µs alone are the samples before the share left to us: never more than them.
    assert (small_cpu <= small_us).all() and (large_cpu <= large_us).all()
    cpu_ratio = float(np.median(large_cpu)) / float(np.median(small_cpu))
    assert cpu_ratio > 1.5, cpu_ratio


def test_the_model_runs_on_the_calling_thread_alone() -> None:
    """Its thread CPU time is then all of the work: ORT starts no pool thread to share it."""
    before = set(os.listdir("/proc/self/task"))
    probe = Probe()
    for _ in range(3):
        probe.run()  # the first builds the model
    assert probe.cost().measure == "onnx"
    assert set(os.listdir("/proc/self/task")) - before == set()


@pytest.mark.live  # it starts two CPU-bound processes
def test_a_wait_for_a_core_is_not_in_the_onnx_cpu_time() -> None:
    tracer = Tracer()
    # A run longer than a scheduler slice (about 3 ms here): the neighbours preempt
    # nearly every one. Most of the default model's 1.4 ms runs end within their slice,
    # and the thread's waits fall between them (their median wall time barely moves).
    probe = Probe(tracer, layers=4 * LAYERS)
    probe.run()  # the model is built in the first run
    probe_spans(tracer)

    def medians() -> tuple[float, float]:
        """The model's median thread CPU µs and median wall µs over RUNS runs."""
        for _ in range(RUNS):
            probe.run()
        spans = probe_spans(tracer)
        assert len(spans) == RUNS and {s["args"]["measure"] for s in spans} == {"onnx"}
        cpu = [s["args"]["onnx_cpu_us"] for s in spans]
        return float(np.median(cpu)), float(np.median([s["args"]["onnx_wall_us"] for s in spans]))

    quiet_cpu, _ = medians()
    with busy(2):
        busy_cpu, busy_wall = medians()
    assert busy_cpu < 1.5 * quiet_cpu, (quiet_cpu, busy_cpu)
    # The waits were real: three on one core, the thread runs about a third of the time.
    assert busy_wall > 1.5 * quiet_cpu, (quiet_cpu, busy_wall)


def test_the_cost_grows_with_the_runs_and_covers_the_work() -> None:
    tracer = Tracer()
    probe = Probe(tracer)
    assert (probe.cost().cpu_s, probe.cost().runs) == (0.0, 0)
    probe.run()  # the model's build is in this one
    first = probe.cost()
    for _ in range(5):
        probe.run()
    later = probe.cost()
    assert (first.runs, later.runs) == (1, 6) and later.measure == "onnx"
    assert 0.0 < first.cpu_s < later.cpu_s
    # At least the CPU time the runs' spans report for their loop and model (each
    # rounded to 1 µs), beside the /proc reads.
    spans = probe_spans(tracer)
    work_us = sum(s["args"]["onnx_cpu_us"] + s["args"]["loop_cpu_us"] - 2 for s in spans)
    assert later.cpu_s * 1e6 >= work_us


def test_a_model_that_cannot_be_built_leaves_the_loop_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "appliance.watch")
    tracer = Tracer()
    probe = Probe(tracer, layers=0)  # a graph whose output no node makes: onnx refuses it
    for _ in range(3):
        probe.run()
    warnings = [r for r in caplog.records if r.name == "appliance.watch"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "could not be built" in warnings[0].getMessage()
    assert "ValidationError" in warnings[0].getMessage()  # why, in onnx's words
    spans = probe_spans(tracer)
    assert [s["args"]["measure"] for s in spans] == ["loop"] * 3
    assert all("onnx_cpu_us" not in s["args"] and s["args"]["host_us"] > 0 for s in spans)
    host_us, waits, cpu_us = probe.since(0.0)
    assert host_us.size == waits.size == cpu_us.size == 3 and probe.cost().measure == "loop"
