"""Request limits of the HTTP layer: a time limit on every request, and a fixed number of
workflow requests (run, validate) at once, each on a thread of its own.

A request past its time is answered 408 and its handler cancelled. Work already on a
thread cannot be cancelled (Python threads cannot be killed; ONNX Runtime's `run` holds
its thread until done), so a workflow request keeps its slot until its thread really
ends: slots count threads at work, not answers sent, and a client that gives up and
retries cannot pile up threads behind the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from appliance.errors import LimitError
from appliance.server.errors import Handler

P = ParamSpec("P")
T = TypeVar("T")

RETRY_AFTER_S = 1.0  # a workflow run takes tens to hundreds of ms: try again soon


class WorkSlots:
    """At most `size` workflow requests at work; the next is refused with 429.

    Used from the event loop only (no lock): the count rises on the loop and falls
    through `call_soon_threadsafe` when a thread ends."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.busy = 0
        self._executor = ThreadPoolExecutor(size, thread_name_prefix="run")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self.busy >= self.size:
            raise LimitError(
                "limits.max_concurrent_runs",
                self.size,
                f"{self.busy} workflow requests are running",
                status=429,
                retry_after_s=RETRY_AFTER_S,
            )
        loop = asyncio.get_running_loop()
        self.busy += 1
        work: Future[T] = self._executor.submit(functools.partial(fn, *args, **kwargs))
        work.add_done_callback(lambda _: loop.call_soon_threadsafe(self._done))
        # Cancelling the wrapper (time limit, shutdown) leaves the thread to finish.
        return await asyncio.wrap_future(work)

    def _done(self) -> None:
        self.busy -= 1

    def close(self) -> None:
        """No new work; queued work is dropped, running threads end on their own."""
        self._executor.shutdown(wait=False, cancel_futures=True)


class Watchers:
    """At most `size` long-lived readers (server-sent events, MJPEG) at once; the next
    is refused with 429. A reader's slot is free again within readers.WATCH_S of its
    client leaving or its stream being removed, due a result or not. On the event loop
    only."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.active = 0

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        if self.active >= self.size:
            raise LimitError(
                "limits.max_watchers",
                self.size,
                f"{self.active} readers are watching",
                status=429,
                retry_after_s=RETRY_AFTER_S,
            )
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1


def timeout_middleware(seconds: float, streaming: frozenset[str] = frozenset()) -> Middleware:
    """Answer 408 (limits.request_timeout_s) when a handler takes longer than `seconds`,
    reading the body included, so a slow client cannot hold a handler either. Routes in
    `streaming` (events, MJPEG) answer for as long as the client reads: they are bounded
    by limits.max_watchers instead."""

    @web.middleware
    async def limit_time(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if resource is not None and resource.canonical in streaming:
            return await handler(request)
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                return await handler(request)
        except TimeoutError:
            if not deadline.expired():
                raise  # the handler's own, not ours
            raise LimitError(
                "limits.request_timeout_s",
                seconds,
                f"{request.method} {request.path} took longer and was cut short",
                status=408,
            ) from None

    return limit_time
