"""HTTP to the workers over their Unix sockets: JSON calls, fan-outs, and forwarding a
request as it came (streamed through for the event and MJPEG routes).

The gateway has checked the caller's token already; toward the workers it sends its own
(the same one, from the same config and environment), so the workers' own checks pass
for every route the gateway let through and fail for nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

import aiohttp
from aiohttp import web

from appliance.server.errors import ApiError
from appliance.server.readers import client_gone
from appliance.workers.procs import WorkerSet

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
MARGIN_S = 2.0  # over the workers' own request timeout: their answer, not our cut, wins


class WorkerUnavailableError(ApiError):
    """503: the worker that runs this is (re)starting or not answering."""

    status = 503

    def __init__(self, index: int, why: str) -> None:
        super().__init__(
            f"worker {index} is not answering ({why}); it is restarted when it dies",
            headers={"Retry-After": "1"},
        )


class WorkerClients:
    """One HTTP client per worker socket."""

    def __init__(self, workers: WorkerSet, token: str | None, timeout_s: float) -> None:
        self.workers = workers
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s + MARGIN_S)
        self._streaming = aiohttp.ClientTimeout(total=None, connect=timeout_s)
        self._sessions: list[aiohttp.ClientSession] = []

    @property
    def count(self) -> int:
        return len(self.workers.workers)

    async def open(self) -> None:
        for worker in self.workers.workers:
            connector = aiohttp.UnixConnector(path=str(worker.socket))
            self._sessions.append(aiohttp.ClientSession(connector=connector))

    async def close(self) -> None:
        for session in self._sessions:
            await session.close()

    def _url(self, path_qs: str) -> str:
        return f"http://worker{path_qs}"  # the host is a placeholder: the socket is the address

    async def call(
        self, index: int, method: str, path: str, body: Any = None, timeout_s: float | None = None
    ) -> tuple[int, Any]:
        """(status, JSON or text) of one request to worker `index`; 503 if it is down."""
        timeout = self._timeout if timeout_s is None else aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._sessions[index].request(
                method, self._url(path), json=body, headers=self._auth, timeout=timeout
            ) as resp:
                if resp.content_type == "application/json":
                    return resp.status, await resp.json()
                return resp.status, await resp.text()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise WorkerUnavailableError(index, _why(exc)) from None

    async def fan_out(
        self,
        method: str,
        path: str,
        body: Any = None,
        indices: Iterable[int] | None = None,
        timeout_s: float | None = None,
    ) -> dict[int, tuple[int, Any]]:
        """The same call to several workers at once; those not answering are left out."""
        chosen = list(range(self.count) if indices is None else indices)
        calls = [self.call(i, method, path, body, timeout_s) for i in chosen]
        answers = await asyncio.gather(*calls, return_exceptions=True)
        out: dict[int, tuple[int, Any]] = {}
        for index, answer in zip(chosen, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, WorkerUnavailableError):
                    raise answer
                continue
            out[index] = answer
        return out

    async def forward(
        self, index: int, request: web.Request, *, streaming: bool, body: bytes | None = None
    ) -> web.StreamResponse:
        """`request` as it came, to worker `index`; its answer as it comes back."""
        data = await request.read() if body is None else body
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            upstream = await self._sessions[index].request(
                request.method,
                self._url(request.path_qs),
                data=data or None,
                headers={**headers, **self._auth},
                allow_redirects=False,
                timeout=self._streaming if streaming else self._timeout,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise WorkerUnavailableError(index, _why(exc)) from None
        async with upstream:
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            if not streaming:
                try:
                    payload = await upstream.read()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise WorkerUnavailableError(index, _why(exc)) from None
                return web.Response(body=payload, status=upstream.status, headers=kept)
            return await _stream_through(request, upstream, kept)


async def _stream_through(
    request: web.Request, upstream: aiohttp.ClientResponse, headers: dict[str, str]
) -> web.StreamResponse:
    """Copy chunks until either side ends: the viewer leaving closes the worker's side,
    at once even while the worker has nothing to send (a camera offline), so the worker's
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
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
