"""One secret planted wherever a URL or a credential enters the appliance (the config, the
API, the CLI's `--url` and `--token`), then looked for in everything that comes out: logs,
every GET answer of the route table, /metrics, error answers, Chrome traces, CLI output.

Each check also asserts that the output did speak of the stream, its URL or the request,
so a broken `mask_url` fails here rather than passing on silence.
"""

from __future__ import annotations

import functools
import http.client
import json
import logging
import subprocess
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.client import ApplianceClient
from appliance.config import ConfigError, parse_config
from appliance.server.routes import ROUTES
from appliance.server.routing import Route
from tests.server.conftest import WAIT_S, config_doc, demo_stream
from tests.server.live import LiveServer, Reply, wait_for, write_yaml
from tests.support.appliance import ROOT, Served, clean_env, detect_workflow
from tests.support.processes import free_port
from tests.support.warm_cli import run_appliance

SECRET = f"s3cr3t-{uuid.uuid4().hex}"
FAST_RETRY = {"open_timeout_s": 2, "backoff": {"initial_s": 0.05, "max_s": 0.2}}
RECONNECTS = 2  # reconnect lines (with the URL) to wait for


def rtsp_url(port: int) -> str:
    """A camera on a closed port: it reconnects, naming its URL each time."""
    return (
        f"rtsp://admin:{SECRET}@127.0.0.1:{port}/live?user=admin&password={SECRET}&token={SECRET}"
    )


def http_url(port: int) -> str:
    return f"http://admin:{SECRET}@127.0.0.1:{port}/video?user=admin&api_key={SECRET}"


def secret_stream(stream_id: str, url: str) -> dict[str, Any]:
    return {"id": stream_id, "source": {"url": url, **FAST_RETRY}, "workflow": detect_workflow()}


def assert_clean(where: str, text: str, *mentions: str) -> None:
    """No secret in `text`, which does mention every one of `mentions`."""
    assert SECRET not in text, f"the secret leaked in {where}:\n{text[:3000]}"
    for mention in mentions:
        assert mention in text, f"{where} does not mention {mention!r}:\n{text[:3000]}"


# -- in process: the config and the API ---------------------------------------------
@pytest.fixture
def secret_server(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[LiveServer]:
    """A live server (token: the secret) with a demo clip and a secret camera, `cam`;
    every record from its start on is captured."""
    caplog.set_level(logging.DEBUG)
    doc = config_doc(demo_stream("clip"), secret_stream("cam", rtsp_url(free_port())), token=SECRET)
    doc["profiling"] = {"dir": str(tmp_path / "traces"), "rotate_s": 0.5, "max_window_s": 5}
    # A TURN server's credential: config only (no session uses it in this test).
    doc["webrtc"] = {"ice_servers": [{"urls": ["turn:127.0.0.1:3478"], "username": "viewer",
                                      "credential": SECRET}]}  # fmt: skip
    # Sink credentials, each toward a closed port so that they fail, retry and log: an MQTT
    # password, and a webhook's URL userinfo and query, HMAC key and header value.
    doc["sinks"] = {
        "bus": {"type": "mqtt", "port": free_port(), "username": "admin", "password": SECRET},
        "hook": {"type": "webhook", "url": http_url(free_port()), "secret": SECRET,
                 "headers": {"X-Api-Key": SECRET}, "retries": 1,
                 "backoff": {"initial_s": 0.05, "max_s": 0.1}},
    }  # fmt: skip
    doc["streams"][0]["outputs"] = ["bus", "hook"]  # the clip's results go to both
    live = LiveServer(write_yaml(tmp_path, doc, "config.yaml"), token=SECRET).start()
    try:
        yield live
    finally:
        if live.clean is None:  # the test stops it itself to read the shutdown's trace
            live.stop()


def test_no_answer_log_or_trace_of_a_live_server_holds_the_secret(
    secret_server: LiveServer, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    live = secret_server
    added = live.call(
        "POST", "/v1/streams", json_body=secret_stream("api-cam", http_url(free_port()))
    )
    assert added.status == 201, added.body
    assert_clean("POST /v1/streams", added.body.decode(), "http://***:***@127.0.0.1", "api_key=***")
    for sid in ("cam", "api-cam"):
        wait_for(functools.partial(_retried, live, sid), WAIT_S, f"{sid} retrying")
    wait_for(functools.partial(_sinks_failed, live), WAIT_S, "both sinks failing")
    window = profiling_window(live)

    _check_refusals(live)
    _check_reload_refused(live)
    for sid in ("clip", "cam", "api-cam"):  # a shadow each, for its GET route below
        shadow = live.call("POST", f"/v1/streams/{sid}/shadow", json_body={"workflow": DRAW})
        assert shadow.status == 201, shadow.body
    _check_get_routes(live, ["clip", "cam", "api-cam"], window)
    assert live.stop(), "unclean shutdown"
    records = [*caplog.get_records("setup"), *caplog.records]
    log = "\n".join(logging.Formatter("%(name)s: %(message)s").format(r) for r in records)
    assert_clean("the log", log, "reconnecting", "password=***&token=***", "api_key=***",
                 "mqtt sink bus", "webhook hook")  # fmt: skip
    _check_traces(tmp_path / "traces")


def _sinks_failed(live: LiveServer) -> bool:
    """Both sinks have a last error: the MQTT connection refused, a webhook POST failed."""
    sinks = {s["name"]: s for s in live.get_json("/v1/sinks")["sinks"]}
    return all(sinks[name]["last_error"] for name in ("bus", "hook"))


def _retried(live: LiveServer, stream_id: str) -> bool:
    return int(live.stream(stream_id)["reconnects"]) >= RECONNECTS


def profiling_window(live: LiveServer) -> str:
    """A 1 s window over every stream, ended; its id."""
    reply = live.call("POST", "/v1/profiling", json_body={"duration_s": 1})
    assert reply.status == 202, reply.body
    path = f"/v1/profiling/{reply.json()['id']}"
    wait_for(lambda: live.get_json(path)["state"] != "running", WAIT_S, "the window to end")
    assert live.get_json(path)["state"] == "done"
    return str(reply.json()["id"])


def _check_refusals(live: LiveServer) -> None:
    """Bad stream configs whose answer would echo the secret URL."""
    url = rtsp_url(free_port())
    workflow = detect_workflow()
    refused = [
        ({"id": "bad", "source": {"url": [url]}, "workflow": workflow}, "source.url"),
        ({"id": "bad", "source": {"url": url, "transport": url}, "workflow": workflow}, "***"),
        ({"id": url, "source": url, "workflow": workflow}, "password=***"),
        (
            {"id": "bad", "source": f"cam.local/live?password={SECRET}", "workflow": workflow},
            "cam.local/live?password=***",
        ),
        ({"id": "cam", "source": url, "workflow": workflow}, "cam"),  # exists already
    ]
    for body, mention in refused:
        reply = live.call("POST", "/v1/streams", json_body=body)
        assert 400 <= reply.status < 500, reply.body
        assert_clean(f"the {reply.status} answer", reply.body.decode(), mention)


def _check_reload_refused(live: LiveServer) -> None:
    """The config file edited with a bad stream: the refusal names it, masked."""
    doc = yaml.safe_load(live.config_path.read_text(encoding="utf-8"))
    bad = secret_stream("bad", rtsp_url(free_port()))
    bad["source"]["transport"] = bad["source"]["url"]
    live.config_path.write_text(yaml.safe_dump({**doc, "streams": [*doc["streams"], bad]}))
    reply = live.call("POST", "/v1/config/reload")
    assert reply.status == 422, reply.body
    assert_clean("the refused reload", reply.body.decode(), "transport", "password=***")


DRAW = {"name": "draw", "blocks": [{"id": "drawn", "type": "annotate"}],
        "outputs": {"video": "drawn"}}  # fmt: skip


def get_routes(
    live: LiveServer, stream_ids: list[str], window: str
) -> Iterator[tuple[Route, str, Reply]]:
    """(route, path, answer) for every GET route of the table, `{id}` filled with every
    stream or the window. The streaming ones (events, MJPEG) never end; they send what
    `latest` answers."""
    ids = {"/v1/streams/": stream_ids, "/v1/profiling/": [window], "/streams/": stream_ids}
    for route in (r for r in ROUTES if r.method == "GET" and not r.streaming):
        prefix, has_id, suffix = route.path.partition("{id}")
        assert not has_id or prefix in ids, f"fill {route.path}'s id in this test"
        suffix = suffix.replace("{seq}", "0")  # a frame's trace: frame 0
        for path in [prefix + i + suffix for i in ids[prefix]] if has_id else [route.path]:
            yield route, path, live.call("GET", path)


def _check_get_routes(live: LiveServer, stream_ids: list[str], window: str) -> None:
    answers = []
    for route, path, reply in get_routes(live, stream_ids, window):
        # These cameras never connect: their results routes answer "no result yet", and
        # their frame 0 is in no trace.
        no_result = reply.status == 404 and (route.tag == "results" or "{seq}" in route.path)
        assert reply.status == 200 or no_result, (path, reply.status, reply.body[:300])
        text = reply.body.decode(errors="replace")  # snapshot.jpg is a JPEG
        assert_clean(path, text)
        answers.append(text)
    every = "\n".join(answers)
    assert_clean("the GET answers", every, "rtsp://***:***@127.0.0.1", "password=***&token=***",
                 '"name": "bus"', '"name": "hook"')  # fmt: skip
    assert 'stream="cam"' in live.call("GET", "/metrics").body.decode()


def _check_traces(folder: Path) -> None:
    """The window's trace and the rolling ones, the last written at shutdown."""
    files = sorted(p for p in folder.rglob("*.json") if p.is_file())
    assert any(p.parent.name == "rolling" for p in files), files
    assert any(p.parent.name == "windows" for p in files), files
    for path in files:
        assert_clean(str(path), path.read_text(encoding="utf-8"))
    assert_clean("the traces", "".join(p.read_text(encoding="utf-8") for p in files), '"clip"')


# -- out of process: `appliance serve` and the CLI -------------------------------------
def appliance(*args: str) -> subprocess.CompletedProcess[str]:
    """The `appliance` command as a user runs it; no APPLIANCE_* variables
    (tests/support/warm_cli.py)."""
    return run_appliance(args, timeout=30, cwd=ROOT, env=clean_env())


def test_no_log_or_cli_message_holds_the_secret(
    serve: Callable[..., Served], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    doc = config_doc(secret_stream("cam", rtsp_url(free_port())), token=SECRET)
    served = serve(write_config(doc), "-v")  # DEBUG: the access lines as well
    secret_url = served.url.replace("http://", f"http://admin:{SECRET}@")
    client = ApplianceClient(secret_url, token=SECRET, timeout=10)
    served.wait_for(lambda: client.stream("cam").reconnects >= RECONNECTS, WAIT_S, "retries")

    outputs = list(_requests_with_secret_lines(served))
    outputs.extend(_cli_runs(secret_url, served.url))
    assert served.terminate() == 0
    log = served.log_path.read_text(encoding="utf-8")
    assert_clean("the serve log", log, "reconnecting", "password=***&token=***", "token=*** HTTP")
    for where, text, mention in outputs:
        assert_clean(where, text, mention)


def _requests_with_secret_lines(served: Served) -> Iterator[tuple[str, str, str]]:
    """Secrets in request paths and queries: the access log and the 404 must mask them."""
    for path, mention in (
        (f"/v1/streams/cam?token={SECRET}", '"id": "cam"'),
        (f"/v1/nope;password={SECRET}", "no route GET /v1/nope;password=***"),
        (f"/health?api_key={SECRET}", '"status": "ok"'),
    ):
        conn = http.client.HTTPConnection("127.0.0.1", int(served.url.rsplit(":", 1)[1]))
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {SECRET}"})
            body = conn.getresponse().read().decode()
        finally:
            conn.close()
        yield f"GET {path.replace(SECRET, '...')}", json.dumps(json.loads(body)), mention


def _cli_runs(secret_url: str, url: str) -> Iterable[tuple[str, str, str]]:
    """(what ran, its stdout and stderr, what it must mention) for each CLI command."""
    echoed = rtsp_url(free_port())
    source = json.dumps({"url": echoed, "transport": echoed})  # 422 echoes the transport
    closed = f"http://admin:{SECRET}@127.0.0.1:{free_port()}"
    add = ("streams", "add", "--workflow", json.dumps(detect_workflow()), "--source")
    runs = [
        (("streams", "list"), secret_url, 0, "rtsp://***:***@"),
        (("streams", "list", "--json"), secret_url, 0, "password=***"),
        (("status",), secret_url, 0, "http://***:***@127.0.0.1"),
        (("status", "--json"), secret_url, 0, "http://***:***@"),
        ((*add, rtsp_url(free_port()), "--id", "cli-cam"), secret_url, 0, "cli-cam"),
        ((*add, source, "--id", "bad"), url, 1, "password=***"),
        (("streams", "list"), closed, 4, "http://***:***@127.0.0.1"),
    ]
    for args, target, code, mention in runs:
        done = appliance(*args, "--url", target, "--token", SECRET)
        assert done.returncode == code, (args[:2], done.stdout, done.stderr)
        yield f"appliance {' '.join(args[:2])}", done.stdout + done.stderr, mention


@pytest.mark.parametrize(
    "doc",
    [
        {"webrtc": {"ice_servers": [{"urls": ["turn:x"], "credential": SECRET * 10}]}},
        {"server": {"token": ["not", "a", "string", SECRET]}},
    ],
)
def test_a_config_error_does_not_echo_a_secret_field(doc: dict[str, Any], tmp_path: Path) -> None:
    """A secret too long, or of the wrong type: the error names the field and the
    problem, not the value."""
    with pytest.raises(ConfigError) as refused:
        parse_config(doc, tmp_path)
    text = str(refused.value)
    assert SECRET not in text and "not shown" in text, text
    # Other fields' values are still shown: they are what a user needs to fix them.
    with pytest.raises(ConfigError, match="got 'fast'"):
        parse_config({"webrtc": {"max_fps": "fast"}}, tmp_path)
