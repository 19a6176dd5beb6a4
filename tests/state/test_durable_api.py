"""The state folder over HTTP: a refused state document shows in /ready and the process
starts from the config; a change that cannot be saved is undone and answered 503."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.live import LiveServer
from tests.state.conftest import cam, config_doc, write_config


@pytest.fixture
def served(tmp_path: Path) -> Iterator[list[LiveServer]]:
    started: list[LiveServer] = []
    yield started
    for server in started:
        server.stop()


def start(served: list[LiveServer], path: Path) -> LiveServer:
    server = LiveServer(path)
    served.append(server)
    return server.start()


def listed(server: LiveServer) -> dict[str, str]:
    return {s["id"]: s["origin"] for s in server.get_json("/v1/streams")["streams"]}


def test_a_corrupt_state_file_is_kept_aside_and_ready_says_so(
    tmp_path: Path, served: list[LiveServer]
) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "streams.json").write_text('{"streams": {"x": ')  # cut short
    server = start(served, write_config(tmp_path / "config.yaml", config_doc(cam("a"))))
    assert listed(server) == {"a": "config"}  # from the config alone
    kept = [p.name for p in (tmp_path / "state").iterdir()]
    assert len(kept) == 1 and kept[0].startswith("streams.json.refused-"), kept
    state: dict[str, Any] = server.call("GET", "/ready").json()["state"]
    assert state["problem"].startswith(f"state file {tmp_path / 'state' / 'streams.json'}: ")
    assert "not JSON" in state["problem"] and kept[0] in state["problem"]
    assert (state["dir"], state["file"], state["streams"]) == ("state", "streams.json", 0)

    added = server.call("POST", "/v1/streams", json_body=cam("x"))
    assert added.status == 201, added.body
    assert added.json()["origin"] == "api"
    state = server.call("GET", "/ready").json()["state"]
    assert state["streams"] == 1 and kept[0] in state["problem"]  # said until a restart


def test_a_change_that_cannot_be_saved_is_undone_and_answered_503(
    tmp_path: Path, served: list[LiveServer]
) -> None:
    # The folder's parent is a regular file: no process can create it, root included.
    (tmp_path / "blocker").write_text("not a folder")
    doc = config_doc(cam("a"), state_dir="blocker/state")
    server = start(served, write_config(tmp_path / "config.yaml", doc))
    assert listed(server) == {"a": "config"}

    added = server.call("POST", "/v1/streams", json_body=cam("x"))
    assert added.status == 503, added.body
    assert added.error["code"] == "unavailable"
    message = added.error["message"]
    assert "state folder blocker/state" in message and "Not a directory" in message, message
    assert listed(server) == {"a": "config"}  # x is not left running

    removed = server.call("DELETE", "/v1/streams/a")
    assert removed.status == 503, removed.body
    assert "state folder blocker/state" in removed.error["message"]
    assert listed(server) == {"a": "config"}  # nor a stopped
    assert server.call("GET", "/health").status == 200
