"""The newest result of every stream, for programs that just want to read it: the API's
`latest`, `snapshot.jpg`, server-sent events and MJPEG read from here.

It is an in-process subscriber of the outputs, so each frame costs one dict store, plus
one `call_soon_threadsafe` per waiting reader. Readers never get a queue: a reader that
waits gets the newest result when it next looks, and what it was too slow for is skipped
(and counted by the reader), so a slow client holds one reference, never a backlog.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from pipelines.types import FrameResult


@dataclass(frozen=True, slots=True)
class Latest:
    """A stream's newest result and how many results the stream has published."""

    result: FrameResult
    count: int


class LatestResults:
    """Newest result per stream; `wait_newer` lets event-loop readers wait for the next."""

    def __init__(self) -> None:
        self._latest: dict[str, Latest] = {}
        # stream id -> (loop, future) of the readers waiting now
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self._lock = threading.Lock()
        self.closed = False

    def __call__(self, result: FrameResult) -> None:
        """The subscriber: called on the stream's worker thread with every result."""
        sid = result.stream_id
        previous = self._latest.get(sid)
        self._latest[sid] = Latest(result, 1 if previous is None else previous.count + 1)
        if self._waiters.get(sid):  # unlocked peek: the common case is nobody waiting
            self._wake(sid)

    def get(self, stream_id: str) -> Latest | None:
        return self._latest.get(stream_id)

    def forget(self, stream_id: str) -> None:
        """A removed stream's last result goes with it; its readers' waits end now, so
        they see at once that it is gone."""
        self._latest.pop(stream_id, None)
        self._wake(stream_id)

    async def wait_newer(self, stream_id: str, count: int, timeout: float) -> Latest | None:
        """The newest result once the stream has published more than `count`; None on
        timeout or when closed (shutdown)."""
        if self.closed:
            return None
        latest = self._latest.get(stream_id)
        if latest is not None and latest.count > count:
            return latest
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        entry = (loop, waiter)
        with self._lock:
            self._waiters.setdefault(stream_id, []).append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            return None
        finally:
            with self._lock:
                waiting = self._waiters.get(stream_id, [])
                if entry in waiting:
                    waiting.remove(entry)
        latest = self._latest.get(stream_id)
        return None if self.closed or latest is None or latest.count <= count else latest

    def close(self) -> None:
        """Shutdown: every reader's wait ends now."""
        self.closed = True
        for sid in list(self._waiters):
            self._wake(sid)

    def _wake(self, stream_id: str) -> None:
        with self._lock:
            waiting = self._waiters.pop(stream_id, [])
        for loop, waiter in waiting:
            loop.call_soon_threadsafe(_resolve, waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
