"""Bearer-token auth: who may call what; and the refusals to start: an exposed address
without a token (the real `appliance serve` process for that), a port already taken."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from appliance.config import ConfigError, parse_config
from appliance.policy.files import FilePolicy
from appliance.policy.roles import Role
from appliance.runtime.runtime import Runtime
from appliance.server.auth import AuthPolicy, Principal, is_loopback
from appliance.server.config import ServerConfig
from appliance.server.serve import Server
from tests.server.conftest import TOKEN, LiveFactory
from tests.server.live import LiveServer
from tests.support.appliance import APPLIANCE, Served
from tests.support.processes import free_port

PROBES = ("/health", "/ready", "/metrics", "/openapi.json", "/docs")
NO_ENV: dict[str, str] = {}


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
     ("::ffff:127.0.0.1", True), ("localhost", True), ("0.0.0.0", False), ("::", False),
     ("192.168.1.20", False), ("", False), ("camera.local", False)],
)  # fmt: skip
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_an_exposed_bind_needs_a_token_unless_insecure() -> None:
    with pytest.raises(ConfigError) as refused:
        AuthPolicy.for_bind(ServerConfig(), "0.0.0.0", environ=NO_ENV)
    assert refused.value.problems[0].startswith("server.token: required to serve on '0.0.0.0'")
    assert "--insecure" in str(refused.value)
    assert (
        AuthPolicy.for_bind(ServerConfig(), "0.0.0.0", insecure=True, environ=NO_ENV).token is None
    )
    exposed = AuthPolicy.for_bind(ServerConfig(token="t"), "0.0.0.0", environ=NO_ENV)
    assert (exposed.token, exposed.probes_open) == ("t", False)  # probes closed when exposed


def test_the_environment_token_wins_and_open_probes_overrides() -> None:
    env = {"APPLIANCE_API_TOKEN": "from-env"}
    assert AuthPolicy.for_bind(ServerConfig(token="t"), "::1", environ=env).token == "from-env"
    empty = {"APPLIANCE_API_TOKEN": ""}  # set but empty: not a token
    assert AuthPolicy.for_bind(ServerConfig(token="t"), "::1", environ=empty).token == "t"
    closed = ServerConfig(token="t", open_probes=False)
    assert AuthPolicy.for_bind(closed, "127.0.0.1", environ=NO_ENV).probes_open is False
    opened = ServerConfig(token="t", open_probes=True)
    assert AuthPolicy.for_bind(opened, "10.0.0.1", environ=NO_ENV).probes_open is True


def test_the_token_is_not_in_reprs() -> None:
    assert "s3cret" not in repr(ServerConfig(token="s3cret"))
    assert "s3cret" not in repr(AuthPolicy.admin_only("s3cret"))


def empty_config(**server: Any) -> dict[str, Any]:
    return {"server": server}


def assert_unauthorized(server: LiveServer, path: str, token: str | bool, why: str) -> None:
    reply = server.call("GET", path, token=token)
    assert reply.status == 401, (path, reply.body)
    assert reply.error["code"] == "unauthorized"
    assert why in reply.error["message"]
    assert reply.headers["www-authenticate"].startswith('Bearer realm="appliance"')


def test_api_routes_need_the_token_and_probes_are_open_on_loopback(
    live_server: LiveFactory,
) -> None:
    server = live_server(empty_config(token=TOKEN))
    assert_unauthorized(server, "/v1/streams", False, "missing bearer token")
    assert_unauthorized(server, "/v1/models", "wrong-token", "wrong bearer token")
    assert_unauthorized(server, "/v1/streams", TOKEN[:-1], "wrong bearer token")  # a prefix
    basic = server.call(
        "GET", "/v1/streams", headers={"Authorization": f"Basic {TOKEN}"}, token=False
    )
    assert basic.status == 401
    assert server.call("GET", "/v1/nope", token=False).status == 401  # no route probing either
    assert server.call("GET", "/v1/streams").status == 200
    assert server.call("GET", "/v1/streams", headers={"Authorization": f"bearer {TOKEN}"},
                       token=False).status == 200  # fmt: skip
    for path in PROBES:
        assert server.call("GET", path, token=False).status == 200, path


def test_closed_probes_need_the_token(live_server: LiveFactory) -> None:
    server = live_server(empty_config(token=TOKEN, open_probes=False))
    for path in PROBES:
        assert_unauthorized(server, path, False, "missing bearer token")
        assert server.call("GET", path).status == 200, path
    document = server.get_json("/openapi.json")
    assert document["paths"]["/health"]["get"]["security"] == [{"bearer": []}]


def test_the_environment_token_replaces_the_config_token(live_server: LiveFactory) -> None:
    server = live_server(empty_config(token=TOKEN), environ={"APPLIANCE_API_TOKEN": "env-token"})
    assert_unauthorized(server, "/v1/streams", TOKEN, "wrong bearer token")
    assert server.call("GET", "/v1/streams", token="env-token").status == 200


def test_without_a_token_on_loopback_everything_is_open(live_server: LiveFactory) -> None:
    server = live_server(empty_config(), token=None)
    assert server.call("GET", "/v1/streams").status == 200
    document = server.get_json("/openapi.json")
    assert "securitySchemes" not in document["components"]
    assert document["paths"]["/v1/streams"]["get"]["security"] == []


def test_serve_refuses_an_exposed_bind_without_a_token(
    write_config: Callable[[dict[str, Any]], Path],
) -> None:
    command = [*APPLIANCE, "serve", "--config", str(write_config({})), "--host", "0.0.0.0",
               "--port", str(free_port())]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "APPLIANCE_API_TOKEN"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 1, done.stderr
    assert "server.token: required to serve on '0.0.0.0'" in done.stderr
    assert "serving on" not in done.stderr


def test_serve_insecure_binds_all_interfaces_without_a_token(
    serve: Callable[..., Served], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    served = serve(write_config({}), "--host", "0.0.0.0", "--insecure")
    assert served.json("/v1/streams") == {"streams": []}
    assert served.terminate() == 0


def test_a_port_in_use_is_reported_as_a_config_error(tmp_path: Path) -> None:
    runtime = Runtime(parse_config({}, tmp_path))

    async def start_on(port: int) -> None:
        server = Server(runtime, "127.0.0.1", port, environ=NO_ENV)
        try:
            await server.startup()
        finally:
            assert await server.shutdown()

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match=r"server: cannot listen on 127\.0\.0\.1:\d+"):
            asyncio.run(start_on(taken.getsockname()[1]))


def test_named_tokens_come_from_the_environment_or_a_file(tmp_path: Path) -> None:
    (tmp_path / "wall.token").write_text("  wall-token\n")
    server = ServerConfig.model_validate(
        {
            "token": "admin-token",
            "tokens": [
                {"name": "ops", "role": "operator", "token_env": "OPS"},
                {"name": "wall", "role": "viewer", "token_file": tmp_path / "wall.token"},
            ],
        }
    )
    owner = FilePolicy.owner(parse_config({}, tmp_path))
    policy = AuthPolicy.for_bind(server, "10.0.0.1", environ={"OPS": "ops-token"}, files=owner)
    assert [(t.name, t.role) for t in policy.tokens] == [
        ("admin", Role.ADMIN), ("ops", Role.OPERATOR), ("wall", Role.VIEWER)
    ]  # fmt: skip
    assert policy.authenticate("Bearer wall-token") == Principal("wall", Role.VIEWER)
    assert policy.authenticate("Bearer ops-token", actor="eve").who == "ops"  # not an admin
    assert policy.authenticate("Bearer admin-token", actor="ops").who == "ops via admin"
    assert "ops-token" not in repr(policy) and "wall-token" not in repr(policy)
    assert policy.insecure is False  # named tokens alone make an exposed bind safe


@pytest.mark.parametrize(
    ("tokens", "environ", "problem"),
    [
        ([{"name": "ops", "role": "operator", "token_env": "OPS"}], {},
         "server.tokens[0].token_env: OPS is not set or empty"),
        ([{"name": "ops", "role": "operator", "token_file": "empty.token"}], {},
         "server.tokens[0].token_file: secret file 'empty.token': empty"),
        ([{"name": "ops", "role": "operator", "token_file": "missing.token"}], {},
         "server.tokens[0].token_file: secret file 'missing.token'"),
        ([{"name": "admin", "role": "viewer", "token_env": "A"}], {"A": "a"},
         "server.tokens[0].name: 'admin' is taken"),
        ([{"name": "a", "role": "viewer", "token_env": "A"},
          {"name": "b", "role": "admin", "token_env": "B"}], {"A": "same", "B": "same"},
         "server.tokens: the token of 'b' is another's too"),
    ],
)  # fmt: skip
def test_a_token_that_cannot_be_read_stops_the_start_named(
    tmp_path: Path, tokens: list[dict[str, Any]], environ: dict[str, str], problem: str
) -> None:
    (tmp_path / "empty.token").write_text("\n")
    server = ServerConfig.model_validate({"token": "admin-token", "tokens": tokens})
    owner = FilePolicy.owner(parse_config({}, tmp_path))
    with pytest.raises(ConfigError) as refused:
        AuthPolicy.for_bind(server, "127.0.0.1", environ=environ, files=owner)
    assert any(p.startswith(problem) for p in refused.value.problems), refused.value.problems


def test_a_gateway_needs_an_admin_token_to_forward() -> None:
    wall = {"name": "wall", "role": "viewer", "token_env": "W"}
    viewer_only = ServerConfig.model_validate({"tokens": [wall]})
    policy = AuthPolicy.for_bind(viewer_only, "127.0.0.1", environ={"W": "w"})
    with pytest.raises(ConfigError, match="needs an admin token"):
        assert policy.token is None
    assert AuthPolicy.for_bind(ServerConfig(), "127.0.0.1", environ={}).token is None
