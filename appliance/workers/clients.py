"""HTTP to the gateway's members, JSON calls, fan-outs, and forwarding a request as it
came (streamed through for the event and MJPEG routes). A member is one of two kinds:

- a worker of `serve --workers N`, over its Unix socket (`LocalWorkers` over procs.py's
  `WorkerSet`);
- a replica of `appliance gateway --replicas`, over TCP (replicas.py's `ReplicaSet`).

Both are a `Members`: each member's index, state and view (for /health and /ready), how
to dial it, and the 503 that names it when it does not answer.

The gateway has checked the caller's token and role already; toward the members it sends
its own admin token (the same one, from the same config and environment), so the
members' own checks pass for every route the gateway let through and fail for nothing
else, and the caller's name (auth.ACTOR_HEADER), so that the member's audit says who
asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from appliance.server.auth import ACTOR, ACTOR_HEADER
from appliance.server.crosssite import BROWSER_HEADERS
from appliance.server.errors import ApiError
from appliance.server.readers import client_gone
from appliance.workers.procs import Worker, WorkerSet

# Not forwarded either way: they describe one connection, not the message (RFC 9110 7.6.1),
# or are set anew (Authorization: ours; Content-Length: aiohttp's).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "content-length",
        "server",
        "date",
    }
)
# A caller's own actor header is not passed on: the gateway says whom it acts for. Nor
# are a browser's Origin and Sec-Fetch-Site: the gateway judged them (crosssite.py).
NOT_FORWARDED = HOP_BY_HOP | {ACTOR_HEADER.lower()} | BROWSER_HEADERS
MARGIN_S = 2.0  # over the members' own request timeout: their answer, not our cut, wins
TIMED_OUT = "timed out"  # a call's failure when it ran out of time (`_why`)


class MemberUnavailableError(ApiError):
    """503: the member that runs this is not answering; the message names it and why."""

    status = 503

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": "1"})


class WorkerUnavailableError(MemberUnavailableError):
    """503: the worker that runs this is (re)starting or not answering."""

    def __init__(self, index: int, why: str) -> None:
        super().__init__(f"worker {index} is not answering ({why}); it is restarted when it dies")


class Member(Protocol):
    """One process behind the gateway."""

    @property
    def index(self) -> int: ...

    @property
    def state(self) -> str:
        """`up` while it answers; the other states are the kind's own."""
        ...

    def view(self) -> dict[str, Any]:
        """What /health and /ready show of it."""
        ...


class Members(Protocol):
    """The gateway's members, of one kind: how to reach each and how to name it."""

    @property
    def noun(self) -> str:
        """`worker` or `replica`: the label of its answers' items, the word in messages."""
        ...

    @property
    def members(self) -> Sequence[Member]: ...

    @property
    def fatal(self) -> str | None:
        """Why the set gave up (the gateway then stops), or None."""
        ...

    @property
    def monitoring(self) -> bool:
        """False once what watches the members ended: the gateway is no longer alive."""
        ...

    def dial(self, index: int) -> tuple[aiohttp.BaseConnector, str]:
        """A connector to member `index` and the base URL of its API."""
        ...

    def down(self, index: int) -> str | None:
        """Why member `index` is known not to answer now (a call then fails at once, not
        after a timeout), or None to try it."""
        ...

    def unavailable(self, index: int, why: str) -> MemberUnavailableError:
        """The 503 for member `index` not answering, `why`."""
        ...


class LocalWorkers:
    """`serve --workers`' processes (procs.py) as the gateway's members."""

    noun = "worker"

    def __init__(self, workers: WorkerSet) -> None:
        self.workers = workers

    @property
    def members(self) -> Sequence[LocalWorker]:
        return [LocalWorker(w) for w in self.workers.workers]

    @property
    def fatal(self) -> str | None:
        return self.workers.fatal

    @property
    def monitoring(self) -> bool:
        return self.workers.monitoring

    def dial(self, index: int) -> tuple[aiohttp.BaseConnector, str]:
        socket = self.workers.workers[index].socket
        # The host is a placeholder: the socket is the address.
        return aiohttp.UnixConnector(path=str(socket)), "http://worker"

    def down(self, index: int) -> str | None:
        return None  # a dead worker's socket refuses at once: no need to know better

    def unavailable(self, index: int, why: str) -> MemberUnavailableError:
        return WorkerUnavailableError(index, why)


class LocalWorker:
    """One worker process as a `Member` (read live: its process changes on a restart)."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    @property
    def index(self) -> int:
        return self._worker.index

    @property
    def state(self) -> str:
        return self._worker.state

    def view(self) -> dict[str, Any]:
        w = self._worker
        return {
            "index": w.index,
            "state": w.state,
            "pid": w.pid,
            "restarts": w.restarts,
            "last_exit": w.last_exit,
        }


class MemberClients:
    """One HTTP client per member."""

    def __init__(self, group: Members, token: str | None, timeout_s: float) -> None:
        self.group = group
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s + MARGIN_S)
        self._streaming = aiohttp.ClientTimeout(total=None, connect=timeout_s)
        self._sessions: list[tuple[aiohttp.ClientSession, str]] = []

    def _headers(self) -> dict[str, str]:
        """Our token, and whom we ask for: the principal of the request being answered
        (auth.ACTOR), so that the member that acts records who asked (the audit)."""
        principal = ACTOR.get()
        return self._auth if principal is None else {**self._auth, ACTOR_HEADER: principal.name}

    @property
    def members(self) -> Sequence[Member]:
        return self.group.members

    @property
    def count(self) -> int:
        return len(self.group.members)

    @property
    def noun(self) -> str:
        return self.group.noun

    def unavailable(self, index: int, why: str) -> MemberUnavailableError:
        return self.group.unavailable(index, why)

    async def open(self) -> None:
        for index in range(self.count):
            connector, base = self.group.dial(index)
            self._sessions.append((aiohttp.ClientSession(connector=connector), base))

    async def close(self) -> None:
        for session, _ in self._sessions:
            await session.close()

    def _session(self, index: int, even_down: bool = False) -> tuple[aiohttp.ClientSession, str]:
        """Member `index`'s session and base URL; its 503 at once when it is known down
        (unless `even_down`: a probe asks anyway)."""
        why = None if even_down else self.group.down(index)
        if why is not None:
            raise self.group.unavailable(index, why)
        return self._sessions[index]

    async def call(
        self,
        index: int,
        method: str,
        path: str,
        body: Any = None,
        timeout_s: float | None = None,
        *,
        even_down: bool = False,
        accept: str | None = None,
    ) -> tuple[int, Any]:
        """(status, JSON or text) of one request to member `index`; 503 if it is down.
        `accept`: the Accept header to send (the formats the caller reads)."""
        session, base = self._session(index, even_down)
        timeout = self._timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        headers = self._headers()
        if accept is not None:
            headers = {**headers, "Accept": accept}
        try:
            async with session.request(
                method, base + path, json=body, headers=headers, timeout=timeout
            ) as resp:
                if resp.content_type == "application/json":
                    return resp.status, await resp.json()
                return resp.status, await resp.text()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise self.group.unavailable(index, _why(exc)) from None

    async def fan_out(
        self,
        method: str,
        path: str,
        body: Any = None,
        indices: Iterable[int] | None = None,
        timeout_s: float | None = None,
        accept: str | None = None,
    ) -> dict[int, tuple[int, Any]]:
        """The same call to several members at once; those not answering are left out."""
        chosen = list(range(self.count) if indices is None else indices)
        calls = [self.call(i, method, path, body, timeout_s, accept=accept) for i in chosen]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        out: dict[int, tuple[int, Any]] = {}
        for index, answer in zip(chosen, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, MemberUnavailableError):
                    raise answer
                continue
            out[index] = answer
        return out

    async def forward(
        self, index: int, request: web.Request, *, streaming: bool, body: bytes | None = None
    ) -> web.StreamResponse:
        """`request` as it came, to member `index`; its answer as it comes back."""
        session, base = self._session(index)
        data = await request.read() if body is None else body
        headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED}
        try:
            upstream = await session.request(
                request.method,
                base + request.path_qs,
                data=data or None,
                headers={**headers, **self._headers()},
                allow_redirects=False,
                timeout=self._streaming if streaming else self._timeout,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise self.group.unavailable(index, _why(exc)) from None
        async with upstream:
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            if not streaming:
                try:
                    payload = await upstream.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise self.group.unavailable(index, _why(exc)) from None
                return web.Response(body=payload, status=upstream.status, headers=kept)
            return await _stream_through(request, upstream, kept)


class WorkerClients(MemberClients):
    """The clients of `serve --workers`' processes, over their Unix sockets."""

    def __init__(self, workers: WorkerSet, token: str | None, timeout_s: float) -> None:
        super().__init__(LocalWorkers(workers), token, timeout_s)
        self.workers = workers


async def _stream_through(
    request: web.Request, upstream: aiohttp.ClientResponse, headers: dict[str, str]
) -> web.StreamResponse:
    """Copy chunks until either side ends: the viewer leaving closes the member's side,
    at once even while the member has nothing to send (a camera offline), so the member's
    reader ends and frees its watcher slot (server/readers.py)."""
    response = web.StreamResponse(status=upstream.status, headers=headers)
    await response.prepare(request)
    copy = asyncio.ensure_future(_copy(upstream, response))
    gone = asyncio.ensure_future(client_gone(request))
    try:
        await asyncio.wait({copy, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        copy.cancel()
        gone.cancel()
        await asyncio.gather(copy, gone, return_exceptions=True)
    return response


async def _copy(upstream: aiohttp.ClientResponse, response: web.StreamResponse) -> None:
    with contextlib.suppress(aiohttp.ClientError, ConnectionError):
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()


def _why(exc: BaseException) -> str:
    """A failed call in a few words: `timed out`, `connection refused`."""
    if isinstance(exc, TimeoutError):
        return TIMED_OUT
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):  # an https:// replica's
        return f"its TLS certificate is not trusted ({exc.certificate_error}): see --replica-ca"
    if isinstance(exc, aiohttp.ClientConnectorError) and exc.os_error.errno:
        # The OS's words for its errno, not aiohttp's whole sentence.
        return os.strerror(exc.os_error.errno).lower()
    return str(exc) or type(exc).__name__
