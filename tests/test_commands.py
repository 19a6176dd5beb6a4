"""The command catalogue (appliance/runtime/commands.py) is the one place a command is
declared: the MQTT parser routes every entry's topic to it with no code of its own per
command, the HTTP route that does the same validates with the very same model, and the
runtime and the `serve --workers` forwarder both run it through its entry."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from appliance.client import ApplianceAPIError, ApplianceConnectionError
from appliance.errors import NoRollbackError, NoShadowError, UnknownStreamError, WindowBusyError
from appliance.observe.audit import AuditLog
from appliance.observe.status import Latency, StreamStatus, WindowStatus
from appliance.policy.roles import Role
from appliance.runtime.commands import (
    CATALOGUE,
    TOPICS,
    Command,
    CommandDispatch,
    ProfilingRequest,
    runtime_commands,
)
from appliance.server import schemas
from appliance.server.routes import ROUTES
from appliance.workers.commands import forwarding
from sinks.mqtt.commands import CommandTopics, Request, answer, parse, topics_of

PARAM = re.compile(r"{(\w+)}")
# The HTTP route that does what each command does: (method, path), None for no route.
ROUTE_OF: dict[str, tuple[str, str] | None] = {
    "restart": ("POST", "/v1/streams/{id}/restart"),
    "profiling": ("POST", "/v1/profiling"),
    "shadow_stop": ("DELETE", "/v1/streams/{id}/shadow"),
    "shadow_rollback": ("POST", "/v1/streams/{id}/shadow/rollback"),
}


def concrete(pattern: str) -> tuple[str, dict[str, str]]:
    """A topic the pattern matches, and the arguments its `{name}` levels carry."""
    args = {name: f"v-{name}" for name in PARAM.findall(pattern)}
    return PARAM.sub(lambda m: args[m.group(1)], pattern), args


def request(rest: str, topics: CommandTopics, payload: bytes = b"") -> Request:
    parsed = parse(rest, payload, 4096, prefix="site", topics=topics)
    assert parsed is not None
    return parsed


# -- the MQTT parser routes the catalogue -------------------------------------------------
@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_every_entrys_topic_is_routed_to_its_name(name: str) -> None:
    command = CATALOGUE[name]
    rest, path_args = concrete(command.topic)
    got = request(rest, topics_of(runtime_commands(FakeRuntime())))
    assert (got.command, got.error, got.args) == (name, None, path_args)
    # Path parameters are the model's fields: the topic fills them, as a route's path does.
    assert set(path_args) <= set(command.args.model_fields)


def test_the_catalogue_is_what_the_sink_is_given() -> None:
    assert schemas.ProfilingRequest is ProfilingRequest  # the HTTP schemas' name for it
    assert {c.topic: name for name, c in CATALOGUE.items()} == TOPICS
    assert runtime_commands(FakeRuntime()).topics == TOPICS


def test_an_unknown_topic_lists_the_known_ones() -> None:
    got = request("cmd/reboot", CommandTopics(TOPICS), b'{"id": "r7"}')
    known = [PARAM.sub(r"<\1>", topic) for topic in TOPICS]  # cmd/streams/<stream>/restart
    assert str(got.error).startswith("unknown command topic 'cmd/reboot' (known: ")
    assert all(topic in str(got.error) for topic in known)
    two = {"cmd/streams/{stream}/restart": "restart", "cmd/profiling": "profiling"}
    assert request("cmd/reboot", CommandTopics(two)).error == (
        "unknown command topic 'cmd/reboot' (known: cmd/profiling, cmd/streams/<stream>/restart)"
    )
    # A topic one level off a pattern is no command either.
    off = request("cmd/streams/cam/restart/now", CommandTopics(TOPICS))
    assert str(off.error).startswith("unknown command topic 'cmd/streams/cam/restart/now'")


@pytest.mark.parametrize(
    "pattern",
    ["status/x", "cmd/reply", "cmd/response/{x}", "cmd/+/x", "cmd/{id}/x", "cmd/{a}/{a}"],
)
def test_a_pattern_no_request_could_use_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match="command topic"):
        CommandTopics({pattern: "x"})


# -- the HTTP route validates with the same model -----------------------------------------
@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_every_entrys_model_is_the_http_routes(name: str) -> None:
    assert name in ROUTE_OF, "say which HTTP route does the same (None: none)"
    where = ROUTE_OF[name]
    if where is None:
        return
    (route,) = [r for r in ROUTES if (r.method, r.path) == where]
    body = route.body.get("application/json")
    if body is None:  # no body (restart): its arguments come from the path, as the topic's
        assert set(CATALOGUE[name].args.model_fields) == set(PARAM.findall(CATALOGUE[name].topic))
    else:
        assert body is CATALOGUE[name].args


@pytest.mark.parametrize(
    "args, problem",
    [
        ({}, "duration_s: "),
        ({"duration_s": 0}, "duration_s: "),
        ({"duration_s": "1"}, "duration_s: "),
        ({"duration_s": 1, "ort_operators": "yes"}, "ort_operators: "),
        ({"duration_s": 1, "seconds": 5}, "seconds: unknown parameter"),
    ],
)
def test_profiling_arguments_are_refused_as_the_route_refuses_them(
    args: dict[str, Any], problem: str
) -> None:
    runtime = FakeRuntime()
    with pytest.raises(ValueError, match=f"^{problem}"):
        run(runtime_commands(runtime)("profiling", args))
    assert runtime.calls == []  # refused before it reached the runtime


# -- the runtime and the forwarder run through the catalogue -------------------------------
class FakeShadows:
    """ShadowControl: no stream runs a shadow (the live ones: tests/sinks/test_outputs_mqtt.py)."""

    def stop(self, stream_id: str, timeout: float = 3.0) -> Any:
        raise NoShadowError(stream_id)

    def rollback(self, stream_id: str) -> dict[str, Any]:
        raise NoRollbackError(f"stream {stream_id!r} has no promotion to roll back")


@dataclass
class FakeRuntime:
    """CommandRuntime: records each call; `busy` refuses profiling as a running window."""

    calls: list[tuple[str, Any]] = field(default_factory=list)
    busy: bool = False
    audit: AuditLog = field(default_factory=AuditLog)
    shadows: FakeShadows = field(default_factory=FakeShadows)

    def restart_stream(self, stream_id: str) -> object:
        self.calls.append(("restart_stream", stream_id))
        if stream_id != "cam":
            raise UnknownStreamError(stream_id)
        return object()

    def stream_status(self, stream_id: str) -> StreamStatus:
        return status(stream_id)

    def start_profiling(
        self, duration_s: float, streams: list[str] | None, ort_operators: bool
    ) -> WindowStatus:
        self.calls.append(("start_profiling", (duration_s, streams, ort_operators)))
        if self.busy:
            raise WindowBusyError("w0")
        return window(duration_s, streams, ort_operators)


class FakeClient:
    """CommandClient: the API's answers and refusals, as ApplianceClient gives them."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def restart_stream(self, stream_id: str) -> StreamStatus:
        self.calls.append(f"restart {stream_id}")
        if stream_id == "gone":
            raise ApplianceConnectionError("http://127.0.0.1:9", "connection refused")
        if stream_id != "cam":
            raise ApplianceAPIError(404, "not_found", f"unknown stream {stream_id!r}")
        return status(stream_id)

    def start_profiling(
        self, duration_s: float, streams: list[str] | None, ort_operators: bool
    ) -> WindowStatus:
        self.calls.append(f"profiling {duration_s}")
        return window(duration_s, streams, ort_operators)

    def shadow(
        self, stream_id: str, action: str = "status", body: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        self.calls.append(f"shadow {action} {stream_id}")
        raise ApplianceAPIError(404, "not_found", f"stream {stream_id!r} runs no shadow")


def test_the_runtime_runs_each_command_through_its_entry() -> None:
    runtime = FakeRuntime()
    handler = runtime_commands(runtime)
    assert run(handler("restart", {"stream": "cam", "x": 1})) == {
        "stream": "cam",
        "state": "running",
    }  # the body is not read: other keys are ignored, as the route ignores its body
    result = run(handler("profiling", {"duration_s": 2, "streams": ["cam"]}))
    assert (result["id"], result["duration_s"], result["streams"]) == ("w1", 2, ["cam"])
    assert runtime.calls == [("restart_stream", "cam"), ("start_profiling", (2, ["cam"], False))]
    with pytest.raises(KeyError, match="nope"):
        run(handler("restart", {"stream": "nope"}))
    known = ", ".join(CATALOGUE)  # restart, profiling
    with pytest.raises(ValueError, match=re.escape(f"unknown command 'reboot' (known: {known})")):
        run(handler("reboot", {}))
    runtime.busy = True
    with pytest.raises(ValueError, match="w0"):  # a refusal the sender hears, not a bug
        run(handler("profiling", {"duration_s": 1}))
    # Each command the runtime carried out (or refused) is in its audit, as `mqtt`'s.
    entries = [(e.who, e.action, e.target, e.outcome) for e in runtime.audit.recent()]
    assert entries == [
        ("mqtt", "profiling.start", None, "refused"),
        ("mqtt", "stream.restart", "nope", "refused"),
        ("mqtt", "profiling.start", "w1", "ok"),
        ("mqtt", "stream.restart", "cam", "ok"),
    ]


def test_the_gateway_forwards_each_command_through_its_entry() -> None:
    client = FakeClient()
    handler = forwarding(client)
    assert handler.topics == TOPICS
    assert run(handler("restart", {"stream": "cam"})) == {"stream": "cam", "state": "running"}
    assert run(handler("profiling", {"duration_s": 1.5}))["duration_s"] == 1.5
    with pytest.raises(ValueError, match=r"^duration_s: "):
        run(handler("profiling", {"duration_s": -1}))  # refused here, as the gateway would
    # The API's refusals as one process gives them: 404 a KeyError, no answer a ValueError.
    with pytest.raises(KeyError, match="unknown stream 'nope'"):
        run(handler("restart", {"stream": "nope"}))
    with pytest.raises(ValueError, match=r"^the appliance's API did not answer"):
        run(handler("restart", {"stream": "gone"}))
    assert client.calls == ["restart cam", "profiling 1.5", "restart nope", "restart gone"]


# -- a new command is one entry ------------------------------------------------------------
class Snapshot(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stream: str
    size: str
    quality: int = 80


@dataclass
class Camera:
    """Stands in for a runtime that has the new command's method."""

    shots: list[Snapshot] = field(default_factory=list)

    def snapshot(self, args: Snapshot) -> dict[str, Any]:
        self.shots.append(args)
        return {"stream": args.stream, "bytes": 1234}


def test_an_added_entry_is_routed_and_run_without_touching_the_parser() -> None:
    camera = Camera()
    entry = Command(
        "snapshot",
        Snapshot,
        "cmd/streams/{stream}/snapshot/{size}",
        lambda runtime, args: camera.snapshot(args),
        lambda client, args: camera.snapshot(args),
        Role.VIEWER,
        "stream.snapshot",
    )
    catalogue = {**CATALOGUE, "snapshot": entry}
    handler = CommandDispatch(lambda command, args: command.run(FakeRuntime(), args), catalogue)
    topics = topics_of(handler)
    got = request("cmd/streams/door/snapshot/small", topics, b'{"id": 7, "quality": 90}')
    assert (got.command, got.error) == ("snapshot", None)
    assert got.args == {"stream": "door", "size": "small", "quality": 90}
    reply = run(answer(got, handler))
    assert reply == {
        "ok": True,
        "command": "snapshot",
        "id": 7,
        "result": {"stream": "door", "bytes": 1234},
    }
    assert camera.shots == [Snapshot(stream="door", size="small", quality=90)]
    # The catalogue's own commands still route beside it, and refusals list it.
    assert request("cmd/profiling", topics).command == "profiling"
    assert "cmd/streams/<stream>/snapshot/<size>" in str(request("cmd/x", topics).error)
    assert request("cmd/streams/door/snapshot/small", CommandTopics(TOPICS)).error is not None


# -- helpers ---------------------------------------------------------------------------------
def run(call: Coroutine[Any, Any, Any]) -> Any:
    """One handler call on a fresh loop (the dispatch does the work on its executor)."""
    return asyncio.run(call)


def status(stream_id: str) -> StreamStatus:
    """A running stream's status, as the runtime and the API give it."""
    return StreamStatus(
        id=stream_id,
        state="running",
        url="file.mp4",
        workflow="w.yaml",
        fps=25.0,
        source_fps=None,
        frames_processed=1,
        frames_dropped=0,
        frames_failed=0,
        latency_ms=Latency(None, None),
        detections=0,
        reconnects=0,
        last_error=None,
        providers={},
        outputs=[],
        sinks={},
        transitions=[],
    )


def window(duration_s: float, streams: list[str] | None, ort_operators: bool) -> WindowStatus:
    trace = "/v1/profiling/w1/trace"
    return WindowStatus("w1", "running", trace, duration_s, streams, ort_operators)
