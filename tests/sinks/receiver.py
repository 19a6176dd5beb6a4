"""A real webhook receiver for tests: an aiohttp server on an unused 127.0.0.1 port, run
on its own event-loop thread (uvicorn's `run_server` practice), answering each request
from a script and recording it; tests wait for N requests on a condition, never by sleep.

    with Receiver([Answer(500), Answer(500)]) as rx:  # then 200 for every later request
        ...
        first, second, third = rx.wait_for(3)

A `check` answers before the script does, as a real receiver that verifies signatures
would: `Receiver(check=lambda headers, body: None if ok(...) else Answer(401))`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")
Check = Callable[[Mapping[str, str], bytes], "Answer | None"]  # an answer refuses the request
WAIT_S = 10.0  # default wait for requests or loop calls: generous for a loaded CI machine


class LoopThread:
    """An event loop on a named thread; `call` runs a coroutine there and waits for it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> LoopThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "loop thread did not end"

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = WAIT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()


@dataclass(frozen=True)
class Answer:
    """What the receiver answers to one request."""

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    hang: bool = False  # wait until the receiver closes (then 503): an endpoint that hangs


@dataclass(frozen=True)
class Request:
    """One request as it arrived."""

    time: float  # time.monotonic() on arrival
    headers: Mapping[str, str]  # lower-case names
    body: bytes
    answer: Answer  # what it was (or is being) answered

    def json(self) -> Any:
        return json.loads(self.body)


def bound_socket(port: int = 0) -> socket.socket:
    """A TCP socket bound to 127.0.0.1 (an unused port for 0), not listening: connections
    to it are refused until a server listens on it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


class Receiver:
    """POST endpoint at `url`; answers come from `check`, if it refuses the request, else
    from `script` in order, then `default`."""

    def __init__(
        self,
        script: Sequence[Answer] = (),
        *,
        port: int = 0,
        default: Answer = Answer(),
        check: Check | None = None,
    ) -> None:
        self._check = check
        self._script = list(script)
        self._default = default
        self._requests: list[Request] = []
        self._cond = threading.Condition()
        self._sock = bound_socket(port)
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._loop = LoopThread(f"receiver-{self.port}")
        self._runner: web.AppRunner | None = None
        self._release: asyncio.Event | None = None

    def __enter__(self) -> Receiver:
        self._loop.__enter__()
        self._loop.call(self._start())
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._loop.call(self._stop())
        finally:
            self._loop.__exit__()

    @property
    def requests(self) -> list[Request]:
        with self._cond:
            return list(self._requests)

    def wait_for(self, n: int, timeout: float = WAIT_S) -> list[Request]:
        """The first `n` requests, once they have arrived; AssertionError after `timeout`."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= n, timeout):
                raise AssertionError(f"{len(self._requests)} of {n} requests in {timeout} s")
            return self._requests[:n]

    async def _start(self) -> None:
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    async def _stop(self) -> None:
        assert self._runner is not None and self._release is not None
        self._release.set()  # hanging handlers answer now
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        refused = self._check(request.headers, body) if self._check is not None else None
        with self._cond:
            answer = refused or (self._script.pop(0) if self._script else self._default)
            self._requests.append(Request(time.monotonic(), headers, body, answer))
            self._cond.notify_all()
        if answer.hang:
            assert self._release is not None
            await self._release.wait()
            return web.Response(status=503)
        return web.Response(status=answer.status, body=answer.body, headers=dict(answer.headers))
