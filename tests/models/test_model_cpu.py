"""A run's own CPU cost (`BatchRecord.cpu_s`): the calling thread's and the session's
intra-op pool threads', found as ONNX Runtime starts them (appliance/models/threads.py).
It grows with the model's work and not with a wait for a core, which is what lets the
regression watch tell a model that does more from one that only waited.

CenterFace on the CPU, spinning off (an idle pool thread sleeps at once, so the CPU
between runs is nobody's), two intra-op threads: the caller and one pool thread. The
contention test interleaves its quiet and busy runs: this 2-core machine is shared, and
load that comes and goes meanwhile falls on both alike."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from appliance.models import BatchRecord, LoadedModel, ModelBatcher, load_model
from appliance.models.threads import (
    block_cpu_ns,
    native_tids,
    session_threads,
    started_during,
    threads_cpu_ns,
)
from pipelines.models import Tensor
from pipelines.spec import BatchingSpec, ModelSpec
from tests.models.conftest import TIMEOUT_S
from tests.support.models import MODELS
from tests.support.processes import end_process, read_line

LARGE = (480, 640)  # height, width: a VGA frame
SMALL = (224, 320)  # 4.3x fewer pixels; CenterFace takes sides that are multiples of 32
RUNS = 10  # of each kind: a few tenths of a second each here
SPIN = "print('spinning', flush=True)\nwhile True: pass"
START_S = 10.0  # a Python's start, on a loaded machine


def load_faces(intra_op_threads: int) -> LoadedModel:
    spec = {
        "path": MODELS / "centerface.onnx",
        "decoder": "centerface",
        "providers": ["cpu"],
        "preprocess": "host",
        "session": {"intra_op_threads": intra_op_threads, "allow_spinning": False},
    }
    return load_model("faces", ModelSpec.model_validate(spec), Path.resolve)


@pytest.fixture(scope="module")
def faces() -> LoadedModel:
    return load_faces(2)


def frame(size: tuple[int, int]) -> Tensor:
    """A CenterFace sample: float32 [3, H, W], noise (the work does not depend on it)."""
    return np.random.default_rng(0).random((3, *size), dtype=np.float32)


@pytest.fixture
def run_once(faces: LoadedModel) -> Iterator[Callable[[Tensor], BatchRecord]]:
    """Runs one sample on a batcher of `faces` (one stream: inline, on this thread) and
    answers its record."""
    records: list[BatchRecord] = []
    batcher = ModelBatcher(faces, BatchingSpec(max_batch_size=1), on_batch=records.append)
    batcher.set_producers(1)

    def run(sample: Tensor) -> BatchRecord:
        batcher.submit(sample, "cam").result(TIMEOUT_S)
        return records[-1]

    with batcher:
        run(frame(LARGE))  # the first run allocates its buffers
        yield run


def python_tids() -> set[int | None]:
    return {t.native_id for t in threading.enumerate()}


def test_a_sessions_pool_threads_are_found(faces: LoadedModel) -> None:
    pool = session_threads(faces.session)
    # intra_op_num_threads 2: the caller is one, ORT starts one more
    assert len(pool) == 1, pool
    assert pool <= native_tids() and not pool & python_tids()
    assert len(session_threads(load_faces(3).session)) == 2


def test_a_python_thread_started_meanwhile_is_not_the_sessions() -> None:
    started, done = threading.Event(), threading.Event()

    def stay() -> None:
        started.set()
        done.wait(TIMEOUT_S)

    other = threading.Thread(target=stay, name="beside")

    def open_beside() -> LoadedModel:
        other.start()
        started.wait(TIMEOUT_S)
        return load_faces(2)

    try:
        model, new = started_during(open_beside)
    finally:
        done.set()
        other.join(TIMEOUT_S)
    assert other.native_id not in new
    assert new == session_threads(model.session) and len(new) == 1


def test_sessions_opened_at_once_do_not_claim_each_others_threads() -> None:
    barrier = threading.Barrier(2)
    models: list[LoadedModel] = []

    def open_one() -> None:
        barrier.wait(TIMEOUT_S)
        models.append(load_faces(3))

    openers = [threading.Thread(target=open_one) for _ in range(2)]
    for t in openers:
        t.start()
    for t in openers:
        t.join(TIMEOUT_S)
    first, second = (session_threads(m.session) for m in models)
    assert len(first) == len(second) == 2 and not first & second, (first, second)


def test_a_thread_that_is_not_ours_counts_nothing(faces: LoadedModel) -> None:
    # Our parent's pid names no thread of ours: as a thread gone since, it adds 0.
    assert threads_cpu_ns({os.getppid()}) == 0
    pool = session_threads(faces.session)
    assert threads_cpu_ns(pool) > 0  # it has run since it started: at least a little


def test_a_runs_cpu_is_its_threads_work(
    faces: LoadedModel, run_once: Callable[[Tensor], BatchRecord]
) -> None:
    sample = frame(LARGE)
    pool = session_threads(faces.session)
    process_before, pool_before = time.process_time(), threads_cpu_ns(pool)
    records = [run_once(sample) for _ in range(RUNS)]
    process_s = time.process_time() - process_before
    assert all(r.ok and r.cpu_s > 0 for r in records)
    assert threads_cpu_ns(pool) > pool_before  # the pool thread did part of the work
    # The runs are all this process did meanwhile (its other threads are idle), so their
    # CPU is nearly all of the process's, and never more: without the pool thread's
    # share it was 0.52-0.76 of it here, with it 0.995-0.996 (beside other load or not).
    runs_s = sum(r.cpu_s for r in records)
    assert 0.9 * process_s < runs_s <= process_s, (runs_s, process_s)


def test_a_larger_input_costs_more_cpu(run_once: Callable[[Tensor], BatchRecord]) -> None:
    large, small = frame(LARGE), frame(SMALL)
    large_s: list[float] = []
    small_s: list[float] = []
    for _ in range(RUNS):  # interleaved: both sizes see the same load
        large_s.append(run_once(large).cpu_s)
        small_s.append(run_once(small).cpu_s)
    # 4.3x the pixels: 4.1-4.9x the CPU here
    ratio = statistics.mean(large_s) / statistics.mean(small_s)
    assert ratio > 2, (ratio, large_s, small_s)


@contextmanager
def competitors(count: int) -> Iterator[Callable[[bool], None]]:
    """`count` CPU-bound processes, each spinning by the time it starts; the value sets
    whether they compete now (SIGCONT) or are stopped (SIGSTOP). The kernel acts on
    either signal as it is sent (a running one is interrupted to stop), so no wait."""
    procs = [
        subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
        for _ in range(count)
    ]

    def compete(on: bool) -> None:
        for p in procs:
            p.send_signal(signal.SIGCONT if on else signal.SIGSTOP)

    try:
        for p in procs:
            assert p.stdout is not None and read_line(p.stdout, START_S) == "spinning"
        yield compete
    finally:
        for p in procs:
            end_process(p, signal.SIGKILL)


@pytest.mark.live  # it starts CPU-bound processes
def test_a_wait_for_a_core_does_not_grow_a_runs_cpu(
    run_once: Callable[[Tensor], BatchRecord],
) -> None:
    sample = frame(LARGE)
    pairs: list[tuple[BatchRecord, BatchRecord]] = []
    # Twice as many spinning loops as cores: a run beside them waits whatever else the
    # machine runs meanwhile (a quiet run may wait for that too, so the pairs are judged
    # one by one: the busy run of a pair against the quiet run just before it).
    with competitors(2 * (os.cpu_count() or 1)) as compete:
        for _ in range(RUNS):
            compete(False)
            quiet = run_once(sample)
            compete(True)
            pairs.append((quiet, run_once(sample)))
    waited = [(q, b) for q, b in pairs if b.run_s > 1.2 * q.run_s]
    # The premise: most busy runs waited for a core (wall x1.5-3 here) ...
    assert len(waited) >= RUNS // 2, [(q.run_s, b.run_s) for q, b in pairs]
    # ... and those did the same work as their quiet twin (CPU x0.89-1.00).
    ratio = statistics.median(b.cpu_s / q.cpu_s for q, b in waited)
    assert 1 / 1.5 < ratio < 1.5, [(q.cpu_s, b.cpu_s) for q, b in waited]


def test_a_blocks_own_cpu_leaves_out_the_model_run_it_made_inline(
    run_once: Callable[[Tensor], BatchRecord],
) -> None:
    """A stream alone on a model runs it inline, on its own thread: the block's own cost
    (`block_cpu_ns`, what the executor times a block by) leaves that run out, so a
    detector block's cost does not change when a second camera moves the runs to the
    batcher's thread."""
    sample = frame(LARGE)
    thread0, block0 = time.thread_time_ns(), block_cpu_ns()
    record = run_once(sample)
    thread_ns, block_ns = time.thread_time_ns() - thread0, block_cpu_ns() - block0
    assert record.inline
    # The run's share on this thread is in the thread's CPU, not in the block's: what is
    # left is submitting and resolving (well under a tenth of a CenterFace VGA run).
    assert thread_ns - block_ns > 0.5 * record.cpu_s * 1e9 / 2  # caller: ~half of two threads
    assert block_ns < 0.1 * thread_ns, (block_ns, thread_ns)
