"""What a shutdown with a deadline needs: the requests in flight, drained for a while and
then cancelled, and a deadline on the process's exit itself.

aiohttp's own grace (`shutdown_timeout`) waits for a handler, then waits as long again
before it cancels it, and says nothing about what it cut; `InFlight` drains once and
names every request it cancels. Cancelling a handler does not stop a thread it handed
work to (threads cannot be killed; ONNX Runtime's `run` holds its thread until done),
and Python waits for every such thread at exit: `ExitDeadline` ends the process anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from appliance.server.errors import Handler

log = logging.getLogger("appliance.server")

T = TypeVar("T")

CANCEL_WAIT_S = 1.0  # a cancelled handler unwinds at its next await: well within this


class InFlight:
    """The requests being handled now (its middleware records them), for the drain."""

    def __init__(self) -> None:
        # handler task -> ("METHOD /path", time.monotonic() it began). No query string:
        # it may carry anything, and these go to the log.
        self._tasks: dict[asyncio.Task[Any], tuple[str, float]] = {}

    def middleware(self) -> Middleware:
        """Records each request's handler task while it runs (innermost: after auth)."""

        @web.middleware
        async def track(request: web.Request, handler: Handler) -> web.StreamResponse:
            task = asyncio.current_task()
            if task is None:  # not in a task: nothing the drain could wait for or cancel
                return await handler(request)
            self._tasks[task] = (f"{request.method} {request.path}", time.monotonic())
            try:
                return await handler(request)
            finally:
                self._tasks.pop(task, None)

        return track

    def describe(self) -> str:
        """`2 request(s) in flight: GET /metrics, POST /v1/workflows/run`, or `no request...`"""
        names = [what for what, _ in list(self._tasks.values())]
        if not names:
            return "no request in flight"
        return f"{len(names)} request(s) in flight: {', '.join(names)}"

    async def drain(self, timeout: float) -> list[str]:
        """Wait up to `timeout` s for the requests in flight, then cancel the rest; their
        `METHOD /path (running N s)`, each also logged as cut short."""
        pending = set(self._tasks)
        if pending:
            _, pending = await asyncio.wait(pending, timeout=timeout)
        now = time.monotonic()
        cut = []
        for task in pending:
            what, began = self._tasks.get(task, ("a request", now))
            cut.append(f"{what} (running {now - began:.1f} s)")
            log.warning("shutdown: cut short %s after the %.1f s drain", cut[-1], timeout)
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=CANCEL_WAIT_S)
        return cut


def in_own_thread(fn: Callable[..., T], *args: Any, name: str) -> asyncio.Future[T]:
    """Run `fn(*args)` on a new daemon thread named `name`, started now; its outcome as a
    future of the running loop. Not the default thread pool: the requests being drained
    may fill it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(_fail, future, exc)
        else:
            loop.call_soon_threadsafe(_succeed, future, result)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _succeed(future: asyncio.Future[T], result: T) -> None:
    if not future.done():  # done: its waiter was cancelled
        future.set_result(result)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


class ExitDeadline:
    """Ends the process (os._exit) if it is still alive `seconds` from now, naming the
    threads it abandons. Only for the `appliance serve` process: never embed it."""

    def __init__(self, seconds: float) -> None:
        self.code = 1  # the exit status if it fires before the shutdown reports
        self._deadline = time.monotonic() + seconds
        self._changed = threading.Event()
        threading.Thread(target=self._watch, name="exit-deadline", daemon=True).start()

    def shorten(self, seconds: float, code: int) -> None:
        """The orderly part is over with exit status `code`: what still holds the process
        gets at most `seconds` more."""
        self.code = code
        self._deadline = min(self._deadline, time.monotonic() + seconds)
        self._changed.set()  # after the store: the watcher reads the new deadline

    def _watch(self) -> None:
        while (left := self._deadline - time.monotonic()) > 0:
            self._changed.wait(left)
            self._changed.clear()
        exit_now(self.code, at_deadline=True)


def exit_now(code: int, *, at_deadline: bool = False) -> NoReturn:
    """End the process with status `code` now, its log and output flushed first, without
    the interpreter's finalization. For `appliance serve` once its shutdown is over:
    finalization runs the destructors of whatever the stopped streams left for the
    garbage collector (a C extension's, which may block: FFmpeg closing a network input,
    a thread pool's join), and once it has begun Python's daemon threads, ExitDeadline's
    included, can no longer run, so nothing would end a process stuck there. A worker of
    `serve --workers` did so once in six suite runs: "shut down in 0.5 s" logged, then
    alive 5 s later until its supervisor killed it. The threads still at work (a request's
    that the drain cut short) are named when there are any, and always `at_deadline`."""
    main = threading.main_thread()
    busy = [t.name for t in threading.enumerate() if not t.daemon and t is not main]
    if busy or at_deadline:
        log.warning(
            "%s: exiting with status %d, abandoning threads still at work: %s",
            "exit deadline" if at_deadline else "shut down",
            code,
            ", ".join(busy) or "none",
        )
    logging.shutdown()  # flush every handler: os._exit skips it
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe
            stream.flush()
    os._exit(code)
