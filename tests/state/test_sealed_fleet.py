"""The fleet gateway's store keeps camera credentials as a replica's state does (issue 39,
item 5; appliance/workers/fleetstore.py): masked in `fleet.json`, the whole URL sealed
under APPLIANCE_STATE_KEY; without a key the gateway refuses such a camera (422) before
it forwards anything. The gateway runs in-process on a loopback port; its one replica is
an address where nothing listens, so a camera that was forwarded would answer 503.

Before, `fleet.json` held each camera's URL as it was given, and the gateway forwarded it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.fernet import Fernet

from appliance.config import parse_config
from appliance.policy.files import FilePolicy
from appliance.server.auth import AuthPolicy
from appliance.workers.fleetserve import FleetProcess
from appliance.workers.fleetstore import FleetStore
from appliance.workers.replicas import Address
from tests.state.conftest import DRAW
from tests.support.processes import free_port

TOKEN = "fleet-s3cret"
PW = f"pw-{uuid.uuid4().hex}"
URL = f"rtsp://admin:{PW}@127.0.0.1:9/live"
KEY_ENV = "APPLIANCE_STATE_KEY"


def camera(stream_id: str, url: str = URL) -> dict[str, Any]:
    return {"id": stream_id, "source": {"url": url}, "workflow": DRAW}


def store_with_key(folder: Path, monkeypatch: pytest.MonkeyPatch) -> FleetStore:
    """A store of `folder` started with a new APPLIANCE_STATE_KEY in its environment."""
    monkeypatch.setenv(KEY_ENV, Fernet.generate_key().decode())
    return FleetStore(folder, FilePolicy.owner(parse_config({}, folder)))


async def post_through_gateway(folder: Path, body: dict[str, Any]) -> tuple[int, Any]:
    config = parse_config({"server": {"token": TOKEN}, "streams": []}, folder)
    replica = Address("127.0.0.1", free_port())  # nothing listens there
    port = free_port()
    process = FleetProcess(
        config, [replica], AuthPolicy.admin_only(TOKEN), "127.0.0.1", port, folder / "state"
    )
    await process.startup()
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{port}/v1/streams", json=body, headers=headers) as r,
        ):
            return r.status, await r.json()
    finally:
        await process.shutdown()


def test_the_gateway_refuses_a_camera_with_credentials_without_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    status, answer = asyncio.run(post_through_gateway(tmp_path, camera("door")))
    assert status == 422, answer
    [detail] = answer["error"]["details"]
    assert detail.startswith("source.url: ") and KEY_ENV in detail, detail
    assert PW not in json.dumps(answer)
    assert not (tmp_path / "state" / "fleet.json").exists()


def test_the_store_keeps_urls_sealed_and_gives_them_back_with_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_with_key(tmp_path, monkeypatch)
    asyncio.run(store.put("door", camera("door")))
    asyncio.run(store.put("yard", camera("yard", "rtsp://127.0.0.1:9/yard")))
    data = (tmp_path / "fleet.json").read_bytes()
    assert PW.encode() not in data
    kept = json.loads(data)
    assert kept["streams"]["door"]["source"]["url"] == "rtsp://***:***@127.0.0.1:9/live"
    assert set(kept["sealed"]) == {"door"}

    again = FleetStore(tmp_path, FilePolicy.owner(parse_config({}, tmp_path)))  # same key
    again.load()
    assert again.specs == {
        "door": camera("door"),
        "yard": camera("yard", "rtsp://127.0.0.1:9/yard"),
    }


def test_a_camera_sealed_under_another_key_is_kept_and_not_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    asyncio.run(store_with_key(tmp_path, monkeypatch).put("door", camera("door")))
    token = json.loads((tmp_path / "fleet.json").read_bytes())["sealed"]["door"]

    other = store_with_key(tmp_path, monkeypatch)  # another key
    other.load()
    assert other.specs == {}  # never POSTed to a replica with a masked URL
    assert any(
        "door" in r.getMessage() and KEY_ENV in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR
    )
    asyncio.run(other.put("yard", camera("yard", "rtsp://127.0.0.1:9/yard")))
    assert json.loads((tmp_path / "fleet.json").read_bytes())["sealed"]["door"] == token


def test_a_clear_store_from_an_older_version_loads_and_is_sealed_with_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = {
        "format": "appliance-state",
        "kind": "fleet",
        "version": 1,
        "saved_at": 0.0,
        "streams": {"door": camera("door")},
    }
    (tmp_path / "fleet.json").write_text(json.dumps(doc))
    store = store_with_key(tmp_path, monkeypatch)
    store.load()
    assert store.specs == {"door": camera("door")}
    assert PW.encode() not in (tmp_path / "fleet.json").read_bytes()
