"""Insecure is loud: `--insecure` on a non-loopback bind without a token warns at start,
and /ready reports `"insecure": true`. Nothing here listens on an exposed address: the
Server is built for one (that applies the policy and warns), and its app is then served
on loopback to read /ready."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from appliance.config import load_config
from appliance.runtime.runtime import Runtime
from appliance.server.auth import AuthPolicy
from appliance.server.config import ServerConfig
from appliance.server.serve import Server
from tests.server.live import write_yaml

WARNING = "anyone who can reach this port controls the appliance"


@pytest.mark.parametrize(
    ("host", "insecure", "token", "expected"),
    [
        ("0.0.0.0", True, None, True),
        ("::", True, None, True),
        ("10.1.2.3", True, None, True),
        ("camera-box.local", True, None, True),  # a name may resolve to anything
        ("0.0.0.0", True, "a-token", False),  # the token guards it
        ("127.0.0.1", True, None, False),  # loopback: only this machine
        ("localhost", False, None, False),
        ("::1", False, None, False),
    ],
)
def test_only_an_open_exposed_bind_is_insecure(
    host: str, insecure: bool, token: str | None, expected: bool
) -> None:
    policy = AuthPolicy.for_bind(ServerConfig(token=token), host, insecure=insecure, environ={})
    assert policy.insecure is expected


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    """A started runtime with nothing to run (no models, no streams)."""
    rt = Runtime(load_config(write_yaml(tmp_path, {})))
    rt.start()
    yield rt
    rt.stop()


async def ready_body(app: web.Application, token: str | None) -> Any:
    """GET /ready of `app`, served on a loopback port."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.get("/ready", headers=headers)
        assert resp.status == 200
        return await resp.json()


@pytest.mark.parametrize(
    ("host", "token", "insecure"),
    [("0.0.0.0", None, True), ("0.0.0.0", "a-token", False), ("127.0.0.1", None, False)],
)
def test_an_insecure_server_warns_at_start_and_ready_says_so(
    runtime: Runtime,
    caplog: pytest.LogCaptureFixture,
    host: str,
    token: str | None,
    insecure: bool,
) -> None:
    environ = {} if token is None else {"APPLIANCE_API_TOKEN": token}
    with caplog.at_level(logging.WARNING, logger="appliance.server"):
        server = Server(runtime, host, 8080, insecure=True, environ=environ)
    warned = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    if insecure:
        assert warned == [f"serving without a token on {host}: {WARNING}"]
    else:
        assert warned == []
    assert asyncio.run(ready_body(server.app, token))["insecure"] is insecure
