"""The appliances the cross-site tests talk to (tests/security/test_cross_site.py), each a
real process on loopback: `appliance serve` without a token, `serve --workers 2` and
`appliance gateway --replicas` over one replica with one; and a client that sets any
header, `Host` included, as a browser or an attacker's script would."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.appliance import Served, launch, start_served
from tests.support.processes import free_port

TOKEN = "cross-site-s3cret"
CONSOLE = "https://console.example"  # a listed origin (a console served elsewhere)
HOSTS = ["appliance.example", ".cams.example"]  # server.allowed_hosts: a name, a suffix
UP_S = 60.0  # a process's start, several beside each other on two cores
# The cheapest workflow with an output: no model to load (tests/test_fleet.py's).
DRAW = {
    "name": "draw",
    "blocks": [{"id": "drawn", "type": "annotate"}],
    "outputs": {"video": "drawn"},
}


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def error(self) -> dict[str, Any]:
        err: dict[str, Any] = json.loads(self.body)["error"]
        assert set(err) == {"code", "message", "details"}, err
        return err

    def cors(self) -> dict[str, str]:
        """The answer's CORS headers."""
        return {k: v for k, v in self.headers.items() if k.startswith("access-control-")}


@dataclass(frozen=True)
class Target:
    """An appliance under test: where it listens, its token (None: none), its config
    file and the clip its streams play."""

    name: str
    port: int
    token: str | None
    config: Path
    clip: Path

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        token: bool = True,
    ) -> Reply:
        """One request; `headers` may name `Host` (http.client then sends that one)."""
        sent = dict(headers or {})
        if token and self.token:
            sent["Authorization"] = f"Bearer {self.token}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=sent)
            resp = conn.getresponse()
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def post_json(self, path: str, doc: Any, headers: Mapping[str, str] | None = None) -> Reply:
        sent = {"Content-Type": "application/json", **(headers or {})}
        return self.call("POST", path, body=json.dumps(doc).encode(), headers=sent)

    def stream(self, stream_id: str) -> dict[str, Any]:
        """A stream to add: the clip, looped, drawn on."""
        source = {"url": str(self.clip), "loop": True, "pace": "realtime"}
        return {"id": stream_id, "source": source, "workflow": DRAW}

    def streams(self) -> set[str]:
        reply = self.call("GET", "/v1/streams")
        assert reply.status == 200, reply.body
        return {s["id"] for s in json.loads(reply.body)["streams"]}

    def remove(self, stream_id: str) -> None:
        assert self.call("DELETE", f"/v1/streams/{stream_id}").status == 200

    def reload_plan(self) -> dict[str, Any]:
        """What a reload would change now (`?dry_run=true`): nothing is changed."""
        reply = self.call("POST", "/v1/config/reload?dry_run=true")
        assert reply.status == 200, reply.body
        plan: dict[str, Any] = json.loads(reply.body)
        return plan

    @contextmanager
    def pending(self, stream_id: str) -> Iterator[None]:
        """The config file names one more stream, which a reload would start; as it was
        afterwards."""
        before = self.config.read_text()
        doc = json.loads(before)
        doc["streams"] = [*doc["streams"], self.stream(stream_id)]
        self.config.write_text(json.dumps(doc))
        try:
            yield
        finally:
            self.config.write_text(before)


def write_config(folder: Path, clip: Path, origins: list[str], token: str | None) -> Path:
    """No stream at start; sources may play the clip; `origins` and CONSOLE listed."""
    folder.mkdir(exist_ok=True)
    server: dict[str, Any] = {
        "drain_timeout_s": 2,
        "file_roots": [str(folder), str(clip.parent)],
        "allowed_origins": [*origins, CONSOLE],
        "allowed_hosts": HOSTS,
    }
    if token is not None:
        server["token"] = token
    path = folder / f"config-{time.monotonic_ns()}.json"
    path.write_text(json.dumps({"server": server, "streams": []}))
    return path


@contextmanager
def single(folder: Path, clip: Path, origins: list[str]) -> Iterator[Target]:
    """`appliance serve` on 127.0.0.1 without a token: the demo's bind."""
    config = write_config(folder, clip, origins, None)
    served = start_served(config, folder)
    try:
        yield Target("single", _port(served), None, config, clip)
    finally:
        served.terminate(15)


@contextmanager
def workers(folder: Path, clip: Path, origins: list[str]) -> Iterator[Target]:
    """`appliance serve --workers 2` with a token, both workers up."""
    config = write_config(folder, clip, origins, TOKEN)
    served = start_served(config, folder, "--workers", "2")
    try:
        served.wait_for(lambda: served.get("/ready")[0] == 200, UP_S, "both workers ready")
        yield Target("workers", _port(served), TOKEN, config, clip)
    finally:
        served.terminate(15)


@contextmanager
def fleet(folder: Path, clip: Path, origins: list[str]) -> Iterator[Target]:
    """`appliance gateway --replicas` in front of one replica (`appliance serve`), both
    with a token; the gateway sees its replica up."""
    config = write_config(folder, clip, origins, TOKEN)
    replica = start_served(config, folder)
    port = free_port()
    argv = ["gateway", "--replicas", f"127.0.0.1:{_port(replica)}", "--config", str(config)]
    argv += ["--port", str(port), "--state-dir", str(folder / "fleet")]
    gateway = launch(argv, port, folder)
    try:
        gateway.wait_for(lambda: gateway.get("/ready")[0] == 200, UP_S, "the replica up")
        yield Target("fleet", port, TOKEN, config, clip)
    finally:
        for served in (gateway, replica):
            if served.process.poll() is None:
                served.terminate(15)


def _port(served: Served) -> int:
    return int(served.url.rsplit(":", 1)[1])
