"""Camera credentials of streams added over the API are never kept in clear in the state
folder (issue 39, item 5; appliance/runtime/sealing.py): the document holds the URL
masked and the whole URL sealed under APPLIANCE_STATE_KEY; without a key a camera with
credentials is refused (422) when there is a folder; a document written in clear by an
older version still loads. The camera is a real RTSP server that requires the password,
so a stream that runs after a restart had it back.

Before, `<state_dir>/streams.json` held `rtsp://admin:<password>@...` as it was given.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from appliance.config import StreamConfig
from appliance.runtime.runtime import Runtime
from appliance.runtime.sharding import Shard
from appliance.runtime.statefile import write_document
from tests.server.live import LiveServer, wait_for
from tests.state.conftest import DRAW, Boot, config_doc, origins, write_config
from tests.support.rtsp import RtspServer, RtspServerFactory

USER = "admin"
PW = f"pw-{uuid.uuid4().hex}"
KEY_ENV = "APPLIANCE_STATE_KEY"
WAIT_S = 30.0


def camera(stream_id: str, url: str) -> dict[str, Any]:
    return {"id": stream_id, "source": {"url": url, "open_timeout_s": 5}, "workflow": DRAW}


def add_door(rt: Runtime, url: str) -> None:
    """The camera `door` at `url`, added over the API."""
    rt.add_stream(StreamConfig.model_validate(camera("door", url)), requested=True)


def document(folder: Path) -> bytes:
    return (folder / "state" / "streams.json").read_bytes()


def assert_no_password(data: bytes) -> None:
    assert PW.encode() not in data
    assert base64.b64encode(f"{USER}:{PW}".encode()) not in data


def wait_running(rt: Runtime, stream_id: str) -> None:
    """Until the stream runs: the camera let it in, so its password came back whole."""
    wait_for(lambda: rt.stream_status(stream_id).state == "running", WAIT_S, f"{stream_id} running")


@pytest.fixture
def guarded(rtsp_server: RtspServerFactory) -> RtspServer:
    """A camera that answers only with the password."""
    return rtsp_server(auth=f"{USER}:{PW}")


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    value = Fernet.generate_key().decode()
    monkeypatch.setenv(KEY_ENV, value)
    return value


@pytest.mark.rtsp
def test_the_document_holds_no_password_and_a_restart_brings_the_camera_back(
    tmp_path: Path, boot: Boot, guarded: RtspServer, key: str
) -> None:
    url = guarded.url_with_credentials(USER, PW)
    path = write_config(tmp_path / "config.yaml", config_doc())
    rt = boot(path)
    add_door(rt, url)

    data = document(tmp_path)
    assert_no_password(data)
    entry = json.loads(data)["streams"]["door"]
    assert entry["spec"]["source"]["url"] == f"rtsp://***:***@127.0.0.1:{guarded.port}/stream"
    assert entry["sealed_url"]  # the whole URL, sealed beside it

    rt = boot(path)  # restarted: unsealed with the key
    assert origins(rt) == {"door": "api"}
    assert rt.streams.declared["door"].source.url == url
    wait_running(rt, "door")  # the camera let it in: the password came back whole


@pytest.mark.rtsp
def test_another_key_leaves_the_stream_stopped_and_kept_until_the_right_one(
    tmp_path: Path,
    boot: Boot,
    guarded: RtspServer,
    key: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = write_config(tmp_path / "config.yaml", config_doc())
    rt = boot(path)
    url = guarded.url_with_credentials(USER, PW)
    add_door(rt, url)
    sealed = document(tmp_path)

    monkeypatch.setenv(KEY_ENV, Fernet.generate_key().decode())
    rt = boot(path)
    assert origins(rt) == {}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("'door'" in m and KEY_ENV in m and "another key" in m for m in errors), errors
    assert document(tmp_path) == sealed  # kept as it was

    monkeypatch.setenv(KEY_ENV, key)
    rt = boot(path)
    wait_running(rt, "door")


def test_without_a_key_a_camera_with_credentials_is_refused_and_nothing_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    server = LiveServer(write_config(tmp_path / "config.yaml", config_doc())).start()
    try:
        for url in (f"rtsp://{USER}:{PW}@127.0.0.1:9/x", f"http://127.0.0.1:9/x?password={PW}"):
            reply = server.call("POST", "/v1/streams", json_body=camera("door", url))
            assert reply.status == 422, reply.body
            [detail] = reply.error["details"]
            assert detail.startswith("source.url: ") and KEY_ENV in detail, detail
            assert PW not in reply.body.decode()
        assert server.get_json("/v1/streams")["streams"] == []
        state = tmp_path / "state"
        assert (
            not (state / "streams.json").exists() or PW not in (state / "streams.json").read_text()
        )
        # A camera without credentials is kept as before.
        reply = server.call("POST", "/v1/streams", json_body=camera("yard", "rtsp://127.0.0.1:9/x"))
        assert reply.status == 201, reply.body
    finally:
        server.stop()


def test_without_a_state_folder_a_camera_with_credentials_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    doc = config_doc()
    del doc["server"]["state_dir"]
    server = LiveServer(write_config(tmp_path / "config.yaml", doc)).start()
    try:
        body = camera("door", f"rtsp://{USER}:{PW}@127.0.0.1:9/x")
        reply = server.call("POST", "/v1/streams", json_body=body)
        assert reply.status == 201, reply.body  # nothing is kept, nothing to seal
    finally:
        server.stop()


def clear_document(tmp_path: Path, url: str) -> None:
    """A streams document as an older version wrote it: the URL in clear."""
    spec = StreamConfig.model_validate(camera("door", url)).model_dump(mode="json")
    entry = {"spec": spec, "over": None, "at": time.time()}
    (tmp_path / "state").mkdir()
    write_document(tmp_path / "state" / "streams.json", "streams", {"streams": {"door": entry}})


@pytest.mark.rtsp
def test_a_clear_document_from_an_older_version_is_sealed_at_a_start_with_a_key(
    tmp_path: Path, boot: Boot, guarded: RtspServer, key: str
) -> None:
    url = guarded.url_with_credentials(USER, PW)
    clear_document(tmp_path, url)
    rt = boot(write_config(tmp_path / "config.yaml", config_doc()))
    wait_running(rt, "door")
    assert_no_password(document(tmp_path))
    assert json.loads(document(tmp_path))["streams"]["door"]["sealed_url"]


@pytest.mark.rtsp
def test_a_clear_document_from_an_older_version_runs_without_a_key_with_a_warning(
    tmp_path: Path,
    boot: Boot,
    guarded: RtspServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    url = guarded.url_with_credentials(USER, PW)
    clear_document(tmp_path, url)
    before = document(tmp_path)
    rt = boot(write_config(tmp_path / "config.yaml", config_doc()))
    wait_running(rt, "door")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("in clear" in m and "'door'" in m and KEY_ENV in m for m in warnings), warnings
    assert document(tmp_path) == before


@pytest.mark.rtsp
def test_a_workers_document_is_sealed_and_taken_over_sealed(
    tmp_path: Path, boot: Boot, guarded: RtspServer, key: str
) -> None:
    url = guarded.url_with_credentials(USER, PW)
    path = write_config(tmp_path / "config.yaml", config_doc())
    rt = boot(path, Shard(1, 2))  # worker 1 of `serve --workers 2`
    add_door(rt, url)
    assert_no_password((tmp_path / "state" / "worker-1.json").read_bytes())

    rt = boot(path)  # one process now: it takes worker 1's document over
    wait_running(rt, "door")
    assert not (tmp_path / "state" / "worker-1.json").exists()
    assert_no_password(document(tmp_path))
