"""The command catalogue: every command a sink can carry (MQTT's `<prefix>/cmd/...`), in
one typed table. An entry says everything about its command:

    name        what the sender's answer calls it ("restart", "profiling")
    args        its argument model, the one validation rule (HTTP uses the same model)
    topic       its MQTT topic below the prefix; `{field}` levels fill the model's fields
    run         how a runtime carries it out (CommandRuntime: the methods it may call)
    forward     how a client of the API does it (CommandClient: `serve --workers`'s gateway)
    role        the least role it needs: the HTTP route's that does the same; over MQTT a
                command acts as an operator (docs/security.md, "Roles"), so the
                catalogue holds no admin command (tests/security/test_roles.py)
    action      what the audit calls it, as the HTTP route's `audit` does (`stream.restart`)

The MQTT parser gets only the topics (`TOPICS`, plain data: sinks/ never imports
appliance/); `CommandDispatch` validates a command's arguments and performs it through
the catalogue, with a runtime (`runtime_commands`) or a client (appliance/workers/
commands.py). Adding a command: one entry here, plus the runtime method and the client
call it names.

The arguments are the body of the HTTP route that does the same, validated the same way
(strict: `"yes"` is not `true`), so what one accepts the other accepts: `profiling` is
POST /v1/profiling's ProfilingRequest (appliance/server/schemas.py imports it from here);
`restart` takes the stream from its topic, as POST /v1/streams/{id}/restart from its path,
and, as that route does, reads nothing from the body.

Each command a runtime carries out is recorded in its audit as done by `mqtt`
(MQTT_ACTOR); one forwarded to the gateway is recorded by the worker that runs it, as
`mqtt via <the admin token's name>`.

Threads: the dispatch runs on the sinks loop and does the work on the loop's executor.
KeyError (an unknown stream) and ValueError (bad arguments, a refusal) are answered to
the sender as errors; nothing else is affected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from appliance.errors import WindowBusyError
from appliance.observe.audit import AuditLog
from appliance.observe.status import StreamStatus, WindowStatus, as_json
from appliance.policy.roles import Role
from pipelines.errors import format_location, pydantic_message

A = TypeVar("A", bound=BaseModel)
MQTT_ACTOR = "mqtt"  # who the audit says a command from the broker is from
MQTT_ROLE = Role.OPERATOR  # the most a command over MQTT may need
Answer = dict[str, Any]  # the `result` of a command's answer, as JSON


class ProfilingRequest(BaseModel):
    """One on-demand profiling window: POST /v1/profiling's body, and the arguments of
    the MQTT `profiling` command (appliance/runtime/commands.py), validated strictly by both."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    duration_s: float = Field(
        gt=0, allow_inf_nan=False, description="seconds, at most profiling.max_window_s"
    )
    streams: list[str] | None = Field(None, description="stream ids to trace; all by default")
    ort_operators: bool = Field(False, description="add ONNX Runtime's per-operator events")


class RestartArgs(BaseModel):
    """A stream restart: the stream comes from the topic, as POST /v1/streams/{id}/restart's
    from its path; the body is not read (other keys are ignored, as the route ignores its)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    stream: str = Field(description="the stream's id")


class ShadowArgs(RestartArgs):
    """A command on a stream's shadow (stop, roll back): the stream from the topic, as
    the HTTP routes take it from the path; the body is not read."""


class ShadowControl(Protocol):
    """The runtime's shadows (appliance/runtime/shadows.py), as the catalogue calls them."""

    def stop(self, stream_id: str, timeout: float = ...) -> Any: ...

    def rollback(self, stream_id: str) -> dict[str, Any]: ...


class CommandRuntime(Protocol):
    """The runtime's methods the catalogue calls (appliance.runtime.runtime.Runtime has
    them); a Protocol, so this module need not import the runtime that imports it."""

    @property
    def audit(self) -> AuditLog: ...

    @property
    def shadows(self) -> ShadowControl: ...

    def restart_stream(self, stream_id: str) -> object: ...

    def stream_status(self, stream_id: str) -> StreamStatus: ...

    def start_profiling(
        self, duration_s: float, streams: list[str] | None, ort_operators: bool
    ) -> WindowStatus: ...


class CommandClient(Protocol):
    """The API calls the catalogue forwards through (appliance.client.ApplianceClient)."""

    def restart_stream(self, stream_id: str) -> StreamStatus: ...

    def shadow(
        self, stream_id: str, action: str = ..., body: Mapping[str, Any] | None = ...
    ) -> dict[str, Any]: ...

    def start_profiling(
        self, duration_s: float, streams: list[str] | None, ort_operators: bool
    ) -> WindowStatus: ...


@dataclass(frozen=True, slots=True)
class Command(Generic[A]):
    """One catalogue entry; see the module docstring for its columns."""

    name: str
    args: type[A]
    topic: str
    run: Callable[[CommandRuntime, A], Answer]
    forward: Callable[[CommandClient, A], Answer]
    role: Role
    action: str

    def validate(self, args: Mapping[str, Any]) -> A:
        """The arguments as `args`' model; ValueError listing every problem as
        `location: message` (as the HTTP route's 422 details do) if they are not one."""
        try:
            return self.args.model_validate(dict(args), strict=True)
        except ValidationError as exc:
            problems = [f"{format_location(e['loc'])}: {pydantic_message(e)}" for e in exc.errors()]
            raise ValueError("; ".join(problems)) from None


# -- the entries' work: each runs on an executor thread -------------------------------------
def _restart(runtime: CommandRuntime, args: RestartArgs) -> Answer:
    runtime.restart_stream(args.stream)
    return {"stream": args.stream, "state": runtime.stream_status(args.stream).state}


def _restart_through(client: CommandClient, args: RestartArgs) -> Answer:
    stream = client.restart_stream(args.stream)
    return {"stream": stream.id, "state": stream.state}


def _profile(runtime: CommandRuntime, args: ProfilingRequest) -> Answer:
    try:
        return _window(runtime.start_profiling(args.duration_s, args.streams, args.ort_operators))
    except WindowBusyError as exc:  # a refusal the sender should hear about
        raise ValueError(str(exc)) from None


def _profile_through(client: CommandClient, args: ProfilingRequest) -> Answer:
    return _window(client.start_profiling(args.duration_s, args.streams, args.ort_operators))


def _shadow_stop(runtime: CommandRuntime, args: ShadowArgs) -> Answer:
    report: Answer = runtime.shadows.stop(args.stream).report()
    return report


def _shadow_rollback(runtime: CommandRuntime, args: ShadowArgs) -> Answer:
    return runtime.shadows.rollback(args.stream)


def _window(window: WindowStatus) -> Answer:
    return as_json(window)  # type: ignore[no-any-return]


CATALOGUE: Mapping[str, Command[Any]] = {
    command.name: command
    for command in (
        Command(
            "restart",
            RestartArgs,
            "cmd/streams/{stream}/restart",
            _restart,
            _restart_through,
            Role.OPERATOR,
            "stream.restart",
        ),
        Command(
            "shadow_stop",
            ShadowArgs,
            "cmd/streams/{stream}/shadow/stop",
            _shadow_stop,
            lambda client, args: client.shadow(args.stream, "stop"),
            Role.OPERATOR,
            "shadow.stop",
        ),
        Command(
            "shadow_rollback",
            ShadowArgs,
            "cmd/streams/{stream}/shadow/rollback",
            _shadow_rollback,
            lambda client, args: client.shadow(args.stream, "rollback"),
            Role.OPERATOR,
            "shadow.rollback",
        ),
        Command(
            "profiling",
            ProfilingRequest,
            "cmd/profiling",
            _profile,
            _profile_through,
            Role.OPERATOR,
            "profiling.start",
        ),
    )
}


def topics(catalogue: Mapping[str, Command[Any]]) -> dict[str, str]:
    """The catalogue's MQTT topic patterns (below the prefix) -> command names: what the
    MQTT sink is given (sinks/mqtt/commands.py, CommandHandler.topics)."""
    return {command.topic: name for name, command in catalogue.items()}


TOPICS: Mapping[str, str] = topics(CATALOGUE)

# Performs one validated command: a runtime runs it, a client forwards it.
Perform = Callable[[Command[Any], BaseModel], Answer]


class CommandDispatch:
    """The sinks' CommandHandler over a catalogue: validates a command's arguments with
    its entry's model on the loop, then `perform`s it on the loop's executor."""

    def __init__(self, perform: Perform, catalogue: Mapping[str, Command[Any]] = CATALOGUE) -> None:
        self._perform = perform
        self.catalogue = catalogue
        self.topics: Mapping[str, str] = topics(catalogue)

    async def __call__(self, name: str, args: dict[str, Any]) -> Answer:
        command = self.catalogue.get(name)
        if command is None:
            raise ValueError(f"unknown command {name!r} (known: {', '.join(self.catalogue)})")
        request = command.validate(args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._perform, command, request)


def runtime_commands(runtime: CommandRuntime) -> CommandDispatch:
    """The commands carried out by `runtime` itself (one process: the default handler),
    each recorded in its audit as MQTT_ACTOR's."""
    return CommandDispatch(lambda command, args: _audited(runtime, command, args))


def _audited(runtime: CommandRuntime, command: Command[Any], args: BaseModel) -> Answer:
    target = getattr(args, "stream", None)
    try:
        answer = command.run(runtime, args)
    except (KeyError, ValueError) as exc:  # answered to the sender: a refusal
        detail = str(exc.args[0]) if exc.args else type(exc).__name__
        runtime.audit.record(MQTT_ACTOR, command.action, target, "refused", detail=detail)
        raise
    except Exception as exc:
        runtime.audit.record(MQTT_ACTOR, command.action, target, "failed", detail=repr(exc))
        raise
    # What it acted on: the stream its topic named, or what it made (a window's id).
    runtime.audit.record(MQTT_ACTOR, command.action, target or answer.get("id"))
    return answer
