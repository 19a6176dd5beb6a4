"""Profiling windows across `serve --workers N` (and `appliance gateway --replicas`: a
replica where this says worker): one window asked of the gateway is one window in each
worker that runs a traced stream, under one id; its trace is theirs merged
(merge.merge_traces: a process track per worker, one timeline).

A worker that restarts during a window loses its part: the window then ends `failed`,
saying which worker. Workers refuse or accept each on their own; when one refuses (a
window of its own still running), the answer is that refusal, and the windows the
others started run out unused.

Who runs which stream is the gateway's to know: it hands in `owners`, a coroutine that
lists them afresh, so this module needs nothing of the gateway's.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from appliance.errors import UnknownWindowError, WindowNotReadyError, WindowRequestError
from appliance.profiling.windows import KEEP_WINDOWS
from appliance.server.context import in_thread
from appliance.server.schemas import ProfilingRequest
from appliance.workers.clients import MemberClients, MemberUnavailableError
from appliance.workers.merge import merge_traces

# () -> stream id -> the index of the worker that runs it, as the workers list them now.
Owners = Callable[[], Awaitable[Mapping[str, int]]]


class WindowFanOut:
    """The gateway's profiling windows: each one a window in every worker it needs."""

    def __init__(self, clients: MemberClients, owners: Owners) -> None:
        self._clients = clients
        self._owners = owners
        # gateway window id -> (its request, worker index -> that worker's window id)
        self._windows: OrderedDict[str, tuple[ProfilingRequest, dict[int, str]]] = OrderedDict()

    async def start(self, raw: bytes) -> tuple[int, Any, dict[str, str]]:
        """(status, body, headers) of POST /v1/profiling: 202 with the window, or the
        first worker's refusal."""
        request = ProfilingRequest.model_validate_json(raw or b"{}")
        parts = await self._parts(request)
        calls = [
            self._clients.call(i, "POST", "/v1/profiling", {**request.model_dump(), "streams": s})
            for i, s in parts.items()
        ]
        answers = dict(zip(parts, await asyncio.gather(*calls), strict=True))
        for status, body in answers.values():
            if status != 202:
                return status, body, {}
        window_id = uuid.uuid4().hex[:12]
        self._windows[window_id] = (request, {i: b["id"] for i, (_, b) in answers.items()})
        while len(self._windows) > KEEP_WINDOWS:
            self._windows.popitem(last=False)
        body = self._body(window_id, "running", None)
        return 202, body, {"Location": f"/v1/profiling/{window_id}"}

    async def _parts(self, request: ProfilingRequest) -> dict[int, list[str] | None]:
        """Worker index -> the streams it traces (None: all of its own)."""
        if request.streams is None:
            return dict.fromkeys(range(self._clients.count))
        owners = await self._owners()
        unknown = sorted(set(request.streams) - set(owners))
        if unknown:
            raise WindowRequestError(f"streams: unknown stream(s) {unknown}")
        parts: dict[int, list[str] | None] = {}
        for stream_id in request.streams:
            parts[owners[stream_id]] = [*(parts.get(owners[stream_id]) or []), stream_id]
        return parts or {0: []}  # no stream at all: a worker says what that means

    async def status(self, window_id: str) -> dict[str, Any]:
        _, parts = self._lookup(window_id)
        states = await self._states(parts)
        noun = self._clients.noun
        failed = [
            f"{noun} {i}: {error}" for i, (state, error) in states.items() if state == "failed"
        ]
        if failed:
            return self._body(window_id, "failed", "; ".join(failed))
        running = any(state == "running" for state, _ in states.values())
        return self._body(window_id, "running" if running else "done", None)

    async def trace(self, window_id: str) -> bytes:
        """The merged trace; WindowNotReadyError (409) while any part runs or failed."""
        status = await self.status(window_id)
        if status["state"] != "done":
            reason = status["error"] or "it is still running"
            raise WindowNotReadyError(f"window {window_id} has no trace: {reason}")
        _, parts = self._lookup(window_id)
        traces: dict[int, Any] = {}
        for index, worker_window in parts.items():
            code, body = await self._clients.call(
                index, "GET", f"/v1/profiling/{worker_window}/trace"
            )
            if code != 200:
                noun = self._clients.noun
                raise WindowNotReadyError(f"window {window_id}: {noun} {index} answered {code}")
            traces[index] = body
        merged = merge_traces(traces, self._clients.noun)
        return (await in_thread(json.dumps, merged)).encode()

    async def _states(self, parts: dict[int, str]) -> dict[int, tuple[str, str | None]]:
        async def one(index: int, worker_window: str) -> tuple[str, str | None]:
            try:
                code, body = await self._clients.call(
                    index, "GET", f"/v1/profiling/{worker_window}"
                )
            except MemberUnavailableError:
                return "failed", "not answering"
            if code == 404:
                return "failed", "restarted during the window: its part is lost"
            return body["state"], body.get("error")

        got = await asyncio.gather(*(one(i, w) for i, w in parts.items()))
        return dict(zip(parts, got, strict=True))

    def _lookup(self, window_id: str) -> tuple[ProfilingRequest, dict[int, str]]:
        if window_id not in self._windows:
            raise UnknownWindowError(window_id)
        return self._windows[window_id]

    def _body(self, window_id: str, state: str, error: str | None) -> dict[str, Any]:
        request, _ = self._windows[window_id]
        return {
            "id": window_id,
            "state": state,
            "trace": f"/v1/profiling/{window_id}/trace",
            "duration_s": request.duration_s,
            "streams": request.streams,
            "ort_operators": request.ort_operators,
            "error": error,
        }
