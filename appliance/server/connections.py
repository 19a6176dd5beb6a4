"""Connection limits, below the requests (nginx's client_header_timeout, keepalive_timeout
and limit_conn): what a client that never finishes a request may hold.

- A new connection must deliver a whole request head (request line and headers) within
  `limits.header_timeout_s` of connecting, however it trickles the bytes: the timer runs
  from the connect and stops when aiohttp hands the parsed head to the application. Past
  it the client gets a 408 and the connection is closed. Once a head has arrived the
  request's own limits take over (request_timeout_s, max_watchers): a long body, an
  event stream or an MJPEG answer is never cut by this timer.
- After an answer, a kept-alive connection must bring its next whole head within
  `limits.keepalive_timeout_s`, or it is closed (aiohttp's keepalive_timeout: its timer
  does not move for the bytes of an unfinished head, so a trickle is cut too).
- At most `limits.max_connections` are open at once, `limits.max_connections_per_client`
  from one peer address; one more is answered 503 and closed at once, before a byte of
  it is read (a socket the OS already accepted costs a write and a close, no task).

Every refusal and head timeout is counted (`appliance_limit_hits_total{limit}`) and
logged at most once per LOG_EVERY_S for each limit, never once per connection: a flood
of connections must not become a flood of log lines.

What this relies on in aiohttp's low-level `web.Server` (3.9 to 3.14 at least; the
tests in tests/server/test_connections.py fail if it changes): its RequestHandler calls
`manager.connection_made(handler, transport)` and `manager.connection_lost(handler,
exc)`, and calls `manager.request_factory` once for each parsed request head;
`Server._kwargs` holds the handler options (keepalive_timeout, access log) the runner
was given.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from appliance.policy.limits import LimitsConfig
from appliance.server.errors import CODES

log = logging.getLogger("appliance.server")

HEAD_TIMEOUT = "limits.header_timeout_s"
MAX_OPEN = "limits.max_connections"
MAX_PER_CLIENT = "limits.max_connections_per_client"
LOG_EVERY_S = 10.0  # at most one log line per limit in this time, with the count since
RETRY_AFTER_S = 1  # a refused client may try again soon: connections end all the time
# Descriptors besides the connections: sources, models, sinks, logs, the loop's own.
FD_RESERVE = 256
FD_CEILING = 1 << 20  # Linux's default fs.nr_open: the most a soft limit may be raised to


def http_answer(status: int, limit: str, value: object, message: str) -> bytes:
    """A whole HTTP/1.1 error answer that ends the connection, in the API's JSON shape
    and wording (LimitError's `message (limit = value)`), written before any request."""
    text = f"{message} ({limit} = {value})"
    error = {"code": CODES[status], "message": text, "details": [f"{limit}: {value}"]}
    body = json.dumps({"error": error}).encode()
    head = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if status == 503:
        head.append(f"Retry-After: {RETRY_AFTER_S}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@dataclass(slots=True)
class _Quiet:
    """When a limit was last logged, and how many hits since."""

    logged: float = -math.inf
    since: int = 0


class ConnectionGuard:
    """The open connections, in all and by peer address, against the caps; the hits.

    Used from the event loop only (no lock). `local` is a Unix socket to our own gateway
    (`serve --workers`): no peer address to cap by, and aiohttp's long keep-alive, so the
    gateway's pooled connections (its client drops them idle after 15 s) are never
    closed under it."""

    def __init__(
        self,
        limits: LimitsConfig,
        *,
        local: bool = False,
        on_hit: Callable[[str], None] | None = None,
    ) -> None:
        self.limits = limits  # the open files limit is raised for them (raise_open_files_limit)
        self.header_timeout_s = limits.header_timeout_s
        self.keepalive_timeout_s = None if local else limits.keepalive_timeout_s
        self.max_open = limits.max_connections
        self.max_per_client = None if local else limits.max_connections_per_client
        self.open = 0
        self.hits: collections.Counter[str] = collections.Counter()  # limit -> connections
        self._by_peer: collections.Counter[str] = collections.Counter()  # open peers only
        self._on_hit = on_hit
        self._quiet: dict[str, _Quiet] = collections.defaultdict(_Quiet)
        self.answers = {
            HEAD_TIMEOUT: http_answer(
                408,
                HEAD_TIMEOUT,
                self.header_timeout_s,
                "the request's headers did not arrive in time",
            ),
            MAX_OPEN: http_answer(503, MAX_OPEN, self.max_open, "too many connections open"),
            MAX_PER_CLIENT: http_answer(
                503, MAX_PER_CLIENT, self.max_per_client, "too many connections from this address"
            ),
        }

    def admit(self, peer: str | None) -> str | None:
        """Take a place for a connection from `peer` (None: no address, a Unix socket);
        the limit that refuses it, or None when it may stay (release it when it ends)."""
        if self.open >= self.max_open:
            return MAX_OPEN
        if peer is not None and self.max_per_client is not None:
            if self._by_peer[peer] >= self.max_per_client:
                return MAX_PER_CLIENT
            self._by_peer[peer] += 1
        self.open += 1
        return None

    def release(self, peer: str | None) -> None:
        """An admitted connection ended."""
        self.open -= 1
        if peer is not None and self.max_per_client is not None:
            self._by_peer[peer] -= 1
            if self._by_peer[peer] <= 0:
                del self._by_peer[peer]  # the table holds the peers with connections only

    def hit(self, limit: str, peer: str | None) -> None:
        """Count a connection closed by `limit`; log it unless that limit was logged
        within LOG_EVERY_S (the next line says how many since)."""
        self.hits[limit] += 1
        if self._on_hit is not None:
            self._on_hit(limit)
        quiet = self._quiet[limit]
        quiet.since += 1
        now = time.monotonic()
        if now - quiet.logged >= LOG_EVERY_S:
            log.warning(
                "%d connection(s) closed by %s since the last such line, the latest from %s",
                quiet.since,
                limit,
                peer or "a local socket",
            )
            quiet.logged, quiet.since = now, 0


@dataclass(slots=True)
class _Place:
    """An admitted connection: its peer, and its head timer until a head arrived."""

    peer: str | None
    timer: asyncio.TimerHandle | None


class GuardedServer(web.Server):
    """aiohttp's low-level server (`plain`, as the runner made it) with the guard at its
    connection hooks and the head timer stopped by its request factory."""

    def __init__(self, plain: web.Server, guard: ConnectionGuard) -> None:
        super().__init__(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            **plain._kwargs,
        )
        self.guard = guard
        self._request_of = self.request_factory  # the application's own factory
        self.request_factory = self._head_arrived
        self._places: dict[RequestHandler, _Place] = {}

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        peer = peer_address(transport)
        refused = self.guard.admit(peer)
        if refused is not None:
            _close(handler, self.guard.answers[refused])
            self.guard.hit(refused, peer)
            return
        timer = asyncio.get_running_loop().call_later(
            self.guard.header_timeout_s, self._head_late, handler
        )
        self._places[handler] = _Place(peer, timer)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        place = self._places.pop(handler, None)
        if place is None:
            return  # refused at the door: it never took a place
        if place.timer is not None:
            place.timer.cancel()
        self.guard.release(place.peer)

    def _head_arrived(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        place = self._places.get(protocol)
        if place is not None and place.timer is not None:
            place.timer.cancel()
            place.timer = None
        return self._request_of(message, payload, protocol, writer, task)

    def _head_late(self, handler: RequestHandler) -> None:
        place = self._places.get(handler)
        if place is None or place.timer is None:
            return
        place.timer = None
        _close(handler, self.guard.answers[HEAD_TIMEOUT])
        self.guard.hit(HEAD_TIMEOUT, place.peer)


class GuardedRunner(web.AppRunner):
    """An AppRunner whose connections pass `guard`, on every site it starts. Its
    keep-alive is the guard's unless `keepalive_timeout` is given."""

    def __init__(self, app: web.Application, guard: ConnectionGuard, **kwargs: Any) -> None:
        if guard.keepalive_timeout_s is not None:
            kwargs.setdefault("keepalive_timeout", guard.keepalive_timeout_s)
        super().__init__(app, **kwargs)
        self.guard = guard

    async def _make_server(self) -> web.Server:
        return GuardedServer(await super()._make_server(), self.guard)


def peer_address(transport: asyncio.BaseTransport) -> str | None:
    """The client's IP address; None for a Unix socket (no address to cap by)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return None


def _close(handler: RequestHandler, answer: bytes) -> None:
    """Write `answer` and close: the transport sends what it holds before it closes."""
    if handler.transport is not None:
        handler.transport.write(answer)
    handler.force_close()


def raise_open_files_limit(limits: LimitsConfig) -> int:
    """Raise this process's soft limit on open files to its hard limit (as nginx's
    worker_rlimit_nofile or systemd's LimitNOFILE do): the usual soft 1024 is below one
    descriptor per allowed connection. Warn when it stays below what `limits` allow.
    The limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
    needed = limits.max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "the open files limit (%d) is below limits.max_connections + %d (%d): past it "
            "new connections fail in the OS, uncounted; raise it (ulimit -n, LimitNOFILE) "
            "or lower limits.max_connections",
            soft,
            FD_RESERVE,
            needed,
        )
    return soft
