"""`appliance gateway --replicas`: one API in front of replicas, with real processes on
loopback standing in for pods (issue 29).

One fleet (`fleet`) serves the module, in this order. It is first two replicas
(`serve --shard I/2`, each its own state folder) and a gateway, through which one camera
is added; then the whole fleet restarts as three (`--shard I/3`, a gateway with three
addresses and the same state folder), which moves that camera to its new owner. The
tests then read it (lists, per-stream routes, WebRTC), add and remove a camera, stop a
replica (SIGSTOP) and kill one (SIGKILL), which comes back from its own state. A test
that needs a camera where an earlier one leaves it waits for it (the moved camera on its
new owner) or adds it (the camera added here), so each passes alone as well.

The replicas run a drawing-only workflow on a tiny looped clip: no model to load, the
cheapest workflow that still yields results and video, on this 2-core machine.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCSessionDescription
from pydantic import TypeAdapter

from appliance.config import parse_config
from appliance.observe.status import StreamStatus
from appliance.policy.files import FilePolicy
from appliance.runtime.sharding import assign, owner_of
from appliance.server.auth import AuthPolicy
from appliance.server.routes import ROUTES
from appliance.workers.clients import MemberClients
from appliance.workers.fleet import FLEET_FORWARD, FLEET_OWN, Fleet
from appliance.workers.fleetstore import FleetStore
from appliance.workers.gateway import plan
from appliance.workers.replicas import Address, ReplicaSet, parse_replicas
from tests.support.appliance import Served, launch
from tests.support.media import MakeClip
from tests.support.processes import free_port
from tests.support.warm_cli import run_appliance
from tests.support.webrtc import recvonly_offer

TOKEN = "fleet-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CAMERAS = ["lobby", "dock", "gate"]  # the config's: one per replica of three (assign)
DRAW = {
    "name": "draw",
    "blocks": [{"id": "drawn", "type": "annotate"}],
    "outputs": {"video": "drawn"},
}
UP_S = 60.0  # a process's start, several at once on two cores
# A stopped replica is down once a probe of it times out: a probe every 2 s, 3 s each
# (appliance/workers/replicas.py); a list in flight meanwhile waits out its own 5 s
# (workers/gateway.py). About 10 s at most, twice that on a loaded box.
DOWN_S = 20.0
MOVE_S = 30.0  # the gateway's moves: a pass at its start, then one every few seconds


def _added(owner: int, moves: bool, taken: tuple[str, ...] = ()) -> str:
    """An id whose owner of three is `owner`; `moves`: its owner of two differs."""
    for n in range(1000):
        stream_id = f"added-{n}"
        if stream_id in taken or owner_of(stream_id, 3) != owner:
            continue
        if (owner_of(stream_id, 2) != owner) == moves:
            return stream_id
    raise AssertionError("no such id")


MOVED = _added(2, moves=True)  # added to the fleet of two; replica 2 owns it among three
ADDED = _added(1, moves=False, taken=(MOVED,))  # added to the fleet of three


def call(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **AUTH}
    req = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw.startswith((b"{", b"[")) else raw
    except urllib.error.HTTPError as err:
        raw = err.read()
        return err.code, json.loads(raw) if raw.startswith(b"{") else raw


def healthy(served: Served) -> bool:
    return served.get("/health")[0] == 200


def answers(served: Served, path: str) -> bool:
    return call(served.url, "GET", path)[0] == 200


def listed(url: str) -> dict[str, dict[str, Any]]:
    status, body = call(url, "GET", "/v1/streams")
    assert status == 200, body
    return {s["id"]: s for s in body["streams"]}


@dataclass
class LiveFleet:
    """The module's fleet: its folder, its replicas (by index) and its gateway."""

    folder: Path
    config: Path
    ports: list[int]
    replicas: dict[int, Served] = field(default_factory=dict)
    gateway: Served | None = None

    def launch(self, argv: list[str], port: int, name: str) -> Served:
        return launch(argv, port, self.folder, name=name)

    def start_replica(self, index: int, count: int) -> Served:
        """`serve --shard index/count` on its port, with its own state folder."""
        port, state = self.ports[index], self.folder / f"state-{index}"
        argv = ["serve", "--config", str(self.config), "--port", str(port)]
        argv += ["--shard", f"{index}/{count}", "--state-dir", str(state)]
        self.replicas[index] = self.launch(argv, port, f"replica-{index}")
        return self.replicas[index]

    def start(self, count: int) -> None:
        """`count` replicas (`--shard I/count`) and a gateway in front of them, up."""
        for i in range(count):
            self.start_replica(i, count)
        addresses = ",".join(f"127.0.0.1:{p}" for p in self.ports[:count])
        port = self.ports[-1]
        argv = ["gateway", "--replicas", addresses, "--config", str(self.config)]
        argv += ["--port", str(port), "--state-dir", str(self.folder / "gateway")]
        self.gateway = self.launch(argv, port, "gateway")
        for served in [*self.replicas.values(), self.gateway]:
            served.wait_for(functools.partial(healthy, served), UP_S, "/health")
        self.gateway.wait_for(self.all_up, UP_S, "the gateway to see every replica up")

    def all_up(self) -> bool:
        replicas = json.loads(self.gw.get("/health")[1])["replicas"]
        return all(r["state"] == "up" for r in replicas)

    def stop(self) -> None:
        for served in [*self.replicas.values(), *([self.gateway] if self.gateway else [])]:
            if served.process.poll() is None:
                served.terminate(15)

    @property
    def gw(self) -> Served:
        assert self.gateway is not None
        return self.gateway

    def runs_on(self, stream_id: str) -> list[int]:
        """The replicas that list `stream_id`, each asked directly."""
        return [i for i, r in sorted(self.replicas.items()) if stream_id in listed(r.url)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, make_clip: MakeClip) -> Iterator[LiveFleet]:
    folder = tmp_path_factory.mktemp("fleet")
    clip = make_clip(160, 120, fps=5, seconds=4.0)
    source = {"url": str(clip), "loop": True, "pace": "realtime"}
    doc: dict[str, Any] = {
        "server": {"token": TOKEN, "drain_timeout_s": 2},
        "webrtc": {"host_addresses": ["127.0.0.1"]},  # loopback ICE (TESTBED.md)
        "streams": [{"id": c, "source": source, "workflow": DRAW} for c in CAMERAS],
    }
    config = folder / "config.yaml"
    config.write_text(json.dumps(doc))
    fleet = LiveFleet(folder, config, [free_port() for _ in range(4)])
    try:
        fleet.start(2)  # a camera added to two replicas, then the fleet grows to three
        spec = {**doc["streams"][0], "id": MOVED}
        status, body = call(fleet.gw.url, "POST", "/v1/streams", spec)
        assert status == 201, body
        assert fleet.runs_on(MOVED) == [owner_of(MOVED, 2)]
        fleet.stop()
        fleet.start(3)
        yield fleet
    finally:
        fleet.stop()


def test_the_gateway_lists_every_camera_of_every_replica_with_its_replica(fleet: LiveFleet) -> None:
    assert set(assign(CAMERAS, 3).values()) == {0, 1, 2}  # each replica has one: it means it
    assert fleet.gw.get("/v1/streams")[0] == 401  # the replicas' token, asked here too
    streams = listed(fleet.gw.url)
    assert {s: streams[s]["replica"] for s in CAMERAS} == assign(CAMERAS, 3)
    assert all(streams[s]["state"] != "unavailable" for s in CAMERAS)
    assert all(streams[s]["origin"] == "config" for s in CAMERAS)
    ready = json.loads(fleet.gw.get("/ready")[1])
    assert [r["address"] for r in ready["replicas"]] == [f"127.0.0.1:{p}" for p in fleet.ports[:3]]


def moved(fleet: LiveFleet) -> None:
    """MOVED (added to the fleet of two) runs on its owner of three, and only there."""
    fleet.gw.wait_for(lambda: fleet.runs_on(MOVED) == [2], MOVE_S, f"{MOVED} on replica 2 only")


def added(fleet: LiveFleet) -> dict[str, Any]:
    """The spec of ADDED, a camera added through the gateway (here, unless it is already)."""
    source = {"url": _clip_of(fleet), "loop": True, "pace": "realtime"}
    spec = {"id": ADDED, "source": source, "workflow": DRAW}
    if call(fleet.gw.url, "GET", f"/v1/streams/{ADDED}")[0] == 404:
        status, body = call(fleet.gw.url, "POST", "/v1/streams", spec)
        assert status == 201, body
    return spec


def test_a_camera_added_to_two_replicas_runs_on_its_owner_of_three_and_only_there(
    fleet: LiveFleet,
) -> None:
    moved(fleet)
    assert listed(fleet.gw.url)[MOVED]["replica"] == 2
    log = fleet.gw.log_path.read_text()
    started = log.index(f"camera {MOVED} started on replica 2")
    stopped = log.find(f"camera {MOVED} moved: stopped on replica {owner_of(MOVED, 2)}")
    assert stopped == -1 or started < stopped  # started on its owner before it stopped


def test_per_stream_routes_reach_the_owner(fleet: LiveFleet) -> None:
    for camera in CAMERAS:
        path = f"/v1/streams/{camera}/latest"
        fleet.gw.wait_for(functools.partial(answers, fleet.gw, path), 20, f"a result of {camera}")
        status, body = call(fleet.gw.url, "GET", f"/v1/streams/{camera}")
        assert status == 200 and body["id"] == camera
    assert call(fleet.gw.url, "GET", "/v1/streams/nope/latest")[0] == 404
    # A shadow's calls too: started, read and stopped on the camera's replica.
    camera, candidate = CAMERAS[-1], {**DRAW, "name": "candidate"}
    shadow = f"/v1/streams/{camera}/shadow"
    status, body = call(fleet.gw.url, "POST", shadow, {"workflow": candidate})
    assert status == 201 and body["stream"] == camera, body
    status, body = call(fleet.gw.url, "GET", shadow)
    assert status == 200 and body["workflow"] == "candidate", body
    assert call(fleet.gw.url, "DELETE", shadow)[0] == 200
    assert call(fleet.gw.url, "GET", shadow)[0] == 404


def test_a_webrtc_offer_reaches_the_owner(fleet: LiveFleet) -> None:
    """The offer goes to the camera's replica, which holds the session (its sessions
    gauge, no other replica's), and whose media reaches the viewer."""
    camera = next(c for c, owner in assign(CAMERAS, 3).items() if owner == 1)

    def sessions(index: int) -> str:
        text = fleet.replicas[index].get("/metrics")[1].decode()
        series = f'appliance_webrtc_sessions{{stream="{camera}"}}'
        return next((line for line in text.splitlines() if line.startswith(series)), "")

    async def watch() -> None:
        pc, frames, offer = await recvonly_offer()
        path = f"/v1/streams/{camera}/webrtc"
        status, answer = await asyncio.to_thread(call, fleet.gw.url, "POST", path, offer)
        assert status == 201, answer
        try:
            await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
            assert (await asyncio.wait_for(frames.get(), 20)).width > 0
            assert sessions(1).endswith(" 1.0")
            assert sessions(0) == sessions(2) == ""
            session = f"/v1/webrtc/{answer['session_id']}"
            assert (await asyncio.to_thread(call, fleet.gw.url, "DELETE", session))[0] == 204
        finally:
            await pc.close()

    asyncio.run(watch())


def test_a_camera_added_through_the_gateway_lands_on_its_owner(fleet: LiveFleet) -> None:
    if call(fleet.gw.url, "GET", f"/v1/streams/{ADDED}")[0] == 200:  # a test before added it
        assert call(fleet.gw.url, "DELETE", f"/v1/streams/{ADDED}")[0] == 200
    spec = added(fleet)  # 201
    assert fleet.runs_on(ADDED) == [owner_of(ADDED, 3)] == [1]
    assert call(fleet.gw.url, "POST", "/v1/streams", spec)[0] == 409  # it runs already
    kept = json.loads((fleet.folder / "gateway" / "fleet.json").read_text())
    assert kept["kind"] == "fleet" and sorted(kept["streams"]) == sorted([MOVED, ADDED])


def _clip_of(fleet: LiveFleet) -> str:
    doc = json.loads(fleet.config.read_text())
    return str(doc["streams"][0]["source"]["url"])


def test_a_stopped_replica_shows_its_cameras_unavailable_and_answers_503(fleet: LiveFleet) -> None:
    victim = fleet.replicas[2]
    moved(fleet)  # else it stays where it runs while its owner is down, and is not shown so
    mine = [c for c, owner in assign(CAMERAS, 3).items() if owner == 2] + [MOVED]
    os.kill(victim.process.pid, signal.SIGSTOP)
    try:
        why = f"replica 2 (127.0.0.1:{fleet.ports[2]}) is not answering: timed out"

        def unavailable() -> bool:
            streams = listed(fleet.gw.url)  # 200 all the same
            return all(
                streams[c]["state"] == "unavailable" and why in streams[c]["last_error"]
                for c in mine
            )

        fleet.gw.wait_for(unavailable, DOWN_S, "replica 2's cameras unavailable")
        table = run_appliance(["streams", "list", "--url", fleet.gw.url, "--token", TOKEN])
        assert table.returncode == 0, table.stderr  # the CLI reads a fleet with one down
        assert all(f"{c} " in table.stdout for c in mine) and "unavailable" in table.stdout
        streams = listed(fleet.gw.url)
        assert all(streams[c]["state"] != "unavailable" for c in CAMERAS if c not in mine)
        status, body = call(fleet.gw.url, "GET", f"/v1/streams/{mine[0]}/latest")
        assert status == 503 and why in body["error"]["message"], body
        ready = json.loads(fleet.gw.get("/ready")[1])
        assert ready["ready"] is False and ready["replicas"][2]["state"] == "down"
        assert fleet.gw.get("/health")[0] == 200  # the gateway itself is alive
    finally:
        os.kill(victim.process.pid, signal.SIGCONT)
    fleet.gw.wait_for(lambda: listed(fleet.gw.url)[mine[0]]["state"] != "unavailable", 20, "back")


def test_a_killed_replica_comes_back_with_the_camera_from_its_state(fleet: LiveFleet) -> None:
    added(fleet)
    owner = owner_of(ADDED, 3)
    victim = fleet.replicas[owner]
    mark = len(fleet.gw.log_path.read_text())
    victim.process.kill()
    victim.process.wait(10)
    why = f"replica {owner} (127.0.0.1:{fleet.ports[owner]}) is not answering: connection refused"
    fleet.gw.wait_for(lambda: why in listed(fleet.gw.url)[ADDED]["last_error"], 20, "refused")
    status, body = call(fleet.gw.url, "GET", f"/v1/streams/{ADDED}")
    assert status == 503 and why in body["error"]["message"], body
    back = fleet.start_replica(owner, 3)  # the same port and state folder
    back.wait_for(lambda: ADDED in listed(back.url), UP_S, f"{ADDED} back on replica {owner}")
    assert listed(back.url)[ADDED]["origin"] == "api"
    # From the replica's own state, not started again by the gateway's moves.
    assert f"camera {ADDED} started" not in fleet.gw.log_path.read_text()[mark:]
    fleet.gw.wait_for(lambda: listed(fleet.gw.url)[ADDED]["state"] != "unavailable", 20, "listed")


def test_a_camera_removed_through_the_gateway_is_gone_from_replicas_and_store(
    fleet: LiveFleet,
) -> None:
    added(fleet)
    assert call(fleet.gw.url, "DELETE", f"/v1/streams/{ADDED}")[0] == 200
    assert fleet.runs_on(ADDED) == []
    kept = json.loads((fleet.folder / "gateway" / "fleet.json").read_text())
    assert sorted(kept["streams"]) == [MOVED]
    assert call(fleet.gw.url, "GET", f"/v1/streams/{ADDED}")[0] == 404


# -- without processes ------------------------------------------------------------------
def test_cameras_of_a_replica_never_reached_are_named_with_their_urls_masked(
    tmp_path: Path,
) -> None:
    """A replica down since the gateway started: its config cameras (by the config's
    rule) and the cameras added here that it owns show as unavailable, with the reason
    and their sources' credentials masked."""
    secret = "rtsp://admin:hunter2@10.0.0.9/live?token=abc123"
    config = parse_config(
        {"streams": [{"id": c, "source": secret, "workflow": DRAW} for c in CAMERAS]}, tmp_path
    )
    port = free_port()  # nothing listens there
    replicas = ReplicaSet([Address("127.0.0.1", port)])
    clients = MemberClients(replicas, TOKEN, 5.0)
    store = FleetStore(None, FilePolicy.owner(config))
    fleet = Fleet(clients, replicas, AuthPolicy.admin_only(TOKEN), store, config)
    store.specs = {"added-x": {"id": "added-x", "source": {"url": secret}, "workflow": DRAW}}
    replicas.replicas[0].mark(False, "connection refused")
    shown = fleet.unavailable_streams(answered=set())
    assert sorted(s["id"] for s in shown) == sorted([*CAMERAS, "added-x"])
    why = f"replica 0 (127.0.0.1:{port}) is not answering: connection refused (since "
    for stream in shown:
        assert stream["state"] == "unavailable" and stream["replica"] == 0
        assert stream["last_error"].startswith(why)
        assert "hunter2" not in json.dumps(stream) and "abc123" not in json.dumps(stream)
    # The Python client (and so `appliance streams list`) reads them as streams.
    parsed = TypeAdapter(list[StreamStatus]).validate_python(shown)
    assert {s.state for s in parsed} == {"unavailable"}


def test_the_fleet_answers_every_route() -> None:
    planned = plan(own=FLEET_OWN, forwards=FLEET_FORWARD)
    assert [route for route, _ in planned] == list(ROUTES)


def test_replica_addresses_are_parsed_in_order_and_bad_ones_named() -> None:
    assert parse_replicas("10.0.0.5:8080, [::1]:9000") == [
        Address("10.0.0.5", 8080),
        Address("::1", 9000),
    ]
    assert str(Address("::1", 9000)) == "[::1]:9000"
    with pytest.raises(ValueError, match=r"entry 1 'pod-1': expected HOST:PORT") as err:
        parse_replicas("a:1,pod-1,b:70000")
    assert "entry 2 'b:70000'" in str(err.value)
    with pytest.raises(ValueError, match="a:1 is listed twice"):
        parse_replicas("a:1,a:1")
