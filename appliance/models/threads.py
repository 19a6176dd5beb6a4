"""This process's native threads: which ones a call started, and the CPU they have used.

ONNX Runtime runs a session's work on the thread calling `run` and on the session's
intra-op pool, native threads that Python does not know about. The batcher charges each
run with the CPU those threads used (appliance/models/batcher.py), which, unlike its
wall time, does not grow while they wait for a core. Linux only: where there is no /proc
no thread is found, and a run is charged its calling thread's CPU alone.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import onnxruntime as ort

T = TypeVar("T")

_TASKS = "/proc/self/task"
# One `started_during` at a time: two sessions created at once would each see the
# other's pool threads appear. Reentrant: an `fn` that opens a session through it too
# (a model loaded inside) must not wait for itself.
_STARTING = threading.RLock()


def native_tids() -> set[int]:
    """The ids of this process's threads now (Linux tids); empty where there is no /proc."""
    try:
        return {int(name) for name in os.listdir(_TASKS)}
    except FileNotFoundError:
        return set()


def started_during(fn: Callable[[], T]) -> tuple[T, frozenset[int]]:
    """`fn()`, and the native threads that appeared while it ran and still live, less
    every Python thread (another part of the appliance may start one meanwhile). Callers
    are serialised (a call inside `fn` answers its own threads, which this one answers
    too). A native thread started meanwhile by code that does not come through here
    (another library's pool) would be counted, as would a Python thread still starting
    as this returns (its `native_id` not set yet: microseconds)."""
    with _STARTING:
        before = native_tids()
        result = fn()
        after = native_tids()
    python = {t.native_id for t in threading.enumerate()}  # after: those started meanwhile
    return result, frozenset(after - before - python)


_RUNS = threading.local()  # per thread: `ns`, the CPU its own model runs took so far


def count_run_cpu(ns: int) -> None:
    """This thread spent `ns` of CPU in a model's run (the batcher's `session.run` share
    on the calling thread): `block_cpu_ns` leaves it out."""
    _RUNS.ns = getattr(_RUNS, "ns", 0) + ns


def block_cpu_ns() -> int:
    """This thread's CPU ns so far, less what its model runs took (`count_run_cpu`): a
    block's own cost. A stream's block runs its model inline, on its own thread, while
    the model has one user, and on the model's batcher thread once it has more: without
    this, adding a camera made a detector block's CPU fall to 4 % of its baseline, and
    removing one would multiply it (bench/regression_watch.py's load part)."""
    return time.thread_time_ns() - getattr(_RUNS, "ns", 0)


def threads_cpu_ns(tids: Iterable[int]) -> int:
    """The CPU ns the threads `tids` of this process have used so far: time spent running
    on a CPU, not waiting for one. Read from each thread's CPU clock (below), else the
    first field of /proc/self/task/<tid>/schedstat (Documentation/scheduler/
    sched-stats.rst), the same count. A thread gone meanwhile counts 0: its time is lost,
    so a difference across its exit is short by what it had used."""
    total = 0
    for tid in tids:
        try:
            total += time.clock_gettime_ns(_thread_clock(tid))
        except OSError:  # gone, or a kernel without per-thread clocks: the file says
            total += _schedstat_ns(tid)
    return total


def _thread_clock(tid: int) -> int:
    """Linux's CPU clock id of thread `tid`, as glibc's pthread_getcpuclockid makes it
    (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED) in the kernel's posix-cpu-timers.h): a
    clock_gettime call, about 1 µs, where opening and reading the schedstat file costs 7
    (measured on this 2-core test machine, see the commit)."""
    return ((~tid) << 3) | _PER_THREAD_SCHED


_PER_THREAD_SCHED = 4 | 2  # CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED


def _schedstat_ns(tid: int) -> int:
    try:
        fd = os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        return int(os.read(fd, 64).split(maxsplit=1)[0])
    except ProcessLookupError:  # exited between the open and the read
        return 0
    finally:
        os.close(fd)


# Each open session's intra-op pool threads (native tids), for the batcher to charge a run
# with their CPU. Weak: the entry goes with its session, before the threads' ids can be
# reused by others.
_POOL_THREADS: weakref.WeakKeyDictionary[ort.InferenceSession, frozenset[int]] = (
    weakref.WeakKeyDictionary()
)


def open_session(
    source: str | bytes, options: ort.SessionOptions, **kwargs: Any
) -> ort.InferenceSession:
    """`ort.InferenceSession(source, options, **kwargs)`, its intra-op pool threads kept for
    `session_threads`: ONNX Runtime starts them as it creates the session."""
    session, pool = started_during(lambda: ort.InferenceSession(source, options, **kwargs))
    _POOL_THREADS[session] = pool
    return session


def session_threads(session: ort.InferenceSession) -> frozenset[int]:
    """The native threads of `session`'s intra-op pool: intra_op_num_threads - 1 of them
    (the thread calling `run` is the last worker). Empty for a session not opened by
    `open_session`, or where there is no /proc. On a GPU provider they may also hold
    threads its libraries start with the process's first session on it (CUDA's driver
    starts its own)."""
    return _POOL_THREADS.get(session, frozenset())
