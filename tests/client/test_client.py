"""`ApplianceClient` against a live appliance: every route, every error it maps."""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import av
import cv2
import pytest

from appliance.client import ApplianceAPIError, ApplianceClient, ApplianceConnectionError
from appliance.observe.status import ModelStatus, Readiness, StreamStatus
from appliance.server.schemas import Reloaded, Removed
from tests.client import (
    TOKEN,
    WORKFLOW,
    config_path,
    served_appliance,
    stream_doc,
    write_demo_config,
)
from tests.support.appliance import DEMO_CLIP, Served, detect_workflow
from tests.support.processes import free_port

ROUTES = {"/health", "/ready", "/metrics", "/v1/streams", "/v1/streams/{id}",
          "/v1/streams/{id}/restart", "/v1/workflows/run", "/v1/workflows/validate",
          "/v1/models", "/v1/config/reload"}  # fmt: skip
BROKEN = {"name": "broken", "blocks": [{"id": "a", "type": "no_such_block"}], "outputs": {}}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with served_appliance(tmp_path_factory.mktemp("client")) as served:
        yield served


@pytest.fixture
def client(served: Served) -> ApplianceClient:
    return ApplianceClient(served.url, token=TOKEN, timeout=20)


@pytest.fixture(scope="module")
def demo_jpeg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A frame of the demo clip with walkers in it, as a JPEG file."""
    with av.open(str(DEMO_CLIP)) as container:
        for index, frame in enumerate(container.decode(video=0)):
            if index == 60:  # 4 s in: a walker on the lawn
                ok, jpeg = cv2.imencode(".jpg", frame.to_ndarray(format="bgr24"))
                break
    assert ok
    path = tmp_path_factory.mktemp("image") / "frame.jpg"
    path.write_bytes(jpeg.tobytes())
    return path


def api_error(call: Any, *args: Any) -> ApplianceAPIError:
    with pytest.raises(ApplianceAPIError) as caught:
        call(*args)
    return caught.value


def raw_json(served: Served, path: str) -> Any:
    """The answer as sent, not parsed by the client."""
    req = urllib.request.Request(served.url + path, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=20) as resp:
        return json.loads(resp.read())


def field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_probes_and_metrics(client: ApplianceClient, served: Served) -> None:
    assert client.health() == {"status": "ok"}
    served.wait_for(lambda: client.ready().ready, 30, "/ready")
    ready = client.ready()
    assert isinstance(ready, Readiness)
    assert (ready.ready, ready.models, ready.waiting) == (True, ["person"], [])
    assert ready.profiling.enabled is True
    assert set(raw_json(served, "/ready")) == field_names(Readiness)
    assert 'appliance_stream_up{stream="people-cam"} 1.0' in client.metrics()


def test_streams_have_the_documented_shape(client: ApplianceClient, served: Served) -> None:
    served.wait_for(lambda: client.stream("people-cam").frames_processed > 0, 30, "frames")
    (listed,) = [s for s in client.streams() if s.id == "people-cam"]
    assert isinstance(listed, StreamStatus)
    assert listed.workflow == "people_counter"
    assert listed.url == str(DEMO_CLIP)
    one = client.stream("people-cam")
    assert [t.state for t in one.transitions][:2] == ["starting", "running"]
    # The wire shape is the dataclass's, field for field (appliance/observe/status.py).
    assert set(raw_json(served, "/v1/streams/people-cam")) == field_names(StreamStatus)


def test_add_restart_and_remove_a_stream(client: ApplianceClient) -> None:
    added = client.add_stream(stream_doc("added-cam"))
    assert (added.id, added.workflow) == ("added-cam", "people_counter")
    assert "added-cam" in {s.id for s in client.streams()}
    before = time.time()
    assert client.restart_stream("added-cam").id == "added-cam"
    first = client.stream("added-cam").transitions[0]
    assert first.state == "starting" and first.time >= before  # a fresh stream
    # The same instant for people: ISO 8601 UTC, to the millisecond.
    assert first.at.endswith("Z") and "T" in first.at
    at = datetime.fromisoformat(first.at.replace("Z", "+00:00"))
    assert abs(at.timestamp() - first.time) < 0.001
    assert client.remove_stream("added-cam") == Removed(
        id="added-cam", removed=True, threads_joined=True
    )
    assert "added-cam" not in {s.id for s in client.streams()}


def test_run_workflow_from_a_file_and_from_bytes(client: ApplianceClient, demo_jpeg: Path) -> None:
    image = cv2.imread(str(demo_jpeg))
    assert image is not None
    result = client.run_workflow(demo_jpeg, detect_workflow(), profile=True)
    assert result.workflow == "detect_person"
    assert result.image_size == [image.shape[1], image.shape[0]]
    assert result.outputs["people"], "walkers are in this frame"
    assert set(result.timings_ms.blocks) == {"people"}
    assert {e["name"] for e in result.trace["traceEvents"]} >= {"workflow.run", "people"}

    by_path = client.run_workflow(demo_jpeg.read_bytes(), str(WORKFLOW))
    assert by_path.workflow == "people_counter"
    assert {"people", "crossings"} <= set(by_path.outputs)
    assert by_path.trace == {}  # no trace unless asked for


def test_validate_workflow(client: ApplianceClient) -> None:
    valid = client.validate_workflow(str(WORKFLOW))
    assert valid.valid is True
    assert "people" in valid.summary
    assert client.validate_workflow(detect_workflow()).valid is True
    error = api_error(client.validate_workflow, BROKEN)
    assert (error.status, error.code) == (422, "invalid")
    assert any("no_such_block" in str(d) for d in error.details)


def test_models(client: ApplianceClient, served: Served) -> None:
    served.wait_for(lambda: client.models()[0].samples > 0, 30, "people-cam's samples")
    (person,) = client.models()
    assert isinstance(person, ModelStatus)
    assert (person.id, person.decoder, person.labels) == ("person", "tf_od", ["person"])
    assert person.batching.max_batch_size == 4
    (wire,) = raw_json(served, "/v1/models")["models"]
    assert set(wire) == field_names(ModelStatus)


def test_reload_applies_the_edited_config(client: ApplianceClient, served: Served) -> None:
    config = config_path(served)
    client.add_stream(stream_doc("api-cam"))  # added over the API: left alone by reloads
    try:
        write_demo_config(config, [stream_doc("file-cam")])
        assert client.reload() == Reloaded(
            added=["file-cam"], removed=[], restarted=[], unchanged=["people-cam"], tls=None
        )
        write_demo_config(config)
        assert client.reload().removed == ["file-cam"]
        assert {s.id for s in client.streams()} == {"people-cam", "api-cam"}
    finally:
        write_demo_config(config)
        client.remove_stream("api-cam")


def test_openapi_documents_every_route(client: ApplianceClient) -> None:
    document = client.openapi()
    assert document["openapi"].startswith("3.1")
    assert set(document["paths"]) >= ROUTES


def test_api_errors_carry_status_code_and_message(client: ApplianceClient) -> None:
    for call in (client.stream, client.remove_stream, client.restart_stream):
        error = api_error(call, "nope")
        assert (error.status, error.code) == (404, "not_found")
        assert "nope" in error.message
    error = api_error(client.add_stream, stream_doc("people-cam"))
    assert (error.status, error.code) == (409, "conflict")
    error = api_error(client.add_stream, stream_doc("broken-cam", BROKEN))
    assert (error.status, error.code) == (422, "invalid")
    assert error.details and any("no_such_block" in str(d) for d in error.details)
    assert "broken-cam" not in {s.id for s in client.streams()}  # nothing started


@pytest.mark.parametrize("token", ["wrong", ""])
def test_a_wrong_or_missing_token_is_401(
    served: Served, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("APPLIANCE_API_TOKEN", raising=False)
    error = api_error(ApplianceClient(served.url, token=token).streams)
    assert (error.status, error.code) == (401, "unauthorized")


def test_the_token_defaults_to_the_environment(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APPLIANCE_API_TOKEN", TOKEN)
    assert "people-cam" in {s.id for s in ApplianceClient(served.url + "/").streams()}


def test_connection_refused_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ApplianceConnectionError, match=f"{url}/health") as caught:
        ApplianceClient(url, token=TOKEN).health()
    assert caught.value.url == f"{url}/health"


class _ProxyError(http.server.BaseHTTPRequestHandler):
    """What a reverse proxy in front of a stopped appliance answers: 502, plain text."""

    def do_GET(self) -> None:
        body = b"upstream unavailable"
        self.send_response(502)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_error_body_of_another_shape_is_kept_as_the_message() -> None:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ProxyError) as proxy:
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            error = api_error(ApplianceClient(f"http://127.0.0.1:{proxy.server_port}").streams)
        finally:
            proxy.shutdown()
    assert (error.status, error.code, error.message) == (502, "bad_gateway", "upstream unavailable")
    assert error.details is None
