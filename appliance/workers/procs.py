"""The worker processes of `appliance serve --workers N`, kept running (uvicorn's
supervisor practice): each is `appliance serve --worker I/N` on a private Unix socket;
one that dies is started again after a backoff; stop sends SIGTERM to all (each drains
as a single process does) and SIGKILL to any still there after the deadline.

A worker that exits with 1 (bad input: a model that does not load, a workflow that does
not compile) before it ever served is fatal: the config is wrong for every restart too,
so the whole appliance stops with that worker's error in the log, as a single process
would. Each worker dies with its supervisor (PR_SET_PDEATHSIG, `die_with_parent`), so
none outlives a SIGKILLed parent.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("appliance.workers")

POLL_S = 0.2  # how often the monitor looks at its processes
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)  # between restarts of one worker, growing
STABLE_S = 30.0  # a worker up this long has its backoff reset
EXIT_BAD_INPUT = 1  # cli.EXIT_BAD_INPUT (not imported: the CLI imports this package)
PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_ENV = "APPLIANCE_SUPERVISOR_PID"  # set for each worker: the pid it must outlive not
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


@dataclass
class Worker:
    """One worker process: its slot, its socket and what happened to it."""

    index: int
    socket: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0  # time.monotonic()
    restarts: int = 0
    served: bool = False  # its socket appeared once: it started serving
    retry_at: float | None = None  # monotonic; set while waiting to restart
    last_exit: int | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def state(self) -> str:
        """`starting` (no socket yet), `up`, `restarting` (waiting out its backoff)."""
        if self.process is None or self.process.poll() is not None:
            return "restarting"
        return "up" if self.socket.exists() else "starting"


class WorkerSet:
    """N workers and the `worker-monitor` thread that restarts them."""

    def __init__(
        self, command: Callable[[int], Sequence[str]], count: int, socket_dir: Path
    ) -> None:
        self._command = command  # index -> argv of that worker
        self.workers = [Worker(i, socket_dir / f"w{i}.sock") for i in range(count)]
        self.fatal: str | None = None  # why the set gave up (a worker that cannot start)
        self.on_fatal: Callable[[], object] = lambda: None  # called on the monitor thread
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # spawn vs stop
        self._thread = threading.Thread(target=self._monitor, name="worker-monitor", daemon=True)

    def start(self) -> None:
        for worker in self.workers:
            self._spawn(worker)
        self._thread.start()

    @property
    def monitoring(self) -> bool:
        """False once the monitor thread ended (stopped, or gave up)."""
        return self._thread.is_alive()

    def signal_all(self, sig: int) -> None:
        """SIGHUP (reload) and the like, to every live worker."""
        for worker in self.workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(sig)

    def kill(self, index: int, why: str) -> None:
        """End a wedged worker now; the monitor starts it again."""
        process = self.workers[index].process
        if process is not None and process.poll() is None:
            log.error("worker %d (pid %d) killed: %s", index, process.pid, why)
            process.kill()

    def stop(self, timeout: float) -> bool:
        """SIGTERM to all, SIGKILL to any left after `timeout` s; True when all exited
        by themselves."""
        with self._lock:
            self._stopping.set()
        self.signal_all(signal.SIGTERM)
        deadline, clean = time.monotonic() + timeout, True
        for worker in self.workers:
            if worker.process is None:
                continue
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker %d did not stop within %.1f s: killed", worker.index, timeout)
                worker.process.kill()
                worker.process.wait()
                clean = False
            clean = clean and worker.process.returncode == 0
        if self._thread.ident is not None:  # started
            self._thread.join(2.0)
        return clean

    # -- the monitor thread -------------------------------------------------------------
    def _monitor(self) -> None:
        while not self._stopping.wait(POLL_S):
            now = time.monotonic()
            for worker in self.workers:
                self._check(worker, now)
            if self.fatal is not None:
                self.on_fatal()
                return

    def _check(self, worker: Worker, now: float) -> None:
        process = worker.process
        if process is not None and process.poll() is None:
            if not worker.served and worker.socket.exists():
                worker.served = True
                log.info("worker %d (pid %d) serving", worker.index, process.pid)
            return
        if worker.retry_at is None:  # it just exited
            self._exited(worker, now)
        elif now >= worker.retry_at and self.fatal is None:
            worker.restarts += 1
            self._spawn(worker)

    def _exited(self, worker: Worker, now: float) -> None:
        code = worker.last_exit = None if worker.process is None else worker.process.returncode
        if code == EXIT_BAD_INPUT and not worker.served and worker.restarts == 0:
            self.fatal = f"worker {worker.index} could not start (exit {code}; its error is above)"
            log.error("%s", self.fatal)
            return
        uptime = now - worker.started_at
        if uptime >= STABLE_S:
            worker.restarts = 0  # a long run: start the backoff over
        delay = BACKOFF_S[min(worker.restarts, len(BACKOFF_S) - 1)]
        log.error(
            "worker %d exited (%s) after %.1f s: starting it again in %.1f s",
            worker.index,
            _describe(code),
            uptime,
            delay,
        )
        worker.retry_at = now + delay

    def _spawn(self, worker: Worker) -> None:
        with self._lock:
            if self._stopping.is_set():
                return
            worker.socket.unlink(missing_ok=True)  # a dead worker's: the new one binds it
            worker.served, worker.retry_at = False, None
            worker.process = subprocess.Popen(
                self._command(worker.index),
                # Its own group: a terminal's Ctrl-C reaches the supervisor, which stops it.
                process_group=0,
                env={**os.environ, PARENT_ENV: str(os.getpid())},
            )
            worker.started_at = time.monotonic()
        log.info("worker %d started (pid %d)", worker.index, worker.process.pid)


def _describe(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def die_with_parent(environ: Mapping[str, str] = os.environ) -> None:
    """Called first thing in a worker: SIGTERM to it when its supervisor dies (strictly:
    when the supervisor's thread that started it ends, its main or monitor thread, which
    live as long as it does). Linux only. A supervisor already gone: exit now."""
    parent = environ.get(PARENT_ENV)
    if _LIBC is None or parent is None:
        return
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # it died before the prctl: nobody will signal us
        raise SystemExit(f"worker: supervisor {parent} is gone")
