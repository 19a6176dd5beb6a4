"""Roles: every route × every role, answered as the route declares (401 without a valid
token, 403 naming the role needed with a token whose role is lower, anything else with
one that holds it), through one process, `serve --workers 2` and the fleet gateway; and
the audit of what each token changed, recorded where the change was made.

One deployment of each kind serves its tests (a module fixture per kind, started once):
a drawing-only workflow on a tiny looped clip, no model to load, three tokens: the admin
token (`server.token`), an operator's from an environment variable and a viewer's from
a file.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from appliance.policy.roles import Role
from appliance.runtime.commands import CATALOGUE, MQTT_ROLE
from appliance.server.routes import ROUTES
from appliance.server.routing import Route
from tests.support.appliance import Served, clean_env, launch
from tests.support.media import MakeClip
from tests.support.processes import free_port
from tests.support.warm_cli import run_appliance

ADMIN, OPERATOR, VIEWER = "admin-s3cret", "operator-s3cret", "viewer-s3cret"
TOKENS = {Role.ADMIN: ADMIN, Role.OPERATOR: OPERATOR, Role.VIEWER: VIEWER}
NAMES = {Role.ADMIN: "admin", Role.OPERATOR: "ops", Role.VIEWER: "wall"}
CAMERA = "cam"
ADDED = "added"  # the stream the admin adds, then removes
DRAW = {"name": "draw", "blocks": [{"id": "drawn", "type": "annotate"}],
        "outputs": {"video": "drawn"}}  # fmt: skip
UP_S = 90.0  # a deployment's start: several processes at once on two cores
KINDS = ("single", "workers", "fleet")


@dataclass
class Deployment:
    """One kind of appliance, up: its processes and the URL of its API."""

    kind: str
    url: str
    processes: list[Served]
    folder: Path

    def log(self) -> str:
        """Every process's whole log (Served.log keeps only its end)."""
        return "\n".join(p.log_path.read_text(errors="replace") for p in self.processes)


def _config(folder: Path, clip: Path) -> Path:
    viewer_file = folder / "viewer.token"
    viewer_file.write_text(VIEWER + "\n")
    doc = {
        "server": {
            "token": ADMIN,
            "tokens": [
                {"name": "ops", "role": "operator", "token_env": "OPS_TOKEN"},
                {"name": "wall", "role": "viewer", "token_file": str(viewer_file)},
            ],
            "file_roots": [str(folder), str(clip.parent)],
            "drain_timeout_s": 2,
        },
        "webrtc": {"host_addresses": ["127.0.0.1"]},
        "streams": [{"id": CAMERA, "source": _source(clip), "workflow": DRAW}],
    }
    config = folder / "config.yaml"
    config.write_text(json.dumps(doc))
    return config


def _source(clip: Path) -> dict[str, Any]:
    return {"url": str(clip), "loop": True, "pace": "realtime"}


def _start(kind: str, folder: Path, config: Path) -> Deployment:
    env = clean_env(OPS_TOKEN=OPERATOR)
    ports = [free_port() for _ in range(2)]
    serve = ["serve", "--config", str(config), "--port", str(ports[0])]
    if kind == "single":
        processes = [launch(serve, ports[0], folder, env=env)]
    elif kind == "workers":
        processes = [launch([*serve, "--workers", "2"], ports[0], folder, env=env)]
    else:
        replica = [*serve, "--shard", "0/1", "--state-dir", str(folder / "state")]
        gateway = ["gateway", "--replicas", f"127.0.0.1:{ports[0]}", "--config", str(config)]
        gateway += ["--port", str(ports[1]), "--state-dir", str(folder / "gateway")]
        processes = [
            launch(replica, ports[0], folder, name="replica", env=env),
            launch(gateway, ports[1], folder, env=env),
        ]
    deployment = Deployment(kind, processes[-1].url, processes, folder)
    front = processes[-1]
    front.wait_for(lambda: _has_result(front.url), UP_S, f"{kind}: the camera's first result")
    # Every member up too (a worker without a stream may come up after the other's result).
    front.wait_for(lambda: _ready(front.url), UP_S, f"{kind}: every member ready")
    return deployment


def _ready(url: str) -> bool:
    return call(url, "GET", "/ready", None).status == 200  # the probes: open on loopback


def _has_result(url: str) -> bool:
    return call(url, "GET", f"/v1/streams/{CAMERA}/latest", ADMIN).status == 200


@pytest.fixture(scope="module", params=KINDS)
def deployment(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    make_clip: MakeClip,
) -> Iterator[Deployment]:
    folder = tmp_path_factory.mktemp(request.param)
    clip = make_clip(160, 120, fps=5, seconds=4.0)
    started = _start(request.param, folder, _config(folder, clip))
    try:
        yield started
    finally:
        for served in reversed(started.processes):
            if served.process.poll() is None:
                served.terminate(15)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    @property
    def message(self) -> str:
        try:
            return str(json.loads(self.body)["error"]["message"])
        except (ValueError, KeyError, TypeError):
            return ""


def call(
    url: str,
    method: str,
    path: str,
    token: str | None,
    body: Any = None,
    *,
    streaming: bool = False,
    actor: str | None = None,
) -> Answer:
    """One request; a streaming answer's body is not read (only its status)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    if actor is not None:
        headers["X-Appliance-Actor"] = actor
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        ok_stream = streaming and response.status == 200
        return Answer(response.status, b"" if ok_stream else response.read())
    finally:
        conn.close()


@dataclass(frozen=True)
class Sample:
    """A request that exercises one route: its path with parameters filled in, its body,
    and the statuses a token that holds the role gets (None: anything but 401 and 403)."""

    path: str
    body: Any = None
    ok: frozenset[int] | None = None


def sample(route: Route, clip: str) -> Sample:
    """The request the table sends to `route` (its parameters filled in)."""
    path = route.path.replace("{id}", CAMERA).replace("{session_id}", "no-such-session")
    key = (route.method, route.path)
    special: dict[tuple[str, str], Sample] = {
        ("POST", "/v1/streams"): Sample(
            path, {"id": ADDED, "source": {"url": clip, "loop": True}, "workflow": DRAW},
            frozenset({201}),
        ),
        ("DELETE", "/v1/streams/{id}"): Sample(f"/v1/streams/{ADDED}", ok=frozenset({200})),
        ("POST", "/v1/streams/{id}/restart"): Sample(path, ok=frozenset({200})),
        # The admin starts a shadow, a viewer reads it, the operator stops it (then 404).
        ("POST", "/v1/streams/{id}/shadow"): Sample(path, {"workflow": DRAW}, frozenset({201})),
        ("GET", "/v1/streams/{id}/shadow"): Sample(path, ok=frozenset({200})),
        # Its newest compared frame: 404 until the shadow compared one.
        ("GET", "/v1/streams/{id}/shadow/frame"): Sample(path, ok=frozenset({200, 404})),
        ("DELETE", "/v1/streams/{id}/shadow"): Sample(path, ok=frozenset({200, 404})),
        ("POST", "/v1/workflows/validate"): Sample(path, {"workflow": DRAW}, frozenset({200})),
        ("POST", "/v1/workflows/run"): Sample(path, {"workflow": DRAW}),  # no image: 4xx
        ("POST", "/v1/profiling"): Sample(path, {"duration_s": 0.2}),  # 202, 409 when busy
        ("GET", "/v1/profiling/{id}"): Sample("/v1/profiling/no-such-window"),
        ("GET", "/v1/profiling/{id}/trace"): Sample("/v1/profiling/no-such-window/trace"),
        ("POST", "/v1/tune"): Sample(path, {"knobs": {"no.such_knob": [1]}}),  # 422 / 501
        ("POST", "/v1/streams/{id}/webrtc"): Sample(path, {"sdp": "v=0", "type": "offer"}),
        ("POST", "/v1/config/reload"): Sample(path + "?dry_run=true", ok=frozenset({200})),
        ("DELETE", "/v1/tune"): Sample(path),  # 409: none runs (501 behind a gateway)
        # Frame 1's trace: held (200), or rotated away already (404 naming the oldest).
        ("GET", "/v1/streams/{id}/frames/{seq}/trace"): Sample(
            path.replace("{seq}", "1"), ok=frozenset({200, 404})
        ),
        # The viewer's page on frame 1's trace: the page, whatever the frame (it reads it).
        ("GET", "/streams/{id}/frames/{seq}"): Sample(
            path.replace("{seq}", "1"), ok=frozenset({200})
        ),
    }  # fmt: skip
    if key in special:
        return special[key]
    if route.method == "GET" and route.path not in ("/v1/tune", "/v1/streams/{id}/scene"):
        return Sample(path, ok=frozenset({200}))
    return Sample(path)


def test_every_route_declares_a_role_and_mqtt_commands_are_an_operators() -> None:
    assert all(isinstance(r.role, Role) for r in ROUTES)
    changes = [r for r in ROUTES if r.method in ("POST", "DELETE") and r.role > Role.VIEWER]
    # Every change above a viewer's is audited, but a workflow's one-off run or check.
    unaudited = {f"{r.method} {r.path}" for r in changes if r.audit is None}
    assert unaudited == {"POST /v1/workflows/run", "POST /v1/workflows/validate"}
    # Each MQTT command needs what the route doing the same needs, at most an operator's.
    routes = {r.audit: r for r in ROUTES if r.audit is not None}
    for command in CATALOGUE.values():
        assert command.role <= MQTT_ROLE, command.name
        assert routes[command.action].role == command.role, command.name


def test_the_route_role_table(deployment: Deployment, make_clip: MakeClip) -> None:
    """Every route, every role: 401 without a token and with a wrong one, 403 naming the
    role needed below it, its own answer at or above it. Lower roles go first, so a
    change the admin makes (a stream added, then removed) is refused to the others
    while it could still be made."""
    clip = str(make_clip(160, 120, fps=5, seconds=4.0))
    failures: list[str] = []
    for route in ROUTES:
        s = sample(route, clip)
        opened = route.public or route.probe  # open on this loopback bind
        for token in (None, "wrong-token"):
            got = call(deployment.url, route.method, s.path, token, s.body, streaming=True)
            if not opened and got.status != 401:
                failures.append(f"{route.method} {route.path} token={token}: {got.status}")
        for role in Role:
            got = call(
                deployment.url, route.method, s.path, TOKENS[role], s.body,
                streaming=route.streaming,
            )  # fmt: skip
            where = f"{route.method} {route.path} as {role.label}: {got.status} {got.body[:200]!r}"
            if role < route.role and not opened:
                needed = f"needs the {route.role.label} role; the token {NAMES[role]!r} has"
                if got.status != 403 or needed not in got.message:
                    failures.append(where)
            elif got.status in (401, 403) or (s.ok is not None and got.status not in s.ok):
                per_process = deployment.kind != "single" and got.status == 501  # a tune
                failures += [] if per_process else [where]
    assert failures == [], "\n".join(failures)


def test_a_tune_that_applies_is_an_admins(deployment: Deployment) -> None:
    body = {"apply": True, "knobs": {"no.such_knob": [1]}}
    got = call(deployment.url, "POST", "/v1/tune", OPERATOR, body)
    if deployment.kind == "single":
        assert got.status == 403, got
        assert "a tune with apply needs the admin role" in got.message
        assert call(deployment.url, "POST", "/v1/tune", ADMIN, body).status == 422
    else:  # a tune runs in one process: the gateway's own 501, for anyone
        assert got.status == 501, got


def test_whoami_names_the_token_and_its_role(deployment: Deployment) -> None:
    for role, token in TOKENS.items():
        got = call(deployment.url, "GET", "/v1/me", token)
        assert got.status == 200, got
        me = json.loads(got.body)
        assert (me["name"], me["role"]) == (NAMES[role], role.label)
        assert me["roles"] == [r.label for r in Role if r <= role]


def test_the_audit_names_who_changed_what(deployment: Deployment) -> None:
    """After the table: the admin's stream added and removed, the operator's restart and
    window, each recorded once by the process that acted, by name (forwarded by a
    gateway: `ops via admin`), with the viewer's refused attempt; never a token."""
    via = "" if deployment.kind == "single" else " via admin"
    assert call(deployment.url, "GET", "/v1/audit", OPERATOR).status == 403
    got = call(deployment.url, "GET", "/v1/audit?limit=1000", ADMIN)
    assert got.status == 200, got
    entries = json.loads(got.body)["entries"]
    seen = {(e["who"], e["action"], e["target"], e["outcome"]) for e in entries}
    assert (f"admin{via}", "stream.add", ADDED, "ok") in seen
    assert (f"admin{via}", "stream.remove", ADDED, "ok") in seen
    assert (f"ops{via}", "stream.restart", CAMERA, "ok") in seen
    # Refused for the role, before the body was read (so with no target): by the gateway
    # itself where there is one (no member hears of it).
    assert ("wall", "stream.add", None, "refused") in seen
    assert ("ops", "stream.add", None, "refused") in seen
    if deployment.kind != "single":
        refused = [e for e in entries if e["outcome"] == "refused" and e["who"] == "wall"]
        label = "replica" if deployment.kind == "fleet" else "worker"  # the gateway's noun
        assert {e[label] for e in refused} == {"gateway"}
    # Refused without a principal (no token): not recorded; a dry run changes nothing.
    assert not [e for e in entries if e["who"] == "anonymous"]
    restarts = [e for e in entries if e["action"] == "stream.restart" and e["outcome"] == "ok"]
    assert len(restarts) == 2  # the operator's and the admin's: once each, not per process
    text = json.dumps(entries) + deployment.log()
    for secret in TOKENS.values():
        assert secret not in text
    lines = [line for line in deployment.log().splitlines() if "audit {" in line]
    logged = [json.loads(line[line.index("audit {") + 6 :]) for line in lines]
    assert {(e["who"], e["action"]) for e in logged} >= {
        (f"admin{via}", "stream.add"),
        (f"ops{via}", "stream.restart"),
    }


def test_only_an_admin_token_may_act_for_another(deployment: Deployment) -> None:
    """The gateways' header that says whom they forward for is believed from an admin
    token only: an operator cannot make the audit name someone else."""
    got = call(
        deployment.url, "POST", f"/v1/streams/{CAMERA}/restart", OPERATOR, actor="someone-else"
    )
    assert got.status == 200, got
    # Recorded before the answer was sent: the newest restart is this one.
    entries = json.loads(call(deployment.url, "GET", "/v1/audit", ADMIN).body)["entries"]
    restarts = [e for e in entries if e["action"] == "stream.restart"]
    assert restarts[0]["who"] in ("ops", "ops via admin"), restarts[0]
    assert not [e for e in entries if "someone-else" in e["who"]]


@pytest.mark.parametrize("deployment", ["single"], indirect=True)  # the same API everywhere
def test_the_cli_says_who_and_lists_the_audit(deployment: Deployment) -> None:
    url = ["--url", deployment.url]
    whoami = run_appliance(["whoami", *url, "--token", OPERATOR])
    assert whoami.returncode == 0, whoami.stderr
    assert whoami.stdout.strip() == "ops (operator: may do what viewer, operator may)"
    refused = run_appliance(["audit", *url, "--token", OPERATOR])
    assert refused.returncode != 0
    assert "needs the admin role; the token 'ops' has operator" in refused.stderr
    assert "hint: use a token with that role" in refused.stderr
    listed = run_appliance(["audit", *url, "--token", ADMIN, "--limit", "1000"])
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:5] == ["AT", "WHO", "ACTION", "TARGET", "OUTCOME"]
    assert any(r.split()[1:5] == ["ops", "stream.restart", CAMERA, "ok"] for r in rows), rows
