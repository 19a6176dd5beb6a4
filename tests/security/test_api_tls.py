"""The API over TLS (`server.tls`), on real `appliance serve` processes with certificates
made here by a test CA (trustme): https answers with the CA, plain HTTP on that port
gets no API answer, /ready says `tls: true`, and the viewer, server-sent events, MJPEG
and WebRTC signalling work over it. A certificate replaced on disk is served to new
connections after a SIGHUP or `POST /v1/config/reload` while a stream opened before goes
on; files that do not load change nothing and the reload says why.

Two appliances per module: one that no test changes, one whose certificate the swap
tests replace (each test reads what is served before it, so their order is free).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.client import ApplianceClient, ApplianceConnectionError
from appliance.client_transport import CA_FILE_ENV
from tests.support.appliance import APPLIANCE, DEMO_CLIP, Served, clean_env, launch, start_served
from tests.support.processes import free_port
from tests.support.tls import TestCA, served_serial
from tests.support.warm_cli import run_appliance
from tests.support.webrtc import recvonly_offer

FRAMES_ONLY = {"name": "frames", "blocks": [], "outputs": {"video": "frame"}}
CERT, KEY = Path("tls/cert.pem"), Path("tls/key.pem")  # relative to the config file
WAIT_S = 20.0
HEAD_TIMEOUT_S = 2  # limits.header_timeout_s: the TLS handshake is held to it too


def tls_config(folder: Path) -> Path:
    """A config serving the demo clip (looped, at its own pace) over TLS with the files
    at CERT and KEY, named relative to the config."""
    doc: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "tls": {"cert_file": str(CERT), "key_file": str(KEY)}},
        "limits": {"header_timeout_s": HEAD_TIMEOUT_S},
        "streams": [
            {
                "id": "cam",
                "source": {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime"},
                "workflow": FRAMES_ONLY,
            }
        ],
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return TestCA()


def start_tls(folder: Path, ca: TestCA, *extra: str) -> Served:
    folder.mkdir(parents=True, exist_ok=True)
    ca.issue("first").write(folder / CERT, folder / KEY)
    served = start_served(tls_config(folder), folder, *extra, tls=ca.client_context())
    try:
        served.wait_for(lambda: served.get("/v1/streams/cam/latest")[0] == 200, 60, "a result")
    except BaseException:
        served.stop()
        raise
    return served


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, ca: TestCA) -> Iterator[Served]:
    """An appliance serving over TLS that no test changes."""
    s = start_tls(tmp_path_factory.mktemp("tls"), ca)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def swapping(tmp_path_factory: pytest.TempPathFactory, ca: TestCA) -> Iterator[Served]:
    """An appliance whose certificate the tests replace."""
    s = start_tls(tmp_path_factory.mktemp("swap"), ca)
    yield s
    s.stop()


def port_of(served: Served) -> int:
    return int(served.url.rsplit(":", 1)[1])


def folder_of(served: Served) -> Path:
    return served.log_path.parent


def post(served: Served, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(served.url + path, b"", method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S, context=served.context) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), json.loads(err.read())


# -- serving ----------------------------------------------------------------------------
def test_https_answers_with_the_ca_and_ready_says_tls(served: Served) -> None:
    ready = served.json("/ready")
    assert ready["tls"] is True
    status, page = served.get("/")
    assert status == 200 and b"<html" in page.lower()  # the viewer
    with pytest.raises(urllib.error.URLError) as refused:  # a client without the CA
        urllib.request.urlopen(served.url + "/health", timeout=WAIT_S)
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)


def test_plain_http_on_the_tls_port_gets_no_api_answer(served: Served) -> None:
    with socket.create_connection(("127.0.0.1", port_of(served)), timeout=WAIT_S) as raw:
        raw.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        received = read_until_closed(raw)
    assert b"HTTP/" not in received and b"status" not in received


def test_a_connection_that_never_says_hello_is_closed_by_the_head_timeout(
    served: Served,
) -> None:
    """The TLS handshake counts toward `limits.header_timeout_s` (asyncio's own default
    would keep a silent connection for 60 s, outside the connection caps)."""
    with socket.create_connection(("127.0.0.1", port_of(served)), timeout=WAIT_S) as raw:
        assert read_until_closed(raw) == b""  # closed by the server, within WAIT_S


def read_until_closed(raw: socket.socket) -> bytes:
    received = b""
    while chunk := raw.recv(4096):
        received += chunk
    return received


def test_events_and_mjpeg_stream_over_tls(served: Served) -> None:
    with open_stream(served, "/v1/streams/cam/events") as (response, _):
        assert response.getheader("Content-Type", "").startswith("text/event-stream")
        event = next_event(response)
        assert event["stream"] == "cam"
    with open_stream(served, "/v1/streams/cam/video.mjpeg") as (response, _):
        assert response.getheader("Content-Type", "").startswith("multipart/x-mixed-replace")
        assert b"image/jpeg" in response.read1(65536) + response.read1(65536)


def test_webrtc_signalling_over_tls(served: Served) -> None:
    async def answer() -> dict[str, Any]:
        pc, _, offer = await recvonly_offer()
        try:
            request = urllib.request.Request(
                served.url + "/v1/streams/cam/webrtc",
                json.dumps(offer).encode(),
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=WAIT_S, context=served.context) as r:
                assert r.status == 201
                body: dict[str, Any] = json.loads(r.read())
            return body
        finally:
            await pc.close()

    body = asyncio.run(answer())
    assert body["type"] == "answer" and "m=video" in body["sdp"]


def test_its_own_https_origin_may_change_things_its_http_origin_may_not(served: Served) -> None:
    """A browser's page of https://HOST:PORT posts with that Origin: the appliance's own
    now (aiohttp's request.scheme is https over TLS); the http origin is another."""
    own = served.url
    assert post(served, "/v1/config/reload?dry_run=true", {"Origin": own})[0] == 200
    other = own.replace("https://", "http://")
    assert post(served, "/v1/config/reload?dry_run=true", {"Origin": other})[0] == 403


class open_stream:  # noqa: N801 (a context manager, read as a verb)
    """A GET of a streaming route over its own TLS connection, its answer begun."""

    def __init__(self, served: Served, path: str) -> None:
        self.conn = http.client.HTTPSConnection(
            "127.0.0.1", port_of(served), timeout=WAIT_S, context=served.context
        )
        self.path = path

    def __enter__(self) -> tuple[http.client.HTTPResponse, http.client.HTTPSConnection]:
        self.conn.request("GET", self.path)
        response = self.conn.getresponse()
        assert response.status == 200
        return response, self.conn

    def __exit__(self, *_: object) -> None:
        self.conn.close()


def next_event(response: http.client.HTTPResponse) -> dict[str, Any]:
    """The next server-sent event's data."""
    while True:
        line = response.readline()
        assert line, "the event stream ended"
        if line.startswith(b"data: "):
            data: dict[str, Any] = json.loads(line[len(b"data: ") :])
            return data


# -- reloading the certificate ----------------------------------------------------------
def wait_served(served: Served, serial: int) -> None:
    port, context = port_of(served), served.context
    assert context is not None
    served.wait_for(
        lambda: served_serial(port, context) == serial, WAIT_S, f"certificate {serial:X}"
    )


@pytest.mark.parametrize("how", ["SIGHUP", "POST /v1/config/reload"])
def test_a_replaced_certificate_is_served_to_new_connections_while_a_stream_goes_on(
    swapping: Served, ca: TestCA, how: str
) -> None:
    folder, context = folder_of(swapping), swapping.context
    assert context is not None
    before = served_serial(port_of(swapping), context)
    with open_stream(swapping, "/v1/streams/cam/events") as (events, _):
        next_event(events)  # the stream is open, over the certificate served before
        renewed = ca.issue("renewed")
        renewed.write(folder / CERT, folder / KEY)
        assert served_serial(port_of(swapping), context) == before  # not before the reload
        if how == "SIGHUP":
            swapping.process.send_signal(signal.SIGHUP)
        else:
            status, body = post(swapping, "/v1/config/reload")
            assert status == 200, body
            tls = body["tls"]
            assert tls["loaded"] is True and tls["error"] is None
            assert tls["served"]["serial"] == f"{renewed.serial:X}"
            assert "CN=renewed" in tls["served"]["subject"]
        wait_served(swapping, renewed.serial)
        seqs = [next_event(events)["seq"] for _ in range(3)]  # the open stream goes on
        assert seqs == sorted(seqs)
    if how == "SIGHUP":
        swapping.wait_for(
            lambda: "TLS certificate reloaded (SIGHUP): CN=renewed" in swapping.log(),
            WAIT_S,
            "the reload's log line",
        )


def test_a_dry_run_checks_the_files_and_changes_nothing(swapping: Served, ca: TestCA) -> None:
    folder, context = folder_of(swapping), swapping.context
    assert context is not None
    before = served_serial(port_of(swapping), context)
    candidate = ca.issue("candidate")
    candidate.write(folder / CERT, folder / KEY)
    status, body = post(swapping, "/v1/config/reload?dry_run=true")
    assert status == 200, body
    assert body["tls"]["loaded"] is True
    assert body["tls"]["served"]["serial"] == f"{candidate.serial:X}"  # would be served
    assert served_serial(port_of(swapping), context) == before


def test_a_key_that_does_not_match_keeps_the_old_certificate(swapping: Served, ca: TestCA) -> None:
    folder, context = folder_of(swapping), swapping.context
    assert context is not None
    before = served_serial(port_of(swapping), context)
    ca.issue("new").write(folder / CERT, folder / "unused.pem")
    ca.issue("other").write(folder / "other.pem", folder / KEY)  # another certificate's key
    status, body = post(swapping, "/v1/config/reload")
    assert status == 200, body  # the streams' part of the reload is not refused
    tls = body["tls"]
    assert tls["loaded"] is False
    assert tls["served"]["serial"] == f"{before:X}"
    assert "server.tls.key_file" in tls["error"] and "does not match" in tls["error"]
    assert served_serial(port_of(swapping), context) == before
    assert swapping.json("/ready")["tls"] is True


def test_a_missing_certificate_file_on_sighup_is_logged_and_the_old_one_served(
    swapping: Served,
) -> None:
    folder, context = folder_of(swapping), swapping.context
    assert context is not None
    before = served_serial(port_of(swapping), context)
    (folder / CERT).unlink()
    swapping.process.send_signal(signal.SIGHUP)
    swapping.wait_for(
        lambda: "TLS certificate not reloaded (SIGHUP)" in swapping.log(),
        WAIT_S,
        "the refusal's log line",
    )
    line = next(x for x in swapping.log().splitlines() if "not reloaded (SIGHUP)" in x)
    assert "server.tls.cert_file" in line and "file not found" in line
    assert f"serial {before:X}" in line
    assert served_serial(port_of(swapping), context) == before


# -- starting -----------------------------------------------------------------------------
def test_a_certificate_file_that_cannot_be_read_stops_the_start(tmp_path: Path) -> None:
    config = tls_config(tmp_path)  # no files written
    done = subprocess.run(
        [*APPLIANCE, "serve", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=clean_env(),
    )
    assert done.returncode == 1
    assert "server.tls.cert_file" in done.stderr and "file not found" in done.stderr


def test_the_workers_gateway_serves_tls(tmp_path: Path, ca: TestCA) -> None:
    served = start_tls(tmp_path, ca, "--workers", "2")
    try:
        served.wait_for(lambda: served.get("/ready")[0] == 200, 60, "both workers ready")
        ready = served.json("/ready")
        assert ready["tls"] is True and len(ready["workers"]) == 2
        with open_stream(served, "/v1/streams/cam/events") as (events, _):
            assert next_event(events)["stream"] == "cam"
        renewed = ca.issue("renewed")
        renewed.write(tmp_path / CERT, tmp_path / KEY)
        status, body = post(served, "/v1/config/reload")
        assert status == 200, body
        assert body["tls"]["served"]["serial"] == f"{renewed.serial:X}"
        wait_served(served, renewed.serial)
    finally:
        served.stop()


# -- the fleet's gateway ------------------------------------------------------------------
def start_gateway(folder: Path, replica: Served, ca: TestCA, *extra: str) -> Served:
    """`appliance gateway` over TLS in front of `replica` (`https://`), from the
    replica's own config (the same server.tls files)."""
    port = free_port()
    argv = ["gateway", "--replicas", f"https://127.0.0.1:{port_of(replica)}"]
    argv += ["--config", str(folder_of(replica) / "config.yaml"), "--port", str(port), *extra]
    gateway = launch(argv, port, folder, tls=ca.client_context())
    try:
        gateway.wait_for(lambda: gateway.get("/health")[0] == 200, 60, "/health")
    except BaseException:
        gateway.stop()
        raise
    return gateway


def replica_view(gateway: Served) -> dict[str, Any]:
    view: dict[str, Any] = json.loads(gateway.get("/health")[1])["replicas"][0]
    return view


def test_the_fleet_gateway_serves_tls_and_checks_its_https_replicas(
    served: Served, ca: TestCA, tmp_path: Path
) -> None:
    ca_file = str(ca.write_ca(tmp_path / "ca.pem"))
    trusting = start_gateway(tmp_path, served, ca, "--replica-ca", ca_file)
    try:
        trusting.wait_for(lambda: replica_view(trusting)["state"] == "up", WAIT_S, "replica up")
        streams = trusting.json("/v1/streams")["streams"]
        assert [(s["id"], s["replica"]) for s in streams] == [("cam", 0)]
        assert trusting.json("/ready")["tls"] is True
    finally:
        trusting.stop()
    doubting = start_gateway(tmp_path, served, ca)  # the system's CAs: not the test CA
    try:
        doubting.wait_for(lambda: replica_view(doubting)["state"] == "down", WAIT_S, "down")
        assert "certificate is not trusted" in replica_view(doubting)["reason"]
    finally:
        doubting.stop()


# -- the client -----------------------------------------------------------------------------
def test_the_client_trusts_a_private_ca_by_option_or_environment(
    served: Served, ca: TestCA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca_file = ca.write_ca(tmp_path / "ca.pem")
    assert ApplianceClient(served.url, ca_file=ca_file).ready().tls is True
    monkeypatch.setenv(CA_FILE_ENV, str(ca_file))
    assert ApplianceClient(served.url).ready().tls is True
    monkeypatch.delenv(CA_FILE_ENV)
    with pytest.raises(ApplianceConnectionError, match="certificate is not trusted"):
        ApplianceClient(served.url).ready()


def test_the_cli_takes_the_ca_from_ca_file_or_the_environment(
    served: Served, ca: TestCA, tmp_path: Path
) -> None:
    ca_file = str(ca.write_ca(tmp_path / "ca.pem"))
    env = clean_env(APPLIANCE_URL=served.url)

    def streams(*extra: str, **more: str) -> subprocess.CompletedProcess[str]:
        return run_appliance(["streams", "list", *extra], env={**env, **more}, timeout=60)

    by_option = streams("--ca-file", ca_file)
    assert by_option.returncode == 0 and "cam" in by_option.stdout, by_option.stderr
    by_environment = streams(APPLIANCE_CA_FILE=ca_file)
    assert by_environment.returncode == 0, by_environment.stderr
    untrusted = streams()
    assert untrusted.returncode == 4
    assert "certificate is not trusted" in untrusted.stderr and "--ca-file" in untrusted.stderr
    missing = streams("--ca-file", str(tmp_path / "nothing.pem"))
    assert missing.returncode == 2 and "nothing.pem" in missing.stderr
