"""The appliance's HTTP server in-process, on an unused loopback port, run on its own
event-loop thread as `appliance serve` runs it (uvicorn's `run_server` practice), and a
small blocking client. In-process, tests can look at the runtime's threads and objects.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiohttp import web

from appliance.config import load_config
from appliance.runtime.runtime import Runtime
from appliance.server.serve import Server

START_TIMEOUT_S = 60.0
BOUNDARY = "appliance-test-boundary"
FORM_TYPE = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
Token = str | None
T = TypeVar("T")


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> dict[str, Any]:
        """The `error` object of an error answer (asserting the shape every error has)."""
        err = self.json()["error"]
        assert set(err) == {"code", "message", "details"}, err
        return dict(err)


class LiveServer:
    """`Server` running `config_path`'s runtime; `token` is sent by `call` unless overridden."""

    def __init__(
        self, config_path: Path, *, environ: Mapping[str, str] | None = None, token: Token = None
    ) -> None:
        self.runtime = Runtime(load_config(config_path), config_path=config_path)
        self.config_path = config_path
        self.config_dir = config_path.parent
        self.token = token
        self._environ = dict(environ or {})
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), name="loop")
        self.clean: bool | None = None  # the shutdown's result
        self.port = 0
        self.app: web.Application | None = None

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> LiveServer:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise AssertionError(f"server not up within {START_TIMEOUT_S} s")
        if self._failure is not None:
            self._thread.join(START_TIMEOUT_S)
            raise self._failure
        return self

    def stop(self, timeout: float = 15.0) -> bool:
        if not self._thread.is_alive():  # stopped already (a test may stop it itself)
            return bool(self.clean)
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "server thread did not end"
        return bool(self.clean)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            server = Server(self.runtime, "127.0.0.1", 0, environ=self._environ)
            await server.startup()
        except BaseException as exc:
            self._failure = exc
            self._ready.set()
            return
        self.port = server.port
        self.app = server.app
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            self.clean = await server.shutdown()

    def call_in_loop(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """`fn()` run on the server's event loop (to read what lives there)."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    # -- requests ---------------------------------------------------------------------
    def call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        token: Token | bool = True,
    ) -> Reply:
        """One request; `token=True` sends ours, None or False none, a string that one."""
        sent = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body).encode()
            sent.setdefault("Content-Type", "application/json")
        bearer = self.token if token is True else token or None
        if bearer:
            sent["Authorization"] = f"Bearer {bearer}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=sent)
            resp = conn.getresponse()
            data = resp.read()
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
        finally:
            conn.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get_json(self, path: str) -> Any:
        reply = self.call("GET", path)
        assert reply.status == 200, (path, reply.status, reply.body[:500])
        return reply.json()

    def stream(self, stream_id: str) -> dict[str, Any]:
        return dict(self.get_json(f"/v1/streams/{stream_id}"))


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll a condition only visible over HTTP until it holds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def write_yaml(folder: Path, doc: dict[str, Any], name: str | None = None) -> Path:
    path = folder / (name or f"{uuid.uuid4().hex[:8]}.yaml")
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def multipart(fields: Mapping[str, bytes], boundary: str = BOUNDARY) -> bytes:
    """A multipart/form-data body; every field is sent as a file part."""
    out = b""
    for name, value in fields.items():
        out += (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
                f'filename="{name}"\r\n\r\n').encode() + value + b"\r\n"  # fmt: skip
    return out + f"--{boundary}--\r\n".encode()
